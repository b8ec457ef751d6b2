#include "run_config.hpp"

#include <filesystem>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "error.hpp"
#include "keel/schema.hpp"
#include "loader/lock.hpp"
#include "loader/installed.hpp"
#include "loader/semver.hpp"
#include "text/text.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

using keel::opt_bool;
using keel::opt_float;
using keel::opt_int;
using keel::opt_path;
using keel::opt_string;

const Schema kRunSchema = {
    opt_string("name", "\"keel\"", "run name"),
    opt_string("output_dir", "\"\"", "run directory (default runs/<name>)"),
    opt_int("seed", "0", "seed for weights, shuffling and dropout", 0, 9.0e15),
    opt_int("threads", "0",
            "intra-op threads (0: the cores / the processes on this machine); BLAS runs "
            "single-threaded", 0, 4096),
    opt_string("device", "\"cpu\"",
               "where the model, optimizer state and batches live: cpu, cuda (under a launcher: "
               "the GPU of LOCAL_RANK), cuda:N, or auto (cuda when there is one, else cpu)"),
    opt_string("mode", "\"train_and_evaluate\"", "what the run does",
               "train_and_evaluate|train|evaluate"),
    opt_bool("malloc_tuning", "true",
             "keep large freed blocks in the heap (fewer page faults per step)"),
};
const Schema kTrainSchema = {
    opt_int("epochs", "1", "epochs to train (0: no epoch limit)", 0, 1e9),
    opt_int("max_steps", "0", "optimizer steps to train (0: no limit)", 0, 1e15),
    opt_int("max_samples", "0", "training samples to consume (0: no limit)", 0, 9e15),
    opt_int("max_tokens", "0", "training tokens to consume (0: no limit)", 0, 9e15),
    opt_int("grad_accum", "1", "micro-batches per optimizer step", 1, 1e6),
    opt_string("accum_normalization", "\"auto\"",
               "auto: by item count when the loss reports one, else mean over micro-batches",
               "auto|mean|items"),
    opt_string("precision", "\"fp32\"", "bf16: autocast on the run's device; fp16: CUDA autocast with loss scaling",
               "fp32|bf16|fp16"),
    opt_string("nonfinite", "\"error\"", "on a NaN/Inf loss or gradient norm", "error|skip"),
    opt_int("max_skips", "10", "skip policy: abort after this many skipped steps", 0, 1e15),
    opt_int("log_every", "50", "steps between training metric records", 1, 1e15),
    opt_bool("eval_each_epoch", "true", "evaluate [data.test] after each epoch"),
    opt_int("eval_every_steps", "0", "also evaluate every N optimizer steps (0: never)", 0, 1e15),
    opt_int("eval_max_batches", "0", "batches per evaluation (0: the whole split)", 0, 1e15),
};
const Schema kDistributedSchema = {
    opt_int("timeout_s", "300",
            "seconds a rank waits for the others (rendezvous, every collective) before it fails",
            1, 86400),
    opt_string("backend", "\"auto\"", "collectives: auto (nccl for CUDA, else gloo), gloo, nccl",
               "auto|gloo|nccl"),
    opt_int("bucket_cap_mb", "25", "gradient all-reduce bucket size in MiB (DDP's bucket_cap_mb)",
            1, 4096),
};
const Schema kHookKernelSchema = {
    opt_int("priority", "0", "hooks run in ascending priority, ties in manifest order", -1e9, 1e9),
    opt_string("label", "\"\"",
               "name of the hook's state in checkpoints (default: its type); give two hooks of "
               "one type that keep state distinct labels"),
};
// One [[optimizer.groups]] table; a value left out keeps the optimizer's own.
const Schema kGroupSchema = {
    opt_string("params", nullptr, "regex matched against whole parameter names"),
    opt_float("lr", "-1.0", "learning rate of the group (left out: the optimizer's own)"),
    opt_float("weight_decay", "-1.0",
              "weight decay of the group (left out: the optimizer's own)"),
};
const Schema kCheckpointKernelSchema = {
    opt_int("every_steps", "0", "save every N optimizer steps (0: never during training)", 0, 1e15),
    opt_int("keep_last", "0",
            "keep this run's newest N checkpoints (0 with keep_best 0: keep all)", 0, 1e9),
    opt_int("keep_best", "0", "also keep this run's best N checkpoints by best_metric", 0, 1e9),
    opt_string("best_metric", "\"test.loss\"",
               "metric keep_best ranks by: <split>.<key> of the latest record at the save"),
    opt_string("best_mode", "\"min\"", "whether a smaller or larger best_metric is better",
               "min|max"),
    opt_bool("at_end", "true", "save when training ends"),
    opt_bool("initial", "false", "save step-0 before the first step"),
    opt_bool("async", "false",
             "write checkpoints on a background thread from an in-memory copy (one at a time)"),
    opt_path("init_from", "\"\"",
             "checkpoint directory whose model weights (and hook state) start the run"),
    opt_string("init_include", "\"\"",
               "init_from: load only model tensors whose name matches this regex (\"\": all)"),
    opt_string("init_exclude", "\"\"",
               "init_from: keep the initialisation of tensors matching this regex"),
    opt_bool("init_from_unverified", "false",
             "init_from: load a directory without a commit record with a backend other than "
             "safetensors"),
};

