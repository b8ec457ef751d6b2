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
  int sessions = 0;
};

LogFacts read_log(const std::string& run_log) {
  LogFacts facts;
  std::istringstream in(run_log);
  std::optional<double> first, last;  // the session's earliest and latest line
  double wall = 0;
  auto close_session = [&] {
    if (first && last) wall += *last - *first;
    first.reset();
    last.reset();
  };
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("===== keel ", 0) == 0) {
      close_session();
      ++facts.sessions;
      continue;
    }
    if (const auto t = line_time(line)) {
      if (!first || *t < *first) first = t;
      if (!last || *t > *last) last = t;
    }
    // "[time] [level] run finished at step N: reason"
    const size_t level_end = line.find("] ", line.find("] [") + 3);
    if (level_end == std::string::npos || line.compare(level_end + 2, 21, kFinished) != 0)
      continue;
    const std::string rest = line.substr(level_end + 2 + 21);
    const size_t colon = rest.find(": ");
    long long step = 0;
    if (colon != std::string::npos && std::sscanf(rest.c_str(), "%lld", &step) == 1)
      facts.stop = ordered_json{{"step", step}, {"reason", rest.substr(colon + 2)}};
  }
  close_session();
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

ordered_json run_summary(const ordered_json& train, const ordered_json& test,
                         const std::string& run_log) {
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
      if (train.back().contains(k) && train.back()[k].is_number()) counters[k] = train.back()[k];
  s["counters"] = counters;
  const LogFacts log = read_log(run_log);
  s["stop"] = log.stop ? *log.stop : ordered_json{{"step", last_step}, {"reason", "unknown"}};
  s["wall_time_s"] = log.wall_s ? ordered_json(*log.wall_s) : ordered_json(nullptr);
  s["sessions"] = log.sessions;
  ordered_json throughput = ordered_json::object();
  for (const char* k : {"samples_per_s", "tokens_per_s"}) {
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
  html += row("stopped", stop["step"].is_null() ? escaped(stop["reason"].get<std::string>())
                                                : "at step " + number(stop["step"]) + ": " +
                                                      escaped(stop["reason"].get<std::string>()));
  html += row("steps", number(s["step"]));
  for (const auto& [k, v] : s["counters"].items()) html += row(k, number(v));
  html += row("wall time", s["wall_time_s"].is_null()
                               ? "unknown (no run.log)"
                               : number(s["wall_time_s"]) + " s (run.log, " +
                                     std::to_string(s["sessions"].get<int>()) + " session" +
                                     (s["sessions"].get<int>() == 1 ? "" : "s") + ")");
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

}  // namespace keel::report
