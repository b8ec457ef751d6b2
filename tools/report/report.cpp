#include "report/report.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <toml++/toml.h>

#include "error.hpp"
#include "files/files.hpp"
#include "report/summary.hpp"
#include "files/owned_dir.hpp"
#include "report_assets.hpp"
#include "text/text.hpp"

namespace keel::report {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

// Whether `p` names an entry of `run_dir` or of a directory inside it, once the symlinks on
// the way to its directory are resolved (the entry itself is not followed: read_text).
bool inside(const fs::path& run_dir, const fs::path& p) {
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(fs::absolute(run_dir), ec);
  if (ec) return false;
  const fs::path dir = fs::weakly_canonical(fs::absolute(p).parent_path(), ec);
  if (ec) return false;
  auto r = root.begin(), d = dir.begin();
  for (; r != root.end(); ++r, ++d)
    if (d == dir.end() || *r != *d) return false;
  return true;
}

// The content of the run directory's file `p`, or "" when it cannot be read: a file out of
// `run_dir`, a symbolic link (O_NOFOLLOW), or anything but a regular file (a FIFO is opened
// with O_NONBLOCK, then refused) is not read. A run directory may come from someone else: no
// name in it leads keel report to read a file of yours into the page.
std::string read_text(const fs::path& run_dir, const fs::path& p) {
  if (!inside(run_dir, p)) return "";
  const UniqueFd fd(::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  std::string text;
  try {
    read_chunks(fd.get(), p.string(), [&](const char* data, size_t n) { text.append(data, n); });
  } catch (const FileError&) {
    return "";
  }
  return text;
}

// Whether the run directory's file `p` is a regular file read_text reads.
bool readable(const fs::path& run_dir, const fs::path& p) {
  std::error_code ec;
  return inside(run_dir, p) && fs::symlink_status(p, ec).type() == fs::file_type::regular;
}

// j[key] when j is an object whose key holds a string, else "".
std::string string_at(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return "";
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// The chrome_trace profiler's trace: the [profiler] path of the resolved manifest (relative
// paths: inside the run directory), else trace.json. A path that leaves the run directory (an
// absolute one, or one through "..") is returned as written, and read_phases does not read it.
fs::path trace_path(const fs::path& run_dir, const std::string& manifest_text) {
  std::string path = "trace.json";
  try {
    const auto m = toml::parse(manifest_text);
    if (const auto p = m["profiler"]["path"].value<std::string>(); p && !p->empty()) path = *p;
  } catch (const toml::parse_error&) {
  }
  const fs::path tp(path);
  return tp.is_absolute() ? tp : run_dir / tp;
}

// The checkpoint a `keel evaluate` evaluated: [checkpoint] init_from of its resolved manifest
// when [run] mode is "evaluate" (`keel evaluate` writes both), else "" (a training run).
std::string evaluated_checkpoint(const std::string& manifest_text) {
  try {
    const auto m = toml::parse(manifest_text);
    if (m["run"]["mode"].value_or(std::string()) != "evaluate") return "";
    return m["checkpoint"]["init_from"].value_or(std::string("(freshly initialised weights)"));
  } catch (const toml::parse_error&) {
    return "";
  }
}

// The chrome_trace profiler's phases (process 0, complete "X" events): per phase, its total
// milliseconds over the recorded steps divided by the number of recorded steps (the steps that
// have any phase event), so that the means of phases that do not nest add up to the mean
// recorded step. null when the file is not a Chrome trace or holds no phase event.
ordered_json phase_breakdown(const fs::path& run_dir, const fs::path& trace) {
  const auto j =
      nlohmann::json::parse(read_text(run_dir, trace), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) return nullptr;
  std::map<std::string, double> total_us;  // phase -> us over all recorded steps
  std::vector<std::string> order;          // phases in order of first appearance
  std::set<int64_t> steps;
  for (const auto& e : j["traceEvents"]) {
    if (!e.is_object() || !e.contains("pid") || !e["pid"].is_number_integer() ||
        e["pid"].get<int64_t>() != 0 || string_at(e, "ph") != "X" || !e.contains("dur") ||
        !e["dur"].is_number() || !e.contains("name") || !e["name"].is_string())
      continue;
    const std::string name = e["name"].get<std::string>();
    int64_t step = -1;
    if (e.contains("args") && e["args"].is_object() && e["args"].contains("step") &&
        e["args"]["step"].is_number_integer())
      step = e["args"]["step"].get<int64_t>();
    steps.insert(step);
    if (!total_us.count(name)) order.push_back(name);
    total_us[name] += e["dur"].get<double>();
  }
  if (order.empty()) return nullptr;
  ordered_json phases = ordered_json::array();
  for (const auto& name : order)
    phases.push_back({{"phase", name},
                      {"mean_ms", total_us[name] / static_cast<double>(steps.size()) / 1e3}});
  return {{"steps", steps.size()}, {"phases", phases}};
}

// The page's data as JSON that is safe inside <script>: every '<' (found only inside JSON
// strings) is written as \u003c, so neither "</script" nor "<!--" can appear in the element.
std::string script_json(const ordered_json& data) {
  const std::string s = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    if (c == '<')
      out += "\\u003c";
    else
      out += c;
  }
  return out;
}

// The page's script: draws every chart with uPlot, then reports what it drew.
constexpr const char kScript[] = R"keel_js(
(function () {
  const errors = [];
  window.addEventListener('error', e => { errors.push(String(e.message)); show(); });
  function show() { document.getElementById('errors').textContent = errors.join('\n'); }
  try {
    const data = JSON.parse(document.getElementById('data').textContent);
    const rendered = [];
    // The known metrics, in this order, some sharing a chart; every other numeric key of a
    // split gets a chart of its own after them, but the counters that only climb (epoch,
    // samples, tokens: the summary gives their last values).
    const groups = [
      ['Loss', [['train', 'loss'], ['train', 'loss_last'], ['test', 'loss']]],
      ['Accuracy', [['train', 'accuracy'], ['test', 'accuracy']]],
      ['Bits per character', [['train', 'bits_per_char'], ['test', 'bits_per_char']]],
      ['Bits per token', [['train', 'bits_per_token'], ['test', 'bits_per_token']]],
      ['Learning rate', [['train', 'lr']]],
      ['Gradient norm (before clipping)', [['train', 'grad_norm'], ['train', 'grad_norm_last']]],
      ['Samples per second', [['train', 'samples_per_s']]],
      ['Tokens per second', [['train', 'tokens_per_s']]],
      ['MFU', [['train', 'mfu']]],
      ['MFU peak (TFLOP/s)', [['train', 'mfu_peak_tflops']]],
      ['Step time (ms)', [['train', 'step_time_ms'], ['train', 'data_time_ms']]],
      ['Evaluation and checkpoint time in the window (s)',
       [['train', 'eval_time_s'], ['train', 'eval_seconds'], ['train', 'checkpoint_time_s'],
        ['train', 'checkpoint_seconds']]],
    ];
    const counters = new Set(data.counters);
    // Training keys that repeat another in every record (tokens per second of a dataset that
    // counts a sample as a token): not charted twice.
    const repeats = new Set(Object.keys(data.same_as).map(k => 'train:' + k));
    const used = new Set();
    for (const [, series] of groups) for (const [split, key] of series) used.add(split + ':' + key);
    const rest = [];
    for (const split of ['train', 'test']) {
      const keys = new Set();
      for (const r of data[split]) for (const k in r) if (typeof r[k] === 'number') keys.add(k);
      for (const k of keys)
        if (k !== 'step' && !counters.has(k) && !used.has(split + ':' + k))
          rest.push([split + ' ' + k, [[split, k]]]);
    }
    groups.push(...rest);  // in order of first appearance
    const charts = document.getElementById('charts');
    const width = Math.min(560, Math.max(320, window.innerWidth / 2 - 40));
    const colors = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e'];
    // Tick labels with 3 significant digits (uPlot's default rounds small values such as a
    // learning rate of 3e-5 to 0).
    const yaxis = {size: 70, values: (u, ticks) => ticks.map(v => v == null ? '' : String(Number(v.toPrecision(3))))};
    for (const [title, series] of groups) {
      const present = series.filter(([split, key]) => !repeats.has(split + ':' + key) &&
          data[split].some(r => typeof r[key] === 'number'));
      if (present.length === 0) continue;
      const steps = [...new Set(present.flatMap(([split, key]) =>
          data[split].filter(r => typeof r[key] === 'number').map(r => r.step)))].sort((a, b) => a - b);
      const columns = [steps];
      const summary = {title: title, series: []};
      present.forEach(([split, key]) => {
        const at = new Map(data[split].filter(r => typeof r[key] === 'number').map(r => [r.step, r[key]]));
        const ys = steps.map(s => at.has(s) ? at.get(s) : null);
        columns.push(ys);
        const values = ys.filter(v => v !== null);
        summary.series.push({label: split + ' ' + key, points: values.length,
                             last: values[values.length - 1]});
      });
      const div = document.createElement('div');
      div.className = 'chart';
      charts.appendChild(div);
      new uPlot({
        title: title, width: width, height: 240,
        scales: {x: {time: false}},
        axes: [{label: 'step'}, yaxis],
        series: [{label: 'step'}].concat(present.map(([split, key], i) => ({
          label: split + ' ' + key, stroke: colors[i % colors.length], width: 1.5, spanGaps: true,
          points: {show: split === 'test' || steps.length < 30}}))),
      }, columns, div);
      rendered.push(summary);
    }
    const phases = document.getElementById('phases');
    if (data.phases) {
      const div = document.createElement('div');
      div.className = 'chart';
      phases.appendChild(div);
      const names = data.phases.phases.map(p => p.phase);
      const ms = data.phases.phases.map(p => p.mean_ms);
      const sum = ms.reduce((a, b) => a + b, 0);
      new uPlot({
        title: 'Mean ms per phase of a step (' + data.phases.steps + ' steps recorded, ' +
               Number(sum.toPrecision(3)) + ' ms in all)',
        width: width, height: 240,
        scales: {x: {time: false, range: [-0.5, names.length - 0.5]}},
        axes: [{values: (u, ticks) => ticks.map(t => names[t] || ''), splits: () => names.map((_, i) => i)}, yaxis],
        series: [{label: 'phase'}, {label: 'ms', fill: '#1f77b488', stroke: '#1f77b4',
                  paths: uPlot.paths.bars({size: [0.6]}), points: {show: false}}],
      }, [names.map((_, i) => i), ms], div);
      rendered.push({title: 'phases', series: [{label: 'ms', points: names.length,
                     last: ms[ms.length - 1]}], phases: names, values: ms});
    }
    document.getElementById('rendered').textContent = JSON.stringify(rendered);
  } catch (e) {
    errors.push(String(e && e.stack || e));
  }
  show();
})();
)keel_js";

constexpr const char kStyle[] = R"keel_css(
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
.chart { display: inline-block; margin: 0 1em 1em 0; vertical-align: top; }
pre.text { background: #f6f6f6; padding: 0.8em; overflow: auto; max-height: 30em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
#errors { color: #b00; } #rendered { display: none; } #summary { margin-bottom: 0.8em; }
)keel_css";

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// metrics.jsonl's records, split into training records and those of the evaluation set named
// "test" ([data.test]), in file order. The records of other evaluation sets ([data.eval.NAME])
// are not charted: their split names, each once, go to `others` when given.
void read_records(const fs::path& run_dir, const fs::path& metrics, ordered_json& train,
                  ordered_json& test, std::vector<std::string>* others = nullptr) {
  if (!readable(run_dir, metrics))
    throw Error("keel report: " + metrics.string() +
                " does not exist (or is not a regular file of the run directory: keel report "
                "follows no symbolic link); hint: the run must have the jsonl hook (the default "
                "hooks include it)");
  std::istringstream in(read_text(run_dir, metrics));
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto r = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || !r.contains("step") || !r["step"].is_number())
      throw Error("keel report: " + metrics.string() + ":" + std::to_string(n) +
                  ": not a metrics record (a JSON object with a numeric \"step\"); hint: the "
                  "file is the jsonl hook's output, one record per line");
    const auto split = r.find("split");
    const bool is_train = split == r.end() || !split->is_string() || *split == "train";
    if (is_train || *split == "test") {
      (is_train ? train : test).push_back(std::move(r));
    } else if (others != nullptr &&
               std::find(others->begin(), others->end(), split->get<std::string>()) ==
                   others->end()) {
      others->push_back(split->get<std::string>());
    }
  }
}

