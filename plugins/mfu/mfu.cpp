// mfu components: model FLOPs utilisation, achieved FLOP/s over the peak FLOP/s of one device.
//   peak_flops    FLOPs per sample from the model (keel_model.flops_per_sample).
//   transformer   FLOPs per token of a decoder-only transformer from the parameter count and the
//                 attention term, 6N + 12*L*H*Q*T (below).
// Both divide by `peak_tflops`, or, when it is 0, by a peak measured on this machine: a short
// float32 matrix-multiply calibration on the device the parameters live on, with the current
// LibTorch thread count, cached in $XDG_CACHE_HOME/keel/peak_flops.json (default
// ~/.cache/keel/) under a key naming the host, CPU model, device and thread counts (LibTorch's
// and OpenBLAS's: the kernel gives OpenBLAS's OpenMP build LibTorch's count, its pthread build
// one thread, and a matrix product runs on OpenBLAS's threads), so that
// later runs on the same machine skip it. The peak used is reported to the kernel
// (keel_mfu.peak_flops), which records it in the metrics as mfu_peak_tflops.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

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

// Best FLOP/s of float32 [n, n] x [n, n] matmuls on `device` over about 0.3 s, after warm-up.
double measure_peak(const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor a = at::randn({kCalibrationSize, kCalibrationSize}, opts);
  const at::Tensor b = at::randn({kCalibrationSize, kCalibrationSize}, opts);
  at::Tensor c = at::empty({kCalibrationSize, kCalibrationSize}, opts);
  const auto sync = [&] { (void)c.select(0, 0).select(0, 0).item<float>(); };
  for (int i = 0; i < 3; ++i) at::mm_out(c, a, b);
  sync();
  const double flops = 2.0 * kCalibrationSize * kCalibrationSize * kCalibrationSize;
  double best = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  for (int round = 0; round < 50 && (round < 3 || std::chrono::steady_clock::now() < until);
       ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    sync();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / std::max(s, 1e-9));
  }
  return best;
}

// OpenBLAS's thread count (it runs the CPU matrix products), or 0 when the BLAS is not OpenBLAS.
int blas_threads() {
  using GetThreads = int (*)();
  const auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get != nullptr ? get() : 0;
}

// The peak FLOP/s of one device: `peak_tflops` from the manifest when > 0, else the cached
// or newly measured calibration. Logs which.
class Peak {
 public:
  Peak(const keel::Context& ctx, const at::Device& device) {
    const keel::Logger log(ctx);
    const double given = ctx.get_float("peak_tflops");
    if (given > 0) {
      flops_ = given * 1e12;
      log(KEEL_LOG_INFO, "peak " + tflops(flops_) + " TFLOP/s per device (peak_tflops)");
      return;
    }
    char host[256] = "unknown host";
    gethostname(host, sizeof(host) - 1);
    std::ostringstream key;
    key << host << " | " << cpu_model() << " | " << device.str()
        << " | threads=" << at::get_num_threads() << " | blas threads=" << blas_threads()
        << " | float32 mm " << kCalibrationSize;
    const fs::path file = cache_file();
    nlohmann::json cache = nlohmann::json::object();
    if (!file.empty() && !ctx.get_bool("recalibrate")) {
      std::ifstream in(file);
      if (in) {
        cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
        if (!cache.is_object()) cache = nlohmann::json::object();
        const auto it = cache.find(key.str());
        if (it != cache.end() && it->is_object() && it->contains("flops") &&
            (*it)["flops"].is_number() && (*it)["flops"].get<double>() > 0) {
          flops_ = (*it)["flops"].get<double>();
          log(KEEL_LOG_INFO, "peak " + tflops(flops_) + " TFLOP/s per device (measured earlier, "
                             "cached in " + file.string() + " for '" + key.str() + "')");
          return;
        }
      }
    }
    flops_ = measure_peak(device);
    std::string where = "not cached: no $XDG_CACHE_HOME or $HOME";
    if (!file.empty()) {
      cache[key.str()] = {{"flops", flops_}};
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
    log(KEEL_LOG_INFO, "peak " + tflops(flops_) + " TFLOP/s per device, measured now (float32 " +
                           std::to_string(kCalibrationSize) + "^3 matmuls, " +
                           std::to_string(at::get_num_threads()) + " threads, OpenBLAS " +
                           std::to_string(blas_threads()) + "; " + where +
                           "); set peak_tflops to use a datasheet value instead");
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
  explicit PeakFlops(const keel::Context& ctx) : peak_(ctx, device_of(ctx)) {}
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
      : peak_(ctx, device_of(ctx)),
        layers_(ctx.get_int("layers")),
        width_(ctx.get_int("width")),
        context_(ctx.get_int("context")) {
    const std::regex exclude(ctx.get_string("exclude"));
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

const char* const kPeakHelp =
    "peak TFLOP/s of one device (one rank's; keel hands MFU the samples per second per device); "
    "0: measure it on this machine (float32 matmuls, cached per host, CPU, device and thread "
    "count)";
const char* const kRecalibrateHelp = "measure the peak again even when a cached value exists";

const keel_option_desc kPeakFlopsOptions[] = {
    keel::opt_float("peak_tflops", nullptr, kPeakHelp, 0, keel::kInf),
    keel::opt_bool("recalibrate", "false", kRecalibrateHelp),
};
const keel_option_desc kTransformerOptions[] = {
    keel::opt_int("layers", nullptr, "transformer blocks (L)", 1, 1 << 20),
    keel::opt_int("width", nullptr, "model width, heads x head dimension (H*Q)", 1, 1 << 24),
    keel::opt_int("context", nullptr, "tokens per sample (T, the sequence length)", 1, 1 << 30),
    keel::opt_string("exclude", "'(^|\\.)wpe\\.weight$'",
                     "regex: parameters (by name) not counted in N (lookups, not matmuls)", nullptr),
    keel::opt_float("peak_tflops", "0", kPeakHelp, 0, keel::kInf),
    keel::opt_bool("recalibrate", "false", kRecalibrateHelp),
};
const keel_component_desc kComponents[] = {
    keel::component<PeakFlops>("peak_flops",
                               "achieved FLOP/s (the model's FLOPs per sample) over a peak",
                               kPeakFlopsOptions),
    keel::component<Transformer>(
        "transformer", "decoder-only transformer: 6N + 12*L*H*Q*T FLOPs per token over a peak",
        kTransformerOptions),
};

}  // namespace

KEEL_PLUGIN("keel-mfu", "0.2.0", "Model FLOPs utilisation", kComponents)