const std::vector<std::string> kTopLevel = {"run", "plugins", "train", "model", "data",
                                            "optimizer", "lr_scheduler", "loss", "grad_clipper",
                                            "mfu", "profiler", "checkpoint", "hooks", "distributed",
                                            "extends"};

const toml::table& table_or_empty(const toml::table& root, const std::string& key,
                                  const std::string& where_label) {
  static const toml::table empty;
  const toml::node* n = root.get(key);
  if (!n) return empty;
  if (!n->is_table())
    throw Error(where(n->source()) + ": [" + where_label + "] must be a table; hint: write it "
                "as a [" + where_label + "] header followed by its keys");
  return *n->as_table();
}

// Resolves one component table: `type` names the plugin component of `kind`.
ComponentSpec component(const Registry& registry, const toml::table& table,
                        const std::string& section, keel_kind kind,
                        const Schema& kernel_schema, keel_options* kernel_values,
                        const std::set<std::string>& kernel_tables = {}) {
  ComponentSpec spec;
  spec.section = section;
  const toml::node* type = table.get("type");
  std::vector<std::string> names;
  for (const Component* c : registry.of_kind(kind)) names.push_back(c->name);
  const std::string available = text::join(names);
  if (!type || !type->is_string())
    throw Error(where(type ? type->source() : table.source()) + ": [" + section +
                "] needs type = \"<" + kind_name(kind) + ">\" (available: " +
                (available.empty() ? "none found" : available) +
                "); hint: `keel plugins` lists every component found");
  const std::string name = type->as_string()->get();
  const std::vector<const Component*> found = registry.matches(kind, name);
  if (found.size() > 1) {
    std::string which, qualified;
    for (const Component* c : found) {
      which += std::string(which.empty() ? "" : " and ") + c->plugin->name + " (" +
               c->plugin->path + ")";
      qualified += std::string(qualified.empty() ? "" : " or ") + "type = \"" +
                   c->qualified_name() + "\"";
    }
    throw Error(where(type->source()) + ": [" + section + "].type: " + std::to_string(found.size()) +
                " plugins provide " + kind_name(kind) + " '" + name + "': " + which +
                "; hint: name the one you want as " + qualified +
                ", or remove one of the files from the search path");
  }
  if (found.empty()) {
    const std::string refused = registry.refusal_summary();
    throw Error(where(type->source()) + ": [" + section + "].type: no " + kind_name(kind) +
                " named '" + name + "' (available: " + (available.empty() ? "none" : available) +
                ")" + (refused.empty() ? "" : "; " + refused) + "; hint: " +
                text::did_you_mean(name, names) +
                "`keel plugins` lists what was found and why files were refused");
  }
  spec.component = found[0];
  // A second copy of its plugin, of another version, was refused: the run would silently use
  // whichever comes first on the search path.
  for (const Shadowed& other : registry.shadowed())
    if (other.used == spec.component->plugin && other.version != other.used->version)
      throw Error(where(type->source()) + ": [" + section + "].type: " + kind_name(kind) + " '" +
                  name + "' comes from plugin " + other.name + " " + other.used->version + " (" +
                  other.used->path + "), and another version of that plugin, " + other.version +
                  " (" + other.path + "), is on the search path too; hint: remove the copy you "
                  "do not want from the search path (`keel plugins` lists both)");
  Schema schema = spec.component->options;
  std::set<std::string> reserved = kernel_tables;
  reserved.insert("type");
  for (const auto& k : kernel_schema) reserved.insert(k.key);
  // Sections with kernel keys are documented by two commands.
  const std::string docs =
      "keel plugins show " + name +
      (kernel_schema.empty() ? "" : "` and `keel options " + section.substr(0, section.find('[')));
  spec.options = validate_options(table, section, docs, schema, reserved);
  if (kernel_values) {
    // The kernel's own keys of this section, validated the same way.
    std::set<std::string> plugin_keys = kernel_tables;
    plugin_keys.insert("type");
    for (const auto& o : schema) plugin_keys.insert(o.key);
    *kernel_values = validate_options(table, section, docs, kernel_schema, plugin_keys);
  }
  return spec;
}

