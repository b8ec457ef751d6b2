#include "config/keys.hpp"

#include <cmath>
#include <optional>
#include <stdexcept>
#include <type_traits>

#include "error.hpp"
#include "keel/schema.hpp"
#include "run_config.hpp"

namespace keel {
namespace {

constexpr OnResume kSafe = OnResume::kSafe;
constexpr OnResume kBreaks = OnResume::kBreaks;

std::vector<std::string> choices_of(const keel_option_desc& o) {
  std::vector<std::string> out;
  std::string item;
  for (const char* c = o.choices ? o.choices : ""; ; ++c) {
    if (*c == '|' || *c == '\0') {
      out.push_back(item);
      item.clear();
      if (*c == '\0') break;
    } else {
      item += *c;
    }
  }
  return out;
}

// Whether a member of type T holds the values of an option read as U (keel::Option<U>,
// keel/schema.hpp): a choice (a string option) lands in an enum, an int in int64_t or uint64_t,
// a path in std::string.
template <class T, class U>
constexpr bool fits() {
  if constexpr (std::is_enum_v<T>) return std::is_same_v<U, std::string>;
  else if constexpr (std::is_same_v<T, uint64_t>) return std::is_same_v<U, int64_t>;
  else return std::is_same_v<T, U>;
}

// A validated value as the member's type: a choice as the enum whose order is the choices'.
template <class T>
T from_value(const KeelOptionValue& v, const keel_option_desc& o) {
  if constexpr (std::is_enum_v<T>) {
    const std::vector<std::string> all = choices_of(o);
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] == std::get<std::string>(v)) return static_cast<T>(i);
    throw Error(std::string("internal: ") + o.key + " = " + std::get<std::string>(v) +
                " is none of " + o.choices);  // validate_options checked it
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    return static_cast<uint64_t>(std::get<int64_t>(v));  // rows bound it to >= 0
  } else {
    return std::get<T>(v);
  }
}

template <class T>
KeelOptionValue to_value(const T& x, const keel_option_desc& o) {
  if constexpr (std::is_enum_v<T>) return choices_of(o).at(static_cast<size_t>(x));
  else if constexpr (std::is_same_v<T, uint64_t>) return static_cast<int64_t>(x);
  else return x;
}

// One row: `option` lands in `member` of the section struct S. A member whose type does not hold
// the option's values does not compile; an enum member needs the option's choices.
template <class S, class T, class U>
Key<S> key(T S::*member, Option<U> option, OnResume on_resume) {
  static_assert(fits<T, U>(), "a kernel key's member type does not hold its option's values");
  if (std::is_enum_v<T> && option.choices == nullptr)
    throw std::logic_error(std::string("kernel key '") + option.key +
                           "': an enum member needs the option's choices");
  return {option, on_resume,
          [member, option](S& s, const KeelOptionValue& v) {
            s.*member = from_value<T>(v, option);
          },
          [member, option](const S& s) { return to_value(s.*member, option); }};
}

// [[optimizer.groups]] lr / weight_decay: left out (the default, -1) lands as NaN, "the
// optimizer's own" (a value written must be >= 0: resolve checks it where it was written).
Key<ParamGroupSpec> unless_negative(double ParamGroupSpec::*member, Option<double> option) {
  return {option, kBreaks,
          [member](ParamGroupSpec& g, const KeelOptionValue& v) {
            const double d = std::get<double>(v);
            g.*member = d < 0 ? NAN : d;
          },
          nullptr};
}

}  // namespace

template <class S>
KeyTable<S>::KeyTable(const char* name, const char* description, std::vector<Key<S>> rows)
    : name(name), description(description), keys(std::move(rows)) {
  for (const Key<S>& k : keys) schema.push_back(k.option);
}

template <class S>
void KeyTable<S>::land(const keel_options& values, S& into) const {
  for (const Key<S>& k : keys) k.land(into, values.values.at(k.option.key));
}

template <class S>
toml::table KeyTable<S>::resolved(const S& from) const {
  keel_options values;
  for (const Key<S>& k : keys)
    if (k.read) values.values[k.option.key] = k.read(from);
  return to_toml(values);
}

template <class S>
const Key<S>* KeyTable<S>::find(const std::string& key) const {
  for (const Key<S>& k : keys)
    if (key == k.option.key) return &k;
  return nullptr;
}

template struct KeyTable<RunKeys>;
template struct KeyTable<TrainKeys>;
template struct KeyTable<DistributedKeys>;
template struct KeyTable<CheckpointKeys>;
template struct KeyTable<ComponentSpec>;
template struct KeyTable<ParamGroupSpec>;
template struct KeyTable<NamedModelSpec>;

