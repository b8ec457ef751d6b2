// resolve: the manifest's sections in order ([plugins], [run], [distributed], [train], the
// components, [checkpoint], [[hooks]]), then manifest.resolved.toml. The kernel's keys come from
// their rows (config/keys.cpp); [plugins] and the lock are in config/plugins.cpp, the component
// tables in config/components.cpp.
#include "run_config.hpp"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>

#include <spdlog/spdlog.h>

#include "config/resolve_parts.hpp"
#include "config/split_name.hpp"
#include "config/toml_text.hpp"
#include "error.hpp"
#include "loader/lock.hpp"
#include "text/text.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

using namespace resolve_parts;

const std::vector<std::string> kTopLevel = {"run", "plugins", "train", "model", "data",
                                            "optimizer", "lr_scheduler", "loss", "grad_clipper",
                                            "mfu", "profiler", "checkpoint", "hooks", "distributed",
                                            "extends", "sparse_optimizer", "step", "models"};

void check_sections(const Manifest& m) {
  for (const auto& [k, v] : m.root) {
    const std::string key(k.str());
    if (std::find(kTopLevel.begin(), kTopLevel.end(), key) == kTopLevel.end())
      throw Error(where(k.source()) + ": unknown section '" + key + "'; hint: " +
                  text::did_you_mean(key, kTopLevel) + "a manifest holds run, plugins, train, model, "
                  "data, optimizer, sparse_optimizer, lr_scheduler, loss, grad_clipper, mfu, "
                  "profiler, checkpoint, hooks, distributed, step, models (docs/manifest.md)");
  }
}

void load_plugins(const Manifest& m, Registry& registry, bool use_lock, RunConfig& rc) {
  rc.plugins = manifest_plugins(m);
  if (std::optional<Lock> lock = use_lock ? manifest_lock(m, rc.plugins) : std::nullopt) {
    rc.lock_file = lock->file;
    registry.use_lock(std::move(*lock));
  }
  registry.discover(plugin_search_path(rc.plugins.dirs, rc.plugins.require));
  if (use_lock && registry.lock()) check_lock(registry, *registry.lock());
  check_requirements(registry, rc.plugins.require);
}

// The kernel's keys of one section: validated against their rows, defaults filled in, landed.
template <class S>
S kernel_section(const Manifest& m, const KeyTable<S>& keys) {
  S out;
  keys.land(validate_options(table_or_empty(m.root, keys.name, keys.name), keys.name,
                             std::string("keel options ") + keys.name, keys.schema),
            out);
  return out;
}

// [section] as written, or nullptr.
const toml::table* written(const Manifest& m, const char* section) {
  const toml::node* n = m.root.get(section);
  return n ? n->as_table() : nullptr;
}

RunKeys run_section(const Manifest& m) {
  RunKeys run = kernel_section(m, run_keys());
  if (run.output_dir.empty()) run.output_dir = "runs/" + run.name;
  // Absolute, so that manifest.resolved.toml reruns the run from any working directory.
  run.output_dir = fs::absolute(run.output_dir).lexically_normal().string();
  const toml::table* t = written(m, "run");
  const std::string at = t && t->get("device") ? where(t->get("device")->source()) + ": run.device"
                                               : m.path + ": run.device";
  run.device_where = at;
  static const std::regex kDevice("cpu|auto|cuda(:[0-9]{1,4})?");
  if (!std::regex_match(run.device, kDevice))
    throw Error(at + " = \"" + run.device + "\" is not a device; hint: use \"cpu\", \"cuda\", "
                "\"cuda:N\" or \"auto\"");
#ifndef KEEL_WITH_CUDA
  if (run.device.rfind("cuda", 0) == 0)
    throw Error(at + " = \"" + run.device + "\": this keel is built against a LibTorch without "
                "CUDA (Debian's libtorch-dev is CPU-only); hint: use device = \"cpu\" or "
                "\"auto\", or build keel against PyTorch 2.11's CUDA LibTorch (./setup.sh --torch "
                "wheel)");
#endif
  return run;
}