// What std::regex_error's code means, in words (its what() is implementation text).
std::string regex_problem(std::regex_constants::error_type code) {
  namespace rc = std::regex_constants;
  switch (code) {
    case rc::error_collate: return "invalid collating element name";
    case rc::error_ctype: return "invalid character class name";
    case rc::error_escape: return "invalid escape or trailing backslash";
    case rc::error_backref: return "invalid back reference";
    case rc::error_brack: return "unmatched [ or ]";
    case rc::error_paren: return "unmatched ( or )";
    case rc::error_brace: return "unmatched { or }";
    case rc::error_badbrace: return "invalid range in { }";
    case rc::error_range: return "invalid character range";
    case rc::error_space: return "out of memory";
    case rc::error_badrepeat: return "*, +, ? or { } repeats nothing";
    case rc::error_complexity: return "too complex";
    case rc::error_stack: return "too complex (stack)";
    default: return "invalid";
  }
}

template <class T>
T get(const keel_options& o, const char* key) {
  return std::get<T>(o.values.at(key));
}

// [[optimizer.groups]]: each a table with `params` (a regex) and optional lr / weight_decay.
std::vector<ParamGroupSpec> param_groups(const toml::table& optimizer, const std::string& name) {
  std::vector<ParamGroupSpec> out;
  const toml::node* groups = optimizer.get("groups");
  if (!groups) return out;
  const toml::array* a = groups->as_array();
  if (!a || !a->is_array_of_tables())
    throw Error(where(groups->source()) + ": optimizer.groups must be an array of tables; hint: "
                "write each as [[optimizer.groups]] with params = \"<regex>\"");
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::table& t = *(*a)[i].as_table();
    const std::string section = "optimizer.groups[" + std::to_string(i) + "]";
    const keel_options o = validate_options(t, section, "keel options optimizer.groups", kGroupSchema);
    ParamGroupSpec g;
    g.params = get<std::string>(o, "params");
    g.where = where(t.get("params")->source());
    for (const char* key : {"lr", "weight_decay"}) {
      const toml::node* n = t.get(key);
      if (!n) continue;
      const double v = get<double>(o, key);
      if (v < 0)
        throw Error(where(n->source()) + ": " + section + "." + key + ": must be >= 0, got " +
                    std::to_string(v) + "; hint: leave it out to keep the optimizer's own value");
      (std::string(key) == "lr" ? g.lr : g.weight_decay) = v;
    }
    try {
      std::regex check(g.params);
    } catch (const std::regex_error& e) {
      throw Error(where(t.get("params")->source()) + ": " + section +
                  ".params: invalid regular expression (" + regex_problem(e.code()) +
                  "); hint: params is an ECMAScript regular expression matched against whole "
                  "parameter names, e.g. \"fc1\\\\..*\"");
    }
    out.push_back(std::move(g));
  }
  return out;
}

template <class E>
E choose(const keel_options& o, const char* key, std::initializer_list<std::pair<const char*, E>> m) {
  const std::string v = get<std::string>(o, key);
  for (const auto& [name, e] : m)
    if (v == name) return e;
  throw Error(std::string("internal: unhandled choice ") + key + " = " + v);  // schema-checked
}

toml::table resolved_table(const ComponentSpec& spec, const keel_options* kernel_values) {
  toml::table t = to_toml(spec.options);
  if (kernel_values) {
    for (auto&& [k, v] : to_toml(*kernel_values)) t.insert(k, v);
  }
  t.insert("type", spec.component->name);
  return t;
}

}  // namespace

const std::vector<KernelTable>& kernel_tables() {
  static const std::vector<KernelTable> tables = {
      {"run", "the run: name, run directory, seed, threads, device, mode", &kRunSchema},
      {"train", "the loop: stop targets, accumulation, precision, logging, evaluation",
       &kTrainSchema},
      {"distributed", "several processes (torchrun, Slurm, Open MPI): timeout, backend, buckets",
       &kDistributedSchema},
      {"checkpoint",
       "kernel keys of [checkpoint] (beside the backend's own options), and the "
       "[checkpoint.init_rename] table of init_from prefix rewrites (\"ckpt.\" = \"model.\")",
       &kCheckpointKernelSchema},
      {"hooks", "kernel keys of each [[hooks]] table (beside the hook's own options)",
       &kHookKernelSchema},
      {"optimizer.groups", "each [[optimizer.groups]] table: parameter groups", &kGroupSchema},
  };
  return tables;
}

