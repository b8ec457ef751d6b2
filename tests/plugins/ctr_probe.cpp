// Drives the components of the keel-ctr plugin (plugins/ctr) through keel/testing.hpp for
// tests/plugins/test_ctr.py. Files are raw arrays in this machine's byte order in a directory
// DIR that the test owns. Modes:
//
//   ctr_probe bce PLUGIN.so DIR N [M]
//     Loss bce on DIR/logits.bin (float32 [N], requiring grad) and DIR/labels.bin (float32
//     [M], default N): the loss, then its backward; DIR/grad.bin receives d(loss)/d(logits)
//     (float32).
//     stdout: {"loss": .., "count": .., "count_items": .., "no_grad_loss": ..}.
//
//   ctr_probe bce_eval PLUGIN.so DIR N BATCH
//     Two evaluations of loss bce as the kernel runs them (a zeroed state of metric_state_size
//     doubles, metric_update per batch, metric_finish): the first over DIR/scores.bin (float32
//     [N]) and DIR/labels.bin (float32 [N]) in batches of BATCH samples, the second over the
//     first BATCH samples alone. stdout: {"state_size": .., "first": {METRICS}, "second":
//     {METRICS}, "state": [the first evaluation's summed state]}.
#include "keel/testing.hpp"

#include "probe.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace {

std::string json(double x) {
  if (std::isnan(x)) return "NaN";
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", x);
  return text;
}

at::Tensor read_tensor(const std::string& path, std::vector<int64_t> shape, at::ScalarType type) {
  std::vector<char> bytes = probe::read_file(path);
  const at::Tensor t = at::from_blob(bytes.data(), shape, type).clone();
  if (static_cast<size_t>(t.nbytes()) != bytes.size())
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) + " bytes, expected " +
                             std::to_string(t.nbytes()));
  return t;
}

void write_tensor(const std::string& path, const at::Tensor& tensor) {
  const at::Tensor t = tensor.detach().contiguous();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  if (!f.flush()) throw std::runtime_error("cannot write " + path);
}

// ---- bce ----------------------------------------------------------------------------------

std::string bce_mode(int argc, char** argv) {
  if (argc != 5 && argc != 6)
    throw std::runtime_error("usage: ctr_probe bce PLUGIN.so DIR N [M]");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  const std::string dir = argv[3];
  const int64_t n = std::stoll(argv[4]);
  const at::Tensor logits = read_tensor(dir + "/logits.bin", {n}, at::kFloat).requires_grad_(true);
  const int64_t m = argc == 6 ? std::stoll(argv[5]) : n;
  const at::Tensor labels = read_tensor(dir + "/labels.bin", {m}, at::kFloat);
  auto loss = plugin.create<keel_loss>("bce");
  keel_tensor* out = nullptr;
  int64_t count = -1;
  loss.call(loss->compute, keel::peek(logits), keel::peek(labels), &out, &count);
  const at::Tensor l = keel::adopt(out);
  double no_grad_loss = 0;
  {
    at::NoGradGuard no_grad;
    keel_tensor* again = nullptr;
    int64_t again_count = -1;
    loss.call(loss->compute, keel::peek(logits), keel::peek(labels), &again, &again_count);
    no_grad_loss = keel::adopt(again).item<double>();
  }
  l.backward();
  write_tensor(dir + "/grad.bin", logits.grad());
  const int64_t items = loss.call(loss->count_items, keel::peek(labels));
  return probe::format("{\"loss\": %s, \"count\": %lld, \"count_items\": %lld, "
                       "\"no_grad_loss\": %s}\n",
                       json(l.item<double>()).c_str(), static_cast<long long>(count),
                       static_cast<long long>(items), json(no_grad_loss).c_str());
}

// A keel_metric_writer collecting "key": value pairs as JSON members.
struct Writer {
  keel_metric_writer abi{};
  std::string members;
  Writer() {
    abi.struct_size = sizeof abi;
    abi.host_data = this;
    abi.put = [](keel_metric_writer* w, const char* key, double value) -> int {
      auto* self = static_cast<Writer*>(w->host_data);
      self->members += (self->members.empty() ? "" : ", ") + probe::json_string(key) + ": " +
                       json(value);
      return 1;
    };
  }
};

// One evaluation of `loss` over scores/labels in batches of `batch`: returns the metrics as a
// JSON object and leaves the summed state in `state`.
std::string evaluate(const keel::testing::Instance<keel_loss>& loss, const at::Tensor& scores,
                     const at::Tensor& labels, int64_t batch, std::vector<double>& state) {
  std::fill(state.begin(), state.end(), 0.0);  // as the kernel does before an evaluation
  at::NoGradGuard no_grad;
  for (int64_t b = 0; b < scores.size(0); b += batch) {
    const at::Tensor s = scores.slice(0, b, b + batch), y = labels.slice(0, b, b + batch);
    keel_tensor* out = nullptr;
    int64_t count = -1;
    loss.call(loss->compute, keel::peek(s), keel::peek(y), &out, &count);
    const double value = keel::adopt(out).item<double>();
    loss.call(loss->metric_update, keel::peek(s), keel::peek(y), value, count, state.data(),
              state.size());
  }
  Writer w;
  loss.call(loss->metric_finish, static_cast<const double*>(state.data()), state.size(), &w.abi);
  return "{" + w.members + "}";
}

std::string bce_eval_mode(int argc, char** argv) {
  if (argc != 6) throw std::runtime_error("usage: ctr_probe bce_eval PLUGIN.so DIR N BATCH");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  const std::string dir = argv[3];
  const int64_t n = std::stoll(argv[4]), batch = std::stoll(argv[5]);
  const at::Tensor scores = read_tensor(dir + "/scores.bin", {n}, at::kFloat);
  const at::Tensor labels = read_tensor(dir + "/labels.bin", {n}, at::kFloat);
  auto loss = plugin.create<keel_loss>("bce");
  const size_t size = loss.call(loss->metric_state_size);
  std::vector<double> state(size), first_state;
  const std::string first = evaluate(loss, scores, labels, batch, state);
  first_state = state;
  const std::string second =
      evaluate(loss, scores.slice(0, 0, batch), labels.slice(0, 0, batch), batch, state);
  std::string summed;
  for (double v : first_state) summed += (summed.empty() ? "" : ", ") + json(v);
  return probe::format("{\"state_size\": %zu, \"first\": %s, \"second\": %s, \"state\": [%s]}\n",
                       size, first.c_str(), second.c_str(), summed.c_str());
}

std::string run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "bce") return bce_mode(argc, argv);
  if (mode == "bce_eval") return bce_eval_mode(argc, argv);
  throw std::runtime_error("usage: ctr_probe bce|bce_eval ... (see ctr_probe.cpp)");
}

}  // namespace

int main(int argc, char** argv) { return probe::main_guard(run, argc, argv); }
