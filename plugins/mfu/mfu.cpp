// mfu components: model FLOPs utilisation, achieved FLOP/s over the peak FLOP/s of one device.
//   peak_flops    FLOPs per sample from the model (keel_model.flops_per_sample).
//   transformer   FLOPs per token of a decoder-only transformer from the parameter count and the
//                 attention term, 6N + 12*L*H*Q*T (below).
// Both divide by `peak_tflops`, or, when it is 0, by a peak measured on this machine: a short
// float32 matrix-multiply calibration on the device the parameters live on, with the current
// thread counts (docs/mfu.md, "The peak"). A measurement is cached in
// $XDG_CACHE_HOME/keel/peak_flops.json (default ~/.cache/keel/) under a key naming what it
// depends on: the host, CPU model, device, LibTorch's thread count and the BLAS that runs the
// products with its thread count (the kernel gives OpenBLAS's OpenMP build LibTorch's count,
// its pthread build one thread), so that later runs on the same machine skip it. A measurement
// taken under load (its matmul threads did not get their cores, or its rounds' rates spread
// widely) is used for that run only: never cached, and said so in the run log. `recalibrate =
// true` measures again over a cached value. The peak used is reported to the kernel
// (keel_mfu.peak_flops), which records it in the metrics as mfu_peak_tflops.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/plugin.hpp"

namespace {

namespace fs = std::filesystem;

constexpr int64_t kCalibrationSize = 1024;  // square float32 matmuls of this size

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown cpu";
}

fs::path cache_file() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg) return fs::path(xdg) / "keel" / "peak_flops.json";
  if (home && *home) return fs::path(home) / ".cache" / "keel" / "peak_flops.json";
  return {};
}

// The BLAS that runs LibTorch's CPU matrix products, as this process loaded it (the plugin
// looks it up by its symbols, as the kernel's blas.cpp does: any BLAS links).
struct Blas {
  bool openblas = false;  // OpenBLAS's openblas_* functions are there
  int threads = 0;        // OpenBLAS's thread count (0: not OpenBLAS, its threads unknown)
  std::string text;       // "OpenBLAS 0.3.21 (OpenMP build, /usr/lib/.../libblas.so.3), 2 threads"
};

Blas blas() {
  Blas b;
  const auto get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const auto parallel = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  const auto config = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  b.openblas = get != nullptr;
  b.threads = get != nullptr ? get() : 0;
  std::string name = b.openblas ? "OpenBLAS" : "not OpenBLAS";
  if (config != nullptr && config() != nullptr) {
    // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64": the first two words.
    const std::string text = config();
    const size_t space = text.find(' ');
    name = text.substr(0, space == std::string::npos ? space : text.find(' ', space + 1));
  }
  std::string notes;
  if (b.openblas)
    notes = parallel != nullptr && parallel() == 2 ? "OpenMP build" : "not the OpenMP build";
  Dl_info where{};
  if (void* dgemm = dlsym(RTLD_DEFAULT, "dgemm_");
      dgemm != nullptr && dladdr(dgemm, &where) != 0 && where.dli_fname != nullptr) {
    char* real = realpath(where.dli_fname, nullptr);
    notes += (notes.empty() ? "" : ", ") + std::string(real != nullptr ? real : where.dli_fname);
    free(real);
  }
  b.text = name + (notes.empty() ? "" : " (" + notes + ")");
  if (b.openblas) b.text += ", " + std::to_string(b.threads) + (b.threads == 1 ? " thread" : " threads");
  return b;
}

// The cores this process may run on (its CPU affinity), at least 1.
int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// This process's CPU time (all its threads), in seconds.
double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// One calibration: the rates of its timed rounds and what the process got meanwhile.
struct Measurement {
  double best = 0, median = 0;  // FLOP/s of the fastest round and of the median round
  int rounds = 0;
  // CPU devices: the process's CPU time over the timed rounds' wall time, divided by the
  // threads the products run on (at most the usable cores): about 1 when each thread had its
  // core, lower when other processes took turns on them. -1: not a CPU device.
  double cpu_share = -1;
  int threads = 0;  // the threads cpu_share counts
};

