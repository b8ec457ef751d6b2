// Drives a loss of the losses plugin (plugins/losses) through keel/testing.hpp for
// tests/plugins/test_lm_losses.py. Three modes:
//
//   lm_losses_probe PLUGIN.so COMPONENT LOGITS.bin SHAPE TARGETS.bin GRAD.bin [KEY=VALUE]...
//     Computes the loss of given logits and targets and its backward, and writes the gradient.
//     SHAPE is the logits' shape as comma-separated extents (e.g. 4,16,65), optionally
//     followed by ':' and the targets' shape (default: the logits' without its last
//     dimension); LOGITS.bin holds float32 values, TARGETS.bin int64 ids, both row-major in
//     this machine's byte order. GRAD.bin receives d(loss)/d(logits) (float32). stdout gets
//     one JSON line: {"loss": .., "count": .., "count_items": .., "requires_grad": ..,
//     "no_grad_loss": .., "no_grad_requires_grad": ..}, the last two from computing the loss
//     a second time under at::NoGradGuard (as evaluation does).
//
//   lm_losses_probe count PLUGIN.so COMPONENT SHAPE [KEY=VALUE]...
//     count_items of an int64 target of SHAPE on the meta device, which has sizes but no
//     data: a count that reads the values (a host sync on a real device) fails there.
//     stdout: {"count_items": ..}.
//
//   lm_losses_probe memory PLUGIN.so COMPONENT B,T,V [KEY=VALUE]...
//     Random float32 logits [B, T, V] and int64 targets (none equal to -100); then the loss and
//     its backward. stdout: {"logits_bytes": .., "peak_growth_bytes": ..}, where the growth is
//     the process's peak resident set (VmHWM in /proc/self/status, reset through
//     /proc/self/clear_refs just before the loss) minus its resident set at that moment. A
//     warm-up on tiny tensors comes first (warm_up).
//
//   lm_losses_probe linear PLUGIN.so COMPONENT FEATURES.bin B,T,F WEIGHT.bin V,G TARGETS.bin
//                   GRADS.bin [KEY=VALUE]...
//     The loss's compute_linear (ABI 1.5) of float32 features [B, T, F] and weight [V, G]
//     (both requiring grad) against int64 targets [B, T], and its backward. GRADS.bin receives
//     d(loss)/d(features) then d(loss)/d(weight) (float32). stdout: {"loss": .., "count": ..,
//     "requires_grad": .., "no_grad_loss": .., "no_grad_requires_grad": ..} as above. A loss
//     without compute_linear fails with "no compute_linear".
//
//   lm_losses_probe memory_linear|memory_plain PLUGIN.so COMPONENT B,T,V,F [KEY=VALUE]...
//     Random float32 features [B, T, F], weight [V, F] and int64 targets; then the loss and its
//     backward: through compute_linear (memory_linear), or through compute on the logits
//     at::linear(features, weight) (memory_plain: what the model's forward and compute do).
//     stdout: {"logits_bytes": (B*T*V*4), "peak_growth_bytes": ..} as in memory mode.
//
// KEY=VALUE are the loss's options (integer values). Any failure prints its message on stderr
// and exits 1. `lm_losses_probe --batch` runs many cases of the first and the `count` and
// `linear` modes (tests/plugins/probe.hpp); the memory modes measure the whole process's peak and so
// refuse to run there: each needs a fresh process.
#include "keel/testing.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include "probe.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace lm_losses_probe {

// A "Vm...:  N kB" line of /proc/self/status, in bytes.
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  throw std::runtime_error("no " + key + " in /proc/self/status");
}

// Resets the peak resident set (VmHWM) to the current one.
void reset_peak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  if (!clear.flush()) throw std::runtime_error("cannot reset the peak RSS (/proc/self/clear_refs)");
}

std::string json(double x) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", x);
  return std::isnan(x) ? std::string("NaN") : std::string(text);
}