PluginsTable manifest_plugins(const Manifest& m) {
  const toml::table& t = table_or_empty(m.root, "plugins", "plugins");
  PluginsTable out;
  for (const auto& [k, v] : t)
    if (k.str() != "paths" && k.str() != "require" && k.str() != "locked")
      throw Error(where(k.source()) + ": unknown key '" + std::string(k.str()) +
                  "' in [plugins]; hint: " +
                  text::did_you_mean(std::string(k.str()), {"paths", "require", "locked"}) +
                  "its keys are paths, require and locked (`keel options plugins`)");
  if (const toml::node* locked = t.get("locked")) {
    if (!locked->is_boolean())
      throw Error(where(locked->source()) + ": plugins.locked: expected true or false; hint: "
                  "locked = true makes a missing lock an error");
    out.locked = locked->as_boolean()->get();
    out.locked_where = where(locked->source());
  }
  if (const toml::node* paths = t.get("paths")) {
    const toml::array* a = paths->as_array();
    if (!a)
      throw Error(where(paths->source()) + ": plugins.paths: expected a list of strings; hint: "
                  "e.g. paths = [\"my_plugins\"] (relative to this manifest)");
    for (const auto& e : *a) {
      if (!e.is_string())
        throw Error(where(e.source()) + ": plugins.paths: expected a list of strings; hint: "
                    "e.g. paths = [\"my_plugins\"] (relative to this manifest)");
      const std::string dir = e.as_string()->get();
      const std::string abs = absolute_path(e, dir.empty() ? "." : dir);  // "": the manifest's
      std::error_code ec;
      if (!fs::is_directory(abs, ec))
        throw Error(where(e.source()) + ": plugins.paths: " + abs +
                    (fs::exists(abs, ec) ? " is not a directory" : " does not exist") +
                    "; hint: paths are relative to the manifest that sets them; create the "
                    "directory or remove the entry");
      out.dirs.push_back(abs);
    }
  }
  if (const toml::node* require = t.get("require")) {
    const toml::table* r = require->as_table();
    if (!r)
      throw Error(where(require->source()) + ": plugins.require: expected a table of plugin "
                  "names and version requirements; hint: require = { \"acme-losses\" = "
                  "\">=1.2, <2\" }");
    for (const auto& [k, v] : *r) {
      const std::string name(k.str());
      if (!v.is_string())
        throw Error(where(v.source()) + ": plugins.require." + name + ": expected a version "
                    "requirement string; hint: \"" + name + "\" = \">=1.2, <2\"");
      PluginRequirement req{name, v.as_string()->get(), where(v.source())};
      try {
        (void)VersionRequirement::parse(req.requirement);
      } catch (const Error& e) {
        throw Error(req.where + ": plugins.require." + name + ": " + e.what() +
                    "; hint: comparators such as \">=1.2, <2\", \"^1.2\", \"~1.2.3\", "
                    "\"=1.2.3\" or \"*\", separated by commas");
      }
      out.require.push_back(std::move(req));
    }
  }
  return out;
}

std::optional<Lock> manifest_lock(const Manifest& m, const PluginsTable& plugins) {
  std::optional<Lock> lock = find_lock(m.files);
  if (!lock && plugins.locked) {
    std::string looked;
    for (const auto& f : m.files) looked += (looked.empty() ? "" : ", ") + lock_path_for(f);
    throw Error(plugins.locked_where + ": plugins.locked = true, but there is no lock (looked "
                "for " + looked + "); hint: review the plugins the run uses, then `keel plugins "
                "lock " + m.path + "` writes one");
  }
  return lock;
}

std::vector<const ComponentSpec*> used_components(const RunConfig& cfg) {
  std::vector<const ComponentSpec*> specs = {&cfg.model, &cfg.train_data, &cfg.optimizer,
                                             &cfg.loss};
  for (const auto* o : {&cfg.test_data, &cfg.lr_scheduler, &cfg.grad_clipper, &cfg.mfu,
                        &cfg.profiler, &cfg.checkpoint})
    if (*o) specs.push_back(&**o);
  for (const auto& h : cfg.hooks) specs.push_back(&h);
  return specs;
}

std::string used_plugins_json(const RunConfig& cfg) {
  // One entry per plugin file, in the order of first use, with the components it provides.
  nlohmann::ordered_json plugins = nlohmann::ordered_json::array();
  std::map<const LoadedPlugin*, size_t> index;
  for (const ComponentSpec* spec : used_components(cfg)) {
    const LoadedPlugin* p = spec->component->plugin;
    if (!p) continue;
    auto [it, added] = index.emplace(p, plugins.size());
    if (added)
      plugins.push_back({{"name", p->name},
                         {"version", p->version},
                         {"sha256", p->sha256},
                         {"path", p->path},
                         {"components", nlohmann::ordered_json::array()}});
    plugins[it->second]["components"].push_back(spec->section + ":" + spec->component->name);
  }
  return nlohmann::ordered_json{{"plugins", plugins}}.dump(2) + "\n";
}