TrainKeys train_section(const Manifest& m, const RunKeys& run) {
  TrainKeys train = kernel_section(m, train_keys());
  // Where a [train] key was set (the file that set it, or --set), else [train] or the file.
  const auto train_where = [&](const char* key) {
    const toml::table* t = written(m, "train");
    if (t && t->get(key)) return where(t->get(key)->source()) + ": train." + key;
    return (t ? where(t->source()) : m.path) + ": [train]";
  };
  if (train.epochs == 0 && train.max_steps == 0 && train.max_samples == 0 &&
      train.max_tokens == 0)
    throw Error(train_where("epochs") +
                ": no stop target is set (epochs, max_steps, max_samples and max_tokens are all "
                "0), so the run would never end; hint: set epochs = N or max_steps = N");
#ifndef KEEL_WITH_CUDA
  if (train.precision == Precision::kFp16)
    throw Error(train_where("precision") + ": \"fp16\" needs a CUDA build of LibTorch and "
                "this keel is CPU-only; hint: use precision = \"bf16\" (CPU autocast)");
#endif
  if (train.precision == Precision::kFp16 && run.device == "cpu")
    throw Error(train_where("precision") + ": \"fp16\" (with loss scaling) runs only on CUDA, "
                "and run.device = \"cpu\"; hint: set [run] device = \"cuda\", or use "
                "precision = \"bf16\"");
  if (train.global_batch > 0) {
    train.global_batch_where = train_where("global_batch");
    const toml::table* t = written(m, "train");
    if (t && t->get("grad_accum"))
      throw Error(train_where("grad_accum") + ": grad_accum and global_batch are both set; "
                  "with global_batch the micro-batches per step are derived from it, batch_size "
                  "and the number of ranks; hint: remove grad_accum");
  }
  return train;
}

// The evaluation sets of `data` ([data] of the manifest): [data.test] as the set named "test",
// then [data.eval.NAME], ordered by name. A name is a split name in records and file names
// (config/split_name.hpp); not "train" (the training records' split) nor "test" (that is
// [data.test]).
std::vector<EvalSetSpec> eval_sets(const toml::table& data, const Registry& registry) {
  std::vector<EvalSetSpec> sets;
  if (data.get("test"))
    sets.push_back({"test", component(registry, table_or_empty(data, "test", "data.test"),
                                      "data.test", KEEL_KIND_DATASET)});
  if (!data.get("eval")) return sets;
  const toml::table& eval = table_or_empty(data, "eval", "data.eval");
  if (eval.empty())
    throw Error(where(eval.source()) + ": [data.eval] holds no evaluation set; hint: name each "
                "set in its own table, e.g. [data.eval.valid] with type = \"<dataset>\"");
  for (const auto& [k, v] : eval) {  // toml::table: in the order of the names
    const std::string name(k.str());
    if (!valid_split_name(name) || name == "train" || name == "test")
      throw Error(where(k.source()) + ": [data.eval." + text::printable(name) + "]: " +
                  (name == "test"    ? "the set named test is [data.test]; hint: rename the table "
                                       "[data.test]"
                   : name == "train" ? "train is the training records' split; hint: choose "
                                       "another name, e.g. [data.eval.train_eval]"
                                     : std::string("an evaluation set's name is ") +
                                           kSplitNameRule + "; hint: e.g. [data.eval.valid]"));
    const std::string section = "data.eval." + name;
    sets.push_back(
        {name, component(registry, table_or_empty(eval, name, section), section, KEEL_KIND_DATASET)});
  }
  return sets;
}