std::string count_mode(int argc, char** argv) {
  if (argc < 5) throw std::runtime_error("usage: lm_losses_probe count PLUGIN.so COMPONENT SHAPE [KEY=VALUE]...");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  auto loss = plugin.create<keel_loss>(argv[3], probe::parse_options(argc, argv, 5));
  const at::Tensor target = at::empty(probe::parse_shape(argv[4]), at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  if (!loss->count_items) throw std::runtime_error("no count_items");
  const int64_t items = loss.call(loss->count_items, keel::peek(target));
  return probe::format("{\"count_items\": %lld}\n", static_cast<long long>(items));
}

// Memory modes measure the process's peak resident set, which earlier cases of a batch would
// have raised (and whose freed memory allocations could reuse without growing it).
void need_fresh_process() {
  if (probe::batch_mode())
    throw std::runtime_error("memory modes measure the process's peak: run each in a fresh "
                             "process, not in --batch");
}

// The same loss and backward once on tiny tensors ([1, 8, 16] logits; features [1, 8, F] and a
// [16, F] weight), before the measured window: what a process does once on first use (the
// autograd engine's worker thread, kernels and libraries loaded lazily) then stays outside the
// measured growth. The tensors are KiB-sized, so the memory they free hardly matters.
void warm_up(keel::testing::Instance<keel_loss>& loss, int64_t features, bool linear) {
  const at::Tensor targets = at::randint(16, {1, 8}, at::kLong);
  keel_tensor* out = nullptr;
  int64_t count = -1;
  if (linear) {
    const at::Tensor f = at::randn({1, 8, features}).requires_grad_(true);
    const at::Tensor w = at::randn({16, features}).requires_grad_(true);
    loss.call(loss->compute_linear, keel::peek(f), keel::peek(w), keel::peek(targets), &out,
              &count);
  } else {
    const at::Tensor logits = (features > 0 ? at::linear(at::randn({1, 8, features}),
                                                         at::randn({16, features}).requires_grad_(true))
                                            : at::randn({1, 8, 16}).requires_grad_(true));
    loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &out, &count);
  }
  keel::adopt(out).backward();
}

std::string memory_mode(int argc, char** argv) {
  need_fresh_process();
  if (argc < 5) throw std::runtime_error("usage: lm_losses_probe memory PLUGIN.so COMPONENT B,T,V [KEY=VALUE]...");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  auto loss = plugin.create<keel_loss>(argv[3], probe::parse_options(argc, argv, 5));
  const std::vector<int64_t> shape = probe::parse_shape(argv[4]);
  at::manual_seed(0);
  const at::Tensor logits = at::randn(shape).requires_grad_(true);
  const at::Tensor targets = at::randint(shape[2], {shape[0], shape[1]}, at::kLong);
  warm_up(loss, 0, false);
  reset_peak();
  const int64_t before = status_bytes("VmRSS");
  keel_tensor* out = nullptr;
  int64_t count = -1;
  loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &out, &count);
  keel::adopt(out).backward();
  const int64_t peak = status_bytes("VmHWM");
  return probe::format("{\"logits_bytes\": %lld, \"peak_growth_bytes\": %lld}\n",
                       static_cast<long long>(logits.nbytes()),
                       static_cast<long long>(peak - before));
}

// compute_linear of the loss `loss`, as the kernel calls it; returns the loss tensor.
at::Tensor linear_loss(keel::testing::Instance<keel_loss>& loss, const at::Tensor& features,
                       const at::Tensor& weight, const at::Tensor& targets, int64_t* count) {
  if (!loss->compute_linear) throw std::runtime_error("no compute_linear");
  keel_tensor* out = nullptr;
  *count = -1;
  loss.call(loss->compute_linear, keel::peek(features), keel::peek(weight), keel::peek(targets),
            &out, count);
  return keel::adopt(out);
}

std::string memory_linear_mode(int argc, char** argv) {
  if (argc < 5)
    throw std::runtime_error("usage: lm_losses_probe memory_linear|memory_plain PLUGIN.so "
                             "COMPONENT B,T,V,F [KEY=VALUE]...");
  need_fresh_process();
  const bool plain = std::string(argv[1]) == "memory_plain";
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  auto loss = plugin.create<keel_loss>(argv[3], probe::parse_options(argc, argv, 5));
  const std::vector<int64_t> s = probe::parse_shape(argv[4]);
  at::manual_seed(0);
  const at::Tensor features = at::randn({s[0], s[1], s[3]}).requires_grad_(true);
  const at::Tensor weight = (at::randn({s[2], s[3]}) * 0.05).requires_grad_(true);
  const at::Tensor targets = at::randint(s[2], {s[0], s[1]}, at::kLong);
  if (!plain && !loss->compute_linear) throw std::runtime_error("no compute_linear");
  warm_up(loss, s[3], !plain);
  reset_peak();
  const int64_t before = status_bytes("VmRSS");
  int64_t count = -1;
  if (plain) {
    keel_tensor* out = nullptr;
    const at::Tensor logits = at::linear(features, weight);
    loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &out, &count);
    keel::adopt(out).backward();
  } else {
    linear_loss(loss, features, weight, targets, &count).backward();
  }
  const int64_t peak = status_bytes("VmHWM");
  return probe::format("{\"logits_bytes\": %lld, \"peak_growth_bytes\": %lld}\n",
                       static_cast<long long>(s[0] * s[1] * s[2] * 4),
                       static_cast<long long>(peak - before));
}

