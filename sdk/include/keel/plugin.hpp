// The C++ layer of the keel plugin SDK.
//
// A C++ plugin derives from one of the component base classes below (keel::Model,
// keel::Dataset, ...), gives it a constructor taking `const keel::Context&`, lists its
// components with keel::component<T>(...) and exports them with KEEL_PLUGIN(...):
//
//   class Constant : public keel::LrScheduler {
//    public:
//     explicit Constant(const keel::Context&) {}
//     double factor(int64_t) override { return 1.0; }
//   };
//   static const keel_component_desc kComponents[] = {
//       keel::component<Constant>("constant", "lr stays at its base value"),
//   };
//   KEEL_PLUGIN("my-schedulers", "1.0.0", "What this library offers", kComponents)
//
// Everything the kernel calls goes through trampolines that catch every exception and turn it
// into KEEL_ERR plus a message, so no exception crosses the C boundary. Slots without an error
// channel (set_training, zero_grad, set_lr, profiler marks, factor, ...) report an exception
// through keel_host.report_error (ABI 1.2; the kernel then ends the run naming the component),
// or, with an older kernel, log it through the host.
#pragma once

#include <torch/version.h>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "keel/abi.h"
#include "keel/ext/batch.h"
#include "keel/ext/hook_model.h"
#include "keel/ext/hook_observe.h"
#include "keel/schema.hpp"
#include "keel/step.h"
#include "keel/tensor.hpp"

namespace keel {

// The tensor `name` of a batch or of a model's outputs (keel/ext/batch.h; keel::find in
// keel/tensor.hpp: a pointer, or nullptr); throws std::runtime_error naming it and the names
// there are when `set` has none of that name.
inline const at::Tensor& need(const NamedTensors& set, const std::string& name) {
  if (const at::Tensor* t = find(set, name)) return *t;
  throw std::runtime_error("no tensor '" + name + "' (there are: " + names_of(set) + ")");
}

// ---------------------------------------------------------------------------------------------
// Shards (ABI 1.7, abi.h "Sharded parameters"): whether an optimizer's or clipper's parameters
// are this rank's shards, and the all-reduce that combines a whole-parameter value (a norm)
// over the ranks. Copyable; valid for the component's life.
// ---------------------------------------------------------------------------------------------
class Shards {
 public:
  explicit Shards(const keel_shard_group* group = nullptr) : group_(group) {}
  // True when the parameters are shards (false: whole parameters, also from a kernel < 1.7).
  bool active() const { return group_ != nullptr; }
  // Each value becomes its sum (max) over the ranks, the same on every rank; does nothing when
  // not active. A collective: every rank calls it equally often with as many values, only from
  // inside step / clip. Throws std::runtime_error with the kernel's message on failure.
  void sum(std::vector<double>& values) const { reduce(values, KEEL_REDUCE_SUM); }
  void max(std::vector<double>& values) const { reduce(values, KEEL_REDUCE_MAX); }

 private:
  void reduce(std::vector<double>& values, keel_reduce_op op) const {
    if (!group_) return;
    keel_error err;
    err.message[0] = '\0';
    if (group_->all_reduce(group_, values.data(), values.size(), op, &err) != KEEL_OK) {
      err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
      throw std::runtime_error(err.message[0] ? err.message : "all_reduce over the shards failed");
    }
  }
  const keel_shard_group* group_;
};

// ---------------------------------------------------------------------------------------------
// Context: what a constructor receives (options, seed, run directory, parameters).
// ---------------------------------------------------------------------------------------------
class Context {
 public:
  explicit Context(const keel_create_context* raw) : raw_(raw) {}

  const keel_create_context& raw() const { return *raw_; }
  const keel_host& host() const { return *raw_->host; }
  std::string section() const { return raw_->section ? raw_->section : ""; }
  uint64_t seed() const { return raw_->seed; }
  int rank() const { return raw_->rank; }
  int world_size() const { return raw_->world_size; }
  std::string run_dir() const { return raw_->run_dir ? raw_->run_dir : ""; }
  int64_t total_steps() const { return raw_->total_steps; }
  // The step a resumed run continues from (0: a fresh run, or a kernel older than ABI 1.3).
  int64_t resume_step() const {
    return KEEL_HAS_FIELD(raw_, keel_create_context, resume_step) ? raw_->resume_step : 0;
  }

  // Option values (the kernel validated them and filled in defaults). get(option) reads an
  // option declared with keel::opt_int and the others (schema.hpp) as the type it declares.
  template <class T>
  T get(const Option<T>& option) const {
    if constexpr (std::is_same_v<T, bool>) return get_bool(option.key);
    else if constexpr (std::is_same_v<T, int64_t>) return get_int(option.key);
    else if constexpr (std::is_same_v<T, double>) return get_float(option.key);
    else if constexpr (std::is_same_v<T, std::string>) return get_string(option.key);
    else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return get_int_list(option.key);
    else return get_float_list(option.key);
  }
  // By name, as the schema entry spells the key.
  bool get_bool(const char* key) const {
    int v = 0;
    if (!host().option_bool(raw_->options, key, &v)) missing(key, "bool");
    return v != 0;
  }
  int64_t get_int(const char* key) const {
    int64_t v = 0;
    if (!host().option_int(raw_->options, key, &v)) missing(key, "int");
    return v;
  }
  double get_float(const char* key) const {
    double v = 0;
    if (!host().option_float(raw_->options, key, &v)) missing(key, "float");
    return v;
  }
  std::string get_string(const char* key) const {
    const char* v = host().option_string(raw_->options, key);
    if (v == nullptr) missing(key, "string");
    return v;
  }
  std::vector<int64_t> get_int_list(const char* key) const {
    const int64_t n = host().option_list_size(raw_->options, key);
    if (n < 0) missing(key, "int list");
    std::vector<int64_t> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host().option_list_int(raw_->options, key, i, &out[i]);
    return out;
  }
  std::vector<double> get_float_list(const char* key) const {
    const int64_t n = host().option_list_size(raw_->options, key);
    if (n < 0) missing(key, "float list");
    std::vector<double> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host().option_list_float(raw_->options, key, i, &out[i]);
    return out;
  }

  // Optimizer and grad_clipper: whether params() are shards of the parameters (ABI 1.7).
  Shards shards() const {
    return Shards(KEEL_HAS_FIELD(raw_, keel_create_context, shards) ? raw_->shards : nullptr);
  }

  // The model's trainable parameters (optimizer and grad_clipper components); with shards()
  // active, this rank's rows of each (abi.h "Sharded parameters").
  std::vector<at::Tensor> params() const {
    std::vector<at::Tensor> out;
    out.reserve(raw_->param_count);
    for (size_t i = 0; i < raw_->param_count; ++i) out.push_back(borrow(raw_->params[i]));
    return out;
  }
  // Parameter groups (optimizers): the group of each parameter, and each group's overrides
  // (NaN: keep the optimizer's own value). One group when the kernel or manifest has none.
  std::vector<int> param_groups() const {
    std::vector<int> out(raw_->param_count, 0);
    if (KEEL_HAS_FIELD(raw_, keel_create_context, group_weight_decay) && raw_->param_group)
      for (size_t i = 0; i < raw_->param_count; ++i) out[i] = raw_->param_group[i];
    return out;
  }
  size_t group_count() const {
    if (KEEL_HAS_FIELD(raw_, keel_create_context, group_weight_decay) && raw_->group_count > 0)
      return raw_->group_count;
    return 1;
  }
  double group_lr(size_t g) const { return group_value(raw_->group_lr, g); }
  double group_weight_decay(size_t g) const { return group_value(raw_->group_weight_decay, g); }

