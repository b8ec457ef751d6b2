// keel::testing: unit-test a plugin's components without the kernel.
//
// A test hands the harness the plugin's own descriptor (link the plugin's object files into the
// test and call its keel_plugin_entry(), as projects written by `keel plugins new` do), creates
// a component by kind and name with a few options, calls its slots and checks what comes back:
//
//   #include "keel/testing.hpp"  // before doctest.h: a LibTorch built with glog (Debian's is)
//                                // defines CHECK macros that would silently replace doctest's
//   #define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
//   #include <doctest/doctest.h>
//   extern "C" const keel_plugin_descriptor* keel_plugin_entry(void);  // the plugin under test
//
//   keel::testing::Plugin plugin(keel_plugin_entry());
//   auto scheduler = plugin.create<keel_lr_scheduler>("halving", {{"every", 10}});
//   CHECK(scheduler.call(scheduler->factor, 25) == 0.25);
//
// The harness's option checks and host are the kernel's own: libkeel-host, a static library the
// SDK installs and keel links too (link a test with pkg-config keel-testing; a plugin itself
// links only keel-sdk). So:
//  - options: the ones given are checked against the component's schema as `keel train` checks
//    a manifest section [Setup::section] (known key, type, bounds, finite floats, choices), and
//    every other option takes its schema default; a required option left out, or a schema
//    whose default is invalid, is an error, with keel's message. A relative PATH option is made
//    absolute against the working directory.
//  - the host (keel_host) works on at::Tensor: a keel_tensor* is an at::TensorImpl*, so
//    keel::borrow/adopt/peek (keel/tensor.hpp) convert handles both ways. Log lines are kept
//    (log_lines()) instead of printed.
//  - LibTorch's default CPU generator is seeded with Setup::seed before each factory runs.
//  - every failure (a factory or slot returning KEEL_ERR, a slot calling
//    keel_host.report_error, a bad option) throws std::runtime_error naming the component.
// What it leaves out: the kernel's checks of what a component returns (batch shapes, a loss's
// dtype, parameter names, ...), parameter groups (the context has none, so an optimizer sees
// one group), device placement, threads, and the ABI-version negotiation with older plugins.
// So a component that passes here must still pass the kernel's own checks in `keel train`.
// Of LibTorch, this header includes <ATen/core/Tensor.h> and <ATen/Context.h> alone: a test
// includes the <ATen/ops/NAME.h> of each function it calls (<ATen/TensorOperators.h> for a * b).
#pragma once

#include <ATen/Context.h>  // at::manual_seed
#include <ATen/core/Tensor.h>
#include <stdlib.h>  // mkdtemp

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "keel/abi.h"
#include "keel/ext/batch.h"
#include "keel/step.h"
#include "keel/tensor.hpp"

namespace keel::testing {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// An option value as a test writes it: {"lr", 0.1}, {"every", 10}, {"name", "x"},
// {"sizes", std::vector<int64_t>{4, 2}} (each constructor is implicit for that). An integer is
// accepted for a float option.
class Value {
 public:
  using Storage = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>>;
  Value(bool v) : v_(v) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Value(T v) : v_(static_cast<int64_t>(v)) {}
  Value(double v) : v_(v) {}
  Value(const char* v) : v_(std::string(v)) {}
  Value(std::string v) : v_(std::move(v)) {}
  Value(std::vector<int64_t> v) : v_(std::move(v)) {}
  Value(std::vector<double> v) : v_(std::move(v)) {}
  const Storage& storage() const { return v_; }

