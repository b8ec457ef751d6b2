// keel export (export.hpp): the checkpoint chosen and verified, its model created alone and
// loaded, its tensors collected (export_state, else keel's names) and written into a new
// directory.
#include "cli/export.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/commit.hpp"
#include "checkpoint/reshard.hpp"
#include "checkpoint/store.hpp"
#include "cli/commands.hpp"
#include "cli/export_tables.hpp"
#include "compat/torch.hpp"
#include "components.hpp"
#include "text/text.hpp"
#include "config/resolve_parts.hpp"
#include "config/keys.hpp"
#include "error.hpp"
#include "files/files.hpp"
#include "keel/tensor.hpp"
#include "loader/registry.hpp"
#include "manifest.hpp"
#include "options.hpp"
#include "run/checkpoint_backend.hpp"
#include "run/parameters.hpp"
#include "run/resume.hpp"
#include "run/run.hpp"
#include "run_config.hpp"
#include "files/owned_dir.hpp"

namespace fs = std::filesystem;

namespace keel::cli {
namespace {

constexpr const char* kPathHint =
    "hint: name a run directory (runs/<name>) or one of its checkpoints "
    "(runs/<name>/checkpoints/step-<N>)";
// The most config.json text a model may write (with its NUL).
constexpr size_t kConfigCapacity = size_t{1} << 20;

struct Source {
  std::string dir;      // the checkpoint directory
  CommitRecord record;  // verified
};

void check_arguments(const ExportArgs& a) {
  const std::string usage_hint = "hint: keel export runs/<name> --format safetensors";
  if (a.positional.empty())
    throw UsageError("keel export: needs RUN_DIR or CHECKPOINT (a run directory or one of its "
                     "checkpoints); " + usage_hint, "export");
  if (a.positional.size() > 1)
    throw UsageError(a.positional[1] + ": unexpected argument (`keel export` takes one RUN_DIR "
                     "or CHECKPOINT); hint: the output directory goes after --output", "export");
  if (a.positional[0].empty())
    throw UsageError("keel export: RUN_DIR|CHECKPOINT is an empty string; " + usage_hint,
                     "export");
  if (!a.format)
    throw UsageError("keel export: needs --format; " + usage_hint, "export");
  if (*a.format != "safetensors")
    throw UsageError("--format " + *a.format + ": not a format keel export writes; hint: "
                     "--format safetensors (the only one)", "export");
  if (a.since && a.since->empty())
    throw UsageError("--since: an empty path; hint: name the older checkpoint whose export the "
                     "delta applies to", "export");
  if (a.output && a.output->empty())
    throw UsageError("--output: an empty path; hint: name a new directory, or leave --output "
                     "out for the default", "export");
}

// --plugins DIR...: absolute, each an existing directory.
std::vector<std::string> plugin_dirs(const ExportArgs& a) {
  std::vector<std::string> out;
  for (const std::string& d : a.plugin_dirs) {
    std::error_code ec;
    if (d.empty() || !fs::is_directory(d, ec))
      throw Error("--plugins " + d + ": " + (d.empty() ? "an empty path" : fs::exists(d, ec) ?
                  "not a directory" : "no such directory") + "; hint: name a directory that "
                  "holds plugin files (`keel plugins` lists what is found)");
    out.push_back(fs::absolute(d).lexically_normal().string());
  }
  return out;
}

// A verification error with its hint (written for resume) replaced by export's own.
Error not_verified(const std::string& dir, const Error& e) {
  std::string what = e.what();
  if (const size_t h = what.find("; hint: "); h != std::string::npos) what.erase(h);
  return Error("checkpoint " + dir + " does not verify: " + what + "; hint: export another "
               "checkpoint of the run, or name the run directory to export its newest verified "
               "one");
}

// Whether run directory `dir`'s manifest.resolved.toml has a [checkpoint] table (true when it
// cannot be read: then nothing is known).
bool saves_checkpoints(const std::string& dir) {
  try {
    return toml::parse_file((fs::path(dir) / "manifest.resolved.toml").string())
        .contains("checkpoint");
  } catch (const std::exception&) {
    return true;
  }
}

// CHECKPOINT verified, or RUN_DIR's newest checkpoint that verifies.
Source choose_checkpoint(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw Error(path + ": no such directory; " + kPathHint);
  if (!fs::is_directory(st)) throw Error(path + ": not a directory; " + kPathHint);
  if (fs::exists(fs::path(path) / "commit.json")) {
    try {
      return {path, verify_checkpoint(path)};
    } catch (const Error& e) {
      throw not_verified(path, e);
    }
  }
  const std::string root = (fs::path(path) / "checkpoints").string();
  if (!fs::is_directory(root))
    throw Error(path + ": neither a checkpoint (no commit.json) nor a run directory (no "
                "checkpoints/); " + kPathHint);
  const auto newest = CheckpointStore::newest_verified(
      root, [](const std::string& dir, const Error& e) {
        spdlog::warn("export: skipping {}: {}", dir, e.what());
      });
  if (!newest) {
    if (!saves_checkpoints(path))
      throw Error(root + " holds no checkpoint to export: the run's manifest (" +
                  (fs::path(path) / "manifest.resolved.toml").string() + ") has no "
                  "[checkpoint] table, so its training saves none; hint: add [checkpoint] with "
                  "type = \"safetensors\" to the manifest (at_end = true, the default, saves "
                  "when training ends; every_steps = N or every_epochs = N also saves during "
                  "it), train it (keel train MANIFEST --overwrite), then export");
    throw Error(root + " holds no verified checkpoint to export; hint: train the run first "
                "(keel train MANIFEST), or name a checkpoint directory");
  }
  spdlog::info("exporting {} (step {}), the newest verified checkpoint of {}", newest->dir,
               newest->record.step, path);
  return {newest->dir, newest->record};
}

// RUN/exports/<checkpoint> for a checkpoint in RUN/checkpoints/, else <checkpoint>-export.
std::string default_output(const std::string& checkpoint) {
  fs::path c = fs::path(checkpoint).lexically_normal();
  if (c.filename().empty()) c = c.parent_path();  // a trailing '/'
  if (c.has_parent_path() && c.parent_path().filename() == "checkpoints")
    return (c.parent_path().parent_path() / "exports" / c.filename()).string();
  return c.string() + "-export";
}

void refuse_existing(const std::string& out) {
  std::error_code ec;
  if (fs::symlink_status(out, ec).type() != fs::file_type::not_found)
    throw Error(out + ": exists; keel export writes a new directory and replaces nothing; "
                "hint: remove it, or name another with --output DIR");
}

// Checkpoint `dir`'s manifest.resolved.toml with run.device = cpu (so that a checkpoint saved on
// a GPU exports on a machine without one). The manifest came with the checkpoint, so it names no
// code and no other file: a manifest with `extends` is refused before the base is read, and its
// [plugins] paths are dropped (said on the console when `say`; *dropped tells whether there
// were any). The plugins are searched for in `plugin_dirs` (--plugins, absolute, checked to be
// directories), KEEL_PLUGIN_PATH, the installed packages and keel's own plugin directory, as
// plugin_search_path does for any manifest.
Manifest checkpoint_manifest(const std::string& dir, const std::vector<std::string>& plugin_dirs,
                             bool say, bool* dropped = nullptr) {
  const std::string manifest = (fs::path(dir) / "manifest.resolved.toml").string();
  try {
    if (toml::parse_file(manifest).contains("extends"))
      throw Error(manifest + ": has `extends`, which keel train never writes into a checkpoint's "
                  "manifest; keel export reads no other file the checkpoint names; hint: the "
                  "directory was not written by keel train");
  } catch (const toml::parse_error&) {
    // load_manifest below says where, with its own line.
  }
  Manifest m = load_manifest(manifest, {"run.device=cpu"});
  bool had_paths = false;
  if (toml::table* plugins = m.root["plugins"].as_table()) {
    const toml::array* paths = plugins->get_as<toml::array>("paths");
    had_paths = plugins->contains("paths") && !(paths && paths->empty());  // `paths = []`: none
    if (had_paths && say)
      spdlog::info("export: the checkpoint's manifest names plugin directories ([plugins] paths "
                   "in {}): not searched, since a checkpoint names no code to run; keel export "
                   "searches --plugins DIR, KEEL_PLUGIN_PATH, the installed packages and keel's "
                   "own plugins", manifest);
    plugins->erase("paths");
  }
  if (dropped) *dropped = had_paths;
  if (!plugin_dirs.empty()) {
    toml::array dirs;
    for (const std::string& d : plugin_dirs) dirs.push_back(d);
    m.root.insert("plugins", toml::table{});  // kept when there is one
    if (toml::table* plugins = m.root["plugins"].as_table())
      plugins->insert_or_assign("paths", std::move(dirs));
  }
  return m;
}

// The checkpoint's run resolved from its manifest (checkpoint_manifest), without a lock.
RunConfig checkpoint_config(const Source& src, Registry& registry,
                            const std::vector<std::string>& plugin_dirs) {
  const std::string manifest = (fs::path(src.dir) / "manifest.resolved.toml").string();
  bool dropped = false;
  const Manifest m = checkpoint_manifest(src.dir, plugin_dirs, /*say=*/true, &dropped);
  RunConfig cfg;
  try {
    cfg = resolve(m, registry, /*use_lock=*/false);
  } catch (const Error& e) {
    if (!dropped || !plugin_dirs.empty()) throw;
    // A component missing because its plugin sat in one of the dropped directories: say how
    // to name it.
    std::string what = e.what();
    if (const size_t h = what.find("; hint: "); h != std::string::npos) what.erase(h);
    throw Error(what + "; hint: the checkpoint's run found plugins in its [plugins] paths, "
                "which keel export does not search: review that directory, then name it with "
                "--plugins DIR (or add it to KEEL_PLUGIN_PATH)");
  }
  if (!cfg.checkpoint)
    throw Error(manifest + ": has no [checkpoint] table, so nothing says how the checkpoint's "
                "files are read; hint: the directory was not written by keel train");
  return cfg;
}

// The bytes LibTorch may hold while the model is created, from a checkpoint whose model
// tensors take `model_bytes` (its commit record's shapes and dtypes, no more than the bytes of
// the files it lists): twice that (an initialiser may hold a temporary as large as a weight)
// plus 64 MiB.
constexpr int64_t kCreationSlack = int64_t{64} << 20;

int64_t creation_budget(const CommitRecord& record) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max() / 4;
  const auto add = [&](int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; };
  int64_t model = 0, files = 0;
  if (const auto it = record.chunks.find("model"); it != record.chunks.end())
    for (const auto& entry : it->second) {
      const at::ScalarType type = dtype_of_name(entry.second.dtype);
      int64_t bytes = type == at::ScalarType::Undefined
                          ? 8
                          : static_cast<int64_t>(c10::elementSize(type));
      for (const int64_t d : entry.second.shape)
        bytes = d <= 0 ? 0 : bytes > kMax / d ? kMax : bytes * d;
      model = add(model, bytes);
    }
  for (const auto& f : record.files)
    files = add(files, f.size > static_cast<uint64_t>(kMax) ? kMax : static_cast<int64_t>(f.size));
  const int64_t held = std::min(model, files);
  return add(held > kMax / 2 ? kMax : 2 * held, kCreationSlack);
}

// LibTorch's CPU allocator while the checkpoint's model is created (CreationBudget): counts the
// bytes of the tensors it holds and refuses an allocation that would take them past the budget,
// so that a manifest claiming a model far larger than the checkpoint's fails before it holds
// the memory. Installed with c10::SetCPUAllocator and never destroyed: tensors allocated through
// it free their memory through it for as long as they live.
class BudgetAllocator final : public compat::Allocator {
 public:
  explicit BudgetAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate_bytes(size_t n) const override {
    const int64_t size = static_cast<int64_t>(n);
    const int64_t now = live_.fetch_add(size) + size;
    if (now > budget_.load()) {
      live_.fetch_sub(size);
      refused_ = true;
      throw std::bad_alloc();
    }
    auto* held = new Held{base_->allocate(n), size, this};
    void* data = held->inner.get();
    const c10::Device device = held->inner.device();
    return {data, held, &Held::release, device};
  }
  // Counts from zero against `budget` (bytes); limit(max) stops refusing.
  void limit(int64_t budget) {
    budget_ = budget;
    refused_ = false;
  }
  bool refused() const { return refused_; }
  int64_t live() const { return live_; }