// Float32 [n, n] x [n, n] matmuls on `device` over about 0.3 s (3 to 50 rounds), after warm-up.
// `threads`: the threads the products run on (CPU).
Measurement measure_peak(const at::Device& device, int threads) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor a = at::randn({kCalibrationSize, kCalibrationSize}, opts);
  const at::Tensor b = at::randn({kCalibrationSize, kCalibrationSize}, opts);
  at::Tensor c = at::empty({kCalibrationSize, kCalibrationSize}, opts);
  const auto sync = [&] { (void)c.select(0, 0).select(0, 0).item<float>(); };
  for (int i = 0; i < 3; ++i) at::mm_out(c, a, b);
  sync();
  const double flops = 2.0 * kCalibrationSize * kCalibrationSize * kCalibrationSize;
  std::vector<double> rates;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_s();
  const auto until = start + std::chrono::milliseconds(300);
  for (int round = 0; round < 50 && (round < 3 || std::chrono::steady_clock::now() < until);
       ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    sync();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(flops / std::max(s, 1e-9));
  }
  const double cpu = process_cpu_s() - cpu_start;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Measurement m;
  std::sort(rates.begin(), rates.end());
  m.rounds = static_cast<int>(rates.size());
  m.best = rates.back();
  m.median = rates[rates.size() / 2];
  if (device.is_cpu()) {
    m.threads = std::max(1, std::min(threads, usable_cores()));
    m.cpu_share = cpu / std::max(wall, 1e-9) / m.threads;
  }
  return m;
}

// Why `m` was measured under load, or "" when it was not: its threads got less than
// `min_cpu_share` of their cores' time, or its median round ran below 2/3 of its best (the
// machine's speed changed while it measured). min_cpu_share 0: no check.
std::string under_load(const Measurement& m, double min_cpu_share) {
  if (min_cpu_share <= 0) return "";
  char buf[200];
  if (m.cpu_share >= 0 && m.cpu_share < min_cpu_share) {
    std::snprintf(buf, sizeof buf,
                  "its %d matmul thread%s got %.0f%% of %s cores' time, below min_cpu_share "
                  "%.2f: other processes were running",
                  m.threads, m.threads == 1 ? "" : "s", 100 * m.cpu_share,
                  m.threads == 1 ? "its" : "their", min_cpu_share);
    return buf;
  }
  if (m.median < m.best * 2 / 3) {
    std::snprintf(buf, sizeof buf,
                  "its %d rounds' median rate is %.0f%% of the best: the machine's speed "
                  "changed while it measured", m.rounds, 100 * m.median / m.best);
    return buf;
  }
  return "";
}

// Now, as "2026-12-06T10:33:13Z".
std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

constexpr const char* kPeakHelp =
    "peak TFLOP/s of one device (one rank's; keel hands MFU the samples per second per device); "
    "0: measure it on this machine (float32 matmuls, cached per host, CPU, device, threads and "
    "BLAS)";
constexpr const char* kRecalibrateHelp =
    "measure the peak again even when a cached value exists (and cache it unless under load)";
constexpr const char* kMinCpuShareHelp =
    "a peak measured on the CPU whose matmul threads got less than this share of their cores' "
    "time (other processes were running), or whose rounds' rates spread widely, is used for the "
    "run but not cached; 0: no load check, cache every measurement";

// Options, each declared once: the schemas at the end list them, the components read them as
// the types they declare (ctx.get). peak_tflops is required of peak_flops and defaults to 0
// (measure) for transformer; Peak reads the declaration its component hands it.
constexpr auto kPeakTflopsRequired =
    keel::opt_float("peak_tflops", nullptr, kPeakHelp, 0, keel::kInf);
constexpr auto kPeakTflopsOr0 = keel::opt_float("peak_tflops", "0", kPeakHelp, 0, keel::kInf);
constexpr auto kRecalibrate = keel::opt_bool("recalibrate", "false", kRecalibrateHelp);
constexpr auto kMinCpuShare = keel::opt_float("min_cpu_share", "0.8", kMinCpuShareHelp, 0, 1);
constexpr auto kLayers = keel::opt_int("layers", nullptr, "transformer blocks (L)", 1, 1 << 20);
constexpr auto kWidth =
    keel::opt_int("width", nullptr, "model width, heads x head dimension (H*Q)", 1, 1 << 24);