// [models.NAME]: the models a [step] runs beside [model], ordered by name. A name is a split
// name's (config/split_name.hpp), not "model" (what the step calls [model]).
std::vector<NamedModelSpec> named_models(const Manifest& m, const Registry& registry,
                                         bool has_step) {
  std::vector<NamedModelSpec> out;
  if (!m.root.get("models")) return out;
  const toml::table& models = table_or_empty(m.root, "models", "models");
  if (models.empty())
    throw Error(where(models.source()) + ": [models] holds no model; hint: name each in its own "
                "table, e.g. [models.teacher] with type = \"<model>\" and init_from");
  for (const auto& [k, v] : models) {  // toml::table: in the order of the names
    const std::string name(k.str());
    const std::string section = "models." + name;
    if (!valid_split_name(name) || name == "model")
      throw Error(where(k.source()) + ": [" + text::printable(section) + "]: " +
                  (name == "model" ? std::string("\"model\" is what a step calls [model]; hint: "
                                                 "choose another name, e.g. [models.teacher]")
                                   : std::string("a model's name is ") + kSplitNameRule +
                                         "; hint: e.g. [models.teacher]"));
    const toml::table& table = table_or_empty(models, name, section);
    NamedModelSpec spec;
    spec.name = name;
    keel_options values;
    spec.model = component(registry, table, section, KEEL_KIND_MODEL, named_model_keys().schema,
                           &values);
    named_model_keys().land(values, spec);
    if (!spec.frozen)
      throw Error(where(table.get("frozen")->source()) + ": " + section + ".frozen = false: a "
                  "model trained beside [model] is not supported; hint: train it in a run of its "
                  "own and load it here frozen from that run's checkpoint (init_from)");
    if (spec.init_from.empty())
      throw Error(where(table.source()) + ": [" + section + "] has no init_from: a frozen model "
                  "needs its weights; hint: init_from = \"runs/<name>/checkpoints/step-<N>\"");
    if (!has_step)
      throw Error(where(k.source()) + ": [" + section + "] is run only by a [step], and the "
                  "manifest has none; hint: add [step] (e.g. type = \"distill\"), or remove the "
                  "table");
    out.push_back(std::move(spec));
  }
  return out;
}

// [model], [data.train], [data.test], [data.eval.NAME], [optimizer] (with
// [[optimizer.groups]]), [loss] and the optional [sparse_optimizer], [lr_scheduler],
// [grad_clipper], [mfu], [profiler], [step] and [models.NAME].
void component_sections(const Manifest& m, const Registry& registry, RunConfig& rc) {
  // `kernel_tables`: keys of the table that belong to the kernel ([[optimizer.groups]]).
  auto required = [&](const char* key, keel_kind kind,
                      const std::set<std::string>& kernel_tables = {}) {
    if (!m.root.get(key))
      throw Error(m.path + ": the manifest has no [" + key + "] table; hint: add one with type = \"<" +
                  kind_name(kind) + ">\"");
    return component(registry, table_or_empty(m.root, key, key), key, kind, {}, nullptr,
                     kernel_tables);
  };
  auto optional = [&](const char* key, keel_kind kind) -> std::optional<ComponentSpec> {
    if (!m.root.get(key)) return std::nullopt;
    return component(registry, table_or_empty(m.root, key, key), key, kind);
  };
  rc.model = required("model", KEEL_KIND_MODEL);
  const toml::table& data = table_or_empty(m.root, "data", "data");
  for (const auto& [k, v] : data)
    if (k.str() != "train" && k.str() != "test" && k.str() != "eval")
      throw Error(where(k.source()) + ": unknown table [data." + std::string(k.str()) +
                  "]; hint: " + text::did_you_mean(std::string(k.str()), {"train", "test", "eval"}) +
                  "datasets go in [data.train], [data.test] and [data.eval.NAME]");
  if (!data.get("train"))
    throw Error(m.path + ": the manifest has no [data.train] table; hint: add one with type = \"<dataset>\"");
  rc.train_data = component(registry, table_or_empty(data, "train", "data.train"), "data.train",
                            KEEL_KIND_DATASET);
  rc.eval_sets = eval_sets(data, registry);
  if (rc.eval_sets.empty() && rc.run.mode == RunMode::kEvaluate)
    throw Error(m.path + ": run.mode = \"evaluate\" needs an evaluation set ([data.test] or "
                "[data.eval.NAME]) to evaluate on; hint: add [data.test] with type = \"<dataset>\"");
  rc.optimizer = required("optimizer", KEEL_KIND_OPTIMIZER, {"groups"});
  rc.param_groups = param_groups(table_or_empty(m.root, "optimizer", "optimizer"));
  rc.sparse_optimizer = optional("sparse_optimizer", KEEL_KIND_SPARSE_OPTIMIZER);
  rc.loss = required("loss", KEEL_KIND_LOSS);
  rc.lr_scheduler = optional("lr_scheduler", KEEL_KIND_LR_SCHEDULER);
  rc.grad_clipper = optional("grad_clipper", KEEL_KIND_GRAD_CLIPPER);
  rc.mfu = optional("mfu", KEEL_KIND_MFU);
  rc.profiler = optional("profiler", KEEL_KIND_PROFILER);
  rc.step = optional("step", KEEL_KIND_STEP);
  rc.models = named_models(m, registry, rc.step.has_value());
}