const KeyTable<RunKeys>& run_keys() {
  using S = RunKeys;
  static const KeyTable<S> t{
      "run", "the run: name, run directory, seed, threads, device, mode", {
      key(&S::name, opt_string("name", "\"keel\"", "run name"), kSafe),
      key(&S::output_dir, opt_string("output_dir", "\"\"", "run directory (default runs/<name>)"),
          kSafe),
      key(&S::seed, opt_int("seed", "0", "seed for weights, shuffling and dropout", 0, 9.0e15),
          kBreaks),
      key(&S::threads,
          opt_int("threads", "0",
                  "intra-op threads (0: the cores / the processes on this machine); OpenBLAS's "
                  "OpenMP build gets as many, its pthread build 1, another BLAS is left as it is",
                  0, 4096),
          kSafe),
      key(&S::device,
          opt_string("device", "\"cpu\"",
                     "where the model, optimizer state and batches live: cpu, cuda (under a "
                     "launcher: the GPU of LOCAL_RANK), cuda:N, or auto (cuda when there is one, "
                     "else cpu)"),
          kBreaks),
      key(&S::mode, opt_string("mode", "\"train_and_evaluate\"", "what the run does",
                               "train_and_evaluate|train|evaluate"),
          kSafe),
      key(&S::malloc_tuning,
          opt_bool("malloc_tuning", "true",
                   "keep large freed blocks in the heap (fewer page faults per step)"),
          kSafe),
  }};
  return t;
}

const KeyTable<TrainKeys>& train_keys() {
  using S = TrainKeys;
  static const KeyTable<S> t{
      "train", "the loop: stop targets, accumulation, precision, logging, evaluation", {
      key(&S::epochs, opt_int("epochs", "1", "epochs to train (0: no epoch limit)", 0, 1e9), kSafe),
      key(&S::max_steps,
          opt_int("max_steps", "0", "optimizer steps to train (0: no limit)", 0, 1e15), kSafe),
      key(&S::max_samples,
          opt_int("max_samples", "0", "training samples to consume (0: no limit)", 0, 9e15), kSafe),
      key(&S::max_tokens,
          opt_int("max_tokens", "0", "training tokens to consume (0: no limit)", 0, 9e15), kSafe),
      key(&S::grad_accum,
          opt_int("grad_accum", "1",
                  "batches of [data.train] per optimizer step (each one micro-batch, or "
                  "several with micro_batch_size)", 1, 1e6),
          kBreaks),
      key(&S::micro_batch_size,
          opt_int("micro_batch_size", "0",
                  "split each training batch along its first dimension into micro-batches of "
                  "at most this many rows, each run forward and backward on its own, for the "
                  "memory of a smaller batch (0: a batch is one micro-batch)",
                  0, 1e9),
          kBreaks),
      key(&S::global_batch,
          opt_int("global_batch", "0",
                  "samples per optimizer step over all ranks: grad_accum is then derived as "
                  "global_batch / ([data.train] batch_size x ranks) (0: batch_size x grad_accum "
                  "x ranks)",
                  0, 1e12),
          kBreaks),
      key(&S::accum_normalization,
          opt_string("accum_normalization", "\"auto\"",
                     "auto: by item count when the loss reports one, else mean over micro-batches",
                     "auto|mean|items"),
          kBreaks),
      key(&S::precision,
          opt_string("precision", "\"fp32\"",
                     "bf16: autocast on the run's device; fp16: CUDA autocast with loss scaling",
                     "fp32|bf16|fp16"),
          kBreaks),
      key(&S::nonfinite,
          opt_string("nonfinite", "\"error\"", "on a NaN/Inf loss or gradient norm", "error|skip"),
          kBreaks),
      key(&S::max_skips,
          opt_int("max_skips", "10", "skip policy: abort after this many skipped steps", 0, 1e15),
          kBreaks),
      key(&S::log_every,
          opt_int("log_every", "50", "steps between training metric records", 1, 1e15), kSafe),
      key(&S::eval_each_epoch,
          opt_bool("eval_each_epoch", "true", "evaluate the evaluation sets after each epoch"),
          kSafe),
      key(&S::eval_at_start,
          opt_bool("eval_at_start", "false",
                   "also evaluate the evaluation sets before step 1 (at step 0, fresh runs only)"),
          kSafe),
      key(&S::eval_every_steps,
          opt_int("eval_every_steps", "0", "also evaluate every N optimizer steps (0: never)", 0,
                  1e15),
          kSafe),
      key(&S::eval_max_batches,
          opt_int("eval_max_batches", "0", "batches per evaluation set and evaluation (0: all)", 0,
                  1e15),
          kSafe),
  }};
  return t;
}