constexpr auto kContext =
    keel::opt_int("context", nullptr, "tokens per sample (T, the sequence length)", 1, 1 << 30);
constexpr auto kExclude =
    keel::opt_string("exclude", "'(^|\\.)wpe\\.weight$'",
                     "regex: parameters (by name) not counted in N (lookups, not matmuls)");

// The peak FLOP/s of one device: `peak_tflops` from the manifest when > 0, else the cached
// or newly measured calibration. Logs which.
class Peak {
 public:
  Peak(const keel::Context& ctx, const keel::Option<double>& peak_tflops,
       const at::Device& device) {
    const keel::Logger log(ctx);
    const double given = ctx.get(peak_tflops);
    if (given > 0) {
      flops_ = given * 1e12;
      log(KEEL_LOG_INFO, "peak " + tflops(flops_) + " TFLOP/s per device (peak_tflops)");
      return;
    }
    char host[256] = "unknown host";
    gethostname(host, sizeof(host) - 1);
    const Blas b = blas();
    std::ostringstream key;
    key << host << " | " << cpu_model() << " | " << device.str()
        << " | threads=" << at::get_num_threads() << " | BLAS " << b.text << " | float32 mm "
        << kCalibrationSize;
    const fs::path file = cache_file();
    nlohmann::json cache = nlohmann::json::object();
    if (!file.empty()) {
      std::ifstream in(file);
      if (in) {
        cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
        if (!cache.is_object()) cache = nlohmann::json::object();
      }
    }
    if (!ctx.get(kRecalibrate)) {
      const auto it = cache.find(key.str());
      if (it != cache.end() && it->is_object() && it->contains("flops") &&
          (*it)["flops"].is_number() && (*it)["flops"].get<double>() > 0) {
        flops_ = (*it)["flops"].get<double>();
        const auto when = it->find("measured");
        log(KEEL_LOG_INFO,
            "peak " + tflops(flops_) + " TFLOP/s per device (measured " +
                (when != it->end() && when->is_string() ? when->get<std::string>() + ", "
                                                         : std::string("earlier, ")) +
                "cached in " + file.string() + " for '" + key.str() +
                "'; --set mfu.recalibrate=true measures it again)");
        return;
      }
    }
    // The threads the products run on: OpenBLAS's; another BLAS's are unknown, so count one.
    const Measurement m = measure_peak(device, b.openblas ? b.threads : 1);
    flops_ = m.best;
    const int threads = at::get_num_threads();
    const std::string how = "float32 " + std::to_string(kCalibrationSize) + "^3 matmuls, " +
                            std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
                            ", BLAS " + b.text;
    const std::string loaded = under_load(m, ctx.get(kMinCpuShare));
    if (!loaded.empty()) {
      log(KEEL_LOG_WARN,
          "peak " + tflops(flops_) + " TFLOP/s per device, measured now under load (" + how +
              "; " + loaded + "): not cached, used for this run only, so its MFU reads high; "
              "hint: measure on an idle machine (the next run does, or --set "
              "mfu.recalibrate=true), or set peak_tflops");
      return;
    }
    std::string where = "not cached: no $XDG_CACHE_HOME or $HOME";
    if (!file.empty()) {
      cache[key.str()] = {{"flops", flops_}, {"measured", utc_now()}, {"cpu_share", m.cpu_share}};
      std::error_code ec;
      fs::create_directories(file.parent_path(), ec);
      const fs::path tmp = file.string() + "." + std::to_string(getpid()) + ".tmp";
      {
        std::ofstream out(tmp);
        out << cache.dump(2) << "\n";
        out.close();
        if (out) fs::rename(tmp, file, ec);  // atomic: readers see the old or the new file
        else ec = std::make_error_code(std::errc::io_error);
      }
      if (ec) {
        fs::remove(tmp, ec);
        where = "could not cache it in " + file.string();
      } else {
        where = "cached in " + file.string();
      }
    }
    log(KEEL_LOG_INFO, "peak " + tflops(flops_) + " TFLOP/s per device, measured now (" + how +
                           "; " + where + "); set peak_tflops to use a datasheet value instead");
  }
  double flops() const { return flops_; }