  // (ABI 1.9) The run's ranks, for components that exchange data themselves (abi.h
  // "Collectives for components"); nullptr from a kernel older than 1.9.
  const keel_comm* comm() const {
    return KEEL_HAS_FIELD(raw_, keel_create_context, comm) ? raw_->comm : nullptr;
  }
  // (ABI 1.11) The run's device for this rank, where the kernel puts the model's parameters and
  // the batches; the CPU from a kernel older than 1.11.
  at::Device device() const {
    if (KEEL_HAS_FIELD(raw_, keel_create_context, device) && raw_->device)
      return at::Device(std::string(raw_->device));
    return at::Device(at::kCPU);
  }
  // (ABI 1.9) sparse_optimizer: the model's embedding tables (abi.h "Sparse embedding tables").
  std::vector<const keel_sparse_table*> tables() const {
    std::vector<const keel_sparse_table*> out;
    if (KEEL_HAS_FIELD(raw_, keel_create_context, table_count) && raw_->tables)
      out.assign(raw_->tables, raw_->tables + raw_->table_count);
    return out;
  }

  std::vector<std::string> param_names() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < raw_->param_count; ++i) out.emplace_back(raw_->param_names[i]);
    return out;
  }

  void log(keel_log_level level, const std::string& message) const {
    host().log(level, raw_->section ? raw_->section : "plugin", message.c_str());
  }

 private:
  double group_value(const double* values, size_t g) const {
    if (!KEEL_HAS_FIELD(raw_, keel_create_context, group_weight_decay) || !values ||
        g >= raw_->group_count)
      return std::numeric_limits<double>::quiet_NaN();
    return values[g];
  }
  [[noreturn]] static void missing(const char* key, const char* type) {
    throw std::runtime_error(std::string("option '") + key + "' is not declared as " + type +
                             " in this component's schema");
  }
  const keel_create_context* raw_;
};

// Logs through the host, prefixed with the component's manifest section (under keel, a hook's is
// shown as its label, else its type, when no other hook of the run has that label) or another
// origin.
// Keep one as a member to log after construction.
class Logger {
 public:
  explicit Logger(const Context& ctx) : host_(&ctx.host()), origin_(ctx.section()) {}
  // With an origin of the component's own choosing ("": lines without a prefix).
  Logger(const Context& ctx, std::string origin) : host_(&ctx.host()), origin_(std::move(origin)) {}
  void operator()(keel_log_level level, const std::string& message) const {
    host_->log(level, origin_.c_str(), message.c_str());
  }

 private:
  const keel_host* host_;
  std::string origin_;
};

// Whether the run has been asked to stop (keel_host.stop_requested, ABI 1.10; always false with
// an older kernel). A dataset that waits in next() for data that has not arrived polls it (every
// 10 to 100 ms) and, once it holds, throws keel::StoppedWhileWaiting. Keep one as a member; it
// may be called from any thread.
class StopRequest {
 public:
  explicit StopRequest(const Context& ctx) : host_(&ctx.host()) {}
  bool operator()() const {
    return KEEL_HAS_FIELD(host_, keel_host, stop_requested) && host_->stop_requested &&
           host_->stop_requested() != 0;
  }

 private:
  const keel_host* host_;
};

// Thrown by Dataset::next while it waits for data, once StopRequest holds: the kernel gets
// *has_batch = KEEL_BATCH_STOPPED (ABI 1.10): no batch, and the dataset's position (what
// state_save saves) stays after the last batch next returned.
struct StoppedWhileWaiting {};

// ---------------------------------------------------------------------------------------------
// Component base classes. Each maps one-to-one onto the C struct of its kind in abi.h.
// ---------------------------------------------------------------------------------------------

// A model's units (abi.h "Model units", ABI 1.8): call enter(u) right before the computation
// of unit u and leave(u, outputs) right after it, in forward and forward_features, every time
// the unit runs. Both do nothing until the kernel gives its calls (only with [distributed]
// shard = "parameters" on several ranks, and only to a model that overrides
// Model::param_unit); then enter returns once the unit's parameters hold their whole values,
// and leave hooks the outputs (so that backward gathers the parameters again) and frees them.
// Errors (the ranks could not agree) are thrown as std::runtime_error, which the SDK's slot
// turns into KEEL_ERR.
class Units {
 public:
  // True once the kernel gave its calls.
  bool active() const { return calls_ != nullptr; }
  void enter(int unit) {
    if (!calls_) return;
    keel_error err{};
    if (calls_->enter(calls_, static_cast<int32_t>(unit), &err) != KEEL_OK)
      throw std::runtime_error(message(err, "enter", unit));
  }
  // `outputs`: every tensor computed inside the unit that is used outside it.
  void leave(int unit, const std::vector<at::Tensor>& outputs) {
    if (!calls_) return;
    std::vector<keel_tensor*> handles;
    for (const at::Tensor& t : outputs) handles.push_back(peek(t));
    keel_error err{};
    if (calls_->leave(calls_, static_cast<int32_t>(unit), handles.data(), handles.size(),
                      &err) != KEEL_OK)
      throw std::runtime_error(message(err, "leave", unit));
  }
  // One output: returns it, for `x = units().leave(i, block(x));`.
  at::Tensor leave(int unit, const at::Tensor& output) {
    leave(unit, std::vector<at::Tensor>{output});
    return output;
  }
  // The SDK's set_unit_calls slot gives the kernel's calls here (valid for the instance's life).
  void attach(const keel_unit_calls* calls) { calls_ = calls; }

 private:
  static std::string message(const keel_error& err, const char* call, int unit) {
    const std::string m(err.message, strnlen(err.message, KEEL_ERROR_CAPACITY));
    return m.empty() ? std::string("unit ") + std::to_string(unit) + ": " + call + " failed" : m;
  }
  const keel_unit_calls* calls_ = nullptr;
};

class Model {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_MODEL;
  virtual ~Model() = default;
  // The output for `input` (a batch's "inputs"). Override it, or forward_batch: then this
  // default gives forward_batch({{"inputs", input}})'s "logits" (for a kernel that predates
  // keel.model.batch/1).
  virtual at::Tensor forward(const at::Tensor& input) {
    return need(forward_batch({{"inputs", input}}), "logits");
  }
  // Optional (keel/ext/batch.h, keel.model.batch/1): the outputs for a batch of named tensors,
  // "logits" (first dimension the batch) and any others. Override it to offer the extension;
  // the kernel then calls it instead of forward.
  virtual NamedTensors forward_batch(const NamedTensors& /*batch*/) {
    throw std::logic_error("the model overrides neither forward nor forward_batch");
  }
  virtual void set_training(bool /*training*/) {}
  // Called once after construction; the tensors must stay the ones the model trains.
  virtual NamedTensors named_parameters() = 0;
  // Parameters and buffers, for checkpoints (called once after construction).
  virtual NamedTensors named_state() { return named_parameters(); }
  virtual double flops_per_sample() { return 0.0; }
  // State beyond named_state() for exact resume (a generator the model keeps itself); see
  // "Component state for exact resume" in abi.h. Override both to offer the slots.
  virtual NamedTensors state_save() { return {}; }
  virtual void state_load(const NamedTensors& /*state*/) {}
  // Optional (abi.h, keel_model.forward_features, ABI 1.5): forward's output as features and
  // an output-layer weight, output = features @ weight^T, so that a loss with compute_linear
  // never builds the whole output. Override it to offer the slot.
  struct Features {
    at::Tensor features;  // [batch, ..., F]
    at::Tensor weight;    // [V, F], the parameter itself
  };
  virtual Features forward_features(const at::Tensor& /*input*/) { return {}; }
  // Optional (abi.h, keel_model.export_state, ABI 1.7): the weights under the names and in the
  // layouts of a Hugging Face `transformers` model, and that model's config.json ("" for
  // none), for `keel export`. Called once, after a checkpoint's weights were loaded into
  // named_state()'s tensors. Override it to offer the slot.
  struct Export {
    NamedTensors tensors;     // name -> tensor (keel export writes floating-point ones as float32)
    std::string config_json;  // the text of config.json, "" for none
  };
  virtual Export export_state() { return {}; }
  // Optional (abi.h, keel_model.param_unit, ABI 1.8): the unit of the parameter named `name`
  // (as named_parameters() names it), 0 <= unit < KEEL_MAX_UNITS, or -1 for the root (used
  // outside every unit; a tied weight belongs to the root). Override it to offer units; then
  // call units().enter/leave around each unit in forward and forward_features.
  virtual int param_unit(const std::string& /*name*/) { return -1; }
  // The kernel's calls around units (no-ops unless the run shards parameters).
  Units& units() { return units_; }
  // Optional (abi.h, keel_model.table_count/table, ABI 1.9): the model's sparse embedding tables
  // (keel::EmbeddingTable::abi() gives one), valid for the model's life; called once after
  // construction. Override it to offer the slots.
  virtual std::vector<const keel_sparse_table*> tables() { return {}; }