namespace {

// With a lock in use, every plugin it lists must have been loaded (by its hash).
void check_lock(const Registry& registry, const Lock& lock) {
  for (const LockEntry& e : lock.entries) {
    bool loaded = false;
    for (const auto& p : registry.plugins()) loaded |= p->sha256 == e.sha256;
    if (loaded) continue;
    std::string why = "no file with its sha256 was found on the search path";
    for (const Refusal& r : registry.refusals())
      if (lock.by_path(r.path) == &e) why = r.path + ": " + without_hint(r.reason);
    throw Error(lock.file + ": plugin " + e.name + " " + e.version + " (sha256 " +
                e.sha256.substr(0, 16) + "...) is locked but was not loaded: " + why +
                "; hint: restore the locked file, or review the new one and run `keel plugins "
                "lock " + lock.manifest + " --update " + e.name + "`");
  }
}

void check_requirements(const Registry& registry, const std::vector<PluginRequirement>& reqs) {
  for (const PluginRequirement& r : reqs) {
    const std::string what = r.where + ": plugins.require: " + r.name + " " + r.requirement;
    const LoadedPlugin* p = registry.plugin_named(r.name);
    if (!p) {
      // Installed versions that do not meet the requirement are not searched: name them.
      std::string installed;
      try {
        for (const auto& pkg : list_installed(default_install_root()))
          if (pkg.info.name == r.name && pkg.problem.empty())
            installed += (installed.empty() ? "" : ", ") + pkg.info.version;
      } catch (const Error&) {
      }
      const std::string refused = registry.refusal_summary();
      throw Error(what + ": " +
                  (installed.empty() ? "no plugin named '" + r.name + "' was found"
                                     : "no installed version meets it (installed: " +
                                           installed + ")") +
                  (refused.empty() ? "" : "; " + refused) + "; hint: install a version that "
                  "satisfies it (keel plugins install PACKAGE), or add its directory to "
                  "[plugins] paths; `keel plugins` lists what was found");
    }
    std::optional<Version> v;
    try {
      v = Version::parse(p->version);
    } catch (const Error& e) {
      throw Error(what + ": found " + r.name + " version '" + p->version + "' (" + p->path +
                  "), which is not a semantic version (" + e.what() + "); hint: ask its author "
                  "for a MAJOR.MINOR.PATCH version, or drop the requirement");
    }
    if (!VersionRequirement::parse(r.requirement).matches(*v))
      throw Error(what + ": found " + r.name + " " + p->version + " (" + p->path +
                  "), which does not satisfy it; hint: install a version that does (keel "
                  "plugins install PACKAGE; `keel plugins` lists installed versions), or change "
                  "the requirement");
  }
}

}  // namespace