 private:
  static std::string tflops(double f) {
    std::ostringstream s;
    s.precision(4);
    s << f / 1e12;
    return s.str();
  }
  double flops_ = 0;
};

at::Device device_of(const keel::Context& ctx) {
  const auto params = ctx.params();
  return params.empty() ? at::Device(at::kCPU) : params.front().device();
}

class PeakFlops : public keel::Mfu {
 public:
  explicit PeakFlops(const keel::Context& ctx)
      : peak_(ctx, kPeakTflopsRequired, device_of(ctx)) {}
  double compute(double flops_per_sample, double samples_per_second) override {
    if (flops_per_sample == 0.0 || !std::isfinite(flops_per_sample)) return 0.0;
    return flops_per_sample * samples_per_second / peak_.flops();
  }
  double peak_flops() override { return peak_.flops(); }

 private:
  Peak peak_;  // FLOP/s of one device (samples_per_second is per device)
};

// Training FLOPs per token of a decoder-only transformer (PaLM, appendix B; nanoGPT's
// estimate_mfu): 6N for the matmuls with the weights (2N forward, 4N backward) plus
// 12*L*H*Q*T for attention's two [T, T] matmuls per layer (QK^T and AV: 2*2*T*H*Q forward per
// token, three times that with the backward), with L layers, H heads of Q dimensions (H*Q =
// width) and T tokens of context. N counts the parameters that multiply activations: every
// trained parameter except those whose name matches `exclude` (default: the position
// embedding wpe, a table lookup that costs no FLOPs). A token embedding tied to the output
// layer (gpt's wte = lm_head) is counted, once: its matmul with the final hidden states is
// 2*V*width FLOPs per token. An untied input embedding is a lookup too: add it to `exclude`.
class Transformer : public keel::Mfu {
 public:
  explicit Transformer(const keel::Context& ctx)
      : peak_(ctx, kPeakTflopsOr0, device_of(ctx)),
        layers_(ctx.get(kLayers)),
        width_(ctx.get(kWidth)),
        context_(ctx.get(kContext)) {
    const std::regex exclude(ctx.get(kExclude));
    const auto params = ctx.params();
    const auto& raw = ctx.raw();
    for (size_t i = 0; i < params.size(); ++i) {
      if (raw.param_names && std::regex_search(raw.param_names[i], exclude)) {
        excluded_ += params[i].numel();
        continue;
      }
      n_ += params[i].numel();
    }
    flops_per_token_ = 6.0 * static_cast<double>(n_) +
                       12.0 * static_cast<double>(layers_) * static_cast<double>(width_) *
                           static_cast<double>(context_);
    const keel::Logger log(ctx);
    log(KEEL_LOG_INFO,
                      "N = " + std::to_string(n_) + " parameters (" + std::to_string(excluded_) +
                          " excluded), " + std::to_string(flops_per_token_ / 1e6) +
                          " MFLOPs per token, " + std::to_string(context_) + " tokens per sample");
  }
  double compute(double /*model's flops_per_sample*/, double samples_per_second) override {
    return flops_per_token_ * static_cast<double>(context_) * samples_per_second / peak_.flops();
  }
  double peak_flops() override { return peak_.flops(); }

 private:
  Peak peak_;
  int64_t layers_, width_, context_;
  int64_t n_ = 0, excluded_ = 0;
  double flops_per_token_ = 0;
};

const keel_option_desc kPeakFlopsOptions[] = {kPeakTflopsRequired, kRecalibrate, kMinCpuShare};
const keel_option_desc kTransformerOptions[] = {kLayers,        kWidth,       kContext,    kExclude,
                                                kPeakTflopsOr0, kRecalibrate, kMinCpuShare};
const keel_component_desc kComponents[] = {
    keel::component<PeakFlops>("peak_flops",
                               "achieved FLOP/s (the model's FLOPs per sample) over a peak",
                               kPeakFlopsOptions),
    keel::component<Transformer>(
        "transformer", "decoder-only transformer: 6N + 12*L*H*Q*T FLOPs per token over a peak",
        kTransformerOptions),
};

}  // namespace

KEEL_PLUGIN("keel-mfu", "0.3.0", "Model FLOPs utilisation", kComponents)