 private:
  Units units_;
};

struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
  int64_t samples = 0;
  int64_t tokens = 0;
};

// A batch of named tensors (keel/ext/batch.h), each with the batch as its first dimension.
struct NamedBatch {
  NamedTensors tensors;
  int64_t samples = 0;
  int64_t tokens = 0;
};

class Dataset {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_DATASET;
  virtual ~Dataset() = default;
  virtual int64_t size() = 0;
  virtual int64_t batches_per_epoch() = 0;
  virtual void start_epoch(int64_t epoch) = 0;
  // Returns false at the end of the epoch. (ABI 1.10) Throws StoppedWhileWaiting instead of
  // waiting on for data once a StopRequest holds. Override it, or next_batch: then this default
  // gives next_batch's "inputs" and "targets" (for a kernel that predates
  // keel.dataset.batch/1).
  virtual bool next(Batch& out) {
    NamedBatch b;
    if (!next_batch(b)) return false;
    out.inputs = need(b.tensors, "inputs");
    out.targets = need(b.tensors, "targets");
    out.samples = b.samples;
    out.tokens = b.tokens;
    return true;
  }
  // Optional (keel/ext/batch.h, keel.dataset.batch/1): next with the batch as named tensors.
  // Override it to offer the extension; the kernel then calls it instead of next.
  virtual bool next_batch(NamedBatch& /*out*/) {
    throw std::logic_error("the dataset overrides neither next nor next_batch");
  }
  // Optional (abi.h, keel_dataset.seek): where start_epoch(epoch) and `batch` calls of next
  // would leave the dataset. Override it to offer the slot; without it a resumed run replays
  // the batches.
  virtual void seek(int64_t /*epoch*/, int64_t /*batch*/) {}
  // Optional (abi.h, keel_dataset.tokens_per_sample, ABI 1.4): tokens in every sample, so that
  // train.max_tokens plans the run's length; override it to offer the slot.
  virtual int64_t tokens_per_sample() { return 0; }
  // State the data position does not capture; override both to offer the slots.
  virtual NamedTensors state_save() { return {}; }
  virtual void state_load(const NamedTensors& /*state*/) {}
};

class Optimizer {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_OPTIMIZER;
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  virtual void zero_grad() = 0;
  virtual size_t group_count() = 0;
  virtual double get_lr(size_t group) = 0;
  virtual void set_lr(size_t group, double lr) = 0;
  // Every state tensor and each group's hyper-parameters, for `keel train --resume`; override
  // both to offer the slots (without them --resume refuses the optimizer).
  virtual NamedTensors state_save() { return {}; }
  virtual void state_load(const NamedTensors& /*state*/) {}
};

// (ABI 1.9) Updates the touched rows of the model's embedding tables (Context::tables()); the
// constructor reserves each row's optimizer state with the table's reserve_slots.
class SparseOptimizer {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_SPARSE_OPTIMIZER;
  virtual ~SparseOptimizer() = default;
  virtual void step() = 0;
  virtual double get_lr() = 0;
  virtual void set_lr(double lr) = 0;
  // State beyond the rows' slots; override both to offer the slots.
  virtual NamedTensors state_save() { return {}; }
  virtual void state_load(const NamedTensors& /*state*/) {}
};

class LrScheduler {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_LR_SCHEDULER;
  virtual ~LrScheduler() = default;
  virtual double factor(int64_t step) = 0;
};

// The state of a loss's evaluation metrics in metric_update (abi.h, "Evaluation metrics of a
// loss"): `size()` doubles, this rank's sums over the evaluation's batches so far.
class MetricState {
 public:
  MetricState(double* values, size_t size) : values_(values), size_(size) {}
  double& operator[](size_t i) const { return values_[i]; }
  size_t size() const { return size_; }
  double* begin() const { return values_; }
  double* end() const { return values_ + size_; }

 private:
  double* values_;
  size_t size_;
};

// The metrics metric_finish reports: (key, value), in the order of the record.
using Metrics = std::vector<std::pair<std::string, double>>;

class Loss {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_LOSS;
  virtual ~Loss() = default;
  // Mean loss; *count receives the number of items it averages over. Override it, or
  // compute_batch: then this default gives compute_batch({{"logits", output}},
  // {{"targets", target}}) (for a kernel that predates keel.loss.batch/1).
  virtual at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) {
    return compute_batch({{"logits", output}}, {{"targets", target}}, count);
  }
  // Optional (keel/ext/batch.h, keel.loss.batch/1): the mean loss of the model's named outputs
  // for a batch of named tensors. Override it to offer the extension; the kernel then calls it
  // instead of compute, and count_items_batch (or, when only it is overridden, count_items with
  // the batch's "targets") instead of count_items, and metric_update_batch when it is
  // overridden (else metric_update with "logits" and "targets").
  virtual at::Tensor compute_batch(const NamedTensors& /*outputs*/, const NamedTensors& /*batch*/,
                                   int64_t* /*count*/) {
    throw std::logic_error("the loss overrides neither compute nor compute_batch");
  }
  // With compute_batch, optional: count_items for a named batch (override it to report counts).
  virtual int64_t count_items_batch(const NamedTensors& /*batch*/) { return -1; }
  // With compute_batch, optional: metric_update for named outputs and batch (override it, with
  // metric_state_size and metric_finish, instead of metric_update).
  virtual void metric_update_batch(const NamedTensors& /*outputs*/, const NamedTensors& /*batch*/,
                                   double /*loss*/, int64_t /*count*/, MetricState /*state*/) {}
  // Items compute() will average over for `target` (-1: not reported; then gradient
  // accumulation scales each micro-batch by 1/k instead of by its share of the items).
  // Override it (or count_items_batch) to offer item-normalised accumulation; a loss that
  // overrides neither leaves keel_loss.count_items NULL.
  virtual int64_t count_items(const at::Tensor& target) {
    return count_items_batch({{"targets", target}});
  }
  // Optional (abi.h, keel_loss.compute_linear, ABI 1.5): compute()'s loss for the output
  // features @ weight^T, without building that output whole. Override it to offer the slot.
  virtual at::Tensor compute_linear(const at::Tensor& /*features*/, const at::Tensor& /*weight*/,
                                    const at::Tensor& /*target*/, int64_t* /*count*/) {
    return {};
  }
  // Optional (abi.h, "Evaluation metrics of a loss", ABI 1.6): the task's metrics in every
  // evaluation record (accuracy, bits per token, AUC). Override all three to offer the slots:
  //   metric_state_size  doubles of sufficient statistics (0: none), fixed after construction;
  //   metric_update      adds one evaluation batch (the model's output, the targets, and the
  //                      mean loss and item count compute gave them) into `state`: sums only,
  //                      since the kernel adds the ranks' states up elementwise;
  //   metric_finish      the metrics of the state summed over the batches and ranks, in record
  //                      order; leave out a metric the data could not define.
  virtual size_t metric_state_size() { return 0; }
  virtual void metric_update(const at::Tensor& output, const at::Tensor& target, double loss,
                             int64_t count, MetricState state) {
    metric_update_batch({{"logits", output}}, {{"targets", target}}, loss, count, state);
  }
  virtual Metrics metric_finish(const std::vector<double>& /*state*/) { return {}; }
};