 private:
  struct Held {
    c10::DataPtr inner;
    int64_t size;
    const BudgetAllocator* owner;
    static void release(void* p) {
      auto* h = static_cast<Held*>(p);
      h->owner->live_.fetch_sub(h->size);
      delete h;
    }
  };
  c10::Allocator* base_;
  mutable std::atomic<int64_t> live_{0};
  std::atomic<int64_t> budget_{std::numeric_limits<int64_t>::max()};
  mutable std::atomic<bool> refused_{false};
};

// Installs the BudgetAllocator with `budget` for its lifetime, then the allocator before it.
class CreationBudget {
 public:
  explicit CreationBudget(int64_t budget) : before_(c10::GetCPUAllocator()) {
    static BudgetAllocator* const counting = new BudgetAllocator(c10::GetDefaultCPUAllocator());
    allocator_ = counting;
    allocator_->limit(budget + allocator_->live());
    c10::SetCPUAllocator(allocator_, kPriority);
  }
  ~CreationBudget() {
    allocator_->limit(std::numeric_limits<int64_t>::max());
    c10::SetCPUAllocator(before_, kPriority);
  }
  CreationBudget(const CreationBudget&) = delete;
  CreationBudget& operator=(const CreationBudget&) = delete;
  bool refused() const { return allocator_->refused(); }