 private:
  Storage v_;
};
using Options = std::vector<std::pair<std::string, Value>>;

// The create context's fields a test may set.
struct Setup {
  std::string section = "test";  // the manifest section, as messages name it
  uint64_t seed = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string run_dir;  // "": a fresh temporary directory, removed with the instance
  int64_t total_steps = 0;
  int64_t resume_step = 0;
  NamedTensors params;  // optimizer, grad_clipper: the model's parameters (borrowed)
};

// The lines components logged through keel_host.log, as "LEVEL [origin] message".
std::vector<std::string> log_lines();
void clear_log_lines();

namespace detail {

[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error(message); }

inline const char* kind_name(keel_kind kind) {
  static const char* const names[] = {"?",            "model",    "dataset",      "optimizer",
                                      "lr_scheduler", "loss",     "grad_clipper", "mfu",
                                      "profiler",     "checkpoint", "hook", "sparse_optimizer",
                                      "step"};
  return kind >= KEEL_KIND_MODEL && kind <= KEEL_KIND_STEP ? names[kind] : names[0];
}

// The given options checked against the component's schema by keel's own option checks
// (libkeel-host, which the kernel links too: a keel_options as `keel train` builds one for the
// manifest section [`section`]), every other option at its schema default; throws keel::Error
// (a std::runtime_error) on the first problem, as `keel train` reports it.
std::shared_ptr<const keel_options> check_options(const keel_component_desc& c,
                                                  const Options& given,
                                                  const std::string& section);
// The keel_host of the components a test creates (log lines kept: log_lines()).
const keel_host* host();
// What a slot passed to keel_host.report_error since the last call, and clears it ("": none).
std::string take_reported_error();

// ---- instances ------------------------------------------------------------------------------
template <class Abi>
struct KindOf;
#define KEEL_TESTING_KIND(STRUCT, KIND) \
  template <>                          \
  struct KindOf<STRUCT> {              \
    static constexpr keel_kind value = KIND; \
  }
KEEL_TESTING_KIND(keel_model, KEEL_KIND_MODEL);
KEEL_TESTING_KIND(keel_dataset, KEEL_KIND_DATASET);
KEEL_TESTING_KIND(keel_optimizer, KEEL_KIND_OPTIMIZER);
KEEL_TESTING_KIND(keel_lr_scheduler, KEEL_KIND_LR_SCHEDULER);
KEEL_TESTING_KIND(keel_loss, KEEL_KIND_LOSS);
KEEL_TESTING_KIND(keel_grad_clipper, KEEL_KIND_GRAD_CLIPPER);
KEEL_TESTING_KIND(keel_mfu, KEEL_KIND_MFU);
KEEL_TESTING_KIND(keel_profiler, KEEL_KIND_PROFILER);
KEEL_TESTING_KIND(keel_checkpoint, KEEL_KIND_CHECKPOINT);
KEEL_TESTING_KIND(keel_hook, KEEL_KIND_HOOK);
KEEL_TESTING_KIND(keel_step, KEEL_KIND_STEP);
#undef KEEL_TESTING_KIND

// What an instance's create context points to, kept for the instance's life.
struct Keep {
  std::shared_ptr<const keel_options> options;
  std::string section, run_dir;
  bool own_run_dir = false;
  NamedTensors params;
  std::vector<keel_tensor*> param_handles;
  std::vector<const char*> param_names;
  ~Keep() {
    std::error_code ec;
    if (own_run_dir) std::filesystem::remove_all(run_dir, ec);
  }
};

inline std::string temporary_directory() {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string pattern = (base / "keel-testing-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    fail("cannot create a temporary run directory under " + base.string() + ": " +
         std::strerror(errno));
  return pattern;
}

}  // namespace detail

// One component instance (Abi: keel_loss, keel_hook, ...); destroyed with this object.
template <class Abi>
class Instance {
 public:
  Instance(Abi* vt, std::shared_ptr<detail::Keep> keep, std::string where)
      : vt_(vt), keep_(std::move(keep)), where_(std::move(where)) {}
  Instance(Instance&& other) noexcept
      : vt_(std::exchange(other.vt_, nullptr)),
        keep_(std::move(other.keep_)),
        where_(std::move(other.where_)) {}
  Instance& operator=(Instance&&) = delete;
  Instance(const Instance&) = delete;
  ~Instance() {
    if (vt_ != nullptr) vt_->destroy(vt_->self);
  }

