// Drives a loss of the losses plugin (plugins/losses) through keel/testing.hpp for
// tests/test_lm_losses.py: computes the loss of given logits and targets, its backward, and
// writes the gradient.
//
// Usage: lm_losses_probe PLUGIN.so COMPONENT LOGITS.bin SHAPE TARGETS.bin GRAD.bin [KEY=VALUE]...
// SHAPE is the logits' shape as comma-separated extents (e.g. 4,16,65), optionally followed by
// ':' and the targets' shape (default: the logits' without its last dimension); LOGITS.bin
// holds float32 values, TARGETS.bin int64 ids, both row-major in this machine's byte order. GRAD.bin receives d(loss)/d(logits) (float32).
// stdout gets one JSON line: {"loss": .., "count": .., "count_items": ..}. KEY=VALUE are the
// loss's options (integer values). Any failure prints its message on stderr and exits 1.
#include "keel/testing.hpp"

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace {

std::vector<char> read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int run(int argc, char** argv) {
  if (argc < 7) throw std::runtime_error("usage: lm_losses_probe PLUGIN.so COMPONENT LOGITS.bin SHAPE TARGETS.bin GRAD.bin [KEY=VALUE]...");
  void* lib = ::dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) throw std::runtime_error(std::string("dlopen: ") + ::dlerror());
  using Entry = const keel_plugin_descriptor* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(lib, "keel_plugin_entry"));
  if (entry == nullptr) throw std::runtime_error("no keel_plugin_entry");
  const std::string shapes = argv[4];
  const auto parse = [](const std::string& text) {
    std::vector<int64_t> out;
    std::stringstream s(text);
    for (std::string e; std::getline(s, e, ',');) out.push_back(std::stoll(e));
    return out;
  };
  const size_t colon = shapes.find(':');
  const std::vector<int64_t> shape = parse(shapes.substr(0, colon));
  const std::vector<int64_t> tshape = colon == std::string::npos
                                          ? std::vector<int64_t>(shape.begin(), shape.end() - 1)
                                          : parse(shapes.substr(colon + 1));
  std::vector<char> lb = read(argv[3]), tb = read(argv[5]);
  const at::Tensor logits =
      at::from_blob(lb.data(), shape, at::kFloat).clone().requires_grad_(true);
  const at::Tensor targets = at::from_blob(tb.data(), tshape, at::kLong).clone();
  keel::testing::Options options;
  for (int i = 7; i < argc; ++i) {
    const std::string a = argv[i];
    options.emplace_back(a.substr(0, a.find('=')), static_cast<int64_t>(std::stoll(a.substr(a.find('=') + 1))));
  }
  keel::testing::Plugin plugin(entry());
  {
    auto loss = plugin.create<keel_loss>(argv[2], options);
    keel_tensor* out = nullptr;
    int64_t count = -1;
    loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &out, &count);
    const at::Tensor l = keel::adopt(out);
    l.backward();
    const int64_t items = loss->count_items ? loss.call(loss->count_items, keel::peek(targets)) : -1;
    const at::Tensor g = logits.grad().contiguous();
    std::ofstream f(argv[6], std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char*>(g.data_ptr()), static_cast<std::streamsize>(g.nbytes()));
    if (!f.flush()) throw std::runtime_error(std::string("cannot write ") + argv[6]);
    const double v = l.item<double>();
    char value[64];
    std::snprintf(value, sizeof(value), "%.17g", v);
    std::printf("{\"loss\": %s, \"count\": %lld, \"count_items\": %lld}\n",
                std::isnan(v) ? "NaN" : value, static_cast<long long>(count),
                static_cast<long long>(items));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
