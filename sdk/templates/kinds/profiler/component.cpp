#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kPath = keel::opt_string(
    "path", "\"phases.tsv\"",
    "file the phase timings are written to (relative: in the run directory)");

// Times each phase of the training loop ("data", "forward", "backward", ...) and, at the end of
// the run, writes one line per phase to `path`: its name, how often it ran and its total seconds,
// tab-separated, after a header line. A relative path is taken in the run directory; with
// several ranks, rank N > 0 writes PATH.rankN.
class @{Class} final : public keel::Profiler {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx) : path_(ctx.get(kPath)) {
    if (path_.empty())
      throw std::invalid_argument("path is empty; hint: path = \"phases.tsv\"");
    if (path_[0] != '/') path_ = ctx.run_dir() + "/" + path_;
    if (ctx.rank() > 0) path_ += ".rank" + std::to_string(ctx.rank());
  }
  // begin and end run on every step: keep them cheap.
  void begin(const char* phase, int64_t /*step*/) override {
    Phase& p = phases_[phase];
    p.started = Clock::now();
    p.running = true;
  }
  void end(const char* phase, int64_t /*step*/) override {
    const auto it = phases_.find(phase);
    if (it == phases_.end() || !it->second.running) return;  // an end without its begin
    Phase& p = it->second;
    p.running = false;
    p.calls += 1;
    p.seconds += std::chrono::duration<double>(Clock::now() - p.started).count();
  }
  // Called once, after a training run that did not fail.
  void flush() override {
    std::FILE* f = std::fopen(path_.c_str(), "w");
    if (f == nullptr)
      throw std::runtime_error("cannot open '" + path_ + "' for writing: " + std::strerror(errno));
    bool ok = std::fprintf(f, "phase\tcalls\tseconds\n") > 0;
    for (const auto& [name, p] : phases_)
      ok = ok && std::fprintf(f, "%s\t%lld\t%.6f\n", name.c_str(),
                              static_cast<long long>(p.calls), p.seconds) > 0;
    if (std::fclose(f) != 0 || !ok) throw std::runtime_error("writing '" + path_ + "' failed");
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Phase {
    int64_t calls = 0;
    double seconds = 0;
    Clock::time_point started;
    bool running = false;
  };
  std::string path_;
  std::map<std::string, Phase> phases_;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kPath};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