// The run's `keel evaluate` runs: each eval-*/ directory of `run_dir` (in name order, which is
// their time order), with the checkpoint its resolved manifest names and its last evaluation
// record (summary.hpp, evaluations_html). A directory whose metrics.jsonl cannot be read or
// holds no evaluation record is listed with no metrics.
ordered_json read_evaluations(const fs::path& run_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind("eval-", 0) == 0 &&
        it->symlink_status(ec).type() == fs::file_type::directory)  // a symlink is not followed
      names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  ordered_json out = ordered_json::array();
  for (const auto& name : names) {
    const fs::path dir = run_dir / name;
    const std::string checkpoint =
        evaluated_checkpoint(read_text(run_dir, dir / "manifest.resolved.toml"));
    ordered_json e = {{"dir", name}, {"checkpoint", checkpoint}, {"step", nullptr},
                      {"metrics", ordered_json::object()}};
    ordered_json train = ordered_json::array(), test = ordered_json::array();
    try {
      read_records(run_dir, dir / "metrics.jsonl", train, test);
    } catch (const Error&) {
    }
    if (!test.empty()) {
      e["step"] = test.back()["step"];
      for (const auto& [k, v] : test.back().items())
        if (v.is_number() && k != "step" && !is_counter(k)) e["metrics"][k] = v;
    }
    out.push_back(std::move(e));
  }
  return out;
}