std::string linear_mode(int argc, char** argv) {
  if (argc < 10)
    throw std::runtime_error("usage: lm_losses_probe linear PLUGIN.so COMPONENT FEATURES.bin "
                             "B,T,F WEIGHT.bin V,G TARGETS.bin GRADS.bin [KEY=VALUE]...");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  const std::vector<int64_t> fs = probe::parse_shape(argv[5]);
  const std::vector<int64_t> ws = probe::parse_shape(argv[7]);
  std::vector<char> fb = probe::read_file(argv[4]), wb = probe::read_file(argv[6]),
                    tb = probe::read_file(argv[8]);
  const at::Tensor features = at::from_blob(fb.data(), fs, at::kFloat).clone().requires_grad_(true);
  const at::Tensor weight = at::from_blob(wb.data(), ws, at::kFloat).clone().requires_grad_(true);
  const at::Tensor targets = at::from_blob(tb.data(), {fs[0], fs[1]}, at::kLong).clone();
  auto loss = plugin.create<keel_loss>(argv[3], probe::parse_options(argc, argv, 10));
  int64_t count = -1;
  const at::Tensor l = linear_loss(loss, features, weight, targets, &count);
  double no_grad_loss = 0;
  bool no_grad_requires_grad = true;
  {
    at::NoGradGuard no_grad;
    int64_t again = -1;
    const at::Tensor a = linear_loss(loss, features, weight, targets, &again);
    no_grad_requires_grad = a.requires_grad();
    no_grad_loss = a.item<double>();
  }
  l.backward();
  std::ofstream f(argv[9], std::ios::binary | std::ios::trunc);
  for (const at::Tensor& g : {features.grad().contiguous(), weight.grad().contiguous()})
    f.write(static_cast<const char*>(g.data_ptr()), static_cast<std::streamsize>(g.nbytes()));
  if (!f.flush()) throw std::runtime_error(std::string("cannot write ") + argv[9]);
  return probe::format(
      "{\"loss\": %s, \"count\": %lld, \"requires_grad\": %s, \"no_grad_loss\": %s, "
      "\"no_grad_requires_grad\": %s}\n",
      json(l.item<double>()).c_str(), static_cast<long long>(count),
      l.requires_grad() ? "true" : "false", json(no_grad_loss).c_str(),
      no_grad_requires_grad ? "true" : "false");
}

std::string run(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "count") return count_mode(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "memory") return memory_mode(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "linear") return linear_mode(argc, argv);
  if (argc > 1 && (std::string(argv[1]) == "memory_linear" ||
                   std::string(argv[1]) == "memory_plain"))
    return memory_linear_mode(argc, argv);
  if (argc < 7) throw std::runtime_error("usage: lm_losses_probe PLUGIN.so COMPONENT LOGITS.bin SHAPE TARGETS.bin GRAD.bin [KEY=VALUE]...");
  keel::testing::Plugin plugin(probe::open_plugin(argv[1]));
  const std::string shapes = argv[4];
  const size_t colon = shapes.find(':');
  const std::vector<int64_t> shape = probe::parse_shape(shapes.substr(0, colon));
  const std::vector<int64_t> tshape = colon == std::string::npos
                                          ? std::vector<int64_t>(shape.begin(), shape.end() - 1)
                                          : probe::parse_shape(shapes.substr(colon + 1));
  std::vector<char> lb = probe::read_file(argv[3]), tb = probe::read_file(argv[5]);
  const at::Tensor logits =
      at::from_blob(lb.data(), shape, at::kFloat).clone().requires_grad_(true);
  const at::Tensor targets = at::from_blob(tb.data(), tshape, at::kLong).clone();
  {
    auto loss = plugin.create<keel_loss>(argv[2], probe::parse_options(argc, argv, 7));
    keel_tensor* out = nullptr;
    int64_t count = -1;
    loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &out, &count);
    const at::Tensor l = keel::adopt(out);
    const bool requires_grad = l.requires_grad();
    // The same loss again without grad mode (as in evaluation).
    double no_grad_loss = 0;
    bool no_grad_requires_grad = true;
    {
      at::NoGradGuard no_grad;
      keel_tensor* again = nullptr;
      int64_t again_count = -1;
      loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &again, &again_count);
      const at::Tensor a = keel::adopt(again);
      no_grad_requires_grad = a.requires_grad();
      no_grad_loss = a.item<double>();
    }
    l.backward();
    const int64_t items = loss->count_items ? loss.call(loss->count_items, keel::peek(targets)) : -1;
    const at::Tensor g = logits.grad().contiguous();
    std::ofstream f(argv[6], std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char*>(g.data_ptr()), static_cast<std::streamsize>(g.nbytes()));
    if (!f.flush()) throw std::runtime_error(std::string("cannot write ") + argv[6]);
    const double v = l.item<double>();
    return probe::format(
        "{\"loss\": %s, \"count\": %lld, \"count_items\": %lld, \"requires_grad\": %s, "
        "\"no_grad_loss\": %s, \"no_grad_requires_grad\": %s}\n",
        json(v).c_str(), static_cast<long long>(count), static_cast<long long>(items),
        requires_grad ? "true" : "false", json(no_grad_loss).c_str(),
        no_grad_requires_grad ? "true" : "false");
  }
}

int entry(int argc, char** argv) { return probe::main_guard(run, argc, argv); }

}  // namespace lm_losses_probe