class GradClipper {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_GRAD_CLIPPER;
  virtual ~GradClipper() = default;
  // Returns the global norm of the gradients before clipping (L2 unless configured otherwise).
  virtual double clip() = 0;
};

class Mfu {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_MFU;
  virtual ~Mfu() = default;
  virtual double compute(double flops_per_sample, double samples_per_second) = 0;
  // Optional (abi.h, keel_mfu.peak_flops, ABI 1.4): the peak FLOP/s compute divides by;
  // override it to offer the slot.
  virtual double peak_flops() { return 0.0; }
};

class Profiler {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_PROFILER;
  virtual ~Profiler() = default;
  virtual void begin(const char* phase, int64_t step) = 0;
  virtual void end(const char* phase, int64_t step) = 0;
  virtual void flush() = 0;
};

class Checkpoint {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_CHECKPOINT;
  virtual ~Checkpoint() = default;
  virtual void save(const std::string& dir, const std::string& stem,
                    const NamedTensors& tensors) = 0;
  // Copies stored values into `into` (same names and shapes).
  virtual void load(const std::string& dir, const std::string& stem, const NamedTensors& into) = 0;
};

// A hook's view of the model (extension keel.hook.model/1, <keel/ext/hook_model.h>): the
// model's parameters and buffers, and the weights evaluations run with. Copyable; valid for the
// hook's life.
class ModelView {
 public:
  struct Entry {
    std::string name;
    at::Tensor tensor;  // the model's own tensor: read it, never write it
    bool is_parameter;  // false: a buffer
  };
  ModelView() = default;
  explicit ModelView(const keel_model_view* view) : view_(view) {
    keel_error err;
    for (size_t i = 0, n = view->count(view); i < n; ++i) {
      const char* name = nullptr;
      keel_tensor* tensor = nullptr;
      int32_t is_parameter = 0;
      err.message[0] = '\0';
      if (view->entry(view, i, &name, &tensor, &is_parameter, &err) != KEEL_OK)
        throw std::runtime_error(err.message);
      entries_.push_back({name, borrow(tensor), is_parameter != 0});
    }
  }
  const std::vector<Entry>& entries() const { return entries_; }
  // Evaluations run with `weights` (one per entry, each like it) from now on, read when each
  // starts; an empty vector: with the model's own values again. Throws std::runtime_error with
  // the kernel's message on a mismatch.
  void set_eval_weights(const std::vector<at::Tensor>& weights) const {
    std::vector<keel_tensor*> handles;
    for (const at::Tensor& w : weights) handles.push_back(peek(w));
    keel_error err;
    err.message[0] = '\0';
    if (view_->set_eval_weights(view_, handles.data(), handles.size(), &err) != KEEL_OK)
      throw std::runtime_error(err.message);
  }

 private:
  const keel_model_view* view_ = nullptr;
  std::vector<Entry> entries_;
};

class Hook {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_HOOK;
  virtual ~Hook() = default;
  virtual void on_event(keel_event& event) = 0;
  // Tensors saved with checkpoints and loaded back in place (called once after construction,
  // and again after attach_model).
  virtual NamedTensors named_state() { return {}; }
  // Override to see the model (ABI 1.12, extension keel.hook.model/1): called once at setup,
  // before named_state is read again and before any event. Not under [distributed] shard =
  // "parameters" (the kernel refuses such a hook there).
  virtual void attach_model(ModelView model) { (void)model; }
  // Override any of these three to see the run's data (ABI 1.12, extension keel.hook.observe/1,
  // <keel/ext/hook_observe.h>). Tensors are lent for the call: clone what you keep (a reference
  // kept past the call ends the run).
  // Each training micro-batch (every tensor of it: "inputs" and "targets" from a 1.x dataset),
  // right after its AFTER_DATA event.
  virtual void on_batch(int64_t micro_batch, const NamedTensors& batch) {
    (void)micro_batch;
    (void)batch;
  }
  // Each evaluation batch of set `split`, with the model's outputs for it ("logits" and any
  // others) and the batch's mean loss ("loss").
  virtual void on_eval_batch(const std::string& split, const NamedTensors& batch,
                             const NamedTensors& outputs) {
    (void)split;
    (void)batch;
    (void)outputs;
  }
  // Scalars added to the METRICS record of `split` ("train" or a set's name) about to be sent.
  virtual std::vector<std::pair<std::string, double>> metrics(const std::string& split) {
    (void)split;
    return {};
  }
};

// The models a step may run during its compute (ABI 1.13, <keel/step.h>).
class StepModels {
 public:
  explicit StepModels(keel_step_services* services) : services_(services) {}
  // Model `model`'s named outputs for `batch`: "model" is the trained [model] (outputs under
  // autograd), any other name a frozen [models.NAME] (outputs without autograd). Throws
  // std::runtime_error with the kernel's message (naming the model) when it fails.
  NamedTensors forward(const std::string& model, const NamedTensors& batch) {
    const TensorSetView set(batch);
    const keel_tensor_set* outputs = nullptr;
    keel_error err;
    err.message[0] = '\0';
    if (services_->forward(services_, model.c_str(), set.abi(), &outputs, &err) != KEEL_OK)
      throw std::runtime_error(err.message);
    return to_named(outputs);
  }

 private:
  keel_step_services* services_;
};

class Step {
 public:
  static constexpr keel_kind kKind = KEEL_KIND_STEP;
  virtual ~Step() = default;
  // The loss of one training micro-batch `batch` (every tensor the dataset gave: "inputs" and
  // "targets" from a 1.x dataset): a 0-dim tensor with autograd through [model]'s parameters,
  // the mean over the batch's items. The kernel runs backward on it.
  virtual at::Tensor compute(StepModels& models, const NamedTensors& batch) = 0;
};

// ---------------------------------------------------------------------------------------------
// Trampolines (implementation detail).
// ---------------------------------------------------------------------------------------------
namespace detail {

inline void set_error(keel_error* err, const char* message) {
  if (err == nullptr) return;
  std::strncpy(err->message, message, KEEL_ERROR_CAPACITY - 1);
  err->message[KEEL_ERROR_CAPACITY - 1] = '\0';
}

template <class F>
keel_status guard(keel_error* err, F&& body) noexcept {
  try {
    body();
    return KEEL_OK;
  } catch (const c10::Error& e) {
    set_error(err, e.what_without_backtrace());
  } catch (const std::exception& e) {
    set_error(err, e.what());
  } catch (...) {
    set_error(err, "unknown exception");
  }
  return KEEL_ERR;
}

// Instance box: the C struct handed to the kernel plus the C++ object behind it.
template <class Base, class Abi>
struct Box {
  Abi vt{};
  std::unique_ptr<Base> obj;
  const keel_host* host = nullptr;
  std::string origin;
  NamedTensors params, state;  // models and hooks: cached so names and handles stay valid
  std::vector<const keel_sparse_table*> tables;  // models: cached likewise

