// profiler component: records phase timings and writes them as a Chrome trace
// (chrome://tracing, Perfetto).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../rank_path.hpp"
#include "keel/plugin.hpp"

namespace {

class ChromeTrace : public keel::Profiler {
 public:
  explicit ChromeTrace(const keel::Context& ctx)
      : path_(ctx.get_string("path")),
        start_step_(ctx.get_int("start_step")),
        end_step_(ctx.get_int("end_step")),
        max_events_(static_cast<size_t>(ctx.get_int("max_events"))),
        log_(ctx),
        origin_(std::chrono::steady_clock::now()) {
    if (!path_.empty() && path_[0] != '/') path_ = ctx.run_dir() + "/" + path_;
    path_ = keel_plugins::rank_path(path_, ctx.rank());  // each rank writes its own trace
    events_.reserve(max_events_);
    open_.reserve(16);
  }

  void begin(const char* phase, int64_t step) override {
    if (!recording(step)) return;
    open_.push_back({intern(phase), step, now_us()});
  }

  void end(const char* phase, int64_t step) override {
    if (!recording(step)) return;
    const double t = now_us();
    const uint32_t id = intern(phase);
    // Close the innermost open phase of that name (and anything still open inside it).
    for (size_t i = open_.size(); i-- > 0;) {
      if (open_[i].phase != id) continue;
      if (events_.size() < max_events_) {
        const Open& o = open_[i];
        events_.push_back({o.phase, o.step, o.ts, t - o.ts});
      } else {
        dropped_++;
      }
      open_.resize(i);
      return;
    }
  }

  void flush() override {
    const std::string tmp = path_ + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr)
      throw std::runtime_error("cannot open '" + tmp +
                               "' for writing; check that the directory exists and is writable");
    // One event per line: {"traceEvents":[\n{event},\n{event}\n],"displayTimeUnit":"ms"}.
    std::fputs("{\"traceEvents\":[", f);
    for (size_t i = 0; i < events_.size(); ++i) {
      const Event& e = events_[i];
      const nlohmann::ordered_json event = {{"name", names_[e.phase]},
                                            {"ph", "X"},
                                            {"ts", microseconds(e.ts)},
                                            {"dur", microseconds(e.dur)},
                                            {"pid", 0},
                                            {"tid", 0},
                                            {"args", {{"step", e.step}}}};
      std::fputs(i == 0 ? "\n" : ",\n", f);
      std::fputs(event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(), f);
    }
    std::fputs("\n],\"displayTimeUnit\":\"ms\"}\n", f);
    const bool ok = std::fflush(f) == 0 && !std::ferror(f);
    if (std::fclose(f) != 0 || !ok)
      throw std::runtime_error("writing '" + tmp + "' failed (disk full?)");
    if (std::rename(tmp.c_str(), path_.c_str()) != 0)
      throw std::runtime_error("cannot rename '" + tmp + "' to '" + path_ + "'");
    if (dropped_ > 0)
      log_(KEEL_LOG_WARN, "dropped " + std::to_string(dropped_) +
                              " events beyond max_events=" + std::to_string(max_events_) +
                              "; raise it");
  }

 private:
  // Phases are interned: a handful of names, so begin/end only compare a few strings.
  struct Open {
    uint32_t phase;
    int64_t step;
    double ts;
  };
  struct Event {
    uint32_t phase;
    int64_t step;
    double ts, dur;
  };

  // Rounded to the nanosecond (the clock's resolution), so the trace shows no float noise.
  static double microseconds(double us) { return std::round(us * 1000.0) / 1000.0; }

  bool recording(int64_t step) const {
    return step >= start_step_ && (end_step_ < 0 || step <= end_step_);
  }
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_)
        .count();
  }
  uint32_t intern(const char* phase) {
    for (size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == phase) return static_cast<uint32_t>(i);
    names_.emplace_back(phase);
    return static_cast<uint32_t>(names_.size() - 1);
  }

  std::string path_;
  int64_t start_step_, end_step_;
  size_t max_events_;
  size_t dropped_ = 0;
  keel::Logger log_;
  std::chrono::steady_clock::time_point origin_;
  std::vector<std::string> names_;
  std::vector<Open> open_;
  std::vector<Event> events_;
};

const keel_option_desc kChromeTraceOptions[] = {
    keel::opt_string("path", "\"trace.json\"",
                     "output file (relative paths: inside the run dir); rank r > 0 writes it with "
                     ".rank<r> before the extension"),
    keel::opt_int("start_step", "0", "first optimizer step to record", 0, 1e18),
    keel::opt_int("end_step", "-1", "last optimizer step to record (-1: until the end)", -1, 1e18),
    keel::opt_int("max_events", "1000000", "events kept at most (memory is reserved up front)", 1,
                  1e8),
};
const keel_component_desc kComponents[] = {
    keel::component<ChromeTrace>("chrome_trace", "phase timings as a Chrome trace JSON file",
                                 kChromeTraceOptions),
};

}  // namespace

KEEL_PLUGIN("keel-profiler", "0.1.0", "Step-phase profiling", kComponents)
