#include "run/resume.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "files/files.hpp"
#include "checkpoint/resume.hpp"
#include "config/resume_check.hpp"
#include "distributed/on_rank0.hpp"
#include "keel/tensor.hpp"
#include "run/checkpointing.hpp"
#include "run/plugin_state.hpp"
#include "run/run.hpp"
#include "text/text.hpp"

namespace fs = std::filesystem;

namespace keel {

namespace {

// Manifest changes since the checkpoint: safe ones (config/resume_check.hpp: by the key rows)
// are named in a warning; one that breaks an exact continuation is refused, unless
// --resume-changed accepts it.
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
              ". That breaks an exact continuation; hint: set it back, or add --resume-changed "
              "to accept the change");
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
  const int64_t saved_by = resume.meta.world_size;
  if (saved_by != run.ranks.world)
    throw Error("--resume: " + resume.dir + " was saved by " + std::to_string(saved_by) +
                " process(es) and this run has " + std::to_string(run.ranks.world) +
                "; each rank's generator and data position are in it, so only the same number "
                "continues it exactly; hint: launch " + std::to_string(saved_by) +
                " process(es) (torchrun --nproc_per_node=" + std::to_string(saved_by) +
                "), or start a new run from its weights with [checkpoint] init_from");
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

void load_model_and_optimizer(Run& run, const CommitRecord& rec, const std::string& dir) {
  const Instance<keel_optimizer>& optimizer = run.components.optimizer;
  CheckpointStore& store = *run.components.store;
  TensorList model_t;
  for (const auto& nt : run.parameters.model_state)
    model_t.emplace_back(nt.name, borrow(nt.tensor));
  check_model_tensors(run, rec, dir, model_t,
                      "resume with the model options the checkpoint was saved with (its "
                      "manifest.resolved.toml)");
  store.load(dir, "model", model_t);
  if (!KEEL_HAS_SLOT(optimizer, keel_optimizer, state_load) ||
      !KEEL_HAS_SLOT(optimizer, keel_optimizer, state_save))
    throw optimizer.error("has no state_save/state_load slots (ABI 1.3), so --resume would "
                          "go on with fresh optimizer moments; hint: use an optimizer that "
                          "keeps its state in checkpoints (sgd, adam, adamw do), or start a "
                          "new run from the weights with [checkpoint] init_from");
  // With shards, this rank's part.
  const std::string object = optimizer_object(run);
  const std::string other = run.shards ? "optimizer" : "rank0.optimizer";
  if (!rec.tensors.count(object) && rec.tensors.count(other))
    throw Error(dir + ": the checkpoint holds the optimizer state " +
                (run.shards ? "whole (distributed.shard = \"none\")" : "in shards") +
                " and this run " + (run.shards ? "shards it" : "does not shard it") +
                "; hint: resume with the distributed.shard the checkpoint was saved with");
  if (!rec.tensors.count(object))
    throw Error(dir + ": the checkpoint holds no optimizer state (saved by an optimizer "
                "without state slots); hint: start a new run from its weights with "
                "[checkpoint] init_from");
  TensorList opt = allocate(rec, object);
  store.load(dir, object, opt);
  const auto named = as_named(opt);
  optimizer.call("state_load", optimizer->state_load, named.data(), named.size());
}

// This rank's "state" object: the state_save entries of the model and the training data.
void load_plugin_state(Run& run, const CommitRecord& rec, const std::string& dir) {
  TensorList plugin_state = allocate(rec, rank_object(run, "state"));
  run.components.store->load(dir, rank_object(run, "state"), plugin_state);
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

// This rank's generators.
void load_generators(Run& run, const CommitRecord& rec, const std::string& dir) {
  TensorList rng = allocate(rec, rank_object(run, "rng"));
  run.components.store->load(dir, rank_object(run, "rng"), rng);
  for (const auto& [name, t] : rng) {
    if (name == "torch.cpu") {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(t);
    } else if (name.rfind("torch.cuda.", 0) == 0) {
      const int d = std::stoi(name.substr(11));
      if (!at::hasCUDA() || d >= at::detail::getCUDAHooks().getNumGPUs())
        throw Error(dir + ": holds the generator of CUDA device " + std::to_string(d) +
                    ", which this process does not have; hint: resume on the same devices");
      at::Generator gen = at::detail::getCUDAHooks().getDefaultCUDAGenerator(d);
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
  records.restored_keys.reserve(m.train_metrics.size() + m.eval_metrics.size());  // stable
  for (const auto& [k, v] : m.train_metrics) {
    records.restored_keys.push_back(k);
    records.train.push_back({records.restored_keys.back().c_str(), v});
  }
  for (const auto& [k, v] : m.eval_metrics) {
    records.restored_keys.push_back(k);
    records.eval.push_back({records.restored_keys.back().c_str(), v});
  }
  if (!records.train.empty()) {
    p.train_metrics = records.train.data();
    p.train_metric_count = records.train.size();
  }
  for (const auto& r : records.train) {
    if (std::strcmp(r.key, "step") == 0) records.last_train_step = static_cast<int64_t>(r.value);
    if (std::strcmp(r.key, "loss_last") == 0) p.loss = r.value;
    if (std::strcmp(r.key, "grad_norm_last") == 0) p.grad_norm = r.value;
  }
  if (!records.eval.empty()) {
    p.eval_metrics = records.eval.data();
    p.eval_metric_count = records.eval.size();
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
  load_model_and_optimizer(run, rec, dir);
  load_hook_state(run, rec, dir);
  load_plugin_state(run, rec, dir);
  load_generators(run, rec, dir);
  restore_progress(run);
}

void check_model_tensors(const Run& run, const CommitRecord& rec, const std::string& dir,
                         const TensorList& into, const std::string& hint) {
  const std::string& model = run.components.model.label();
  auto it = rec.tensors.find("model");
  if (it == rec.tensors.end())
    throw Error(dir + ": the checkpoint holds no model; hint: it was not written by keel train");
  std::map<std::string, const CommitRecord::Tensor*> stored;
  for (const auto& t : it->second) stored[t.name] = &t;
  for (const auto& [name, t] : into) {
    auto s = stored.find(name);
    if (s == stored.end())
      throw Error(dir + ": the checkpoint has no tensor '" + name + "' for " + model +
                  "; hint: " + hint);
    if (s->second->shape != t.sizes().vec())
      throw Error(dir + ": tensor '" + name + "' has shape " + text::shape(s->second->shape) +
                  " in the checkpoint and " + text::shape(t.sizes()) + " in " + model + "; hint: " + hint);
  }
}

void load_hook_state(Run& run, const CommitRecord& rec, const std::string& dir) {
  std::set<std::string> stored;
  if (auto it = rec.tensors.find("hooks"); it != rec.tensors.end())
    for (const auto& t : it->second) stored.insert(t.name);
  TensorList into;
  std::set<std::string> mine;
  for (const auto& nt : run.parameters.hook_state) {
    mine.insert(nt.name);
    if (stored.count(nt.name))
      into.emplace_back(nt.name, borrow(nt.tensor));
    else
      spdlog::warn("hook state '{}' is not in {}: that hook starts afresh", nt.name, dir);
  }
  for (const auto& name : stored)
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
    keel_batch b{};
    int has = 0;
    data.call("next", data->next, &b, &has);
    adopt(b.inputs);
    adopt(b.targets);
    if (!has)
      throw data.error("epoch " + std::to_string(epoch) + " ended after " + std::to_string(i) +
                       " batches, but the checkpoint was saved after " + std::to_string(batch) +
                       "; hint: resume with the data options it was saved with");
  }
}

}  // namespace keel