  static Box* of(void* self) { return static_cast<Box*>(self); }
  // For slots without an error channel: report through keel_host.report_error (ABI 1.2; the
  // kernel then ends the run), else log.
  template <class F>
  static void quiet(void* self, F&& body) noexcept {
    keel_error err;
    err.message[0] = '\0';
    if (guard(&err, body) != KEEL_OK) {
      Box* b = of(self);
      if (KEEL_HAS_FIELD(b->host, keel_host, report_error) && b->host->report_error)
        b->host->report_error(err.message);
      else
        b->host->log(KEEL_LOG_ERROR, b->origin.c_str(), err.message);
    }
  }
  static void destroy(void* self) noexcept { delete of(self); }
};

template <class Base>
struct Abi;
#define KEEL_SDK_ABI(BASE, STRUCT) \
  template <>                      \
  struct Abi<BASE> {               \
    using type = STRUCT;           \
  }
KEEL_SDK_ABI(Model, keel_model);
KEEL_SDK_ABI(Dataset, keel_dataset);
KEEL_SDK_ABI(Optimizer, keel_optimizer);
KEEL_SDK_ABI(SparseOptimizer, keel_sparse_optimizer);
KEEL_SDK_ABI(LrScheduler, keel_lr_scheduler);
KEEL_SDK_ABI(Loss, keel_loss);
KEEL_SDK_ABI(GradClipper, keel_grad_clipper);
KEEL_SDK_ABI(Mfu, keel_mfu);
KEEL_SDK_ABI(Profiler, keel_profiler);
KEEL_SDK_ABI(Checkpoint, keel_checkpoint);
KEEL_SDK_ABI(Hook, keel_hook);
KEEL_SDK_ABI(Step, keel_step);
#undef KEEL_SDK_ABI

inline NamedTensors to_named(const keel_named_tensor* t, size_t n) {
  NamedTensors out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.emplace_back(t[i].name, borrow(t[i].tensor));
  return out;
}

template <class B>
using BoxOf = Box<B, typename Abi<B>::type>;

// state_save / state_load (ABI 1.3) of models, datasets and optimizers.
template <class X>
void fill_state(X& b) {
  b.vt.state_save = [](void* s, keel_state_writer* w, keel_error* e) noexcept {
    return guard(e, [&] {
      for (const auto& [name, tensor] : X::of(s)->obj->state_save())
        if (!w->put(w, name.c_str(), peek(tensor)))
          throw std::runtime_error("the host refused state entry '" + name + "'");
    });
  };
  b.vt.state_load = [](void* s, const keel_named_tensor* t, size_t n, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->state_load(to_named(t, n)); });
  };
}

// True when T overrides Base's member M (the member pointer's class is no longer Base).
#define KEEL_SDK_OVERRIDES(T, Base, M) \
  (!std::is_same<decltype(&T::M), decltype(&Base::M)>::value)

inline void fill(BoxOf<Model>& b) {
  using X = BoxOf<Model>;
  b.params = b.obj->named_parameters();
  b.state = b.obj->named_state();
  b.vt.forward = [](void* s, keel_tensor* in, keel_tensor** out, keel_error* e) noexcept {
    return guard(e, [&] { *out = give(X::of(s)->obj->forward(borrow(in))); });
  };
  b.vt.set_training = [](void* s, int t) noexcept {
    X::quiet(s, [&] { X::of(s)->obj->set_training(t != 0); });
  };
  b.vt.param_count = [](void* s) noexcept { return X::of(s)->params.size(); };
  b.vt.param = [](void* s, size_t i, const char** name, keel_tensor** t, keel_error* e) noexcept {
    return guard(e, [&] {
      const auto& p = X::of(s)->params.at(i);
      *name = p.first.c_str();
      *t = peek(p.second);
    });
  };
  b.vt.state_count = [](void* s) noexcept { return X::of(s)->state.size(); };
  b.vt.state = [](void* s, size_t i, const char** name, keel_tensor** t, keel_error* e) noexcept {
    return guard(e, [&] {
      const auto& p = X::of(s)->state.at(i);
      *name = p.first.c_str();
      *t = peek(p.second);
    });
  };
  b.vt.flops_per_sample = [](void* s) noexcept {
    double v = std::numeric_limits<double>::quiet_NaN();
    X::quiet(s, [&] { v = X::of(s)->obj->flops_per_sample(); });
    return v;
  };
  b.vt.forward_features = [](void* s, keel_tensor* in, keel_tensor** features, keel_tensor** weight,
                             keel_error* e) noexcept {
    return guard(e, [&] {
      Model::Features f = X::of(s)->obj->forward_features(borrow(in));
      *features = give(std::move(f.features));
      *weight = give(std::move(f.weight));
    });
  };
  b.vt.export_state = [](void* s, keel_state_writer* w, char* config, size_t capacity,
                         keel_error* e) noexcept {
    return guard(e, [&] {
      const Model::Export x = X::of(s)->obj->export_state();
      if (!x.config_json.empty() && x.config_json.size() >= capacity)
        throw std::runtime_error("config.json is " + std::to_string(x.config_json.size()) +
                                 " bytes; the host takes at most " +
                                 std::to_string(capacity > 0 ? capacity - 1 : 0));
      for (const auto& [name, tensor] : x.tensors)
        if (!w->put(w, name.c_str(), peek(tensor)))
          throw std::runtime_error("the host refused export entry '" + name + "'");
      if (!x.config_json.empty())
        std::memcpy(config, x.config_json.c_str(), x.config_json.size() + 1);
    });
  };
  b.vt.param_unit = [](void* s, size_t i) noexcept {
    int32_t unit = -1;
    X::quiet(s, [&] { unit = X::of(s)->obj->param_unit(X::of(s)->params.at(i).first); });
    return unit;
  };
  b.vt.set_unit_calls = [](void* s, const keel_unit_calls* calls) noexcept {
    X::of(s)->obj->units().attach(calls);
  };
  b.tables = b.obj->tables();
  b.vt.table_count = [](void* s) noexcept { return X::of(s)->tables.size(); };
  b.vt.table = [](void* s, size_t i) noexcept {
    const auto& t = X::of(s)->tables;
    return i < t.size() ? t[i] : nullptr;
  };
  fill_state(b);
}

inline void fill(BoxOf<Dataset>& b) {
  using X = BoxOf<Dataset>;
  b.vt.size = [](void* s) noexcept {
    int64_t v = -1;
    X::quiet(s, [&] { v = X::of(s)->obj->size(); });
    return v;
  };
  b.vt.batches_per_epoch = [](void* s) noexcept {
    int64_t v = -1;
    X::quiet(s, [&] { v = X::of(s)->obj->batches_per_epoch(); });
    return v;
  };
  b.vt.tokens_per_sample = [](void* s) noexcept {
    int64_t v = -1;
    X::quiet(s, [&] { v = X::of(s)->obj->tokens_per_sample(); });
    return v;
  };
  b.vt.start_epoch = [](void* s, int64_t epoch, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->start_epoch(epoch); });
  };
  b.vt.next = [](void* s, keel_batch* out, int* has, keel_error* e) noexcept {
    return guard(e, [&] {
      Batch batch;
      try {
        *has = X::of(s)->obj->next(batch) ? 1 : 0;
      } catch (const StoppedWhileWaiting&) {
        *has = KEEL_BATCH_STOPPED;
        return;
      }
      if (*has) {
        out->samples = batch.samples;
        out->tokens = batch.tokens;
        out->inputs = give(std::move(batch.inputs));
        out->targets = give(std::move(batch.targets));
      }
    });
  };
  b.vt.seek = [](void* s, int64_t epoch, int64_t batch, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->seek(epoch, batch); });
  };
  fill_state(b);
}