// The plugins table from plugins.json, or a sentence saying why there is none.
std::string plugins_html(const fs::path& run_dir, const fs::path& plugins) {
  std::error_code ec;
  const bool have_plugins = fs::exists(plugins, ec);
  const auto pj = have_plugins
                      ? nlohmann::json::parse(read_text(run_dir, plugins), nullptr, false)
                      : nlohmann::json();
  if (!have_plugins)
    return "<p>No plugins.json in the run directory (a run from before keel recorded "
           "its plugins): the plugins are not known.</p>";
  if (!pj.is_object() || !pj.contains("plugins") || !pj["plugins"].is_array())
    return "<p>" + escape_html(plugins.string()) +
           " is not a {\"plugins\": [...]} JSON object: the plugins are not shown.</p>";
  std::string html = "<table><tr><th>plugin</th><th>version</th><th>components</th>"
                     "<th>sha256</th><th>file</th></tr>";
  for (const auto& p : pj["plugins"]) {
    std::vector<std::string> names;
    if (p.is_object() && p.contains("components") && p["components"].is_array())
      for (const auto& c : p["components"])
        if (c.is_string()) names.push_back(c.get<std::string>());
    const std::string components = text::join(names);
    const std::string sha = string_at(p, "sha256");
    html += "<tr><td>" + escape_html(string_at(p, "name")) + "</td><td>" +
            escape_html(string_at(p, "version")) + "</td><td>" + escape_html(components) +
            "</td><td><code title=\"" + escape_html(sha) + "\">" +
            escape_html(sha.substr(0, 16)) + "...</code></td><td><code>" +
            escape_html(string_at(p, "path")) + "</code></td></tr>";
  }
  return html + "</table>";
}

