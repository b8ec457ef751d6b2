#include "report/report.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.hpp"
#include "report_assets.hpp"

namespace keel::report {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The chrome_trace profiler's phases (process 0): per phase, the mean over the recorded steps
// of the milliseconds that phase took in a step.
ordered_json phase_breakdown(const fs::path& trace) {
  const auto j = nlohmann::json::parse(read_text(trace), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) return nullptr;
  std::map<std::string, std::map<int64_t, double>> per_step;  // phase -> step -> us
  std::vector<std::string> order;
  for (const auto& e : j["traceEvents"]) {
    if (!e.is_object() || e.value("pid", -1) != 0 || !e.contains("dur") || !e["dur"].is_number())
      continue;
    const std::string name = e.value("name", "");
    int64_t step = 0;
    if (e.contains("args") && e["args"].is_object() && e["args"].contains("step") &&
        e["args"]["step"].is_number_integer())
      step = e["args"]["step"].get<int64_t>();
    if (!per_step.count(name)) order.push_back(name);
    per_step[name][step] += e["dur"].get<double>();
  }
  ordered_json out = ordered_json::array();
  for (const auto& name : order) {
    double sum = 0;
    for (const auto& [step, us] : per_step[name]) sum += us;
    const auto steps = static_cast<double>(per_step[name].size());
    out.push_back({{"phase", name}, {"mean_ms", sum / steps / 1e3}, {"steps", per_step[name].size()}});
  }
  return out;
}

// The page's data as JSON that is safe inside <script>: "</" cannot close the element.
std::string script_json(const ordered_json& data) {
  std::string s = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') {
      out += "<\\/";
      ++i;
    } else {
      out += s[i];
    }
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
    const skip = new Set(['step', 'epoch', 'samples', 'tokens', 'split', 'loss_last',
                          'grad_norm_last']);
    const groups = [
      ['Loss', [['train', 'loss'], ['test', 'loss']]],
      ['Accuracy', [['test', 'accuracy']]],
      ['Bits per token', [['test', 'bits_per_token']]],
      ['Learning rate', [['train', 'lr']]],
      ['Gradient norm (before clipping)', [['train', 'grad_norm']]],
      ['Samples per second', [['train', 'samples_per_s']]],
      ['Tokens per second', [['train', 'tokens_per_s']]],
      ['MFU', [['train', 'mfu']]],
      ['Step time (ms)', [['train', 'step_time_ms'], ['train', 'data_time_ms']]],
      ['Evaluation and checkpoint time in the window (s)',
       [['train', 'eval_time_s'], ['train', 'checkpoint_time_s']]],
    ];
    const used = new Set();
    for (const [, series] of groups) for (const [split, key] of series) used.add(split + ':' + key);
    for (const split of ['train', 'test']) {
      const keys = new Set();
      for (const r of data[split]) for (const k in r) if (typeof r[k] === 'number') keys.add(k);
      for (const k of keys)
        if (!skip.has(k) && !used.has(split + ':' + k)) groups.push([split + ' ' + k, [[split, k]]]);
    }
    const charts = document.getElementById('charts');
    const width = Math.min(560, Math.max(320, window.innerWidth / 2 - 40));
    const colors = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e'];
    // Tick labels with 3 significant digits (uPlot's default rounds small values such as a
    // learning rate of 3e-5 to 0).
    const yaxis = {size: 70, values: (u, ticks) => ticks.map(v => v == null ? '' : String(Number(v.toPrecision(3))))};
    for (const [title, series] of groups) {
      const present = series.filter(([split, key]) => data[split].some(r => typeof r[key] === 'number'));
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
    if (data.phases && data.phases.length) {
      const div = document.createElement('div');
      div.className = 'chart';
      document.getElementById('phases').appendChild(div);
      const names = data.phases.map(p => p.phase);
      new uPlot({
        title: 'Mean ms per phase of a step (' + data.phases[0].steps + ' steps recorded)',
        width: width, height: 240,
        scales: {x: {time: false, range: [-0.5, names.length - 0.5]}},
        axes: [{values: (u, ticks) => ticks.map(t => names[t] || ''), splits: () => names.map((_, i) => i)}, yaxis],
        series: [{label: 'phase'}, {label: 'ms', fill: '#1f77b488', stroke: '#1f77b4',
                  paths: uPlot.paths.bars({size: [0.6]}), points: {show: false}}],
      }, [names.map((_, i) => i), data.phases.map(p => p.mean_ms)], div);
      rendered.push({title: 'phases', series: [{label: 'ms', points: names.length,
                     last: data.phases[data.phases.length - 1].mean_ms}]});
    } else {
      document.getElementById('phases').textContent =
          'No phase timings: run with a [profiler] type = "chrome_trace" table to record them.';
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
#errors { color: #b00; } #rendered { display: none; }
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

}  // namespace

std::string write_report(const std::string& run_dir_arg, const std::string& output_arg) {
  const fs::path run_dir(run_dir_arg);
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw Error("keel report: " + run_dir_arg +
                " is not a directory; hint: give the run directory of a `keel train` run "
                "([run] output_dir, default runs/<name>)");
  const fs::path metrics = run_dir / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in)
    throw Error("keel report: " + metrics.string() +
                " does not exist; hint: the run must have the jsonl hook (the default hooks "
                "include it)");
  ordered_json train = ordered_json::array(), test = ordered_json::array();
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto r = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || !r.contains("step") || !r["step"].is_number())
      throw Error("keel report: " + metrics.string() + ":" + std::to_string(n) +
                  ": not a metrics record (a JSON object with a numeric \"step\"); hint: the "
                  "file is the jsonl hook's output, one record per line");
    (r.value("split", "train") == "train" ? train : test).push_back(std::move(r));
  }

  ordered_json data = {{"run_dir", fs::absolute(run_dir).string()},
                       {"train", train},
                       {"test", test},
                       {"phases", nullptr}};
  const fs::path trace = run_dir / "trace.json";
  if (fs::exists(trace, ec)) data["phases"] = phase_breakdown(trace);

  const fs::path manifest = run_dir / "manifest.resolved.toml";
  const std::string manifest_text = fs::exists(manifest, ec) ? read_text(manifest) : "";
  std::string plugins_html;
  const fs::path plugins = run_dir / "plugins.json";
  const auto pj = fs::exists(plugins, ec)
                      ? nlohmann::json::parse(read_text(plugins), nullptr, false)
                      : nlohmann::json();
  if (pj.is_object() && pj.contains("plugins") && pj["plugins"].is_array()) {
    plugins_html = "<table><tr><th>plugin</th><th>version</th><th>components</th><th>sha256</th>"
                   "<th>file</th></tr>";
    for (const auto& p : pj["plugins"]) {
      std::string components;
      if (p.contains("components") && p["components"].is_array())
        for (const auto& c : p["components"])
          components += (components.empty() ? "" : ", ") + c.get<std::string>();
      plugins_html += "<tr><td>" + escape_html(p.value("name", "")) + "</td><td>" +
                      escape_html(p.value("version", "")) + "</td><td>" + escape_html(components) +
                      "</td><td><code>" + escape_html(p.value("sha256", "").substr(0, 16)) +
                      "...</code></td><td><code>" + escape_html(p.value("path", "")) +
                      "</code></td></tr>";
    }
    plugins_html += "</table>";
  } else {
    plugins_html = "<p>No plugins.json in the run directory (a run from before keel recorded "
                   "its plugins).</p>";
  }

  std::string html = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n<title>keel report: " +
                     escape_html(run_dir.filename().string()) + "</title>\n<style>" + kUplotCss +
                     "</style>\n<style>" + kStyle + "</style>\n<script>" + kUplotJs +
                     "</script>\n</head><body>\n<h1>keel run " +
                     escape_html(fs::absolute(run_dir).string()) + "</h1>\n" +
                     "<p>" + std::to_string(train.size()) + " training records, " +
                     std::to_string(test.size()) + " evaluation records.</p>\n" +
                     "<pre id=\"errors\"></pre>\n<h2>Metrics over steps</h2>\n<div id=\"charts\"></div>\n" +
                     "<h2>Phase breakdown of a step</h2>\n<div id=\"phases\"></div>\n" +
                     "<h2>Plugins</h2>\n" + plugins_html + "\n<h2>Resolved manifest</h2>\n" +
                     (manifest_text.empty() ? std::string("<p>No manifest.resolved.toml.</p>")
                                            : "<pre class=\"text\">" + escape_html(manifest_text) + "</pre>") +
                     "\n<pre id=\"rendered\"></pre>\n<script type=\"application/json\" id=\"data\">" +
                     script_json(data) + "</script>\n<script>" + kScript + "</script>\n</body></html>\n";

  const fs::path output = output_arg.empty() ? run_dir / "report.html" : fs::path(output_arg);
  const fs::path tmp = output.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << html;
    out.close();
    if (!out) {
      fs::remove(tmp, ec);
      throw Error("keel report: cannot write " + output.string() +
                  "; hint: check that its directory exists and is writable, or pass --output");
    }
  }
  fs::rename(tmp, output, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error("keel report: cannot write " + output.string() + ": " + ec.message());
  }
  return output.string();
}

}  // namespace keel::report