  // The C struct: its slots, e.g. `loss->compute`.
  Abi* operator->() const { return vt_; }
  Abi& operator*() const { return *vt_; }
  // The run directory the component was created with.
  const std::string& run_dir() const { return keep_->run_dir; }
  // "loss 'my_loss' (plugin my-losses)", as error messages name the component.
  const std::string& name() const { return where_; }

  // Calls a slot that reports failure through keel_error (pass every argument but `self` and
  // the keel_error): throws std::runtime_error with the component's message on KEEL_ERR.
  template <class... P, class... A>
  void call(keel_status (*slot)(void*, P...), A&&... args) const {
    static_assert(sizeof...(A) + 1 == sizeof...(P), "pass every argument but self and err");
    if (slot == nullptr) detail::fail(where_ + ": this optional slot is not provided (NULL)");
    keel_error err;
    err.message[0] = '\0';
    if (slot(vt_->self, std::forward<A>(args)..., &err) != KEEL_OK) {
      err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
      detail::fail(where_ + ": " + (err.message[0] ? err.message : "failed without a message"));
    }
  }
  // Calls any other slot (pass every argument but `self`) and returns its result; throws when
  // the slot reported an error through keel_host.report_error.
  template <class R, class... P, class... A>
  R call(R (*slot)(void*, P...), A&&... args) const {
    if (slot == nullptr) detail::fail(where_ + ": this optional slot is not provided (NULL)");
    detail::take_reported_error();  // drop a report left over from elsewhere
    if constexpr (std::is_void_v<R>) {
      slot(vt_->self, std::forward<A>(args)...);
      const std::string message = detail::take_reported_error();
      if (!message.empty()) detail::fail(where_ + ": " + message);
    } else {
      R result = slot(vt_->self, std::forward<A>(args)...);
      const std::string message = detail::take_reported_error();
      if (!message.empty()) detail::fail(where_ + ": " + message);
      return result;
    }
  }

 private:
  Abi* vt_;
  std::shared_ptr<detail::Keep> keep_;
  std::string where_;
};

// keel_named_tensor entries borrowing `tensors` (which must outlive this object), for the
// checkpoint and state_load slots.
class NamedHandles {
 public:
  explicit NamedHandles(const NamedTensors& tensors) {
    for (const auto& [name, tensor] : tensors) entries_.push_back({name.c_str(), peek(tensor)});
  }
  const keel_named_tensor* data() const { return entries_.data(); }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<keel_named_tensor> entries_;
};

// A keel_tensor_set lending `tensors` (which must outlive it): a batch or a model's outputs
// for the slots of <keel/ext/batch.h> and <keel/step.h> (keel/tensor.hpp's TensorSetView).
using TensorSet = keel::TensorSetView;

// A model's forward through its keel.model.batch/1 (<keel/ext/batch.h>): the outputs it puts
// for `batch`, in order. Throws when the model offers no such extension, refuses an output or
// fails.
inline NamedTensors forward_batch(const Instance<keel_model>& model, const NamedTensors& batch) {
  const auto* ext = model->get_extension
                        ? static_cast<const keel_model_batch*>(
                              model->get_extension(model->self, KEEL_EXT_MODEL_BATCH))
                        : nullptr;
  if (ext == nullptr) detail::fail(model.name() + ": offers no " KEEL_EXT_MODEL_BATCH);
  struct Out {
    keel_tensor_writer abi;
    NamedTensors tensors;
  } out{};
  out.abi.struct_size = sizeof out.abi;
  out.abi.host_data = &out;
  out.abi.put = [](keel_tensor_writer* w, const char* name, keel_tensor* t) -> int {
    auto* o = static_cast<Out*>(w->host_data);
    if (name == nullptr || *name == '\0' || t == nullptr) return 0;
    for (const auto& e : o->tensors)
      if (e.first == name) return 0;
    o->tensors.emplace_back(name, borrow(t));
    return 1;
  };
  const TensorSet in(batch);
  model.call(ext->forward, in.abi(), &out.abi);
  return out.tensors;
}

// The models a step's compute runs in a test (keel/step.h): each name ("model", or the NAME of
// a [models.NAME]) maps to a function from the batch to the model's named outputs. Pass abi()
// to compute; the outputs stay alive as long as this object. A name without a function fails
// the forward, as the kernel's does for a model the run lacks.
//
//   keel::testing::StepModels models;
//   models.add("model", [&](const auto& batch) { return NamedTensors{{"logits", ...}}; });
//   keel_tensor* loss = nullptr;
//   step.call(step->compute, models.abi(), keel::testing::TensorSet(batch).abi(), &loss);
class StepModels {
 public:
  using Forward = std::function<NamedTensors(const NamedTensors& batch)>;
  StepModels() {
    abi_.struct_size = sizeof abi_;
    abi_.host_data = this;
    abi_.forward = &forward;
  }
  StepModels(const StepModels&) = delete;
  StepModels& operator=(const StepModels&) = delete;
  void add(const std::string& name, Forward f) { models_[name] = std::move(f); }
  keel_step_services* abi() { return &abi_; }
  // The models' forward calls so far, by name, in order.
  const std::vector<std::string>& calls() const { return calls_; }

