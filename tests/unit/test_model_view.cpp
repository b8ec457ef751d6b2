// The host's side of keel.hook.model/1 (kernel/run/model_view.cpp), driven through the C structs
// a plain C hook sees: the view's entries, set_eval_weights' refusals (count, shape, dtype, a
// second hook), clearing, and the copy in and back out around an evaluation (ForEvaluation),
// which also refuses weights a hook resized after setting them. Hooks are hand-made keel_hook
// structs whose get_extension offers the extension; whole runs with the `ema` hook are in
// tests/cli (test_pytorch_parity.py, test_resume.py) and tests/sdk/test_sdk_install.sh.
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

#include <cstring>
#include <string>
#include <vector>

#include "components.hpp"
#include "keel/ext/hook_model.h"
#include "keel/tensor.hpp"
#include "run/model_view.hpp"

namespace unit_model_view {

namespace {

// A hook that keeps the view the kernel attaches; `offers` = 0: it offers no extension.
struct FakeHook {
  keel_hook vt{};
  const keel_model_view* view = nullptr;
  int offers = 1;
};

keel_status attach(void* self, const keel_model_view* view, keel_error*) {
  static_cast<FakeHook*>(self)->view = view;
  return KEEL_OK;
}
const keel_hook_model kExtension = {sizeof(keel_hook_model), attach};

const void* get_extension(void* self, const char* id) {
  const bool mine = std::strcmp(id, KEEL_EXT_HOOK_MODEL) == 0;
  return static_cast<FakeHook*>(self)->offers && mine ? &kExtension : nullptr;
}

keel::Instance<keel_hook> instance(FakeHook& h, const std::string& label) {
  h.vt.struct_size = sizeof(keel_hook);
  h.vt.self = &h;
  h.vt.destroy = [](void*) {};
  h.vt.on_event = [](void*, keel_event*, keel_error*) { return KEEL_OK; };
  h.vt.get_extension = get_extension;
  return keel::Instance<keel_hook>(&h.vt, label);
}

// set_eval_weights through the C view: "" on success, else the kernel's message.
std::string set(const keel_model_view* v, const std::vector<at::Tensor>& ts) {
  std::vector<keel_tensor*> handles;
  for (const at::Tensor& t : ts) handles.push_back(keel::peek(t));
  keel_error err;
  err.message[0] = '\0';
  return v->set_eval_weights(v, handles.data(), handles.size(), &err) == KEEL_OK ? ""
                                                                                  : err.message;
}

}  // namespace

TEST_CASE("model view: entries, eval weights' checks, and the copy around an evaluation") {
  // The model: a parameter w [2, 3] and a buffer b [3].
  at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3}).set_requires_grad(true);
  at::Tensor b = at::zeros({3}, at::kFloat);
  const std::vector<keel_named_tensor> state = {{"w", keel::peek(w)}, {"b", keel::peek(b)}};
  keel::ModelViews views(state, {w});

  FakeHook silent, first, second;
  silent.offers = 0;
  auto s = instance(silent, "hook 'silent'");
  auto h1 = instance(first, "hook 'first'");
  auto h2 = instance(second, "hook 'second'");
  views.attach(s, "");
  CHECK(silent.view == nullptr);  // offered nothing: never attached
  views.attach(h1, "");
  views.attach(h2, "");
  REQUIRE(first.view != nullptr);
  const keel_model_view* v = first.view;

  // Entries: names, the model's own handles, parameter or buffer.
  REQUIRE(v->count(v) == 2);
  const char* name = nullptr;
  keel_tensor* t = nullptr;
  int32_t is_param = -1;
  keel_error err;
  REQUIRE(v->entry(v, 0, &name, &t, &is_param, &err) == KEEL_OK);
  CHECK(std::string(name) == "w");
  CHECK(t == keel::peek(w));
  CHECK(is_param == 1);
  REQUIRE(v->entry(v, 1, &name, &t, &is_param, &err) == KEEL_OK);
  CHECK(std::string(name) == "b");
  CHECK(is_param == 0);
  CHECK(v->entry(v, 2, &name, &t, &is_param, &err) == KEEL_ERR);

  // Refusals change nothing.
  at::Tensor ew = at::ones({2, 3}, at::kFloat), eb = at::ones({3}, at::kFloat);
  CHECK(set(v, {ew}) == "set_eval_weights: 1 tensors for the model's 2 entries");
  CHECK(set(v, {ew, at::ones({4}, at::kFloat)}) ==
        "set_eval_weights: entry 1 ('b') is Float [4] on cpu, the model's is Float [3] on cpu");
  CHECK(set(v, {ew.to(at::kDouble), eb}) ==
        "set_eval_weights: entry 0 ('w') is Double [2, 3] on cpu, the model's is Float [2, 3] "
        "on cpu");
  CHECK_FALSE(views.has_eval_weights());

  // Accepted: an evaluation sees them, training's values come back after it; one hook at a time.
  CHECK(set(v, {ew, eb}) == "");
  CHECK(views.has_eval_weights());
  CHECK(set(second.view, {ew, eb}) ==
        "set_eval_weights: hook 'first' set the evaluation's weights already; one hook of a run "
        "at a time may");
  const at::Tensor w0 = w.detach().clone(), b0 = b.clone();
  ew.fill_(7);  // read when the evaluation starts, not when set
  {
    keel::ModelViews::ForEvaluation during(&views);
    CHECK(at::equal(w.detach(), at::full({2, 3}, 7.0f)));
    CHECK(at::equal(b, at::ones({3})));
    during.restore();
    CHECK(at::equal(w.detach(), w0));
    CHECK(at::equal(b, b0));
  }
  CHECK(at::equal(w.detach(), w0));  // restored once
  {
    const keel::ModelViews::ForEvaluation failed(&views);  // an evaluation that threw
  }
  CHECK(at::equal(w.detach(), w0));
  CHECK(at::equal(b, b0));

  // A hook that resized its tensor since: the evaluation is refused, naming it; the model keeps
  // its values.
  eb.resize_({5});
  CHECK_THROWS_WITH([&] { const keel::ModelViews::ForEvaluation during(&views); }(),
                    "hook 'first': its evaluation weights no longer fit the model: entry 1 ('b') "
                    "is Float [5] on cpu, the model's is Float [3] on cpu");
  CHECK(at::equal(w.detach(), w0));

  // Cleared: evaluations use the model's own values, and another hook may set them.
  CHECK(set(v, {}) == "");
  CHECK_FALSE(views.has_eval_weights());
  CHECK(set(second.view, {at::ones({2, 3}), at::ones({3})}) == "");

  // Under shard = "parameters" a hook that offers the extension is refused, naming it.
  FakeHook third;
  auto h3 = instance(third, "hook 'third'");
  CHECK_THROWS_WITH(views.attach(h3, "parameters"),
                    doctest::Contains("hook 'third': reads the model's weights "
                                      "(keel.hook.model/1), which ranks hold only in shards"));
  CHECK(third.view == nullptr);
}

}  // namespace unit_model_view
