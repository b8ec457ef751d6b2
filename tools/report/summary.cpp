#include "report/summary.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "text/text.hpp"

namespace keel::report {

using nlohmann::ordered_json;

namespace {

constexpr const char* kFinished = "run finished at step ";

// A run.log line's time, "[YYYY-MM-DD HH:MM:SS.mmm] ...", in seconds since the epoch (UTC or
// local: only differences are used).
std::optional<double> line_time(const std::string& line) {
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(line.c_str(), "[%d-%d-%d %d:%d:%d.%d]", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
    return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<double>(timegm(&tm)) + ms / 1000.0;
}

struct LogFacts {
  std::optional<ordered_json> stop;  // {"step", "reason"} of the last "run finished" line
  std::optional<double> wall_s;
  int sessions = 0;          // the sessions of the run the records are of
  int earlier_sessions = 0;  // those of earlier runs in the directory, not counted
};

// One session of run.log: from a "===== keel <command>, run <id>, ... =====" line (or the
// file's start) to the next.
struct Session {
  std::string run_id;  // "" when the header names none (or before the first header)
  bool has_header = false;
  std::optional<double> first, last;  // the earliest and latest timestamped line
  std::optional<ordered_json> stop;
};

// The run id of a session header "===== keel train, run <id>, <time>, pid <pid> =====".
std::string header_run_id(const std::string& line) {
  const size_t at = line.find(", run ");
  if (at == std::string::npos) return "";
  const size_t begin = at + 6, end = line.find(',', begin);
  return line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// run.log is appended to by every run in the directory (a resumed run and one started over the
// records with --overwrite alike). A resumed run keeps its run id, a new one draws another, so
// the run whose records metrics.jsonl holds is the trailing sessions sharing the last one's
// run id; the sessions before them are earlier runs' (replaced by --overwrite) and do not count.
LogFacts read_log(const std::string& run_log) {
  std::vector<Session> sessions(1);  // [0]: lines before any header
  std::istringstream in(run_log);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("===== keel ", 0) == 0) {
      sessions.push_back({header_run_id(line), true, std::nullopt, std::nullopt, std::nullopt});
      continue;
    }
    Session& s = sessions.back();
    if (const auto t = line_time(line)) {
      if (!s.first || *t < *s.first) s.first = t;
      if (!s.last || *t > *s.last) s.last = t;
    }
    // "[time] [level] run finished at step N: reason"
    const size_t level_end = line.find("] ", line.find("] [") + 3);
    if (level_end == std::string::npos || line.compare(level_end + 2, 21, kFinished) != 0)
      continue;
    const std::string rest = line.substr(level_end + 2 + 21);
    const size_t colon = rest.find(": ");
    long long step = 0;
    if (colon != std::string::npos && std::sscanf(rest.c_str(), "%lld", &step) == 1)
      s.stop = ordered_json{{"step", step}, {"reason", rest.substr(colon + 2)}};
  }
  // The sessions of the last run: from the end back while the run id is the last one's.
  size_t from = sessions.size() - 1;
  while (from > 1 && sessions[from - 1].run_id == sessions.back().run_id) --from;
  if (!sessions.back().has_header) from = 0;  // no header at all: one session, the whole file
  LogFacts facts;
  double wall = 0;
  for (size_t i = from; i < sessions.size(); ++i) {
    const Session& s = sessions[i];
    if (s.first && s.last) wall += *s.last - *s.first;
    if (s.stop) facts.stop = s.stop;
    facts.sessions += s.has_header;
  }
  facts.earlier_sessions = from > 1 ? static_cast<int>(from - 1) : 0;
  if (facts.sessions > 0 || wall > 0) facts.wall_s = wall;
  return facts;
}

// Which way a metric improves: -1 lower is better, 1 higher, 0 unknown.
int direction(const std::string& key) {
  for (const char* low : {"loss", "bits_per", "perplexity", "error"})
    if (key.find(low) != std::string::npos) return -1;
  for (const char* high : {"accuracy", "auc", "f1", "precision", "recall"})
    if (key.find(high) != std::string::npos) return 1;
  return 0;
}

ordered_json eval_metrics(const ordered_json& test) {
  std::vector<std::string> keys;
  for (const auto& r : test)
    for (const auto& [k, v] : r.items())
      if (v.is_number() && k != "step" && !is_counter(k) &&
          std::find(keys.begin(), keys.end(), k) == keys.end())
        keys.push_back(k);
  ordered_json out = ordered_json::array();
  for (const auto& key : keys) {
    ordered_json m = {{"metric", key}, {"final", nullptr}, {"final_step", nullptr},
                      {"best", nullptr}, {"best_step", nullptr}};
    const int dir = direction(key);
    for (const auto& r : test) {
      if (!r.contains(key) || !r[key].is_number()) continue;
      const double v = r[key].get<double>();
      m["final"] = v;
      m["final_step"] = r["step"];
      if (dir != 0 && (m["best"].is_null() || (dir < 0 ? v < m["best"].get<double>()
                                                       : v > m["best"].get<double>()))) {
        m["best"] = v;
        m["best_step"] = r["step"];
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::string number(const ordered_json& v) {
  if (v.is_null()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v.get<double>());
  return buf;
}

std::string row(const std::string& head, const std::string& cell) {
  return "<tr><th>" + head + "</th><td>" + cell + "</td></tr>";
}

// "1 session", "2 sessions".
std::string plural(int n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& counter_keys() {
  static const std::vector<std::string> keys = {"epoch", "samples", "tokens"};
  return keys;
}

bool is_counter(const std::string& key) {
  return std::find(counter_keys().begin(), counter_keys().end(), key) != counter_keys().end();
}

namespace {

// Whether every training record that has `key` or `like` has both, equal, and one has them: a
// dataset without tokens of its own (the MLP's images) counts each sample as one token.
bool same_series(const ordered_json& train, const std::string& key, const std::string& like) {
  bool any = false;
  for (const auto& r : train) {
    const bool a = r.contains(key) && r[key].is_number(), b = r.contains(like) && r[like].is_number();
    if (!a && !b) continue;
    if (!a || !b || r[key].get<double>() != r[like].get<double>()) return false;
    any = true;
  }
  return any;
}

}  // namespace

ordered_json same_as(const ordered_json& train) {
  ordered_json same = ordered_json::object();
  for (const auto& [key, like] : {std::pair<const char*, const char*>{"tokens", "samples"},
                                  {"tokens_per_s", "samples_per_s"}})
    if (same_series(train, key, like)) same[key] = like;
  return same;
}

ordered_json run_summary(const ordered_json& train, const ordered_json& test,
                         const std::string& run_log, const std::string& evaluated_checkpoint) {
  const ordered_json same = same_as(train);
  ordered_json s;
  ordered_json last_step = nullptr;
  for (const ordered_json* records : {&train, &test})
    for (const auto& r : *records)
      if (last_step.is_null() || r["step"].get<double>() > last_step.get<double>())
        last_step = r["step"];
  s["step"] = last_step;
  ordered_json counters = ordered_json::object();
  if (!train.empty())
    for (const std::string& k : counter_keys())
      if (train.back().contains(k) && train.back()[k].is_number() && !same.contains(k))
        counters[k] = train.back()[k];
  s["counters"] = counters;
  if (!evaluated_checkpoint.empty())
    s["checkpoint"] = {{"path", evaluated_checkpoint},
                       {"step", test.empty() ? ordered_json(nullptr) : test.back()["step"]}};
  const LogFacts log = read_log(run_log);
  s["stop"] = log.stop ? *log.stop : ordered_json{{"step", last_step}, {"reason", "unknown"}};
  s["wall_time_s"] = log.wall_s ? ordered_json(*log.wall_s) : ordered_json(nullptr);
  s["sessions"] = log.sessions;
  s["earlier_sessions"] = log.earlier_sessions;
  ordered_json throughput = ordered_json::object();
  for (const char* k : {"samples_per_s", "tokens_per_s"}) {
    if (same.contains(k)) continue;
    double sum = 0;
    int n = 0;
    for (const auto& r : train)
      if (r.contains(k) && r[k].is_number()) {
        sum += r[k].get<double>();
        ++n;
      }
    if (n > 0) throughput[k] = sum / n;
  }
  s["throughput"] = throughput;
  s["eval"] = eval_metrics(test);
  return s;
}

std::string summary_html(const ordered_json& s) {
  std::string html = "<table id=\"summary\">";
  const ordered_json& stop = s["stop"];
  if (s.contains("checkpoint")) {
    const ordered_json& c = s["checkpoint"];
    html += row("evaluated checkpoint", "<code>" + escaped(c["path"].get<std::string>()) +
                                            "</code>" +
                                            (c["step"].is_null() ? "" : " (step " + number(c["step"]) + ")"));
  }
  html += row("stopped", stop["step"].is_null() ? escaped(stop["reason"].get<std::string>())
                                                : "at step " + number(stop["step"]) + ": " +
                                                      escaped(stop["reason"].get<std::string>()));
  html += row("steps", number(s["step"]));
  for (const auto& [k, v] : s["counters"].items()) html += row(k, number(v));
  html += row("wall time", s["wall_time_s"].is_null()
                               ? "unknown (no run.log)"
                               : number(s["wall_time_s"]) + " s (run.log, " +
                                     plural(s["sessions"].get<int>(), "session") +
                                     (s["earlier_sessions"].get<int>() == 0
                                          ? ""
                                          : "; not counted: " +
                                                plural(s["earlier_sessions"].get<int>(),
                                                       "session") +
                                                " of earlier runs in the directory") +
                                     ")");
  std::vector<std::string> rates;
  for (const auto& [k, v] : s["throughput"].items())
    rates.push_back(number(v) + " " + (k == "samples_per_s" ? "samples/s" : "tokens/s"));
  const std::string rate = text::join(rates);
  html += row("throughput", rate.empty() ? "unknown" : rate + " (mean of the logged windows)");
  html += "</table>\n";
  if (s["eval"].empty()) return html + "<p>No evaluation records.</p>\n";
  html += "<table id=\"eval-summary\"><tr><th>evaluation metric</th><th>final</th><th>at step"
          "</th><th>best</th><th>at step</th></tr>";
  for (const auto& m : s["eval"])
    html += "<tr><td>" + escaped(m["metric"].get<std::string>()) + "</td><td>" +
            number(m["final"]) + "</td><td>" + number(m["final_step"]) + "</td><td>" +
            number(m["best"]) + "</td><td>" + number(m["best_step"]) + "</td></tr>";
  return html + "</table>\n";
}

std::string evaluations_html(const ordered_json& evaluations) {
  if (evaluations.empty())
    return "<p>No <code>keel evaluate</code> of this run (no eval-*/ in the run directory).</p>\n";
  std::vector<std::string> keys;  // the metrics of any evaluation, in order of first appearance
  for (const auto& e : evaluations)
    for (const auto& [k, v] : e["metrics"].items())
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  std::string html = "<table id=\"evaluations\"><tr><th>evaluation</th><th>checkpoint</th>"
                     "<th>step</th>";
  for (const auto& k : keys) html += "<th>" + escaped(k) + "</th>";
  html += "</tr>";
  for (const auto& e : evaluations) {
    html += "<tr><td>" + escaped(e["dir"].get<std::string>()) + "</td><td><code>" +
            escaped(e["checkpoint"].get<std::string>()) + "</code></td><td>" +
            number(e["step"]) + "</td>";
    for (const auto& k : keys)
      html += "<td>" + number(e["metrics"].contains(k) ? e["metrics"][k] : ordered_json(nullptr)) +
              "</td>";
    html += "</tr>";
  }
  return html + "</table>\n";
}

}  // namespace keel::report