// The phase chart's data into data["phases"]; returns the sentence shown instead ("" when
// the chart is drawn).
std::string read_phases(const fs::path& run_dir, const fs::path& trace, ordered_json& data) {
  std::error_code ec;
  if (!inside(run_dir, trace))
    return "<p>The profiler trace " + escape_html(trace.string()) + " is outside the run "
           "directory: keel report reads only the run directory's own files.</p>";
  if (!readable(run_dir, trace))
    return "<p>No profiler trace (" + escape_html(trace.string()) +
           " does not exist): run with a [profiler] type = \"chrome_trace\" table to "
           "record the phases of a step.</p>";
  if ((data["phases"] = phase_breakdown(run_dir, trace)).is_null())
    return "<p>" + escape_html(trace.string()) +
           " is not a Chrome trace with phase events (complete events of process 0).</p>";
  return "";
}

// Writes `html` to `output` under the rules of a run directory's files (files/owned_dir.hpp): its
// directory (created when missing) belongs to you, and others cannot write it unless it is
// sticky; the page goes into a new temporary file there (O_EXCL, O_NOFOLLOW), fsync'd, and is
// renamed over `output` (a symlink of that name is replaced, never written through).
void write_page(const fs::path& output, const std::string& html) {
  std::error_code ec;
  const fs::path target = fs::absolute(output, ec).lexically_normal();
  const std::string name = target.filename().string();
  if (fs::is_directory(output, ec) || name.empty() || name == "." || name == "..")
    throw Error("keel report: cannot write " + output.string() +
                ": it is a directory; hint: pass --output FILE, a file name");
  DirUse use;
  use.what = "output directory";
  use.flag = "--output";
  use.sticky_ok = true;
  CreatedEntries created;
  try {
    const OwnedDir dir = OwnedDir::open(target.parent_path().string(), created, use);
    dir.check_replaceable(name);
    dir.write_file(name, html, created);
  } catch (const Error&) {
    created.remove_all();
    throw;
  }
}

}  // namespace