 private:
  static constexpr uint8_t kPriority = 255;  // above LibTorch's default allocator's 0
  c10::Allocator* before_;
  BudgetAllocator* allocator_ = nullptr;
};

// --weights-from LABEL: every model tensor from the hook state LABEL.<name> that the checkpoint's
// `hooks` object holds (the ema hook's average), each checked against the commit record's dtype
// and shape first, and the files checked unchanged after the load.
void load_hook_weights(const Run& run, const Source& src, const std::string& label,
                       const TensorList& into) {
  const auto stored = stored_hook_state(src.record);
  TensorList from;
  for (const auto& [name, t] : into) {
    const std::string full = label + "." + name;
    const auto it = stored.find(full);
    if (it == stored.end())
      throw Error("--weights-from " + label + ": checkpoint " + src.dir + " holds no hook state '" +
                  full + "'; hint: name the label of a hook that keeps a copy of every model "
                  "tensor, such as [[hooks]] type = \"ema\" (label ema unless it sets one)");
    if (!same_layout(*it->second, t))
      throw Error("--weights-from " + label + ": hook state '" + full + "' is " +
                  layout(*it->second) + " in " + src.dir + ", the model's '" + name + "' " +
                  layout(t));
    from.emplace_back(full, t);
  }
  std::vector<keel_named_tensor> named;
  for (const auto& [name, t] : from) named.push_back({name.c_str(), peek(t)});
  run.components.backend->load(src.dir, "hooks", named);
  check_unchanged(src.dir, src.record);  // the bytes loaded are the bytes verified
  spdlog::info("--weights-from {}: the model's {} tensors are the hook's copies", label,
               from.size());
}

// Creates the run's model alone (on the CPU) and reads the checkpoint's model tensors into it
// with the checkpoint's backend, consolidating the chunks each rank wrote (or, with
// `weights_from`, a hook's copies: load_hook_weights). The model is created under a
// CreationBudget from the checkpoint's record, so that a manifest claiming a far larger model
// than the checkpoint holds is one error line before the memory is taken.
void load_model(Run& run, const Source& src, const std::optional<std::string>& weights_from) {
  run.directory.path = run.directory.scratch.create();
  const int64_t budget = creation_budget(src.record);
  {
    const CreationBudget bounded(budget);
    try {
      create_model(run);
    } catch (const std::exception& e) {
      if (!bounded.refused()) throw;
      throw Error("checkpoint " + src.dir + ": its manifest's [model] takes more than " +
                  std::to_string(budget >> 20) + " MiB while it is created, and the checkpoint's model "
                  "tensors take less than half of that (its commit record), so the manifest "
                  "does not describe the checkpoint's model; hint: export a checkpoint whose "
                  "manifest.resolved.toml is the one keel train wrote beside it");
    }
  }
  Components& c = run.components;
  c.checkpoint = make_instance<keel_checkpoint>(run, *run.config.checkpoint);
  c.backend.emplace(c.checkpoint);
  TensorList into;
  for (const auto& nt : run.parameters.model_state) into.emplace_back(nt.name, borrow(nt.tensor));
  check_model_tensors(run.components.model.label(), src.record, src.dir, into,
                      "export it with the plugins of the run that saved it");
  if (weights_from) return load_hook_weights(run, src, *weights_from, into);
  // Every chunk of every tensor, whatever world size and shard mode saved it: full tensors.
  std::vector<ChunkReader::Request> requests;
  for (const auto& [name, t] : into) requests.push_back({"model", name, 0, t});
  ChunkReader(*c.backend, src.dir, src.record).read(requests);
}

// A tensor as written: on the CPU, contiguous, float32 when floating-point.
at::Tensor full_precision(const at::Tensor& t) {
  const at::NoGradGuard no_grad;
  at::Tensor out = t.detach().to(at::kCPU);
  if (out.is_floating_point()) out = out.to(at::kFloat);
  return out.contiguous();
}

// What export_state puts (keel_state_writer.host_data).
struct Collected {
  TensorList tensors;
  std::set<std::string> names;
  std::string refused;  // why the first refused entry was refused
};

int put_exported(keel_state_writer* w, const char* name, keel_tensor* tensor) noexcept {
  auto* c = static_cast<Collected*>(w->host_data);
  try {
    const size_t n = name ? strnlen(name, KEEL_NAME_CAPACITY) : 0;
    std::string why;
    if (n == 0) why = "an entry without a name";
    else if (n == KEEL_NAME_CAPACITY)
      why = "a name of KEEL_NAME_CAPACITY bytes or more";
    else if (!c->names.insert(name).second) why = "'" + std::string(name) + "' twice";
    else if (tensor == nullptr) why = "'" + std::string(name) + "' without a tensor";
    if (why.empty()) {
      c->tensors.emplace_back(name, full_precision(borrow(tensor)));
      return 1;
    }
    if (c->refused.empty()) c->refused = why;
  } catch (const std::exception& e) {
    if (c->refused.empty())
      c->refused = "an entry keel export could not copy (" + std::string(e.what()) + ")";
  }
  return 0;
}

// The model's export_state: its tensors and config.json (checked to be a JSON object).
TensorList exported_state(const Instance<keel_model>& model, std::string& config) {
  Collected collected;
  keel_state_writer writer{};
  writer.struct_size = sizeof(writer);
  writer.host_data = &collected;
  writer.put = &put_exported;
  std::vector<char> text(kConfigCapacity, '\0');
  try {
    model.call("export_state", model->export_state, &writer, text.data(), text.size());
  } catch (const Error& e) {
    if (collected.refused.empty()) throw;
  }
  if (!collected.refused.empty())
    throw model.error("export_state put " + collected.refused + "; every entry needs a unique "
                      "non-empty name and a tensor");
  if (collected.tensors.empty()) throw model.error("export_state put no tensors");
  text.back() = '\0';
  config = text.data();
  if (!config.empty()) {
    nlohmann::json parsed;
    try {
      parsed = nlohmann::json::parse(config);
    } catch (const nlohmann::json::exception& e) {
      throw model.error("export_state wrote a config.json that is not JSON (" +
                        std::string(e.what()) + ")");
    }
    if (!parsed.is_object())
      throw model.error("export_state wrote a config.json that is not a JSON object");
  }
  return std::move(collected.tensors);
}

// What model.safetensors holds: the model's export_state, else its state under keel's names.
TensorList export_tensors(const Run& run, std::string& config) {
  const Instance<keel_model>& model = run.components.model;
  if (KEEL_HAS_SLOT(model, keel_model, export_state)) return exported_state(model, config);
  spdlog::info("{} has no export_state (ABI 1.7): model.safetensors holds the tensors under "
               "keel's names, as checkpoints do, and no config.json is written",
               model.label());
  TensorList out;
  for (const auto& nt : run.parameters.model_state)
    out.emplace_back(nt.name, full_precision(borrow(nt.tensor)));
  return out;
}

// The staging directory, removed unless kept.
struct Staging {
  std::string path;
  bool keep = false;
  ~Staging() {
    std::error_code ec;
    if (!keep && !path.empty()) fs::remove_all(path, ec);
  }
};

// Writes model.safetensors (keel-safetensors' component) and config.json into a staging
// directory beside `out`, then renames it to `out` without replacing anything.
// The objects keel export writes (stem -> tensors: model, tables or tables.delta) and the files
// beside them (name -> text: config.json, delta.json).
struct ExportFiles {
  std::vector<std::pair<std::string, TensorList>> objects;
  std::vector<std::pair<std::string, std::string>> texts;
};

// The directory that will hold DIR, opened (and created when missing) under a run directory's
// rules (files/owned_dir.hpp): not a symlink, yours, others cannot write it unless it is sticky,
// nor a directory on the way to it. Opened before anything is loaded; what it created is in
// `created`, removed when the export fails.
struct OutputParent {
  CreatedEntries created;
  std::optional<OwnedDir> dir;
  std::string name;  // DIR's name in it
  bool done = false;
  ~OutputParent() {
    if (!done) created.remove_all();
  }
};

void open_output_parent(const std::string& out, OutputParent& parent) {
  fs::path target = fs::absolute(out).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // a trailing '/'
  parent.name = target.filename().string();
  if (parent.name.empty() || parent.name == "." || parent.name == "..")
    throw Error(out + ": not a name for a new directory; hint: name a new directory with "
                "--output DIR");
  DirUse use;
  use.what = "output directory";
  use.flag = "--output";
  use.sticky_ok = true;
  parent.dir.emplace(OwnedDir::open(target.parent_path().string(), parent.created, use));
}

void write_export(const Registry& registry, const Run& run, const std::string& out,
                  const OutputParent& parent, const ExportFiles& files) {
  const Component* writer = registry.find(KEEL_KIND_CHECKPOINT, "keel-safetensors:safetensors");
  if (writer == nullptr)
    throw Error("keel export writes model.safetensors with the safetensors component of the "
                "keel-safetensors plugin, and the plugin search path has none; hint: `keel "
                "plugins` lists what was found (KEEL_PLUGIN_PATH adds a directory)");
  ComponentSpec spec;
  spec.section = "export";
  spec.component = writer;
  spec.options = validate_options(toml::table{}, "export", "keel plugins show safetensors",
                                  writer->options);
  const Instance<keel_checkpoint> instance = make_instance<keel_checkpoint>(run, spec);
  const PluginCheckpointBackend backend(instance);

  const OwnedDir& dir = *parent.dir;
  const std::string target = dir.path_of(parent.name);
  Staging staging;
  const std::string staging_name = "." + parent.name + ".tmp-" + random_token();
  if (::mkdirat(dir.fd(), staging_name.c_str(), 0755) != 0)
    throw Error("creating " + dir.path_of(staging_name) + " failed: " + std::strerror(errno) +
                "; hint: check that " + dir.path() + " is writable");
  staging.path = dir.path_of(staging_name);
  for (const auto& [stem, tensors] : files.objects) {
    std::vector<keel_named_tensor> named;
    for (const auto& [n, t] : tensors) named.push_back({n.c_str(), peek(t)});
    backend.save(staging.path, stem, named);
  }
  add_hint(
      [&] {
        for (const auto& object : files.objects)
          fsync_path(staging.path + "/" + object.first + ".safetensors");
        for (const auto& [name, text] : files.texts)
          write_file_durably(staging.path + "/" + name, text);
        fsync_path(staging.path);
      },
      [](int) { return "check that the output's file system has space"; });
  const bool renamed =
      add_hint([&] { return durable_rename_new(staging.path, target); },
               [](int) { return "check that the output's directory is writable"; });
  if (!renamed)  // created while keel export wrote
    throw Error(out + ": exists (created while keel export wrote); keel export replaces "
                "nothing; hint: remove it, or name another with --output DIR");
  staging.keep = true;
}

// The tables' rows as one object: `<table>.ids` and `<table>.values` (and, for a delta,
// `<table>.removed_ids`); counts the rows written into `rows`.
TensorList table_tensors(const std::map<std::string, TableRows>& tables, int64_t& rows) {
  TensorList out;
  for (const auto& [name, t] : tables) {
    out.emplace_back(name + ".ids", t.ids);
    out.emplace_back(name + ".values", t.values);
    rows += t.ids.numel();
  }
  return out;
}

TensorList delta_tensors(const std::map<std::string, TableDelta>& delta, int64_t& rows,
                         int64_t& removed) {
  TensorList out;
  for (const auto& [name, d] : delta) {
    out.emplace_back(name + ".ids", d.ids);
    out.emplace_back(name + ".values", d.values);
    out.emplace_back(name + ".removed_ids", d.removed_ids);
    rows += d.ids.numel();
    removed += d.removed_ids.numel();
  }
  return out;
}

// The names of `tables`, quoted, in order ('a', 'b'), or "none".
std::string table_names(const std::map<std::string, TableRows>& tables) {
  std::vector<std::string> names;
  for (const auto& entry : tables) names.push_back("'" + text::printable(entry.first) + "'");
  return names.empty() ? "none" : text::join(names);
}

// The backend checkpoint `old` was written with: the [checkpoint] type of its own manifest
// (checkpoint_manifest: no plugin directory of its), from the plugins `registry` found.
struct OldBackend {
  Instance<keel_checkpoint> instance;
  std::optional<PluginCheckpointBackend> backend;
  const CheckpointBackend& operator*() const { return *backend; }
};

std::unique_ptr<OldBackend> old_backend(const Registry& registry, const Run& run,
                                        const Source& old,
                                        const std::vector<std::string>& plugin_dirs) {
  const Manifest m = checkpoint_manifest(old.dir, plugin_dirs, /*say=*/false);
  const toml::table* ct = m.root["checkpoint"].as_table();
  if (ct == nullptr)
    throw Error(old.dir + "/manifest.resolved.toml: has no [checkpoint] table, so nothing says "
                "how the --since checkpoint's files are read; hint: the directory was not "
                "written by keel train");
  keel_options kernel_values;
  const ComponentSpec spec =
      resolve_parts::component(registry, *ct, "checkpoint", KEEL_KIND_CHECKPOINT,
                               checkpoint_keys().schema, &kernel_values, {"init_rename"});
  auto out = std::make_unique<OldBackend>();
  out->instance = make_instance<keel_checkpoint>(run, spec);
  out->backend.emplace(out->instance);
  return out;
}

// --since: the older checkpoint, verified, and its tables' delta to `tables` as an object and
// delta.json. Describes it in `summary`.
void add_delta(const ExportArgs& args, const Registry& registry,
               const std::vector<std::string>& plugin_dirs, const Run& run, const Source& src,
               const std::map<std::string, TableRows>& tables, ExportFiles& files,
               std::string& summary) {
  if (tables.empty())
    throw Error("--since " + *args.since + ": checkpoint " + src.dir + " holds no sparse tables, "
                "so there is no delta to write; hint: leave --since out");
  const Source old = choose_checkpoint(*args.since);
  if (!args.since_any_run && old.record.run_id != src.record.run_id)
    throw Error("--since " + *args.since + ": its checkpoint " + old.dir + " is of another run "
                "(run id " + text::printable(old.record.run_id) + ") than the exported one (run "
                "id " + text::printable(src.record.run_id) + "), so the delta would not apply "
                "to this run's earlier export; hint: name a checkpoint of the same run, or add "
                "--since-any-run when the copy being served is that other run's export");
  if (old.record.step >= src.record.step)
    throw Error("--since " + *args.since + ": its checkpoint (step " +
                std::to_string(old.record.step) + ") is not older than the exported one (step " +
                std::to_string(src.record.step) + "); hint: name the checkpoint of the previous "
                "export");
  const auto before = read_tables(**old_backend(registry, run, old, plugin_dirs), old.dir,
                                  old.record);
  if (table_names(before) != table_names(tables))
    throw Error("--since " + *args.since + ": its checkpoint holds the table(s) " +
                table_names(before) + " and the exported one " + table_names(tables) + ": not "
                "the same tables, so the delta would not describe the served copy; hint: name a "
                "checkpoint of the same model (of the same run)");
  int64_t rows = 0, removed = 0;
  files.objects.emplace_back("tables.delta",
                             delta_tensors(table_delta(before, tables), rows, removed));
  nlohmann::json info = {
      {"since", old.dir}, {"since_step", old.record.step}, {"step", src.record.step}};
  files.texts.emplace_back("delta.json", info.dump(2) + "\n");
  summary = "; tables.delta.safetensors: " + std::to_string(rows) + " changed row(s), " +
            std::to_string(removed) + " removed since step " + std::to_string(old.record.step);
}

}  // namespace

