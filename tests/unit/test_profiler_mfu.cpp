// The chrome_trace profiler records each phase of the steps in its range as a Chrome trace
// (each rank its own file); the MFU plugins (peak_flops from the model's FLOPs per sample,
// transformer from the parameter count) turn throughput into a utilisation of a given or
// measured and cached peak (keyed by what it depends on, never cached when measured under
// load); an MFU above 1 is left out of the records; throughput covers training steps only.
#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "blas.hpp"
#include "components.hpp"
#include "host.hpp"
#include "manifest.hpp"
#include "options.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "run/trainer.hpp"

namespace unit_profiler_mfu {  // keel_units is one unity build: each file's names stay its own

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("chrome_trace records the phases of steps start_step..end_step") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[profiler]\ntype = \"chrome_trace\"\nstart_step = 2\n"
                                       "end_step = 5\n");
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  keel::apply_process_settings(rc);
  keel::Trainer(rc).train();
  const std::string trace = keel_test::read(d.path / "run/trace.json");
  REQUIRE(trace.rfind("{\"traceEvents\":[", 0) == 0);
  CHECK(trace.find("\"displayTimeUnit\":\"ms\"}") != std::string::npos);
  // Steps 2..5 (as numbered when the phase starts: the step count before the update).
  for (const char* phase : {"data", "forward", "backward", "optimizer"})
    CHECK_MESSAGE(count(trace, std::string("{\"name\":\"") + phase + "\"") == 4, phase);
  CHECK(count(trace, "\"step\":1}") == 0);
  CHECK(count(trace, "\"step\":6}") == 0);
  // Durations are non-negative numbers.
  CHECK(std::regex_search(trace, std::regex("\"dur\":[0-9]+\\.[0-9]+")));
  CHECK_FALSE(std::regex_search(trace, std::regex("\"dur\":-")));
}

TEST_CASE("chrome_trace: rank 0 writes trace.json, rank r > 0 trace.rank<r>.json") {
  const keel::Component* c = keel_test::default_registry().find(KEEL_KIND_PROFILER, "chrome_trace");
  REQUIRE(c != nullptr);
  const keel_options options = keel::validate_options(toml::table{}, "profiler",
                                                      "keel plugins show chrome_trace", c->options);
  for (const int rank : {0, 1, 3}) {
    CAPTURE(rank);
    TempDir d;
    keel_create_context ctx{};
    ctx.host = keel::host();
    ctx.options = &options;
    ctx.section = "profiler";
    ctx.run_dir = d.path.c_str();
    ctx.rank = rank;
    ctx.world_size = 4;
    const auto profiler = keel::create_instance<keel_profiler>(*c, ctx);
    profiler->begin(profiler.self(), "forward", 0);
    profiler->end(profiler.self(), "forward", 0);
    profiler.call("flush", profiler->flush);
    const std::string name =
        rank == 0 ? "trace.json" : "trace.rank" + std::to_string(rank) + ".json";
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(d.path))
      files.push_back(e.path().filename());
    CHECK(files == std::vector<std::string>{name});
    CHECK(count(keel_test::read(d.path / name), "{\"name\":\"forward\"") == 1);
  }
}

TEST_CASE("peak_flops reports MFU from the model's FLOPs per sample") {
  TempDir d;
  // A peak of 1000 TFLOP/s, far above the mlp's rate (an mfu above 1 is not recorded).
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[mfu]\ntype = \"peak_flops\"\npeak_tflops = 1000\n");
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  keel::apply_process_settings(rc);
  keel::Trainer(rc).train();
  std::stringstream s(keel_test::read(d.path / "run/metrics.jsonl"));
  int records = 0;
  for (std::string line; std::getline(s, line);) {
    if (line.find("\"split\": \"train\"") == std::string::npos) continue;
    std::smatch m, sps;
    REQUIRE(std::regex_search(line, m, std::regex("\"mfu\": ([-0-9.eE+]+)")));
    REQUIRE(std::regex_search(line, sps, std::regex("\"samples_per_s\": ([-0-9.eE+]+)")));
    // mlp 784 -> 32 -> 10: forward 2*(784*32 + 32*10) FLOPs, training 3x that.
    const double flops = 3.0 * 2.0 * (784 * 32 + 32 * 10);
    CHECK(std::stod(m[1]) == doctest::Approx(flops * std::stod(sps[1]) / 1e15).epsilon(1e-9));
    ++records;
  }
  CHECK(records == 4);
}