// [checkpoint]: its backend (when there is the table) and the kernel's keys (always).
void checkpoint_section(const Manifest& m, const Registry& registry, RunConfig& rc) {
  const toml::table& ct = table_or_empty(m.root, "checkpoint", "checkpoint");
  keel_options values;
  if (m.root.get("checkpoint"))
    rc.checkpoint = component(registry, ct, "checkpoint", KEEL_KIND_CHECKPOINT,
                              checkpoint_keys().schema, &values, {"init_rename"});
  else
    values = validate_options(ct, "checkpoint", "keel options checkpoint",
                              checkpoint_keys().schema);
  rc.checkpointing = checkpoint_keys_of(ct, values);
  // keep_best ranks by a split the run records: "train" or an evaluation set's name.
  const std::string& metric = rc.checkpointing.best_metric;
  const std::string split = metric.substr(0, metric.find('.'));
  std::vector<std::string> splits = {"train"};
  for (const EvalSetSpec& set : rc.eval_sets) splits.push_back(set.name);
  if (rc.checkpointing.keep_best > 0 &&
      std::find(splits.begin(), splits.end(), split) == splits.end())
    throw Error((ct.get("best_metric") ? where(ct.get("best_metric")->source())
                                       : where(ct.source())) +
                ": checkpoint.best_metric = \"" + text::printable(metric) + "\" names split \"" +
                text::printable(split) + "\", which this run does not record; hint: " +
                text::did_you_mean(split, splits) + "the splits are " +
                text::join(splits) + " (train and the evaluation sets)");
}

// A component's table in manifest.resolved.toml: its options, defaults filled in, and `type`:
// the bare name, or the one this run uses where several plugins provide the name.
toml::table resolved_table(const Registry& registry, const ComponentSpec& spec) {
  toml::table t = to_toml(spec.options);
  const Component& c = *spec.component;
  t.insert("type", registry.matches(c.kind, c.name).size() > 1 ? c.qualified_name() : c.name);
  return t;
}

