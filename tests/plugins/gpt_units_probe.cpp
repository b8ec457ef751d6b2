// The gpt plugin's model units (ABI 1.8, abi.h "Model units") through its C slots, with a fake
// keel_unit_calls that records every call, as the kernel's would be called:
//
//   gpt_units_probe PLUGIN.so
//
// Checks, for a gpt of 3 blocks (width 16, context 8): param_unit gives block N's parameters
// (transformer.h.N.*) unit N and every other parameter -1 (the root); before set_unit_calls
// forward calls nothing; after it, forward and forward_features (training mode, under
// autograd) call enter(0), leave(0), enter(1), leave(1), enter(2), leave(2) in that order, each
// leave with one output: the block's output [B, T, 16], a tensor of the autograd graph; an
// enter that fails makes forward fail with its message. Prints what it saw and "ok", or the
// first mismatch on stderr with exit status 1.
#include "keel/testing.hpp"

#include <ATen/ops/randint.h>

#include "probe.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace gpt_units_probe {

struct Recorder {
  keel_unit_calls calls{};
  std::vector<std::string> seen;
  bool fail_enter = false;
};

keel_status enter(const keel_unit_calls* c, int32_t unit, keel_error* err) {
  auto* r = static_cast<Recorder*>(c->host_data);
  r->seen.push_back("enter " + std::to_string(unit));
  if (!r->fail_enter) return KEEL_OK;
  std::snprintf(err->message, KEEL_ERROR_CAPACITY, "the ranks could not agree (test)");
  return KEEL_ERR;
}

keel_status leave(const keel_unit_calls* c, int32_t unit, keel_tensor* const* outputs,
                  size_t count, keel_error*) {
  auto* r = static_cast<Recorder*>(c->host_data);
  std::string s = "leave " + std::to_string(unit) + " x" + std::to_string(count);
  for (size_t i = 0; i < count; ++i) {
    const at::Tensor t = keel::borrow(outputs[i]);
    s += " [";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
    s += t.requires_grad() && t.grad_fn() ? "] graph" : "] no-graph";
  }
  r->seen.push_back(s);
  return KEEL_OK;
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : "; ") + s;
  return out;
}

void run(const char* path) {
  keel::testing::Plugin plugin(probe::open_plugin(path));
  keel::testing::Setup setup;
  keel::testing::Options options = {{"vocab_size", int64_t{16}}, {"context", int64_t{8}},
                                    {"layers", int64_t{3}},      {"heads", int64_t{2}},
                                    {"width", int64_t{16}}};
  auto model = plugin.create<keel_model>("gpt", options, setup);
  expect(KEEL_HAS_FIELD(&*model, keel_model, set_unit_calls) && model->param_unit &&
             model->set_unit_calls,
         "gpt offers no param_unit / set_unit_calls");
  const size_t n = model.call(model->param_count);
  for (size_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    keel_tensor* t = nullptr;
    model.call(model->param, i, &name, &t);
    const std::string s = name;
    const int32_t unit = model.call(model->param_unit, i);
    const std::string h = "transformer.h.";
    const int32_t want = s.compare(0, h.size(), h) == 0 ? std::stoi(s.substr(h.size())) : -1;
    expect(unit == want, s + ": param_unit " + std::to_string(unit) + ", expected " +
                             std::to_string(want));
  }
  Recorder r;
  r.calls.struct_size = sizeof(r.calls);
  r.calls.host_data = &r;
  r.calls.enter = &enter;
  r.calls.leave = &leave;
  const at::Tensor tokens = at::randint(16, {2, 8}, at::kLong);
  model.call(model->set_training, 1);
  keel_tensor* out = nullptr;
  model.call(model->forward, keel::peek(tokens), &out);
  keel::adopt(out);
  expect(r.seen.empty(), "calls before set_unit_calls: " + joined(r.seen));
  model.call(model->set_unit_calls, static_cast<const keel_unit_calls*>(&r.calls));
  std::vector<std::string> want;
  for (int u = 0; u < 3; ++u) {
    want.push_back("enter " + std::to_string(u));
    want.push_back("leave " + std::to_string(u) + " x1 [2,8,16] graph");
  }
  model.call(model->forward, keel::peek(tokens), &out);
  keel::adopt(out);
  std::printf("forward: %s\n", joined(r.seen).c_str());
  expect(r.seen == want, "forward called " + joined(r.seen) + "; expected " + joined(want));
  r.seen.clear();
  keel_tensor* features = nullptr;
  keel_tensor* weight = nullptr;
  model.call(model->forward_features, keel::peek(tokens), &features, &weight);
  keel::adopt(features);
  keel::adopt(weight);
  std::printf("forward_features: %s\n", joined(r.seen).c_str());
  expect(r.seen == want, "forward_features called " + joined(r.seen));
  r.fail_enter = true;
  keel_error err{};
  const keel_status st = model->forward(model->self, keel::peek(tokens), &out, &err);
  std::printf("a failing enter: %s\n", err.message);
  expect(st == KEEL_ERR && std::strstr(err.message, "the ranks could not agree (test)"),
         "a failing enter did not fail forward with its message: " + std::string(err.message));
}

int entry(int argc, char** argv) {
  try {
    if (argc != 2) throw std::runtime_error("usage: gpt_units_probe PLUGIN.so");
    run(argv[1]);
    std::printf("ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_units_probe: %s\n", e.what());
    return 1;
  }
}

}  // namespace gpt_units_probe