namespace {

// Each training record's value of `key` (REQUIREd present).
std::vector<double> train_values(const fs::path& metrics, const std::string& key) {
  std::stringstream s(keel_test::read(metrics));
  std::vector<double> out;
  for (std::string line; std::getline(s, line);) {
    if (line.find("\"split\": \"train\"") == std::string::npos) continue;
    std::smatch m;
    REQUIRE(std::regex_search(line, m, std::regex("\"" + key + "\": ([-0-9.eE+]+)")));
    out.push_back(std::stod(m[1]));
  }
  return out;
}

void train(const fs::path& manifest) {
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(manifest.string(), {}), registry);
  keel::apply_process_settings(rc);
  keel::Trainer(rc).train();
}

// Sets an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("the peak an mfu divides by is recorded as mfu_peak_tflops") {
  TempDir d;
  train(d.write("m.toml", keel_test::small_run(d.path / "run") +
                              "[mfu]\ntype = \"peak_flops\"\npeak_tflops = 0.001\n"));
  const auto peaks = train_values(d.path / "run/metrics.jsonl", "mfu_peak_tflops");
  REQUIRE(peaks.size() == 4);
  for (double p : peaks) CHECK(p == doctest::Approx(0.001).epsilon(1e-12));
}

namespace {

// /proc/cpuinfo's first "model name" (the CPU the peak cache's key names).
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

}  // namespace

TEST_CASE("peak_tflops = 0 measures the peak once and caches it per CPU, device, threads and BLAS") {
  TempDir d;
  const ScopedEnv cache("XDG_CACHE_HOME", (d.path / "cache").string());
  // min_cpu_share = 0: cached even when other tests load the machine (the check: below).
  const std::string mfu = "[mfu]\ntype = \"peak_flops\"\npeak_tflops = 0\nmin_cpu_share = 0\n";
  train(d.write("a.toml", keel_test::small_run(d.path / "a") + mfu));
  const fs::path file = d.path / "cache/keel/peak_flops.json";
  REQUIRE(fs::exists(file));
  const std::string cached = keel_test::read(file);
  // One entry, keyed by host, CPU model, device, thread count and the BLAS with its threads,
  // holding the measured FLOP/s and when it was measured.
  const auto entries = nlohmann::json::parse(cached);
  REQUIRE(entries.size() == 1);
  const std::string key = entries.begin().key();
  CAPTURE(key);
  CHECK(key.find(" | " + cpu_model() + " | cpu | threads=" +
                 std::to_string(at::get_num_threads()) + " | BLAS ") != std::string::npos);
  const keel::BlasInfo blas = keel::blas_info();
  CHECK(key.find("BLAS " + (blas.openblas ? blas.version : std::string("not OpenBLAS"))) !=
        std::string::npos);
  if (!blas.library.empty()) CHECK(key.find(blas.library) != std::string::npos);
  if (blas.openblas)
    CHECK(key.find(", " + std::to_string(keel::blas_threads()) + " thread") != std::string::npos);
  CHECK(entries.begin()->contains("measured"));
  const double measured = train_values(d.path / "a/metrics.jsonl", "mfu_peak_tflops").at(0);
  CHECK(measured > 1e-4);  // > 0.1 GFLOP/s: a matmul calibration, not a placeholder
  CHECK(measured < 1e3);
  // A second run reads the cache instead of measuring: rewrite the cached value and see it used.
  std::smatch m;
  REQUIRE(std::regex_search(cached, m, std::regex("\"flops\": ([-0-9.eE+]+)")));
  std::string edited = cached;
  edited.replace(m.position(1), m.length(1), "2.5e9");
  d.write("cache/keel/peak_flops.json", edited);
  train(d.write("b.toml", keel_test::small_run(d.path / "b") + mfu));
  for (double p : train_values(d.path / "b/metrics.jsonl", "mfu_peak_tflops"))
    CHECK(p == doctest::Approx(0.0025).epsilon(1e-12));
  // recalibrate = true measures again and replaces the cached value.
  train(d.write("c.toml", keel_test::small_run(d.path / "c") + mfu + "recalibrate = true\n"));
  CHECK(train_values(d.path / "c/metrics.jsonl", "mfu_peak_tflops").at(0) != 0.0025);
  CHECK(keel_test::read(file).find("2.5e9") == std::string::npos);
  // Another thread count is another key: measured anew, the first entry kept.
  const std::string other = at::get_num_threads() == 1 ? "2" : "1";
  train(d.write("e.toml", std::regex_replace(keel_test::small_run(d.path / "e"),
                                             std::regex("seed = 7\n"),
                                             "seed = 7\nthreads = " + other + "\n") + mfu));
  CHECK(nlohmann::json::parse(keel_test::read(file)).size() == 2);
}

