#include "run/resume.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "files/files.hpp"
#include "checkpoint/reshard.hpp"
#include "compat/torch.hpp"
#include "checkpoint/manifest_changes.hpp"
#include "config/resume_changes.hpp"
#include "distributed/on_rank0.hpp"
#include "keel/tensor.hpp"
#include "run/checkpointing.hpp"
#include "run/plugin_state.hpp"
#include "run/run.hpp"
#include "run/signals.hpp"
#include "run/tables.hpp"
#include "text/text.hpp"

namespace fs = std::filesystem;

namespace keel {

namespace {

// `--set KEY=VALUE`, the argument as one shell word.
std::string set_argument(const std::string& key, const std::string& value) {
  return "--set " + text::shell_word(key + "=" + value);
}

// What sets the breaking changes back as the checkpoint has them: a --set of the saved value
// for each key (a key the checkpoint's manifest lacks has to be removed from the manifest). Where
// a component's `type` changed, the options only one of the two plugins has come and go with it.
std::string set_back(const std::vector<ManifestChange>& breaking) {
  std::vector<std::string> retyped;  // "optimizer." for a changed optimizer.type
  for (const ManifestChange& c : breaking)
    if (c.key.size() > 5 && c.key.compare(c.key.size() - 5, 5, ".type") == 0)
      retyped.push_back(c.key.substr(0, c.key.size() - 4));
  std::vector<std::string> sets, removals;
  for (const ManifestChange& c : breaking) {
    const bool with_type = std::any_of(retyped.begin(), retyped.end(), [&](const std::string& s) {
      return c.key.rfind(s, 0) == 0 && c.key != s + "type";
    });
    if (with_type && (c.before == kAbsent || c.after == kAbsent)) continue;
    (c.before == kAbsent ? removals : sets)
        .push_back(c.before == kAbsent ? c.key : set_argument(c.key, c.before));
  }
  std::string out;
  for (const std::string& s : sets) out += (out.empty() ? "" : " ") + s;
  if (!removals.empty())
    out += (out.empty() ? "remove " : " and remove ") + text::join(removals) +
           " from the manifest";
  return out;
}

// Manifest changes since the checkpoint: safe ones (config/resume_changes.hpp: by the key rows)
// are named in a warning; one that breaks an exact continuation is refused, unless
// --resume-changed accepts it. The refusal's hint sets them back as the checkpoint has them.
void check_manifest_changes(const Run& run, const std::string& saved) {
  const auto [safe, breaking] = resume_changes(saved, run.resolved_manifest);
  for (const ManifestChange& c : safe)
    spdlog::warn("--resume: {} changed since the checkpoint ({} -> {})", c.key, c.before,
                 c.after);
  if (breaking.empty()) return;
  if (run.config.resume_changed) {
    for (const ManifestChange& c : breaking)
      spdlog::warn("--resume: {} changed since the checkpoint ({} -> {}), accepted by "
                   "--resume-changed: the run no longer continues exactly",
                   c.key, c.before, c.after);
    return;
  }
  std::vector<std::string> others;
  for (size_t i = 1; i < breaking.size(); ++i) others.push_back(breaking[i].key);
  const std::string more = text::join(others);
  const ManifestChange& c = breaking.front();
  throw Error("--resume: " + c.key + " changed since the checkpoint " + run.resume.dir + " (" +
              c.before + " -> " + c.after + ")" +
              (more.empty() ? "" : "; also changed: " + more) +
              ". That breaks an exact continuation; hint: set " +
              (breaking.size() > 1 ? "them" : "it") + " back as the checkpoint has " +
              (breaking.size() > 1 ? "them" : "it") + " (" + set_back(breaking) +
              "), or add --resume-changed to accept the change");
}

// At another world size, the saved data position (the global sample cursor, epoch_samples) in
// this run's micro-batches per rank: datasets shard strided (rank r takes samples r, r + W,
// ...), so the W ranks' micro-batch t holds the epoch's samples t B W .. (t + 1) B W - 1 at any
// W, and the position maps exactly when it is a whole number of this run's B W.
void remap_data_position(Run& run) {
  CheckpointMeta& m = run.resume.meta;
  const int64_t world = run.ranks.world, batch = micro_batch_size(run.config);
  const int64_t global = batch * run.plan.grad_accum * world;
  if (m.global_batch > 0 && batch > 0 && m.global_batch != global)
    spdlog::warn("--resume: {} was saved with {} samples per step over its {} rank(s), this run "
                 "takes {} over {}: the steps after it are not the ones the saved run would "
                 "have taken; hint: set [train] global_batch = {} to keep it at any number of "
                 "ranks", run.resume.dir, m.global_batch, m.world_size, global, world,
                 m.global_batch);
  if (m.world_size == world || m.epoch_batches == 0) return;
  if (m.epoch_samples <= 0 || batch <= 0)
    throw Error(fmt::format("--resume: {} was saved by {} rank(s) inside epoch {} and this run "
                            "has {}, but its data position is not a sample count (no "
                            "epoch_samples, or [data.train] has no integer batch_size); hint: "
                            "launch {} process(es), or resume from a checkpoint saved at an "
                            "epoch's end", run.resume.dir, m.world_size, m.epoch, world,
                            m.world_size));
  if (m.epoch_samples % (batch * world) != 0)
    throw Error(fmt::format("--resume: {} was saved after {} samples of epoch {}, not a whole "
                            "number of micro-batches of [data.train] batch_size {} x {} rank(s) "
                            "= {}; hint: launch a number of ranks whose batch_size x ranks "
                            "divides {}, or {}", run.resume.dir, m.epoch_samples, m.epoch, batch,
                            world, batch * world, m.epoch_samples, m.world_size));
  m.epoch_batches = m.epoch_samples / (batch * world);
}

// Reads the metadata of run.resume.dir and checks that this run can continue it.
void adopt_resume_point(Run& run) {
  ResumePoint& resume = run.resume;
  const fs::path meta_path = fs::path(resume.dir) / "trainer_state.toml";
  resume.meta =
      read_checkpoint_meta(read_resume_file(resume.dir, "trainer_state.toml"), meta_path.string());
  if (resume.meta.step != resume.record.step || resume.meta.run_id != resume.record.run_id)
    throw Error(meta_path.string() + ": step and run_id differ from its commit record; hint: "
                "the checkpoint is damaged, resume from another one");
  run.run_id = resume.meta.run_id;
  remap_data_position(run);
  check_manifest_changes(run, read_resume_file(resume.dir, "manifest.resolved.toml"));
  const auto now = plugin_versions(run);
  for (const auto& [name, version] : resume.meta.plugins)
    for (const auto& [n, v] : now)
      if (n == name && v != version)
        spdlog::warn("--resume: plugin {} was version {} when {} was saved, it is {} now", name,
                     version, resume.dir, v);
}

// Rank 0: the checkpoint --resume names, or the newest complete one; verified. Returns its
// directory ("" when there is none yet).
std::string pick_resume_checkpoint(Run& run) {
  const RunConfig& cfg = run.config;
  ResumePoint& resume = run.resume;
  if (!cfg.checkpoint)
    throw Error("--resume: the manifest has no [checkpoint] table, so this run keeps no "
                "checkpoints to resume from; hint: add [checkpoint] with type = \"safetensors\"");
  const fs::path root = fs::path(cfg.run.output_dir) / "checkpoints";
  if (cfg.resume == RunConfig::Resume::kPath) {
    const std::string dir = fs::absolute(cfg.resume_path).lexically_normal().string();
    if (!fs::is_directory(dir))
      throw Error("--resume " + cfg.resume_path + ": not a directory; hint: name a checkpoint "
                  "directory (runs/<name>/checkpoints/step-<N>), or give --resume alone for the "
                  "newest one in " + root.string());
    try {
      resume.record = verify_checkpoint(dir);
    } catch (const Error& e) {
      throw Error("--resume " + cfg.resume_path + ": cannot resume from it: " + e.what());
    }
    return resume.dir = dir;
  }
  const auto newest = CheckpointStore::newest_verified(
      root.string(), [](const std::string& dir, const Error& e) {
        spdlog::warn("--resume: skipping {}: {}", dir, e.what());
      });
  if (!newest) {
    spdlog::info("--resume: no complete checkpoint in {}: starting a fresh run", root.string());
    return "";
  }
  resume.record = newest->record;
  return resume.dir = newest->dir;
}

// The model's tensors: this rank's rows of each parameter (all of them without shards; with
// shards the all-gather then gives every rank every row) and every other tensor whole, from
// whichever chunks hold them.
void load_model(Run& run, const ChunkReader& reader, const std::string& dir) {
  const Parameters& p = run.parameters;
  TensorList whole;
  for (const auto& nt : p.model_state) whole.emplace_back(nt.name, borrow(nt.tensor));
  check_model_tensors(run.components.model.label(), reader.record(), dir, whole,
                      "resume with the model options the checkpoint was saved with (its "
                      "manifest.resolved.toml)");
  std::vector<ChunkReader::Request> requests;
  std::set<const keel_tensor*> read;
  for (const auto& nt : p.model_state) {
    const auto it = std::find(p.handles.begin(), p.handles.end(), nt.tensor);
    if (!read.insert(nt.tensor).second) continue;  // a tied weight: once
    if (run.shards && it != p.handles.end()) {
      const ShardedParams::Rows rows =
          run.shards->rows_of(static_cast<size_t>(it - p.handles.begin()));
      requests.push_back({"model", nt.name, rows.begin, rows.shard});
    } else {
      requests.push_back({"model", nt.name, 0, borrow(nt.tensor)});
    }
  }
  reader.read(requests);
  if (run.shards) run.shards->gather_parameters("gathering the parameters loaded from " + dir);
}

// The optimizer's state as this run holds it: its rows of each entry elementwise over a
// parameter, every other entry whole.
void load_optimizer(Run& run, const ChunkReader& reader, const std::string& dir) {
  const Instance<keel_optimizer>& optimizer = run.components.optimizer;
  if (!KEEL_HAS_SLOT(optimizer, keel_optimizer, state_load) ||
      !KEEL_HAS_SLOT(optimizer, keel_optimizer, state_save))
    throw optimizer.error("has no state_save/state_load slots (ABI 1.3), so --resume would "
                          "go on with fresh optimizer moments; hint: use an optimizer that "
                          "keeps its state in checkpoints (sgd, adam, adamw do), or start a "
                          "new run from the weights with [checkpoint] init_from");
  const auto entries = reader.record().chunks.find("optimizer");
  if (entries == reader.record().chunks.end())
    throw Error(dir + ": the checkpoint holds no optimizer state (saved by an optimizer "
                "without state slots); hint: start a new run from its weights with "
                "[checkpoint] init_from");
  reader.check_coverage("optimizer");
  const std::vector<ParamRows> layout = param_rows(run);
  TensorList opt;
  std::vector<ChunkReader::Request> requests;
  for (const auto& [name, g] : entries->second) {
    std::vector<int64_t> shape = g.shape;
    int64_t begin = 0;
    if (!g.like.empty()) {
      const auto p = std::find_if(layout.begin(), layout.end(),
                                  [&like = g.like](const ParamRows& r) { return r.name == like; });
      if (p == layout.end())
        throw Error(dir + ": optimizer state '" + name + "' follows parameter '" + g.like +
                    "', which " + run.components.model.label() + " does not have; hint: "
                    "resume with the model options the checkpoint was saved with");
      shape = p->local_shape();
      begin = p->begin;
    }
    opt.emplace_back(name, allocate_claimed(shape, dtype_of_name(g.dtype),
                                            "optimizer tensor '" + name + "'", dir));
    requests.push_back({"optimizer", name, begin, opt.back().second});
  }
  reader.read(requests);
  const auto named = as_named(opt);
  optimizer.call("state_load", optimizer->state_load, named.data(), named.size());
}

// allocate(rec, object) (run/plugin_state.hpp) of checkpoint `dir`: an allocation that fails
// (its claims are bounded by the files' size, not by this machine's memory) is one error line.
template <class F>
TensorList allocating(const std::string& dir, F&& allocate_them) {
  try {
    return allocate_them();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // c10::Error (DefaultCPUAllocator), std::bad_alloc
    const std::string why = e.what();
    throw Error(dir + ": cannot allocate the tensors its commit record lists to load them (" +
                text::printable(why.substr(0, why.find('\n'))) + "); hint: load the "
                "checkpoint on a machine with more memory");
  }
}

// This rank's "state" object: the state_save entries of the model and the training data. At
// another world size, rank 0's model entries on every rank, and no training data state (its
// position comes from the global sample cursor, remap_data_position).
void load_plugin_state(Run& run, const CommitRecord& rec, const std::string& dir) {
  const bool same_world = run.resume.meta.world_size == run.ranks.world;
  const std::string object = same_world ? rank_object(run, "state") : "state";
  TensorList plugin_state = allocating(dir, [&] { return allocate(rec, object); });
  run.components.store->load(dir, object, plugin_state);
  if (!same_world)
    plugin_state.erase(std::remove_if(plugin_state.begin(), plugin_state.end(),
                                      [](const auto& e) { return e.first.rfind("data.train/", 0) == 0; }),
                       plugin_state.end());
  const auto give_state = [&](const auto& inst, const std::string& section) {
    using Abi = std::remove_pointer_t<decltype(inst.operator->())>;
    TensorList mine;
    const std::string prefix = section + "/";
    for (const auto& [name, t] : plugin_state)
      if (name.rfind(prefix, 0) == 0) mine.emplace_back(name.substr(prefix.size()), t);
    if (!KEEL_HAS_SLOT(inst, Abi, state_load)) {
      if (!mine.empty())
        spdlog::warn("{} holds state of {}, which has no state_load slot now: not loaded", dir,
                     inst.label());
      return;
    }
    const auto n = as_named(mine);
    inst.call("state_load", inst->state_load, n.data(), n.size());
  };
  give_state(run.components.model, "model");
  give_state(run.components.train_data, "data.train");
}

// This rank's generators. At another world size the ranks' streams cannot be remapped: rank 0
// restores its own, rank r > 0 seeds afresh from the run's seed, its rank and the step.
void load_generators(Run& run, const CommitRecord& rec, const std::string& dir) {
  const int64_t saved_by = run.resume.meta.world_size;
  if (saved_by != run.ranks.world && run.ranks.rank == 0)
    spdlog::warn("--resume: {} was saved by {} rank(s) and this run has {}: the parameters, the "
                 "optimizer state and the data position (global sample cursor) continue exactly; "
                 "rank 0's generators are restored, those of ranks 1.. are re-derived from the "
                 "seed (seed + 1000003 x rank + step) and no training data state is restored, "
                 "so dropout and other random draws of those ranks differ from an "
                 "uninterrupted run", dir, saved_by, run.ranks.world);
  if (saved_by != run.ranks.world && run.ranks.rank > 0) {
    at::manual_seed(run.config.run.seed + 1000003ull * static_cast<uint64_t>(run.ranks.rank) +
                    static_cast<uint64_t>(run.resume.meta.step));
    return;
  }
  TensorList rng = allocating(dir, [&] { return allocate(rec, rank_object(run, "rng")); });
  run.components.store->load(dir, rank_object(run, "rng"), rng);
  for (const auto& [name, t] : rng) {
    if (name == "torch.cpu") {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(t);
    } else if (name.rfind("torch.cuda.", 0) == 0) {
      const int d = std::stoi(name.substr(11));
      if (!at::hasCUDA() || d >= at::detail::getCUDAHooks().getNumGPUs())
        throw Error(fmt::format("{}: holds the generator of CUDA device {}, which this process "
                                "does not have; hint: resume on the same devices", dir, d));
      at::Generator gen = compat::cuda_default_generator(d);
      gen.set_state(t);
    }
  }
}

// The progress, the log window, the loss scale and the latest records the checkpoint saved.
void restore_progress(Run& run) {
  const CheckpointMeta& m = run.resume.meta;
  keel_trainer_state& p = run.progress;
  Records& records = run.records;
  p.step = m.step;
  p.epoch = m.epoch;
  p.samples = m.samples;
  p.tokens = m.tokens;
  p.skipped_steps = m.skipped_steps;
  records.last_eval_step = m.last_eval_step;
  records.last_saved_step = m.step;
  if (run.plan.scaler && m.loss_scale > 0)
    run.plan.scaler->restore(m.loss_scale, m.loss_scale_clean_steps);
  Window& w = run.window;
  w.loss = m.window.loss;
  w.grad_norm = m.window.grad_norm;
  w.steps = m.window.steps;
  w.norms = m.window.norms;
  w.samples = m.window.samples;
  w.tokens = m.window.tokens;
  records.restored_keys.clear();
  records.restored_keys.reserve(m.train_metrics.size());  // stable
  for (const auto& [k, v] : m.train_metrics) {
    records.restored_keys.push_back(k);
    records.train.push_back({records.restored_keys.back().c_str(), v});
  }
  // The records of the sets this run evaluates, in its order of the sets (a set the resumed
  // manifest no longer has leaves its record behind).
  records.eval.clear();
  for (const EvalSetSpec& set : run.config.eval_sets)
    for (const auto& [split, record] : m.eval_metrics)
      if (split == set.name) records.eval.emplace_back(split, record);
  if (!records.train.empty()) {
    p.train_metrics = records.train.data();
    p.train_metric_count = records.train.size();
  }
  for (const auto& r : records.train) {
    if (std::strcmp(r.key, "step") == 0) records.last_train_step = static_cast<int64_t>(r.value);
    if (std::strcmp(r.key, "loss_last") == 0) p.loss = r.value;
    if (std::strcmp(r.key, "grad_norm_last") == 0) p.grad_norm = r.value;
  }
  if (!records.eval.empty()) {  // the set evaluated last
    p.eval_metrics = records.eval.back().metrics.data();
    p.eval_metric_count = records.eval.back().metrics.size();
  }
}

}  // namespace

void choose_resume_point(Run& run) {
  const std::string dir =
      on_rank0(run.ranks.group.get(), run.ranks.rank, "choose the checkpoint to resume from", [&] {
        if (!pick_resume_checkpoint(run).empty()) adopt_resume_point(run);
        return run.resume.dir;
      });
  ProcessGroup* group = run.ranks.group.get();
  if (!group || dir.empty()) return;
  // The other ranks read the checkpoint rank 0 chose (and verified), and every rank agrees that
  // they could: a rank that cannot fails every rank, instead of leaving the others waiting.
  std::optional<Error> failed;
  if (run.ranks.rank != 0) {
    try {
      run.resume.dir = dir;
      run.resume.record = read_commit_file(dir);
      adopt_resume_point(run);
    } catch (const Error& e) {
      failed = e;
    }
  }
  if (!group->any(failed.has_value(), "reading the checkpoint to resume on every rank")) return;
  if (failed) throw *failed;
  throw Error("another rank could not read the checkpoint " + dir + " to resume from; hint: its "
              "error line says why (every rank reads it: check it is on a path and with "
              "permissions that every rank can read)");
}

std::string read_resume_file(const std::string& dir, const std::string& name) {
  return add_hint([&] { return read_file((fs::path(dir) / name).string()); }, [](int code) {
    return code == EACCES || code == EPERM
               ? "check its permissions: every process of the run reads it"
               : "the checkpoint is incomplete or damaged, resume from another one (--resume "
                 "PATH)";
  });
}

void load_resume_point(Run& run) {
  const CommitRecord& rec = run.resume.record;
  const std::string& dir = run.resume.dir;
  const ChunkReader reader(*run.components.backend, dir, rec);
  load_model(run, reader, dir);
  load_optimizer(run, reader, dir);
  load_hook_state(run, rec, dir, /*fresh_on_mismatch=*/false);
  load_plugin_state(run, rec, dir);
  load_tables(run, rec, dir);
  load_generators(run, rec, dir);
  check_unchanged(dir, rec);  // every file loaded is still the one verified (rank 0)
  restore_progress(run);
}

void check_model_tensors(const std::string& model, const CommitRecord& rec,
                         const std::string& dir, const TensorList& into, const std::string& hint) {
  auto it = rec.chunks.find("model");
  if (it == rec.chunks.end())
    throw Error(dir + ": the checkpoint holds no model; hint: it was not written by keel train");
  for (const auto& [name, t] : into) {
    auto s = it->second.find(name);
    if (s == it->second.end())
      throw Error(dir + ": the checkpoint has no tensor '" + name + "' for " + model +
                  "; hint: " + hint);
    if (s->second.shape != t.sizes().vec())
      throw Error(dir + ": tensor '" + name + "' has shape " + text::shape(s->second.shape) +
                  " in the checkpoint and " + text::shape(t.sizes()) + " in " + model + "; hint: " + hint);
  }
}

std::map<std::string, const CommitRecord::Tensor*> stored_hook_state(const CommitRecord& rec) {
  std::map<std::string, const CommitRecord::Tensor*> stored;
  if (auto it = rec.tensors.find("hooks"); it != rec.tensors.end())
    for (const auto& t : it->second) stored.emplace(t.name, &t);
  return stored;
}

bool same_layout(const CommitRecord::Tensor& stored, const at::Tensor& t) {
  const Dtype* dtype = dtype_of(t.scalar_type());
  return stored.shape == t.sizes().vec() && dtype && stored.dtype == dtype->name;
}

std::string layout(const CommitRecord::Tensor& stored) {
  return stored.dtype + " " + text::shape(stored.shape);
}

std::string layout(const at::Tensor& t) {
  const Dtype* dtype = dtype_of(t.scalar_type());
  return std::string(dtype ? dtype->name : "?") + " " + text::shape(t.sizes());
}

void load_hook_state(Run& run, const CommitRecord& rec, const std::string& dir,
                     bool fresh_on_mismatch) {
  const auto stored = stored_hook_state(rec);
  const Parameters& p = run.parameters;
  std::set<std::string> afresh;  // labels of hooks whose stored state does not fit
  for (size_t i = 0; i < p.hook_state.size() && fresh_on_mismatch; ++i) {
    const auto it = stored.find(p.hook_state[i].name);
    const at::Tensor mine = borrow(p.hook_state[i].tensor);
    if (it == stored.end() || afresh.count(p.hook_state_labels[i]) ||
        same_layout(*it->second, mine))
      continue;
    afresh.insert(p.hook_state_labels[i]);
    spdlog::warn("hook state '{}' is {} in {}, {} here: hook '{}' starts afresh", it->first,
                 layout(*it->second), dir, layout(mine), p.hook_state_labels[i]);
  }
  TensorList into;
  std::set<std::string> mine;
  for (size_t i = 0; i < p.hook_state.size(); ++i) {
    const keel_named_tensor& nt = p.hook_state[i];
    mine.insert(nt.name);
    if (afresh.count(p.hook_state_labels[i])) continue;
    if (stored.count(nt.name))
      into.emplace_back(nt.name, borrow(nt.tensor));
    else
      spdlog::warn("hook state '{}' is not in {}: that hook starts afresh", nt.name, dir);
  }
  for (const auto& [name, t] : stored)
    if (!mine.count(name))
      spdlog::warn("{} holds hook state '{}', which no hook of this run keeps (hooks are matched "
                   "by label): not loaded", dir, name);
  run.components.store->load(dir, "hooks", into);
}

void seek_train_data(Run& run, int64_t epoch, int64_t batch) {
  const Instance<keel_dataset>& data = run.components.train_data;
  if (KEEL_HAS_SLOT(data, keel_dataset, seek)) {
    data.call("seek", data->seek, epoch, batch);
    return;
  }
  spdlog::info("{} has no seek slot: replaying {} batch(es) of epoch {} to reach the resume "
               "position", data.label(), batch, epoch);
  data.call("start_epoch", data->start_epoch, epoch);
  for (int64_t i = 0; i < batch; ++i) {
    MicroBatch discarded;
    const NextResult got = next_batch(run.components.train_source, run.ranks.device, &discarded);
    // Stopped while waiting (a SIGTERM/SIGINT during the replay): no step was taken since the
    // checkpoint resumed from, which stays the newest; the position reached is not saved.
    if (got == NextResult::kStopped)
      throw data.error(fmt::format("stopped by a signal while replaying batch {} of {} to reach "
                                   "the resume position; nothing new to save: the checkpoint "
                                   "resumed from is still the newest; hint: resume again when "
                                   "the data is there", i + 1, batch));
    if (got == NextResult::kEnd)
      throw data.error(fmt::format("epoch {} ended after {} batches, but the checkpoint was "
                                   "saved after {}; hint: resume with the data options it was "
                                   "saved with", epoch, i, batch));
  }
}

}  // namespace keel
