// profiler component: records phase timings and writes them as a Chrome trace
// (chrome://tracing, Perfetto). With `operators = true` it also records the LibTorch operators
// that run during the same steps (name, duration, input shapes, FLOPs, CPU memory allocated and
// freed) into the same file, through LibTorch's profiler.
//
// Debian's LibTorch 1.13 is built without Kineto, but the profiler API of profiler_kineto.h
// (prepareProfiler / enableProfiler / disableProfiler) works there without it: it is what
// PyTorch's own torch.profiler calls on that build, and it returns the operators as
// KinetoEvents. Only ProfilerResult::save, which writes Kineto's trace, needs Kineto (it throws
// there), so this component writes the events itself. See docs/profiling.md.
#include <ATen/Context.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../rank_path.hpp"
#include "keel/plugin.hpp"
#include "keel/torch_compat.hpp"

namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kPath = keel::opt_string(
    "path", "\"trace.json\"",
    "output file (relative paths: inside the run dir; missing directories are "
    "created); rank r > 0 writes it with .rank<r> before the extension");
constexpr auto kStartStep = keel::opt_int(
    "start_step", "0", "first optimizer step to record", 0, 1e18);
constexpr auto kEndStep = keel::opt_int(
    "end_step", "-1", "last optimizer step to record (-1: until the end)", -1, 1e18);
constexpr auto kMaxEvents = keel::opt_int(
    "max_events", "1000000", "events kept at most (memory is reserved up front)", 1, 1e8);
constexpr auto kOperators = keel::opt_bool(
    "operators", "false",
    "also record LibTorch's operators in the same steps (LibTorch's profiler) "
    "into the same trace; needs end_step");
constexpr auto kRecordShapes = keel::opt_bool(
    "record_shapes", "true",
    "with operators: record each operator's input shapes (and its FLOPs, for "
    "the operators LibTorch counts)");
constexpr auto kProfileMemory = keel::opt_bool(
    "profile_memory", "true",
    "with operators: record each CPU allocation and free, and each operator's " "net CPU memory");

class ChromeTrace : public keel::Profiler {
 public:
  explicit ChromeTrace(const keel::Context& ctx)
      : path_(ctx.get(kPath)),
        start_step_(ctx.get(kStartStep)),
        end_step_(ctx.get(kEndStep)),
        max_events_(static_cast<size_t>(ctx.get(kMaxEvents))),
        operators_(ctx.get(kOperators)),
        record_shapes_(ctx.get(kRecordShapes)),
        profile_memory_(ctx.get(kProfileMemory)),
        log_(ctx),
        origin_(std::chrono::steady_clock::now()),
        wall_origin_(std::chrono::duration<double, std::micro>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count()) {
    if (!path_.empty() && path_[0] != '/') path_ = ctx.run_dir() + "/" + path_;
    path_ = keel_plugins::rank_path(path_, ctx.rank());  // each rank writes its own trace
    // LibTorch's profiler keeps every event until it stops: an open-ended range would grow
    // without bound.
    if (operators_ && end_step_ < 0)
      throw std::invalid_argument("operators = true needs an end_step (>= start_step): LibTorch's "
                                  "profiler keeps every operator it records in memory until it "
                                  "stops; keep the range a few steps long");
    if (operators_ && end_step_ < start_step_)
      throw std::invalid_argument("operators = true with end_step < start_step records nothing");
    events_.reserve(max_events_);
    open_.reserve(16);
  }

  ~ChromeTrace() override {
    if (ops_on_) {  // a run that failed: stop the profiler of this thread, drop its events
      try {
        torch::autograd::profiler::disableProfiler();
      } catch (...) {
      }
    }
  }

  void begin(const char* phase, int64_t step) override {
    if (operators_) operators_at(step);
    if (!recording(step)) return;
    open_.push_back({intern(phase), step, now_us()});
  }