RunConfig resolve(const Manifest& m, Registry& registry, bool use_lock) {
  RunConfig rc;
  rc.manifest_path = m.path;
  for (const auto& [k, v] : m.root) {
    const std::string key(k.str());
    if (std::find(kTopLevel.begin(), kTopLevel.end(), key) == kTopLevel.end())
      throw Error(where(k.source()) + ": unknown section '" + key + "'; hint: " +
                  text::did_you_mean(key, kTopLevel) +
                  "a manifest holds run, plugins, train, model, data, optimizer, lr_scheduler, "
                  "loss, grad_clipper, mfu, profiler, checkpoint, hooks, distributed (README, "
                  "\"Manifest\")");
  }

  const PluginsTable plugins = manifest_plugins(m);
  rc.plugin_paths = plugins.dirs;
  rc.plugin_requirements = plugins.require;
  if (std::optional<Lock> lock = use_lock ? manifest_lock(m, plugins) : std::nullopt) {
    rc.lock_file = lock->file;
    registry.use_lock(std::move(*lock));
  }
  registry.discover(plugin_search_path(rc.plugin_paths, rc.plugin_requirements));
  if (use_lock && registry.lock()) check_lock(registry, *registry.lock());
  check_requirements(registry, rc.plugin_requirements);

  const keel_options run = validate_options(table_or_empty(m.root, "run", "run"), "run",
                                            "keel options run", kRunSchema);
  rc.name = get<std::string>(run, "name");
  rc.output_dir = get<std::string>(run, "output_dir");
  if (rc.output_dir.empty()) rc.output_dir = "runs/" + rc.name;
  // Absolute, so that manifest.resolved.toml reruns the run from any working directory.
  rc.output_dir = fs::absolute(rc.output_dir).lexically_normal().string();
  rc.seed = static_cast<uint64_t>(get<int64_t>(run, "seed"));
  rc.threads = get<int64_t>(run, "threads");
  rc.malloc_tuning = get<bool>(run, "malloc_tuning");
  rc.device = get<std::string>(run, "device");
  {
    const toml::table* t = m.root.get("run") ? m.root.get("run")->as_table() : nullptr;
    const std::string at = t && t->get("device") ? where(t->get("device")->source()) + ": run.device"
                                                 : m.path + ": run.device";
    static const std::regex kDevice("cpu|auto|cuda(:[0-9]{1,4})?");
    if (!std::regex_match(rc.device, kDevice))
      throw Error(at + " = \"" + rc.device + "\" is not a device; hint: use \"cpu\", \"cuda\", "
                  "\"cuda:N\" or \"auto\"");
#ifndef KEEL_WITH_CUDA
    if (rc.device.rfind("cuda", 0) == 0)
      throw Error(at + " = \"" + rc.device + "\": this keel is built against a LibTorch without "
                  "CUDA (Debian's libtorch-dev is CPU-only); hint: use device = \"cpu\" or "
                  "\"auto\", or rebuild keel with -Dtorch_prefix= pointing at a CUDA LibTorch");
#endif
  }
  const keel_options dist = validate_options(
      table_or_empty(m.root, "distributed", "distributed"), "distributed",
      "keel options distributed", kDistributedSchema);
  rc.dist_timeout_s = get<int64_t>(dist, "timeout_s");
  rc.dist_backend = get<std::string>(dist, "backend");
  rc.dist_bucket_cap_mb = get<int64_t>(dist, "bucket_cap_mb");
  rc.mode = choose<RunMode>(run, "mode", {{"train_and_evaluate", RunMode::kTrainAndEvaluate},
                                          {"train", RunMode::kTrain},
                                          {"evaluate", RunMode::kEvaluate}});

  const keel_options train = validate_options(table_or_empty(m.root, "train", "train"), "train",
                                              "keel options train", kTrainSchema);
  rc.epochs = get<int64_t>(train, "epochs");
  rc.max_steps = get<int64_t>(train, "max_steps");
  rc.log_every = get<int64_t>(train, "log_every");
  rc.eval_each_epoch = get<bool>(train, "eval_each_epoch");
  rc.eval_max_batches = get<int64_t>(train, "eval_max_batches");
  rc.eval_every_steps = get<int64_t>(train, "eval_every_steps");
  rc.max_samples = get<int64_t>(train, "max_samples");
  rc.max_tokens = get<int64_t>(train, "max_tokens");
  rc.grad_accum = get<int64_t>(train, "grad_accum");
  rc.max_skips = get<int64_t>(train, "max_skips");
  rc.accum_normalization = choose<AccumNorm>(
      train, "accum_normalization",
      {{"auto", AccumNorm::kAuto}, {"mean", AccumNorm::kMean}, {"items", AccumNorm::kItems}});
  rc.precision = choose<Precision>(
      train, "precision",
      {{"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}});
  rc.nonfinite =
      choose<NonFinite>(train, "nonfinite", {{"error", NonFinite::kError}, {"skip", NonFinite::kSkip}});
  // Where a [train] key was set (the file that set it, or --set), else [train] or the file.
  const auto train_where = [&](const char* key) {
    const toml::table* t = m.root.get("train") ? m.root.get("train")->as_table() : nullptr;
    if (t && t->get(key)) return where(t->get(key)->source()) + ": train." + key;
    return (t ? where(t->source()) : m.path) + ": [train]";
  };
  if (rc.epochs == 0 && rc.max_steps == 0 && rc.max_samples == 0 && rc.max_tokens == 0)
    throw Error(train_where("epochs") +
                ": no stop target is set (epochs, max_steps, max_samples and max_tokens are all "
                "0), so the run would never end; hint: set epochs = N or max_steps = N");
#ifndef KEEL_WITH_CUDA
  if (rc.precision == Precision::kFp16)
    throw Error(train_where("precision") + ": \"fp16\" needs a CUDA build of LibTorch and "
                "this keel is CPU-only; hint: use precision = \"bf16\" (CPU autocast)");
#endif
  if (rc.precision == Precision::kFp16 && rc.device == "cpu")
    throw Error(train_where("precision") + ": \"fp16\" (with loss scaling) runs only on CUDA, "
                "and run.device = \"cpu\"; hint: set [run] device = \"cuda\", or use "
                "precision = \"bf16\"");

  // `kernel_tables`: keys of the table that belong to the kernel ([[optimizer.groups]]).
  auto required = [&](const char* key, keel_kind kind,
                      const std::set<std::string>& kernel_tables = {}) {
    const toml::node* n = m.root.get(key);
    if (!n)
      throw Error(m.path + ": the manifest has no [" + key + "] table; hint: add one with type = \"<" +
                  kind_name(kind) + ">\"");
    return component(registry, table_or_empty(m.root, key, key), key, kind, {}, nullptr,
                     kernel_tables);
  };
  auto optional = [&](const char* key, keel_kind kind) -> std::optional<ComponentSpec> {
    if (!m.root.get(key)) return std::nullopt;
    return component(registry, table_or_empty(m.root, key, key), key, kind, {}, nullptr);
  };

  rc.model = required("model", KEEL_KIND_MODEL);
  const toml::table& data = table_or_empty(m.root, "data", "data");
  for (const auto& [k, v] : data)
    if (k.str() != "train" && k.str() != "test")
      throw Error(where(k.source()) + ": unknown table [data." + std::string(k.str()) +
                  "]; hint: " + text::did_you_mean(std::string(k.str()), {"train", "test"}) +
                  "datasets go in [data.train] and [data.test]");
  if (!data.get("train"))
    throw Error(m.path + ": the manifest has no [data.train] table; hint: add one with type = \"<dataset>\"");
  rc.train_data = component(registry, table_or_empty(data, "train", "data.train"), "data.train",
                            KEEL_KIND_DATASET, {}, nullptr);
  if (data.get("test"))
    rc.test_data = component(registry, table_or_empty(data, "test", "data.test"), "data.test",
                             KEEL_KIND_DATASET, {}, nullptr);
  else if (rc.mode == RunMode::kEvaluate)
    throw Error(m.path + ": run.mode = \"evaluate\" needs a [data.test] table to evaluate on; "
                "hint: add one with type = \"<dataset>\"");
  rc.optimizer = required("optimizer", KEEL_KIND_OPTIMIZER, {"groups"});
  const toml::table& optimizer_table = table_or_empty(m.root, "optimizer", "optimizer");
  rc.param_groups = param_groups(optimizer_table, rc.optimizer.component->name);
  rc.loss = required("loss", KEEL_KIND_LOSS);
  rc.lr_scheduler = optional("lr_scheduler", KEEL_KIND_LR_SCHEDULER);
  rc.grad_clipper = optional("grad_clipper", KEEL_KIND_GRAD_CLIPPER);
  rc.mfu = optional("mfu", KEEL_KIND_MFU);
  rc.profiler = optional("profiler", KEEL_KIND_PROFILER);

  keel_options ckpt;
  if (m.root.get("checkpoint")) {
    rc.checkpoint = component(registry, table_or_empty(m.root, "checkpoint", "checkpoint"),
                              "checkpoint", KEEL_KIND_CHECKPOINT, kCheckpointKernelSchema, &ckpt,
                              {"init_rename"});
    rc.checkpoint_every_steps = get<int64_t>(ckpt, "every_steps");
    rc.checkpoint_keep_last = get<int64_t>(ckpt, "keep_last");
    rc.checkpoint_at_end = get<bool>(ckpt, "at_end");
    rc.checkpoint_initial = get<bool>(ckpt, "initial");
    rc.init_from = get<std::string>(ckpt, "init_from");  // a PATH: already absolute
    rc.checkpoint_keep_best = get<int64_t>(ckpt, "keep_best");
    rc.checkpoint_best_metric = get<std::string>(ckpt, "best_metric");
    rc.checkpoint_best_max = get<std::string>(ckpt, "best_mode") == "max";
    rc.checkpoint_async = get<bool>(ckpt, "async");
    const toml::table& ct = table_or_empty(m.root, "checkpoint", "checkpoint");
    const auto bm = rc.checkpoint_best_metric;
    if (rc.checkpoint_keep_best > 0 &&
        (bm.find('.') == std::string::npos || bm.front() == '.' || bm.back() == '.'))
      throw Error((ct.get("best_metric") ? where(ct.get("best_metric")->source()) : where(ct.source())) +
                  ": checkpoint.best_metric = \"" + bm + "\" is not <split>.<key>; hint: e.g. "
                  "\"test.loss\" or \"train.loss\" (keys as in metrics.jsonl)");
    rc.init_include = get<std::string>(ckpt, "init_include");
    rc.init_exclude = get<std::string>(ckpt, "init_exclude");
    rc.init_from_unverified = get<bool>(ckpt, "init_from_unverified");
    for (const char* key : {"init_include", "init_exclude"}) {
      try {
        std::regex check(get<std::string>(ckpt, key));
      } catch (const std::regex_error& e) {
        throw Error(where(ct.get(key)->source()) + ": checkpoint." + key +
                    ": invalid regular expression (" + regex_problem(e.code()) +
                    "); hint: an ECMAScript regex searched in tensor names, e.g. \"^encoder\\\\.\"");
      }
    }
    if (const toml::node* rn = ct.get("init_rename")) {
      const toml::table* t = rn->as_table();
      if (t == nullptr)
        throw Error(where(rn->source()) + ": checkpoint.init_rename must be a table of prefix "
                    "rewrites; hint: [checkpoint.init_rename] with \"old.\" = \"new.\"");
      for (const auto& [k, v] : *t) {
        if (!v.is_string())
          throw Error(where(v.source()) + ": checkpoint.init_rename.\"" + std::string(k.str()) +
                      "\" must be a string (the model's prefix); hint: \"trunk.\" = \"encoder.\"");
        rc.init_rename.emplace_back(std::string(k.str()), v.as_string()->get());
      }
    }
  }

  if (const toml::node* hooks = m.root.get("hooks")) {
    const toml::array* a = hooks->as_array();
    if (!a || (!a->empty() && !a->is_array_of_tables()))
      throw Error(where(hooks->source()) + ": hooks must be an array of tables; hint: write "
                  "each hook as [[hooks]] with type = \"<hook>\" (hooks = [] for none)");
    for (size_t i = 0; i < a->size(); ++i) {
      keel_options kernel_keys;
      rc.hooks.push_back(component(registry, *(*a)[i].as_table(),
                                   "hooks[" + std::to_string(i) + "]", KEEL_KIND_HOOK,
                                   kHookKernelSchema, &kernel_keys));
      rc.hooks.back().priority = get<int64_t>(kernel_keys, "priority");
      rc.hooks.back().label = get<std::string>(kernel_keys, "label");
      if (rc.hooks.back().label.empty()) rc.hooks.back().label = rc.hooks.back().component->name;
    }
  } else {
    // No [[hooks]]: the console logger and the JSONL metrics file (the run directory contract).
    for (const char* name : {"console", "jsonl"}) {
      toml::table t;
      t.insert("type", name);
      if (!registry.matches(KEEL_KIND_HOOK, name).empty())
        rc.hooks.push_back(component(registry, t, "hooks[" + std::to_string(rc.hooks.size()) + "]",
                                     KEEL_KIND_HOOK, {}, nullptr));
    }
  }

  for (auto& h : rc.hooks)
    if (h.label.empty()) h.label = h.component->name;

  // The resolved manifest.
  toml::table& r = rc.resolved;
  toml::table run_t = to_toml(run);
  run_t.insert_or_assign("output_dir", rc.output_dir);
  r.insert("run", std::move(run_t));
  toml::array paths;
  for (const auto& p : rc.plugin_paths) paths.push_back(p);
  toml::table require;
  for (const auto& q : rc.plugin_requirements) require.insert_or_assign(q.name, q.requirement);
  r.insert("plugins", toml::table{{"paths", std::move(paths)}, {"require", std::move(require)}});
  r.insert("train", to_toml(train));
  r.insert("distributed", to_toml(dist));
  r.insert("model", resolved_table(rc.model, nullptr));
  toml::table data_t;
  data_t.insert("train", resolved_table(rc.train_data, nullptr));
  if (rc.test_data) data_t.insert("test", resolved_table(*rc.test_data, nullptr));
  r.insert("data", std::move(data_t));
  toml::table optimizer_t = resolved_table(rc.optimizer, nullptr);
  if (const toml::node* groups = optimizer_table.get("groups")) optimizer_t.insert("groups", *groups);
  r.insert("optimizer", std::move(optimizer_t));
  r.insert("loss", resolved_table(rc.loss, nullptr));
  if (rc.lr_scheduler) r.insert("lr_scheduler", resolved_table(*rc.lr_scheduler, nullptr));
  if (rc.grad_clipper) r.insert("grad_clipper", resolved_table(*rc.grad_clipper, nullptr));
  if (rc.mfu) r.insert("mfu", resolved_table(*rc.mfu, nullptr));
  if (rc.profiler) r.insert("profiler", resolved_table(*rc.profiler, nullptr));
  if (rc.checkpoint) {
    toml::table ct = resolved_table(*rc.checkpoint, &ckpt);
    if (!rc.init_rename.empty()) {
      toml::table rn;
      for (const auto& [from, to] : rc.init_rename) rn.insert(from, to);
      ct.insert("init_rename", std::move(rn));
    }
    r.insert("checkpoint", std::move(ct));
  }
  toml::array hooks_t;
  for (const auto& h : rc.hooks) {
    toml::table t = resolved_table(h, nullptr);
    t.insert("priority", h.priority);
    t.insert("label", h.label);
    hooks_t.push_back(std::move(t));
  }
  r.insert("hooks", std::move(hooks_t));
  // Second copies of plugins (those the run uses with another version failed above).
  for (const Shadowed& other : registry.shadowed())
    spdlog::warn("plugin {} {} at {} is not used: {} {} at {} comes first on the search path; "
                 "remove one of the two from the search path",
                 other.name, other.version, other.path, other.used->name, other.used->version,
                 other.used->path);
  return rc;
}

}  // namespace keel