std::string write_report(const std::string& run_dir_arg, const std::string& output_arg) {
  const fs::path run_dir(run_dir_arg);
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw Error("keel report: " + run_dir_arg +
                " is not a directory; hint: give the run directory of a `keel train` run "
                "([run] output_dir, default runs/<name>)");
  ordered_json train = ordered_json::array(), test = ordered_json::array();
  std::vector<std::string> other_sets;
  read_records(run_dir, run_dir / "metrics.jsonl", train, test, &other_sets);
  const fs::path manifest = run_dir / "manifest.resolved.toml";
  const std::string manifest_text = read_text(run_dir, manifest);
  const fs::path run_log = run_dir / "run.log";
  const std::string checkpoint = evaluated_checkpoint(manifest_text);
  const ordered_json summary =
      run_summary(train, test, read_text(run_dir, run_log),
                  checkpoint);
  // A training run's evaluations (an evaluation's own directory holds none).
  const ordered_json evaluations =
      checkpoint.empty() ? read_evaluations(run_dir) : ordered_json::array();

  const fs::path run_abs = fs::weakly_canonical(fs::absolute(run_dir), ec);  // no "." at the end
  ordered_json data = {{"run_dir", run_abs.string()}, {"summary", summary},
                       {"counters", counter_keys()}, {"same_as", same_as(train)},
                       {"evaluations", evaluations},
                       {"train", train}, {"test", test}, {"phases", nullptr}};
  const std::string phases_html =
      read_phases(run_dir, trace_path(run_dir, manifest_text), data);

  std::string html = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n<title>keel report: " +
                     escape_html(run_abs.filename().string()) + "</title>\n<style>" + kUplotCss +
                     "</style>\n<style>" + kStyle + "</style>\n<script>" + kUplotJs +
                     "</script>\n</head><body>\n<h1>keel run " +
                     escape_html(run_abs.string()) + "</h1>\n" +
                     "<h2>Summary</h2>\n" + summary_html(summary) +
                     "<p>" + std::to_string(train.size()) + " training records, " +
                     std::to_string(test.size()) + " evaluation records (split test)." +
                     (other_sets.empty()
                          ? std::string()
                          : " The records of the other evaluation sets (" +
                                escape_html(text::join(other_sets)) +
                                ") are in metrics.jsonl, not charted here.") +
                     "</p>\n" +
                     (checkpoint.empty() ? "<h2>Evaluations (keel evaluate)</h2>\n" +
                                               evaluations_html(evaluations)
                                         : std::string()) +
                     "<pre id=\"errors\"></pre>\n<h2>Metrics over steps</h2>\n<div id=\"charts\"></div>\n" +
                     "<h2>Phase breakdown of a step</h2>\n<div id=\"phases\">" + phases_html + "</div>\n" +
                     "<h2>Plugins</h2>\n" + plugins_html(run_dir, run_dir / "plugins.json") +
                     "\n<h2>Resolved manifest</h2>\n" +
                     (manifest_text.empty() ? std::string("<p>No manifest.resolved.toml.</p>")
                                            : "<pre class=\"text\">" + escape_html(manifest_text) + "</pre>") +
                     "\n<pre id=\"rendered\"></pre>\n<script type=\"application/json\" id=\"data\">" +
                     script_json(data) + "</script>\n<script>" + kScript + "</script>\n" +
                     "<details><summary>The charts are drawn by uPlot, inlined into this page "
                     "(its licence)</summary><pre class=\"text\">" + escape_html(kUplotLicense) +
                     "</pre></details>\n</body></html>\n";

  const fs::path output = output_arg.empty() ? run_dir / "report.html" : fs::path(output_arg);
  write_page(output, html);
  return output.string();
}

}  // namespace keel::report