const KeyTable<DistributedKeys>& distributed_keys() {
  using S = DistributedKeys;
  static const KeyTable<S> t{
      "distributed", "several processes (torchrun, Slurm, Open MPI): timeout, backend, buckets, "
      "sharding", {
      key(&S::timeout_s,
          opt_int("timeout_s", "300",
                  "seconds a rank waits for the others (rendezvous, every collective) before it "
                  "fails",
                  1, 86400),
          kSafe),
      key(&S::backend,
          opt_string("backend", "\"auto\"",
                     "collectives: auto (nccl for CUDA, else gloo), gloo, nccl", "auto|gloo|nccl"),
          kBreaks),
      key(&S::bucket_cap_mb,
          opt_int("bucket_cap_mb", "25",
                  "gradient all-reduce bucket size in MiB (DDP's bucket_cap_mb)", 1, 4096),
          kSafe),
      key(&S::shard,
          opt_string("shard", "\"none\"",
                     "none: every rank holds the whole optimizer state and gradients (DDP); "
                     "optimizer: each rank holds the optimizer state of its 1/ranks of every "
                     "parameter's rows (ZeRO-1); gradients: also only their gradients (ZeRO-2); "
                     "parameters: also only their rows of the parameters between uses, each "
                     "unit of the model gathered around its forward and backward (FSDP)",
                     "none|optimizer|gradients|parameters"),
          kSafe),
  }};
  return t;
}

// Every [checkpoint] key is safe on resume: it decides what is saved and kept, not what
// training computes (init_from is not read when resuming).
const KeyTable<CheckpointKeys>& checkpoint_keys() {
  using S = CheckpointKeys;
  static const KeyTable<S> t{
      "checkpoint",
      "kernel keys of [checkpoint] (beside the backend's own options), and the "
      "[checkpoint.init_rename] table of init_from prefix rewrites (\"ckpt.\" = \"model.\")", {
      key(&S::every_steps,
          opt_int("every_steps", "0", "save every N optimizer steps (0: never during training)", 0,
                  1e15),
          kSafe),
      key(&S::every_epochs,
          opt_int("every_epochs", "0",
                  "also save after every N-th completed epoch (a stream's windows; 0: never)", 0,
                  1e9),
          kSafe),
      key(&S::keep_last,
          opt_int("keep_last", "0",
                  "keep this run's newest N checkpoints (0 with keep_best 0: keep all)", 0, 1e9),
          kSafe),
      key(&S::keep_best,
          opt_int("keep_best", "0", "also keep this run's best N checkpoints by best_metric", 0,
                  1e9),
          kSafe),
      key(&S::best_metric,
          opt_string("best_metric", "\"test.loss\"",
                     "metric keep_best ranks by: <split>.<key> of the latest record at the save"),
          kSafe),
      key(&S::best_mode,
          opt_string("best_mode", "\"min\"", "whether a smaller or larger best_metric is better",
                     "min|max"),
          kSafe),
      key(&S::at_end, opt_bool("at_end", "true", "save when training ends"), kSafe),
      key(&S::initial, opt_bool("initial", "false", "save step-0 before the first step"), kSafe),
      key(&S::async,
          opt_bool("async", "false",
                   "write checkpoints on a background thread from an in-memory copy (one at a "
                   "time)"),
          kSafe),
      key(&S::init_from,
          opt_path("init_from", "\"\"",
                   "checkpoint directory whose model weights (and hook state) start the run"),
          kSafe),
      key(&S::init_include,
          opt_string("init_include", "\"\"",
                     "init_from: load only model tensors whose name matches this regex (\"\": "
                     "all)"),
          kSafe),
      key(&S::init_exclude,
          opt_string("init_exclude", "\"\"",
                     "init_from: keep the initialisation of tensors matching this regex"),
          kSafe),
      key(&S::init_from_unverified,
          opt_bool("init_from_unverified", "false",
                   "init_from: load a directory without a commit record with a backend other "
                   "than safetensors"),
          kSafe),
  }};
  return t;
}

const KeyTable<ComponentSpec>& hook_keys() {
  using S = ComponentSpec;
  static const KeyTable<S> t{
      "hooks", "kernel keys of each [[hooks]] table (beside the hook's own options)", {
      key(&S::priority,
          opt_int("priority", "0", "hooks run in ascending priority, ties in manifest order", -1e9,
                  1e9),
          kSafe),
      key(&S::label,
          opt_string("label", "\"\"",
                     "name of the hook's state in checkpoints (default: its type); give two "
                     "hooks of one type that keep state distinct labels"),
          kSafe),
  }};
  return t;
}