toml::table resolved_manifest(const Manifest& m, const Registry& registry, const RunConfig& rc) {
  toml::table r;
  r.insert("run", run_keys().resolved(rc.run));
  toml::array paths;
  for (const auto& p : rc.plugins.dirs) paths.push_back(p);
  toml::table require;
  for (const auto& q : rc.plugins.require) require.insert_or_assign(q.name, q.requirement);
  r.insert("plugins", toml::table{{"paths", std::move(paths)}, {"require", std::move(require)}});
  toml::table train = train_keys().resolved(rc.train);
  // With global_batch, grad_accum is derived from it at assembly (batch_size, ranks): written,
  // it would be refused beside global_batch when the resolved manifest is read again.
  if (rc.train.global_batch > 0) train.erase("grad_accum");
  r.insert("train", std::move(train));
  r.insert("distributed", distributed_keys().resolved(rc.distributed));
  r.insert("model", resolved_table(registry, rc.model));
  toml::table data_t;
  data_t.insert("train", resolved_table(registry, rc.train_data));
  toml::table eval_t;
  for (const EvalSetSpec& set : rc.eval_sets)
    if (set.name == "test")
      data_t.insert("test", resolved_table(registry, set.data));
    else
      eval_t.insert(set.name, resolved_table(registry, set.data));
  if (!eval_t.empty()) data_t.insert("eval", std::move(eval_t));
  r.insert("data", std::move(data_t));
  toml::table optimizer_t = resolved_table(registry, rc.optimizer);
  // The groups as written (a left-out lr is the optimizer's own, which no value states).
  if (const toml::node* groups = table_or_empty(m.root, "optimizer", "optimizer").get("groups"))
    optimizer_t.insert("groups", *groups);
  r.insert("optimizer", std::move(optimizer_t));
  if (rc.sparse_optimizer) r.insert("sparse_optimizer", resolved_table(registry, *rc.sparse_optimizer));
  r.insert("loss", resolved_table(registry, rc.loss));
  for (const auto& [key, spec] : {std::pair{"lr_scheduler", &rc.lr_scheduler},
                                  {"grad_clipper", &rc.grad_clipper}, {"mfu", &rc.mfu},
                                  {"profiler", &rc.profiler}, {"step", &rc.step}})
    if (*spec) r.insert(key, resolved_table(registry, **spec));
  toml::table models_t;
  for (const NamedModelSpec& spec : rc.models) {
    toml::table t = resolved_table(registry, spec.model);
    for (auto&& [k, v] : named_model_keys().resolved(spec)) t.insert(k, v);
    models_t.insert(spec.name, std::move(t));
  }
  if (!models_t.empty()) r.insert("models", std::move(models_t));
  if (rc.checkpoint) {
    toml::table ct = resolved_table(registry, *rc.checkpoint);
    for (auto&& [k, v] : checkpoint_keys().resolved(rc.checkpointing)) ct.insert(k, v);
    if (!rc.checkpointing.init_rename.empty()) {
      toml::table rn;
      for (const auto& [from, to] : rc.checkpointing.init_rename) rn.insert(from, to);
      ct.insert("init_rename", std::move(rn));
    }
    r.insert("checkpoint", std::move(ct));
  }
  toml::array hooks_t;
  for (const auto& h : rc.hooks) {
    toml::table t = resolved_table(registry, h);
    for (auto&& [k, v] : hook_keys().resolved(h)) t.insert(k, v);
    hooks_t.push_back(std::move(t));
  }
  r.insert("hooks", std::move(hooks_t));
  return r;
}

}  // namespace

std::string resolved_text(const RunConfig& config) {
  std::ostringstream text;
  text << "# Resolved from " << config.manifest_path << " (extends, --set and defaults applied)\n"
       << toml_text(config.resolved);
  return text.str();
}

RunConfig resolve(const Manifest& m, Registry& registry, bool use_lock) {
  RunConfig rc;
  rc.manifest_path = m.path;
  check_sections(m);
  load_plugins(m, registry, use_lock, rc);
  rc.run = run_section(m);
  rc.distributed = kernel_section(m, distributed_keys());
  rc.train = train_section(m, rc.run);
  component_sections(m, registry, rc);
  checkpoint_section(m, registry, rc);
  rc.hooks = hooks(m, registry);
  rc.resolved = resolved_manifest(m, registry, rc);
  // Second copies of plugins (those the run uses with another version failed above).
  for (const Shadowed& other : registry.shadowed())
    spdlog::warn("plugin {} {} at {} is not used: {} {} at {} comes first on the search path; "
                 "remove one of the two from the search path",
                 other.name, other.version, other.path, other.used->name, other.used->version,
                 other.used->path);
  return rc;
}

}  // namespace keel
