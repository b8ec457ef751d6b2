// Drives the gpt model of the gpt plugin (plugins/gpt) through keel/testing.hpp for
// tests/plugins/test_gpt.py:
//
//   gpt_probe PLUGIN.so SEED train|eval TOKENS.bin B,T OUT.safetensors [--threads N]
//             [--perturb STD] [--load WEIGHTS.bin] [KEY=VALUE]...
//
// With --threads, sets LibTorch's intra-op thread count to N first (else it is what the
// process has: OMP_NUM_THREADS sets it at start-up, an earlier case of a batch may have changed
// it). Creates the model with the options KEY=VALUE ("true"/"false": a bool, a value with '.': a
// float, else an integer) and seed SEED; with --perturb, adds noise ~ N(0, STD) to every
// parameter in place (drawn after the model's initialisation, so from the same seeded
// generator), so that a comparison does not rest on the initial values alone (LayerNorms at 1
// and 0, small weights). With --load, it then overwrites every parameter with WEIGHTS.bin: the
// float32 values of each distinct parameter (a tied one once, at its first name), in the
// model's parameter order, back to back, and nothing else (tests/cli/test_export.py writes it
// from a checkpoint's model.safetensors). Then it switches the model to training or evaluation
// mode and runs it on int64 token ids [B, T] (the first B*T int64 values of TOKENS.bin; the
// next B*T are the targets), then the mean cross-entropy of the logits against the targets
// and its backward.
// OUT.safetensors receives, as float32, "param/NAME" (each parameter's values before the
// backward), "grad/NAME" (its gradient; absent when it has none) and "logits" ([B, T, vocab]).
// stdout gets one JSON line: {"params": [names in the model's order], "same_as": [for each
// parameter, the index of the first earlier one that is the same tensor (same TensorImpl), or
// -1], "state": [names], "flops_per_sample": .., "loss": .., "graph": {NODE: COUNT}, "threads": N}, where
// "graph" counts the autograd nodes behind the logits whose names contain "CausalAttention"
// (the plugin's fused attention), "SoftmaxBackward" (LibTorch's softmax, the reference
// attention), "AddmmBackward" (a Linear layer with a bias run as one addmm, as PyTorch's
// F.linear runs it on a contiguous [B, T, in] input), "SplitLinear" (a Linear layer or the
// output layer run by the plugin's split_linear, with or without a bias), "FusedGelu" (the
// plugin's GELU) or "GeluBackward" (LibTorch's gelu), and N is LibTorch's intra-op thread count
// the case ran with. Any failure prints its message on stderr and exits 1. `gpt_probe --batch`
// runs many cases (tests/plugins/probe.hpp).
#include "keel/testing.hpp"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn_like.h>
#include <torch/csrc/autograd/function.h>

#include "probe.hpp"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

namespace gpt_probe {

std::string json_number(double x) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", x);
  return text;
}

// Writes float32 tensors as a safetensors file (8-byte little-endian header length, JSON
// header, data).
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::string header = "{";
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor t = tensor.detach().to(at::kFloat).contiguous();
    std::string shape;
    for (const int64_t e : t.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(e);
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    header += (data.empty() ? "\"" : ",\"") + name + "\":{\"dtype\":\"F32\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
    data.push_back(t);
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint64_t n = header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const at::Tensor& t : data)
    f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  if (!f.flush()) throw std::runtime_error("cannot write " + path);
}

// How many distinct autograd nodes reachable from `root` have a name containing each of `keys`.
std::string count_nodes(const at::Tensor& root, const std::vector<std::string>& keys) {
  std::vector<int64_t> counts(keys.size(), 0);
  std::vector<torch::autograd::Node*> stack{root.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    const std::string name = node->name();
    for (size_t k = 0; k < keys.size(); ++k)
      if (name.find(keys[k]) != std::string::npos) ++counts[k];
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
  std::string out = "{";
  for (size_t k = 0; k < keys.size(); ++k)
    out += (k ? ", \"" : "\"") + keys[k] + "\": " + std::to_string(counts[k]);
  return out + "}";
}

// --load: WEIGHTS.bin's float32 values into each distinct parameter of `params`, in order.
void load_weights(const std::string& path,
                  const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::vector<char> bytes = probe::read_file(path);
  size_t offset = 0;
  std::set<const void*> done;
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    if (!done.insert(p.unsafeGetTensorImpl()).second) continue;  // tied: loaded once
    const size_t n = static_cast<size_t>(p.numel()) * sizeof(float);
    if (offset + n > bytes.size())
      throw std::runtime_error(path + " ends before parameter " + name);
    p.copy_(at::from_blob(bytes.data() + offset, p.sizes(), at::kFloat));
    offset += n;
  }
  if (offset != bytes.size())
    throw std::runtime_error(path + " holds " + std::to_string(bytes.size() - offset) +
                             " bytes more than the parameters");
}