  void end(const char* phase, int64_t step) override {
    if (operators_) operators_at(step);
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
    if (ops_on_) collect_operators();
    const std::string tmp = path_ + ".tmp";
    const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
    std::error_code ec;  // a `path` in a subdirectory ("profile/trace.json") creates it
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
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
    // Operators: process 1, one track per thread; memory as instant events.
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Op& o = ops_[i];
      nlohmann::ordered_json event = {{"name", o.name},
                                      {"cat", o.memory ? "memory" : "operator"},
                                      {"ph", o.memory ? "i" : "X"},
                                      {"ts", microseconds(o.ts)}};
      if (!o.memory) event["dur"] = microseconds(o.dur);
      event["pid"] = 1;
      event["tid"] = o.tid;
      if (o.memory) {
        event["s"] = "t";
        event["args"] = {{"bytes", o.bytes}};
      } else {
        event["args"] = {{"input_shapes", o.shapes}};
        if (o.flops != 0) event["args"]["flops"] = o.flops;
        if (o.bytes != 0) event["args"]["cpu_memory_bytes"] = o.bytes;
      }
      std::fputs(events_.empty() && i == 0 ? "\n" : ",\n", f);
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

  // The operator profiler runs from the first mark of a step in range to the first mark of a
  // step after it (or flush): outside the range it costs this test and nothing else. It is
  // started at most once per run.
  void operators_at(int64_t step) {
    if (!ops_on_ && !ops_done_ && recording(step)) {
      ops_done_ = true;
      namespace impl = torch::profiler::impl;
      if (impl::profilerEnabled()) {  // someone else's (LibTorch 2.x would stack ours on it)
        log_(KEEL_LOG_WARN, "operators not recorded: LibTorch's profiler did not start (the "
                            "profiler is already enabled on this thread); the phases are still "
                            "recorded");
        return;
      }
      // Kineto (inside a CUDA-linked LibTorch, PyTorch 2.x's wheel) asks CUDA for its devices
      // when it starts and, on a machine without a GPU, prints "ERROR: ... gpuGetDeviceCount
      // failed" to stderr, though only the CPU is profiled: below ERROR only where there is no
      // GPU, and never over a KINETO_LOG_LEVEL of the user's.
      if (!at::hasCUDA()) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
      try {
        const impl::ProfilerConfig config(impl::ProfilerState::KINETO, record_shapes_,
                                          profile_memory_, /*with_stack=*/false,
                                          /*with_flops=*/record_shapes_);
        const std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
        torch::autograd::profiler::prepareProfiler(config, activities);
        torch::autograd::profiler::enableProfiler(config, activities);
        ops_on_ = true;
      } catch (const std::exception& e) {
        log_(KEEL_LOG_WARN, "operators not recorded: LibTorch's profiler did not start (" +
                                first_line(e.what()) + "); the phases are still recorded");
      }
    } else if (ops_on_ && !recording(step)) {
      collect_operators();
    }
  }

  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

  void collect_operators() {
    ops_on_ = false;
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result;
    try {
      result = torch::autograd::profiler::disableProfiler();
    } catch (const std::exception& e) {
      log_(KEEL_LOG_WARN, "operators not recorded: stopping LibTorch's profiler failed (" +
                              first_line(e.what()) + "); the phases are still recorded");
      return;
    }
    if (!result) return;
    // LibTorch stamps events with the wall clock (microseconds since the epoch); the phases use
    // the steady clock from origin_. wall_origin_ was read at the same moment.
    const double origin = wall_origin_;
    // Memory events, per thread in time order, with running sums of their bytes: an operator's
    // cpu_memory_bytes is the net of those that fall within its span (as PyTorch's "CPU Mem").
    struct Mem {
      uint64_t tid;
      int64_t ns;
      int64_t sum;  // bytes of this event and every earlier one of its thread
    };
    std::vector<Mem> mem;
    for (const auto& e : result->events()) {
      if (e.name() != "[memory]") continue;
      const int64_t start = keel::compat::event_start_ns(e);
      mem.push_back({e.startThreadId(), start, e.nBytes()});
      add_op({e.name(), start / 1e3 - origin, 0, "", 0, e.nBytes(),
              static_cast<int64_t>(e.startThreadId()), true});
    }
    const auto before = [](const Mem& a, const Mem& b) {
      return a.tid != b.tid ? a.tid < b.tid : a.ns < b.ns;
    };
    std::stable_sort(mem.begin(), mem.end(), before);
    for (size_t i = 1; i < mem.size(); ++i)
      if (mem[i].tid == mem[i - 1].tid) mem[i].sum += mem[i - 1].sum;
    const auto net_bytes = [&](uint64_t tid, int64_t from, int64_t to) -> int64_t {
      // Sum over the events of `tid` with from <= ns <= to.
      const auto lo = std::lower_bound(mem.begin(), mem.end(), Mem{tid, from, 0}, before);
      const auto hi = std::upper_bound(mem.begin(), mem.end(), Mem{tid, to, 0}, before);
      if (lo == hi) return 0;
      return (hi - 1)->sum - (lo != mem.begin() && (lo - 1)->tid == tid ? (lo - 1)->sum : 0);
    };
    for (const auto& e : result->events()) {
      if (e.name() == "[memory]" || e.deviceType() != c10::DeviceType::CPU) continue;
      std::ostringstream shapes;
      shapes << "[";
      const auto sh = e.shapes();
      for (size_t k = 0; k < sh.size(); ++k) {
        shapes << (k ? ", " : "") << "[";
        for (size_t d = 0; d < sh[k].size(); ++d) shapes << (d ? ", " : "") << sh[k][d];
        shapes << "]";
      }
      shapes << "]";
      const int64_t start = keel::compat::event_start_ns(e);
      const int64_t duration = keel::compat::event_duration_ns(e);
      add_op({e.name(), start / 1e3 - origin, duration / 1e3, shapes.str(),
              static_cast<int64_t>(e.flops()),
              net_bytes(e.startThreadId(), start, start + duration),
              static_cast<int64_t>(e.startThreadId()), false});
    }
  }
  struct Op {
    std::string name;
    double ts, dur;
    std::string shapes;
    int64_t flops;
    int64_t bytes;
    int64_t tid;
    bool memory;
  };
  void add_op(Op op) {
    if (events_.size() + ops_.size() < max_events_) ops_.push_back(std::move(op));
    else dropped_++;
  }

  std::string path_;
  int64_t start_step_, end_step_;
  size_t max_events_;
  bool operators_, record_shapes_, profile_memory_;
  bool ops_on_ = false, ops_done_ = false;
  std::vector<Op> ops_;
  size_t dropped_ = 0;
  keel::Logger log_;
  std::chrono::steady_clock::time_point origin_;
  double wall_origin_;  // the wall clock at origin_, in microseconds since the epoch
  std::vector<std::string> names_;
  std::vector<Open> open_;
  std::vector<Event> events_;
};

const keel_option_desc kChromeTraceOptions[] = {
    kPath, kStartStep, kEndStep, kMaxEvents, kOperators, kRecordShapes, kProfileMemory,
};
const keel_component_desc kComponents[] = {
    keel::component<ChromeTrace>("chrome_trace",
                                 "phase timings (and optionally operators) as a Chrome trace JSON "
                                 "file",
                                 kChromeTraceOptions),
};

}  // namespace

KEEL_PLUGIN("keel-profiler", "0.1.0", "Step-phase profiling", kComponents)