const KeyTable<NamedModelSpec>& named_model_keys() {
  using S = NamedModelSpec;
  static const KeyTable<S> t{
      "models", "kernel keys of each [models.NAME] table (beside the model's own options): a "
      "model a [step] runs beside [model]", {
      key(&S::init_from,
          opt_path("init_from", "\"\"",
                   "committed checkpoint directory (runs/<name>/checkpoints/step-<N>) whose model "
                   "weights the model is loaded with at every start, resume included (required)"),
          kBreaks),
      key(&S::frozen,
          opt_bool("frozen", "true",
                   "never trained: no optimizer, no gradients, evaluation mode, not saved in "
                   "checkpoints (only true is supported)"),
          kBreaks),
  }};
  return t;
}

const KeyTable<ParamGroupSpec>& group_keys() {
  using S = ParamGroupSpec;
  static const KeyTable<S> t{
      "optimizer.groups", "each [[optimizer.groups]] table: parameter groups", {
      key(&S::params, opt_string("params", nullptr, "regex matched against whole parameter names"),
          kBreaks),
      unless_negative(&S::lr, opt_float("lr", "-1.0",
                                        "learning rate of the group (left out: the optimizer's "
                                        "own)")),
      unless_negative(&S::weight_decay,
                      opt_float("weight_decay", "-1.0",
                                "weight decay of the group (left out: the optimizer's own)")),
  }};
  return t;
}

const std::vector<KernelTable>& kernel_tables() {
  static const std::vector<KernelTable> tables = [] {
    std::vector<KernelTable> out;
    auto add = [&](const auto& t) { out.push_back({t.name, t.description, &t.schema}); };
    add(run_keys());
    add(train_keys());
    add(distributed_keys());
    add(checkpoint_keys());
    add(hook_keys());
    add(group_keys());
    add(named_model_keys());
    return out;
  }();
  return tables;
}

namespace {

// A component's own options (and its `type`): whether changing them changes what training
// computes. Its section's kernel keys (checkpoint, hooks, optimizer.groups) answer by row.
struct ComponentResume {
  const char* section;
  OnResume on_resume;
};
constexpr ComponentResume kComponents[] = {
    {"model", kBreaks},      {"data.train", kBreaks},   {"data.test", kSafe},
    {"data.eval", kSafe},
    {"optimizer", kBreaks},  {"loss", kBreaks},         {"lr_scheduler", kBreaks},
    {"grad_clipper", kBreaks}, {"mfu", kSafe},          {"profiler", kSafe},
    {"checkpoint", kSafe},   {"hooks", kSafe},          {"sparse_optimizer", kBreaks},
};

bool starts(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The key after "<section>." ("train.epochs" -> "epochs"), or after "<section>[N]."
// ("hooks[1].label" -> "label") for an array of tables; "" when `dotted` is not in it.
std::string key_in(const std::string& dotted, const std::string& section) {
  if (starts(dotted, section + ".")) return dotted.substr(section.size() + 1);
  if (!starts(dotted, section + "[")) return "";
  const size_t dot = dotted.find("].", section.size());
  return dot == std::string::npos ? "" : dotted.substr(dot + 2);
}

template <class S>
std::optional<OnResume> row_answer(const KeyTable<S>& table, const std::string& dotted) {
  const std::string key = key_in(dotted, table.name);
  if (key.empty()) return std::nullopt;
  if (const Key<S>* k = table.find(key)) return k->on_resume;
  return std::nullopt;
}

template <class S>
const char* row_default_in(const KeyTable<S>& table, const std::string& dotted) {
  const std::string key = key_in(dotted, table.name);
  if (key.empty()) return nullptr;
  const Key<S>* k = table.find(key);
  return k ? k->option.default_toml : nullptr;
}

}  // namespace

const char* row_default(const std::string& dotted) {
  for (const char* d : {row_default_in(run_keys(), dotted), row_default_in(train_keys(), dotted),
                        row_default_in(distributed_keys(), dotted),
                        row_default_in(checkpoint_keys(), dotted),
                        row_default_in(hook_keys(), dotted), row_default_in(group_keys(), dotted)})
    if (d) return d;
  return nullptr;
}

OnResume on_resume(const std::string& dotted) {
  if (auto a = row_answer(run_keys(), dotted)) return *a;
  if (auto a = row_answer(train_keys(), dotted)) return *a;
  if (auto a = row_answer(distributed_keys(), dotted)) return *a;
  if (auto a = row_answer(checkpoint_keys(), dotted)) return *a;
  if (auto a = row_answer(hook_keys(), dotted)) return *a;
  if (auto a = row_answer(group_keys(), dotted)) return *a;
  for (const ComponentResume& c : kComponents)
    if (dotted == c.section || starts(dotted, std::string(c.section) + ".") ||
        starts(dotted, std::string(c.section) + "["))
      return c.on_resume;
  if (starts(dotted, "plugins.")) return kSafe;  // where plugins are found, which versions
  return kBreaks;  // a key no row declares ([run], [train], [distributed] of another keel)
}

}  // namespace keel
