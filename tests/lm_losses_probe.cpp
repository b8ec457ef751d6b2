// Drives a loss of the losses plugin (plugins/losses) through keel/testing.hpp for
// tests/test_lm_losses.py. Three modes:
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
//     /proc/self/clear_refs just before the loss) minus its resident set at that moment.
//
// KEY=VALUE are the loss's options (integer values). Any failure prints its message on stderr
// and exits 1.
#include "keel/testing.hpp"

#include "probe.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace {

// A "Vm...:  N kB" line of /proc/self/status, in bytes.
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  throw std::runtime_error("no " + key + " in /proc/self/status");
}

int count_mode(int argc, char** argv) {
  if (argc < 5) throw std::runtime_error("usage: lm_losses_probe count PLUGIN.so COMPONENT SHAPE [KEY=VALUE]...");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  auto loss = plugin.create<keel_loss>(argv[3], probe::parse_options(argc, argv, 5));
  const at::Tensor target = at::empty(probe::parse_shape(argv[4]), at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  if (!loss->count_items) throw std::runtime_error("no count_items");
  const int64_t items = loss.call(loss->count_items, keel::peek(target));
  std::printf("{\"count_items\": %lld}\n", static_cast<long long>(items));
  return 0;
}

int memory_mode(int argc, char** argv) {
  if (argc < 5) throw std::runtime_error("usage: lm_losses_probe memory PLUGIN.so COMPONENT B,T,V [KEY=VALUE]...");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  auto loss = plugin.create<keel_loss>(argv[3], probe::parse_options(argc, argv, 5));
  const std::vector<int64_t> shape = probe::parse_shape(argv[4]);
  at::manual_seed(0);
  const at::Tensor logits = at::randn(shape).requires_grad_(true);
  const at::Tensor targets = at::randint(shape[2], {shape[0], shape[1]}, at::kLong);
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // resets VmHWM to the current resident set
    if (!clear.flush()) throw std::runtime_error("cannot reset the peak RSS (/proc/self/clear_refs)");
  }
  const int64_t before = status_bytes("VmRSS");
  keel_tensor* out = nullptr;
  int64_t count = -1;
  loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &out, &count);
  keel::adopt(out).backward();
  const int64_t peak = status_bytes("VmHWM");
  std::printf("{\"logits_bytes\": %lld, \"peak_growth_bytes\": %lld}\n",
              static_cast<long long>(logits.nbytes()), static_cast<long long>(peak - before));
  return 0;
}

int run(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "count") return count_mode(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "memory") return memory_mode(argc, argv);
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
    const auto json = [](double x) {
      char text[64];
      std::snprintf(text, sizeof(text), "%.17g", x);
      return std::isnan(x) ? std::string("NaN") : std::string(text);
    };
    std::printf("{\"loss\": %s, \"count\": %lld, \"count_items\": %lld, \"requires_grad\": %s, "
                "\"no_grad_loss\": %s, \"no_grad_requires_grad\": %s}\n",
                json(v).c_str(), static_cast<long long>(count), static_cast<long long>(items),
                requires_grad ? "true" : "false", json(no_grad_loss).c_str(),
                no_grad_requires_grad ? "true" : "false");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return probe::main_guard(run, argc, argv); }