int export_checkpoint(const ExportArgs& args) {
  check_arguments(args);
  const std::vector<std::string> plugins = plugin_dirs(args);
  const Source src = choose_checkpoint(args.positional[0]);
  const std::string out = args.output ? *args.output : default_output(src.dir);
  refuse_existing(out);
  OutputParent parent;
  open_output_parent(out, parent);

  Registry registry;  // declared first: libraries outlive every instance
  Run run;
  run.config = checkpoint_config(src, registry, plugins);
  load_model(run, src, args.weights_from);
  std::string config;
  ExportFiles files;
  files.objects.emplace_back("model", export_tensors(run, config));
  if (!config.empty()) files.texts.emplace_back("config.json", config);
  const auto tables = read_tables(*run.components.backend, src.dir, src.record);
  std::string summary;
  if (args.since) {
    add_delta(args, registry, plugins, run, src, tables, files, summary);
  } else if (!tables.empty()) {
    int64_t rows = 0;
    files.objects.emplace_back("tables", table_tensors(tables, rows));
    summary = "; tables.safetensors: " + std::to_string(tables.size()) + " table(s), " +
              std::to_string(rows) + " rows";
  }
  write_export(registry, run, out, parent, files);
  parent.done = true;
  const TensorList& tensors = files.objects.front().second;
  int64_t values = 0;
  for (const auto& nt : tensors) values += nt.second.numel();
  std::printf("keel export: wrote %s (model.safetensors: %zu tensors, %lld values%s%s) from %s "
              "(step %lld%s)\n",
              out.c_str(), tensors.size(), static_cast<long long>(values),
              config.empty() ? "" : "; config.json", summary.c_str(), src.dir.c_str(),
              static_cast<long long>(src.record.step),
              args.weights_from ? (", hook " + *args.weights_from + "'s weights").c_str() : "");
  return 0;
}

}  // namespace keel::cli