namespace {

// Processes that spin on every core while in scope (load from outside the keel process).
class Spinners {
 public:
  explicit Spinners(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        for (volatile uint64_t x = 0;; x = x + 1) {
        }
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~Spinners() {
    for (const pid_t pid : pids_) kill(pid, SIGKILL);
    for (const pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  Spinners(const Spinners&) = delete;
  Spinners& operator=(const Spinners&) = delete;

 private:
  std::vector<pid_t> pids_;
};

}  // namespace

TEST_CASE("a peak measured under load is used for the run but not cached, and the log says so") {
  TempDir d;
  const ScopedEnv cache("XDG_CACHE_HOME", (d.path / "cache").string());
  {
    // Two spinning processes per core: the calibration's threads get at most half their cores.
    const Spinners load(2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    train(d.write("a.toml", keel_test::small_run(d.path / "a") +
                                "[mfu]\ntype = \"peak_flops\"\npeak_tflops = 0\n"));
  }
  CHECK_FALSE(fs::exists(d.path / "cache/keel/peak_flops.json"));
  const double used = train_values(d.path / "a/metrics.jsonl", "mfu_peak_tflops").at(0);
  CHECK(used > 0);
  const std::string log = keel_test::read(d.path / "a/run.log");
  CHECK(log.find("measured now under load") != std::string::npos);
  // Why: the cores' time its threads got, or the spread of its rounds.
  CHECK((log.find("cores' time, below min_cpu_share 0.80") != std::string::npos ||
         log.find("median rate is") != std::string::npos));
  CHECK(log.find("not cached, used for this run only") != std::string::npos);
}

TEST_CASE("an mfu above 1 (a peak too low) is left out of the records, with one warning") {
  TempDir d;
  // A peak of 1 kFLOP/s: the mlp's training runs far above it.
  train(d.write("m.toml", keel_test::small_run(d.path / "run") +
                              "[mfu]\ntype = \"peak_flops\"\npeak_tflops = 1e-9\n"));
  const std::string metrics = keel_test::read(d.path / "run/metrics.jsonl");
  CHECK(metrics.find("\"mfu\"") == std::string::npos);
  CHECK(train_values(d.path / "run/metrics.jsonl", "mfu_peak_tflops").size() == 4);
  const std::string log = keel_test::read(d.path / "run/run.log");
  CHECK(count(log, "is above 1, so the peak it divides by (") == 1);
  CHECK(std::regex_search(log, std::regex(R"(by \(1(\.0*[0-9]?)?e-09 TFLOP/s\) is too low)")));
  CHECK(log.find("--set mfu.recalibrate=true") != std::string::npos);
}

TEST_CASE("transformer: MFU from 6N + 12*L*width*T FLOPs per token, N from the parameters") {
  // The mlp 784 -> 32 -> 10 stands in for a transformer: the calculator counts its parameters
  // (N) and takes L, width and T from its options.
  const double weights = 784 * 32 + 32 * 10, biases = 32 + 10;
  for (const auto& case_ : {std::pair<std::string, double>{"^$", weights + biases},
                            std::pair<std::string, double>{"bias", weights}}) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& exclude = case_.first;
    const auto& n = case_.second;
    CAPTURE(exclude);
    TempDir d;
    train(d.write("m.toml", keel_test::small_run(d.path / "run") +
                                "[mfu]\ntype = \"transformer\"\nlayers = 2\nwidth = 8\n"
                                "context = 4\npeak_tflops = 1000\nexclude = '" +
                                exclude + "'\n"));
    const auto mfu = train_values(d.path / "run/metrics.jsonl", "mfu");
    const auto sps = train_values(d.path / "run/metrics.jsonl", "samples_per_s");
    REQUIRE(mfu.size() == 4);
    const double per_token = 6 * n + 12.0 * 2 * 8 * 4;
    for (size_t i = 0; i < mfu.size(); ++i)
      CHECK(mfu[i] == doctest::Approx(per_token * 4 * sps[i] / 1e15).epsilon(1e-9));
  }
}

TEST_CASE("throughput covers training steps only: evaluation and checkpoint time are reported apart") {
  // An evaluation of the 10000 test samples (a forward pass over about 300 times a step's 32
  // samples) after every training step: under the old accounting the step time included it;
  // now step_time_ms is the training step alone.
  TempDir d;
  std::string m = keel_test::small_run(d.path / "run");
  m = std::regex_replace(m, std::regex("limit = 200\n"), "limit = 10000\nbatch_size = 1000\n");
  m = std::regex_replace(m, std::regex("batch_size = 100\n"), "");
  m = std::regex_replace(m, std::regex("epochs = 2\n"), "epochs = 1\neval_every_steps = 1\n");
  m += "[checkpoint]\ntype = \"safetensors\"\nevery_steps = 2\n";
  train(d.write("m.toml", m));
  const auto metrics = d.path / "run/metrics.jsonl";
  const auto step_ms = train_values(metrics, "step_time_ms");
  const auto eval_s = train_values(metrics, "eval_time_s");
  const auto ckpt_s = train_values(metrics, "checkpoint_time_s");
  REQUIRE(step_ms.size() == 2);  // 8 steps, log_every = 4
  for (size_t i = 0; i < step_ms.size(); ++i) {
    CAPTURE(i);
    CHECK(eval_s[i] > 0);
    CHECK(ckpt_s[i] > 0);
    // 4 evaluations of 10000 samples take longer than 4 training steps of 32.
    CHECK(4 * step_ms[i] / 1e3 < eval_s[i]);
  }
}

TEST_CASE("chrome_trace with operators = true records LibTorch's operators of the same steps") {
  TempDir d;
  // Steps 2..3 of 8 with the mlp 784 -> 32 -> 10: two addmm forward per step.
  train(d.write("m.toml", keel_test::small_run(d.path / "run") +
                              "[profiler]\ntype = \"chrome_trace\"\nstart_step = 2\n"
                              "end_step = 3\noperators = true\n"));
  const auto trace = nlohmann::json::parse(keel_test::read(d.path / "run/trace.json"));
  double phase_begin = 1e300, phase_end = -1e300;
  int addmm = 0, backward = 0, memory = 0, outside = 0;
  std::set<int64_t> steps;
  for (const auto& e : trace["traceEvents"]) {
    if (e["pid"] == 0) {
      steps.insert(e["args"]["step"].get<int64_t>());
      phase_begin = std::min(phase_begin, e["ts"].get<double>());
      phase_end = std::max(phase_end, e["ts"].get<double>() + e["dur"].get<double>());
    }
  }
  for (const auto& e : trace["traceEvents"]) {
    if (e["pid"] != 1) continue;
    const double ts = e["ts"].get<double>();
    if (ts < phase_begin - 1 || ts > phase_end + 1) ++outside;  // 1 us: the two clocks' rounding
    if (e["name"] == "[memory]") {
      ++memory;
      CHECK(e["ph"] == "i");
      continue;
    }
    CHECK(e["ph"] == "X");
    if (e["name"] == "aten::addmm") {
      const std::string shapes = e["args"]["input_shapes"];
      CHECK((shapes == "[[32], [32, 784], [784, 32], [], []]" ||
             shapes == "[[10], [32, 32], [32, 10], [], []]"));
      ++addmm;
    }
    if (e["name"] == "AddmmBackward0") ++backward;
  }
  CHECK(steps == std::set<int64_t>{2, 3});
  CHECK(addmm == 4);     // 2 layers x 2 steps
  CHECK(backward == 4);
  CHECK(memory > 0);     // allocations and frees, with their sizes
  CHECK(outside == 0);   // only operators of the recorded steps, on the phases' time axis

  // Without `operators`, the trace holds the phases only.
  TempDir e;
  train(e.write("m.toml", keel_test::small_run(e.path / "run") +
                              "[profiler]\ntype = \"chrome_trace\"\nstart_step = 2\nend_step = 3\n"));
  const auto phases = nlohmann::json::parse(keel_test::read(e.path / "run/trace.json"));
  for (const auto& ev : phases["traceEvents"]) CHECK(ev["pid"] == 0);
}

}  // namespace unit_profiler_mfu