 private:
  struct Lent {
    NamedTensors outputs;
    std::unique_ptr<TensorSet> set;
  };
  static keel_status forward(keel_step_services* s, const char* model,
                             const keel_tensor_set* batch, const keel_tensor_set** outputs,
                             keel_error* err) noexcept {
    try {
      auto* self = static_cast<StepModels*>(s->host_data);
      const auto it = self->models_.find(model ? model : "");
      if (it == self->models_.end())
        throw std::runtime_error(std::string("forward: no model '") + (model ? model : "") +
                                 "' in this test");
      self->calls_.push_back(it->first);
      Lent& lent = self->lent_.emplace_back();
      lent.outputs = it->second(keel::to_named(batch));
      lent.set = std::make_unique<TensorSet>(lent.outputs);
      *outputs = lent.set->abi();
      return KEEL_OK;
    } catch (const std::exception& e) {
      std::strncpy(err->message, e.what(), KEEL_ERROR_CAPACITY - 1);
      err->message[KEEL_ERROR_CAPACITY - 1] = '\0';
      return KEEL_ERR;
    }
  }
  keel_step_services abi_{};
  std::map<std::string, Forward> models_;
  std::deque<Lent> lent_;
  std::vector<std::string> calls_;
};

// Calls a component's state_save slot (models, datasets, optimizers; abi.h "Component state
// for exact resume") and returns copies of the entries it put, as a checkpoint holds them.
template <class Abi>
NamedTensors save_state(const Instance<Abi>& c) {
  NamedTensors out;
  keel_state_writer writer{};
  writer.struct_size = sizeof writer;
  writer.host_data = &out;
  writer.put = [](keel_state_writer* w, const char* name, keel_tensor* t) -> int {
    auto* entries = static_cast<NamedTensors*>(w->host_data);
    if (name == nullptr || *name == '\0' || t == nullptr) return 0;
    for (const auto& e : *entries)
      if (e.first == name) return 0;
    entries->emplace_back(name, borrow(t).detach().to(at::kCPU).clone());
    return 1;
  };
  c.call(c->state_save, &writer);
  return out;
}

// Calls a component's state_load slot with `state` (as save_state returned it).
template <class Abi>
void load_state(const Instance<Abi>& c, const NamedTensors& state) {
  const NamedHandles handles(state);
  c.call(c->state_load, handles.data(), handles.size());
}

// A plugin, from its descriptor (the value of its keel_plugin_entry()).
class Plugin {
 public:
  explicit Plugin(const keel_plugin_descriptor* descriptor) : d_(descriptor) {
    if (d_ == nullptr) detail::fail("keel_plugin_entry() returned NULL");
    if (d_->abi_major != KEEL_ABI_MAJOR || d_->abi_minor > KEEL_ABI_MINOR)
      detail::fail("the plugin declares ABI " + std::to_string(d_->abi_major) + "." +
                   std::to_string(d_->abi_minor) + ", this SDK speaks " +
                   std::to_string(KEEL_ABI_MAJOR) + "." + std::to_string(KEEL_ABI_MINOR));
    if (d_->components == nullptr || d_->component_size < sizeof(keel_component_desc))
      detail::fail("the plugin's descriptor has no components array of keel_component_desc");
  }
  const keel_plugin_descriptor& descriptor() const { return *d_; }