inline void fill(BoxOf<Optimizer>& b) {
  using X = BoxOf<Optimizer>;
  b.vt.step = [](void* s, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->step(); });
  };
  b.vt.zero_grad = [](void* s) noexcept { X::quiet(s, [&] { X::of(s)->obj->zero_grad(); }); };
  b.vt.group_count = [](void* s) noexcept {
    size_t v = 0;
    X::quiet(s, [&] { v = X::of(s)->obj->group_count(); });
    return v;
  };
  b.vt.get_lr = [](void* s, size_t g) noexcept {
    double v = std::numeric_limits<double>::quiet_NaN();
    X::quiet(s, [&] { v = X::of(s)->obj->get_lr(g); });
    return v;
  };
  b.vt.set_lr = [](void* s, size_t g, double lr) noexcept {
    X::quiet(s, [&] { X::of(s)->obj->set_lr(g, lr); });
  };
  fill_state(b);
}

inline void fill(BoxOf<SparseOptimizer>& b) {
  using X = BoxOf<SparseOptimizer>;
  b.vt.step = [](void* s, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->step(); });
  };
  b.vt.get_lr = [](void* s) noexcept {
    double v = std::numeric_limits<double>::quiet_NaN();
    X::quiet(s, [&] { v = X::of(s)->obj->get_lr(); });
    return v;
  };
  b.vt.set_lr = [](void* s, double lr) noexcept {
    X::quiet(s, [&] { X::of(s)->obj->set_lr(lr); });
  };
  fill_state(b);
}

inline void fill(BoxOf<LrScheduler>& b) {
  using X = BoxOf<LrScheduler>;
  b.vt.factor = [](void* s, int64_t step) noexcept {
    double v = std::numeric_limits<double>::quiet_NaN();
    X::quiet(s, [&] { v = X::of(s)->obj->factor(step); });
    return v;
  };
}

inline void fill(BoxOf<Loss>& b) {
  using X = BoxOf<Loss>;
  b.vt.compute = [](void* s, keel_tensor* out, keel_tensor* tgt, keel_tensor** loss, int64_t* count,
                    keel_error* e) noexcept {
    return guard(e, [&] { *loss = give(X::of(s)->obj->compute(borrow(out), borrow(tgt), count)); });
  };
  b.vt.count_items = [](void* s, keel_tensor* tgt) noexcept {
    int64_t v = -1;
    X::quiet(s, [&] { v = X::of(s)->obj->count_items(borrow(tgt)); });
    return v;
  };
  b.vt.compute_linear = [](void* s, keel_tensor* features, keel_tensor* weight, keel_tensor* tgt,
                           keel_tensor** loss, int64_t* count, keel_error* e) noexcept {
    return guard(e, [&] {
      *loss = give(X::of(s)->obj->compute_linear(borrow(features), borrow(weight), borrow(tgt),
                                                 count));
    });
  };
  b.vt.metric_state_size = [](void* s) noexcept {
    size_t v = 0;
    X::quiet(s, [&] { v = X::of(s)->obj->metric_state_size(); });
    return v;
  };
  b.vt.metric_update = [](void* s, keel_tensor* out, keel_tensor* tgt, double loss, int64_t count,
                          double* state, size_t size, keel_error* e) noexcept {
    return guard(e, [&] {
      X::of(s)->obj->metric_update(borrow(out), borrow(tgt), loss, count,
                                   MetricState(state, size));
    });
  };
  b.vt.metric_finish = [](void* s, const double* state, size_t size, keel_metric_writer* w,
                          keel_error* e) noexcept {
    return guard(e, [&] {
      const std::vector<double> summed(state, state + size);
      for (const auto& [key, value] : X::of(s)->obj->metric_finish(summed))
        if (!w->put(w, key.c_str(), value))
          throw std::runtime_error("the host refused metric '" + key + "'");
    });
  };
}

inline void fill(BoxOf<GradClipper>& b) {
  using X = BoxOf<GradClipper>;
  b.vt.clip = [](void* s, double* norm, keel_error* e) noexcept {
    return guard(e, [&] { *norm = X::of(s)->obj->clip(); });
  };
}

inline void fill(BoxOf<Mfu>& b) {
  using X = BoxOf<Mfu>;
  b.vt.compute = [](void* s, double flops, double sps) noexcept {
    double v = std::numeric_limits<double>::quiet_NaN();
    X::quiet(s, [&] { v = X::of(s)->obj->compute(flops, sps); });
    return v;
  };
  b.vt.peak_flops = [](void* s) noexcept {
    double v = std::numeric_limits<double>::quiet_NaN();
    X::quiet(s, [&] { v = X::of(s)->obj->peak_flops(); });
    return v;
  };
}

inline void fill(BoxOf<Profiler>& b) {
  using X = BoxOf<Profiler>;
  b.vt.begin = [](void* s, const char* phase, int64_t step) noexcept {
    X::quiet(s, [&] { X::of(s)->obj->begin(phase, step); });
  };
  b.vt.end = [](void* s, const char* phase, int64_t step) noexcept {
    X::quiet(s, [&] { X::of(s)->obj->end(phase, step); });
  };
  b.vt.flush = [](void* s, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->flush(); });
  };
}

inline void fill(BoxOf<Checkpoint>& b) {
  using X = BoxOf<Checkpoint>;
  b.vt.save = [](void* s, const char* dir, const char* stem, const keel_named_tensor* t, size_t n,
                 keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->save(dir, stem, to_named(t, n)); });
  };
  b.vt.load = [](void* s, const char* dir, const char* stem, const keel_named_tensor* t, size_t n,
                 keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->load(dir, stem, to_named(t, n)); });
  };
}

inline void fill(BoxOf<Hook>& b) {
  using X = BoxOf<Hook>;
  b.vt.on_event = [](void* s, keel_event* ev, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->on_event(*ev); });
  };
  b.state = b.obj->named_state();
  b.vt.state_count = [](void* s) noexcept { return X::of(s)->state.size(); };
  b.vt.state = [](void* s, size_t i, const char** name, keel_tensor** t, keel_error* e) noexcept {
    return guard(e, [&] {
      const auto& p = X::of(s)->state.at(i);
      *name = p.first.c_str();
      *t = peek(p.second);
    });
  };
}

using keel::to_named;  // of a keel_tensor_set (keel/tensor.hpp), beside the overload above

// The extensions a hook T offers (ABI 1.12), each when T overrides one of its methods.
template <class T>
struct HookExtensions {
  static constexpr bool kModel = KEEL_SDK_OVERRIDES(T, Hook, attach_model);
  static constexpr bool kBatch = KEEL_SDK_OVERRIDES(T, Hook, on_batch);
  static constexpr bool kEvalBatch = KEEL_SDK_OVERRIDES(T, Hook, on_eval_batch);
  static constexpr bool kMetrics = KEEL_SDK_OVERRIDES(T, Hook, metrics);
  static constexpr bool kObserve = kBatch || kEvalBatch || kMetrics;
  using X = BoxOf<Hook>;