std::string run(int argc, char** argv) {
  if (argc < 7)
    throw std::runtime_error(
        "usage: gpt_probe PLUGIN.so SEED train|eval TOKENS.bin B,T OUT.safetensors "
        "[--threads N] [--perturb STD] [--load WEIGHTS.bin] [KEY=VALUE]...");
  keel::testing::Plugin plugin(probe::open_plugin(argv[1]));
  keel::testing::Setup setup;
  setup.seed = std::stoull(argv[2]);
  const std::string mode = argv[3];
  const std::vector<int64_t> shape = probe::parse_shape(argv[5]);
  std::vector<char> tb = probe::read_file(argv[4]);
  const at::Tensor all = at::from_blob(tb.data(), {2, shape[0], shape[1]}, at::kLong).clone();
  const at::Tensor tokens = all[0], targets = all[1];

  double perturb = 0;
  int first_option = 7;
  if (argc > first_option + 1 && std::string(argv[first_option]) == "--threads") {
    at::set_num_threads(std::stoi(argv[first_option + 1]));
    first_option += 2;
  }
  if (argc > first_option + 1 && std::string(argv[first_option]) == "--perturb") {
    perturb = std::stod(argv[first_option + 1]);
    first_option += 2;
  }
  std::string load;
  if (argc > first_option + 1 && std::string(argv[first_option]) == "--load") {
    load = argv[first_option + 1];
    first_option += 2;
  }
  auto model = plugin.create<keel_model>("gpt", probe::parse_options(argc, argv, first_option), setup);
  const size_t np = model.call(model->param_count);
  std::vector<std::pair<std::string, at::Tensor>> params, out;
  std::string names, same_as;
  for (size_t i = 0; i < np; ++i) {
    const char* name = nullptr;
    keel_tensor* t = nullptr;
    model.call(model->param, i, &name, &t);
    const at::Tensor p = keel::borrow(t);
    int64_t first = -1;
    for (size_t j = 0; j < params.size() && first < 0; ++j)
      if (params[j].second.unsafeGetTensorImpl() == p.unsafeGetTensorImpl())
        first = static_cast<int64_t>(j);
    if (perturb > 0 && first < 0) {
      at::NoGradGuard no_grad;
      p.add_(at::randn_like(p) * perturb);
    }
    names += std::string(i ? "," : "") + "\"" + name + "\"";
    same_as += std::string(i ? "," : "") + std::to_string(first);
    params.emplace_back(name, p);
    out.emplace_back(std::string("param/") + name, p.detach().clone());
  }
  if (!load.empty()) {
    load_weights(load, params);
    for (size_t i = 0; i < params.size(); ++i) out[i].second = params[i].second.detach().clone();
  }
  std::string state;
  const size_t ns = model.call(model->state_count);
  for (size_t i = 0; i < ns; ++i) {
    const char* name = nullptr;
    keel_tensor* t = nullptr;
    model.call(model->state, i, &name, &t);
    state += std::string(i ? "," : "") + "\"" + name + "\"";
  }
  const double flops = model.call(model->flops_per_sample);

  model.call(model->set_training, mode == "train" ? 1 : 0);
  keel_tensor* o = nullptr;
  model.call(model->forward, keel::peek(tokens), &o);
  const at::Tensor logits = keel::adopt(o);
  const std::string graph =
      count_nodes(logits, {"CausalAttention", "SoftmaxBackward", "AddmmBackward", "SplitLinear",
                           "FusedGelu", "GeluBackward"});
  const at::Tensor loss =
      at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  loss.backward();
  for (const auto& [name, p] : params)
    if (p.grad().defined()) out.emplace_back("grad/" + name, p.grad());
  out.emplace_back("logits", logits);
  write_safetensors(argv[6], out);
  return probe::format(
      "{\"params\": [%s], \"same_as\": [%s], \"state\": [%s], \"flops_per_sample\": %s, "
      "\"loss\": %s, \"graph\": %s, \"threads\": %d}\n",
      names.c_str(), same_as.c_str(), state.c_str(), json_number(flops).c_str(),
      json_number(loss.item<double>()).c_str(), graph.c_str(), at::get_num_threads());
}

int entry(int argc, char** argv) { return probe::main_guard(run, argc, argv); }

}  // namespace gpt_probe