  // The component of `kind` named `name`; throws naming the plugin's components otherwise.
  const keel_component_desc& component(keel_kind kind, const std::string& name) const {
    std::string all;
    const char* p = reinterpret_cast<const char*>(d_->components);
    for (uint32_t i = 0; i < d_->component_count; ++i) {
      const auto& c =
          *reinterpret_cast<const keel_component_desc*>(p + size_t(i) * d_->component_size);
      if (c.kind == kind && c.name != nullptr && name == c.name) return c;
      all += (all.empty() ? "" : ", ") + std::string(detail::kind_name(c.kind)) + " " +
             (c.name ? c.name : "?");
    }
    detail::fail(std::string("plugin ") + d_->name + " has no " + detail::kind_name(kind) +
                 " named '" + name + "' (it has: " + (all.empty() ? "none" : all) + ")");
  }

  // Creates the component of Abi's kind named `name` with `options` (the others take their
  // schema defaults) and the context fields of `setup`.
  template <class Abi>
  Instance<Abi> create(const std::string& name, const Options& options = {},
                       const Setup& setup = {}) const {
    const keel_kind kind = detail::KindOf<Abi>::value;
    const keel_component_desc& c = component(kind, name);
    const std::string where = std::string(detail::kind_name(kind)) + " '" + name + "' (plugin " +
                              d_->name + ")";
    auto keep = std::make_shared<detail::Keep>();
    try {
      keep->options = detail::check_options(c, options, setup.section);
    } catch (const std::exception& e) {
      detail::fail(where + ": " + e.what());
    }
    keep->section = setup.section;
    keep->run_dir = setup.run_dir;
    if (keep->run_dir.empty()) {
      keep->run_dir = detail::temporary_directory();
      keep->own_run_dir = true;
    }
    keep->params = setup.params;
    for (const auto& [pname, tensor] : keep->params) {
      keep->param_handles.push_back(peek(tensor));
      keep->param_names.push_back(pname.c_str());
    }

    keel_create_context ctx{};
    ctx.struct_size = sizeof ctx;
    ctx.host = detail::host();
    ctx.options = keep->options.get();
    ctx.section = keep->section.c_str();
    ctx.seed = setup.seed;
    ctx.rank = setup.rank;
    ctx.world_size = setup.world_size;
    ctx.run_dir = keep->run_dir.c_str();
    ctx.params = keep->param_handles.data();
    ctx.param_names = keep->param_names.data();
    ctx.param_count = keep->param_handles.size();
    ctx.total_steps = setup.total_steps;
    ctx.resume_step = setup.resume_step;

    at::manual_seed(setup.seed);
    keel_error err;
    err.message[0] = '\0';
    void* out = nullptr;
    if (c.create(&ctx, &out, &err) != KEEL_OK) {
      err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
      detail::fail(where + ": " + (err.message[0] ? err.message : "failed without a message"));
    }
    auto* vt = static_cast<Abi*>(out);
    if (vt == nullptr) detail::fail(where + ": the factory returned KEEL_OK and no instance");
    if (vt->struct_size < sizeof(Abi) || vt->destroy == nullptr)
      detail::fail(where + ": the instance's struct_size is " + std::to_string(vt->struct_size) +
                   ", smaller than this SDK's struct (" + std::to_string(sizeof(Abi)) +
                   "), or it has no destroy slot");
    return Instance<Abi>(vt, std::move(keep), where);
  }

 private:
  const keel_plugin_descriptor* d_;
};

}  // namespace keel::testing