  static keel_status attach(void* s, const keel_model_view* view, keel_error* e) noexcept {
    return guard(e, [&] {
      X::of(s)->obj->attach_model(ModelView(view));
      X::of(s)->state = X::of(s)->obj->named_state();  // state may depend on the model
    });
  }
  static keel_status batch(void* s, int64_t i, const keel_tensor_set* b, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->on_batch(i, to_named(b)); });
  }
  static keel_status eval_batch(void* s, const char* split, const keel_tensor_set* b,
                                const keel_tensor_set* out, keel_error* e) noexcept {
    return guard(e, [&] { X::of(s)->obj->on_eval_batch(split, to_named(b), to_named(out)); });
  }
  static keel_status put_metrics(void* s, const char* split, keel_metric_writer* w,
                                 keel_error* e) noexcept {
    return guard(e, [&] {
      for (const auto& [key, value] : X::of(s)->obj->metrics(split))
        if (!w->put(w, key.c_str(), value))
          throw std::runtime_error("metric '" + key + "' refused");
    });
  }
  static const void* get(void*, const char* id) noexcept {
    static const keel_hook_model model = {static_cast<uint32_t>(sizeof(keel_hook_model)),
                                          &attach};
    static const keel_hook_observe observe = {
        static_cast<uint32_t>(sizeof(keel_hook_observe)), kBatch ? &batch : nullptr,
        kEvalBatch ? &eval_batch : nullptr, kMetrics ? &put_metrics : nullptr};
    if (id == nullptr) return nullptr;
    if (kModel && std::strcmp(id, KEEL_EXT_HOOK_MODEL) == 0) return &model;
    if (kObserve && std::strcmp(id, KEEL_EXT_HOOK_OBSERVE) == 0) return &observe;
    return nullptr;
  }
};

inline void fill(BoxOf<Step>& b) {
  using X = BoxOf<Step>;
  b.vt.compute = [](void* s, keel_step_services* services, const keel_tensor_set* batch,
                    keel_tensor** loss, keel_error* e) noexcept {
    return guard(e, [&] {
      StepModels models(services);
      *loss = give(X::of(s)->obj->compute(models, to_named(batch)));
    });
  };
}

// Puts every tensor of `set` into `w` (keel/ext/tensors.h); throws when the host refuses one.
inline void put_all(keel_tensor_writer* w, const NamedTensors& set, const char* what) {
  for (const auto& [name, tensor] : set)
    if (!w->put(w, name.c_str(), peek(tensor)))
      throw std::runtime_error(std::string("the host refused ") + what + " '" + name + "'");
}

// The named-batch extensions (keel/ext/batch.h) of a dataset, model or loss T, each offered when
// T overrides next_batch, forward_batch or compute_batch.
template <class T>
struct DatasetExtensions {
  static constexpr bool kAny = KEEL_SDK_OVERRIDES(T, Dataset, next_batch);
  using X = BoxOf<Dataset>;
  static keel_status next(void* s, keel_tensor_writer* w, int64_t* samples, int64_t* tokens,
                          int* has, keel_error* e) noexcept {
    return guard(e, [&] {
      NamedBatch batch;
      try {
        *has = X::of(s)->obj->next_batch(batch) ? 1 : 0;
      } catch (const StoppedWhileWaiting&) {
        *has = KEEL_BATCH_STOPPED;
        return;
      }
      if (!*has) return;
      *samples = batch.samples;
      *tokens = batch.tokens;
      put_all(w, batch.tensors, "batch tensor");
    });
  }
  static const void* get(void*, const char* id) noexcept {
    static const keel_dataset_batch ext = {static_cast<uint32_t>(sizeof(keel_dataset_batch)),
                                           &next};
    return id && std::strcmp(id, KEEL_EXT_DATASET_BATCH) == 0 ? &ext : nullptr;
  }
};
template <class T>
struct ModelExtensions {
  static constexpr bool kAny = KEEL_SDK_OVERRIDES(T, Model, forward_batch);
  using X = BoxOf<Model>;
  static keel_status forward(void* s, const keel_tensor_set* batch, keel_tensor_writer* w,
                             keel_error* e) noexcept {
    return guard(e, [&] { put_all(w, X::of(s)->obj->forward_batch(to_named(batch)), "output"); });
  }
  static const void* get(void*, const char* id) noexcept {
    static const keel_model_batch ext = {static_cast<uint32_t>(sizeof(keel_model_batch)),
                                         &forward};
    return id && std::strcmp(id, KEEL_EXT_MODEL_BATCH) == 0 ? &ext : nullptr;
  }
};
template <class T>
struct LossExtensions {
  static constexpr bool kAny = KEEL_SDK_OVERRIDES(T, Loss, compute_batch);
  static constexpr bool kCount = KEEL_SDK_OVERRIDES(T, Loss, count_items_batch);
  static constexpr bool kCountTargets = KEEL_SDK_OVERRIDES(T, Loss, count_items);
  static constexpr bool kMetric = KEEL_SDK_OVERRIDES(T, Loss, metric_update_batch);
  using X = BoxOf<Loss>;
  static keel_status compute(void* s, const keel_tensor_set* outputs, const keel_tensor_set* batch,
                             keel_tensor** loss, int64_t* count, keel_error* e) noexcept {
    return guard(e, [&] {
      *loss = give(X::of(s)->obj->compute_batch(to_named(outputs), to_named(batch), count));
    });
  }
  static int64_t count_items(void* s, const keel_tensor_set* batch) noexcept {
    int64_t v = -1;
    X::quiet(s, [&] {
      const NamedTensors named = to_named(batch);
      Loss& loss = *X::of(s)->obj;
      v = kCount ? loss.count_items_batch(named) : loss.count_items(need(named, "targets"));
    });
    return v;
  }
  static keel_status metric_update(void* s, const keel_tensor_set* outputs,
                                   const keel_tensor_set* batch, double loss, int64_t count,
                                   double* state, size_t size, keel_error* e) noexcept {
    return guard(e, [&] {
      X::of(s)->obj->metric_update_batch(to_named(outputs), to_named(batch), loss, count,
                                         MetricState(state, size));
    });
  }
  static const void* get(void*, const char* id) noexcept {
    static const keel_loss_batch ext = {static_cast<uint32_t>(sizeof(keel_loss_batch)), &compute,
                                        kCount || kCountTargets ? &count_items : nullptr,
                                        kMetric ? &metric_update : nullptr};
    return id && std::strcmp(id, KEEL_EXT_LOSS_BATCH) == 0 ? &ext : nullptr;
  }
};

// get_extension (ABI 1.12) of component T's instances: the extensions T offers by overriding
// their methods (a hook's attach_model: keel.hook.model/1; on_batch, on_eval_batch, metrics:
// keel.hook.observe/1; a dataset's next_batch, a model's forward_batch, a loss's compute_batch:
// keel.dataset.batch/1, keel.model.batch/1, keel.loss.batch/1), or NULL when it offers none.
template <class T, class B>
constexpr keel_get_extension_fn extensions_of() {
  if constexpr (std::is_same<B, Hook>::value) {
    if constexpr (HookExtensions<T>::kModel || HookExtensions<T>::kObserve)
      return &HookExtensions<T>::get;
  }
  if constexpr (std::is_same<B, Dataset>::value) {
    static_assert(KEEL_SDK_OVERRIDES(T, Dataset, next) || DatasetExtensions<T>::kAny,
                  "a dataset overrides next or next_batch");
    if constexpr (DatasetExtensions<T>::kAny) return &DatasetExtensions<T>::get;
  }
  if constexpr (std::is_same<B, Model>::value) {
    static_assert(KEEL_SDK_OVERRIDES(T, Model, forward) || ModelExtensions<T>::kAny,
                  "a model overrides forward or forward_batch");
    if constexpr (ModelExtensions<T>::kAny) return &ModelExtensions<T>::get;
  }
  if constexpr (std::is_same<B, Loss>::value) {
    static_assert(KEEL_SDK_OVERRIDES(T, Loss, compute) || LossExtensions<T>::kAny,
                  "a loss overrides compute or compute_batch");
    static_assert(LossExtensions<T>::kAny ||
                      !(LossExtensions<T>::kCount || LossExtensions<T>::kMetric),
                  "count_items_batch and metric_update_batch go with compute_batch");
    if constexpr (LossExtensions<T>::kAny) return &LossExtensions<T>::get;
  }
  return nullptr;
}

// The factory of component T: constructs T, wraps it in its box and fills the C struct.
template <class T, class B>
keel_status create(const keel_create_context* ctx, void** out, keel_error* err) noexcept {
  return guard(err, [&] {
    Context context(ctx);
    auto box = std::make_unique<BoxOf<B>>();
    box->host = ctx->host;
    box->origin = context.section();
    box->obj = std::make_unique<T>(context);
    box->vt.struct_size = sizeof(box->vt);
    box->vt.self = box.get();
    box->vt.destroy = &BoxOf<B>::destroy;
    box->vt.get_extension = extensions_of<T, B>();
    fill(*box);
    // Optional slots are offered only when T overrides them (abi.h: NULL = not provided).
    if constexpr (std::is_same<B, Loss>::value) {
      // count_items: so that "auto" accumulation falls back to the mean for losses that count
      // nothing.
      if (!KEEL_SDK_OVERRIDES(T, Loss, count_items) && !LossExtensions<T>::kCount)
        box->vt.count_items = nullptr;
      if (!KEEL_SDK_OVERRIDES(T, Loss, compute_linear)) box->vt.compute_linear = nullptr;
      constexpr bool update = KEEL_SDK_OVERRIDES(T, Loss, metric_update) ||
                              LossExtensions<T>::kMetric;  // either: the core's calls _batch's
      static_assert(KEEL_SDK_OVERRIDES(T, Loss, metric_state_size) == update &&
                        update == KEEL_SDK_OVERRIDES(T, Loss, metric_finish),
                    "override metric_state_size, metric_update (or metric_update_batch) and "
                    "metric_finish, or none");
      if (!KEEL_SDK_OVERRIDES(T, Loss, metric_state_size)) {
        box->vt.metric_state_size = nullptr;
        box->vt.metric_update = nullptr;
        box->vt.metric_finish = nullptr;
      }
    }
    if constexpr (std::is_same<B, Model>::value) {
      if (!KEEL_SDK_OVERRIDES(T, Model, forward_features)) box->vt.forward_features = nullptr;
      if (!KEEL_SDK_OVERRIDES(T, Model, export_state)) box->vt.export_state = nullptr;
      if (!KEEL_SDK_OVERRIDES(T, Model, param_unit)) {
        box->vt.param_unit = nullptr;
        box->vt.set_unit_calls = nullptr;
      }
      if (!KEEL_SDK_OVERRIDES(T, Model, tables)) {
        box->vt.table_count = nullptr;
        box->vt.table = nullptr;
      }
    }
    if constexpr (std::is_same<B, Model>::value || std::is_same<B, Dataset>::value ||
                  std::is_same<B, Optimizer>::value || std::is_same<B, SparseOptimizer>::value) {
      static_assert(KEEL_SDK_OVERRIDES(T, B, state_save) == KEEL_SDK_OVERRIDES(T, B, state_load),
                    "override both state_save and state_load, or neither");
      if (!KEEL_SDK_OVERRIDES(T, B, state_save)) {
        box->vt.state_save = nullptr;
        box->vt.state_load = nullptr;
      }
    }
    if constexpr (std::is_same<B, Dataset>::value) {
      if (!KEEL_SDK_OVERRIDES(T, Dataset, seek)) box->vt.seek = nullptr;
      if (!KEEL_SDK_OVERRIDES(T, Dataset, tokens_per_sample)) box->vt.tokens_per_sample = nullptr;
    }
    if constexpr (std::is_same<B, Mfu>::value) {
      if (!KEEL_SDK_OVERRIDES(T, Mfu, peak_flops)) box->vt.peak_flops = nullptr;
    }
    *out = &box.release()->vt;
  });
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Declaring components and the plugin.
// ---------------------------------------------------------------------------------------------

// Which keel base class a component derives from (overload resolution picks it).
namespace detail {
Model* base_of(Model*);
Dataset* base_of(Dataset*);
Optimizer* base_of(Optimizer*);
SparseOptimizer* base_of(SparseOptimizer*);
LrScheduler* base_of(LrScheduler*);
Loss* base_of(Loss*);
GradClipper* base_of(GradClipper*);
Mfu* base_of(Mfu*);
Profiler* base_of(Profiler*);
Checkpoint* base_of(Checkpoint*);
Hook* base_of(Hook*);
Step* base_of(Step*);
}  // namespace detail
template <class T>
using base_of_t = std::remove_pointer_t<decltype(detail::base_of(static_cast<T*>(nullptr)))>;

template <class T, class Base = base_of_t<T>>
constexpr keel_component_desc component(const char* name, const char* description,
                                        const keel_option_desc* options,
                                        uint32_t option_count) {
  static_assert(std::is_base_of<Base, T>::value, "T must derive from a keel component base");
  return keel_component_desc{Base::kKind,
                             name,
                             description,
                             options,
                             option_count,
                             static_cast<uint32_t>(sizeof(keel_option_desc)),
                             &detail::create<T, Base>};
}

template <class T>
constexpr keel_component_desc component(const char* name, const char* description) {
  return component<T>(name, description, nullptr, 0u);
}

template <class T, size_t N>
constexpr keel_component_desc component(const char* name, const char* description,
                                        const keel_option_desc (&options)[N]) {
  return component<T>(name, description, options, static_cast<uint32_t>(N));
}

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define KEEL_SDK_CXX11_ABI _GLIBCXX_USE_CXX11_ABI
#else
#define KEEL_SDK_CXX11_ABI -1
#endif

}  // namespace keel

// Exports the plugin: NAME, VERSION and DESCRIPTION are string literals, COMPONENTS a static
// array of keel_component_desc built with keel::component.
#define KEEL_PLUGIN(NAME, VERSION, DESCRIPTION, COMPONENTS)                                   \
  extern "C" KEEL_EXPORT const keel_plugin_descriptor* keel_plugin_entry(void) {              \
    static const keel_plugin_descriptor descriptor = {                                        \
        KEEL_ABI_MAJOR,                                                                        \
        KEEL_ABI_MINOR,                                                                        \
        static_cast<uint32_t>(sizeof(keel_plugin_descriptor)),                                 \
        NAME,                                                                                  \
        VERSION,                                                                               \
        DESCRIPTION,                                                                           \
        {TORCH_VERSION, __VERSION__, KEEL_SDK_CXX11_ABI},                                      \
        COMPONENTS,                                                                            \
        static_cast<uint32_t>(sizeof(COMPONENTS) / sizeof(COMPONENTS[0])),                     \
        static_cast<uint32_t>(sizeof(keel_component_desc))};                                   \
    return &descriptor;                                                                        \
  }
