#include "run/checkpointing.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "checkpoint/checksum.hpp"
#include "checkpoint/multi_rank.hpp"
#include "distributed/store_client.hpp"
#include "keel/tensor.hpp"
#include "run/events.hpp"
#include "run/plugin_state.hpp"
#include "run/run.hpp"

namespace keel {

namespace {

// Rank 0's objects: the replicated ones (model, optimizer, hooks). Parameters and optimizer
// state change only in the optimizer step: an asynchronous save copies them on its thread
// while the next step's forward and backward run (the step waits for that copy before
// BEFORE_OPTIMIZER_STEP).
void add_replicated_objects(const Run& run, Snapshot& snap) {
  const Parameters& p = run.parameters;
  const Components& c = run.components;
  TensorList model_t, hooks_t;
  const std::set<const void*> params_set(p.handles.begin(), p.handles.end());
  for (const auto& nt : p.model_state) {
    model_t.emplace_back(nt.name, borrow(nt.tensor));
    if (params_set.count(nt.tensor)) snap.deferred.insert(nt.tensor);
  }
  snap.objects.emplace_back("model", std::move(model_t));
  // With shards each rank holds its own part of the optimizer state (add_rank_objects).
  if (!run.shards && KEEL_HAS_SLOT(c.optimizer, keel_optimizer, state_save)) {
    TensorList opt = save_state(c.optimizer);
    for (const auto& [name, t] : opt) snap.deferred.insert(t.unsafeGetTensorImpl());
    snap.objects.emplace_back("optimizer", std::move(opt));
  }
  for (const auto& nt : p.hook_state) hooks_t.emplace_back(nt.name, borrow(nt.tensor));
  snap.objects.emplace_back("hooks", std::move(hooks_t));
}

// Every rank's own objects: its generators ("rng") and its plugins' state_save entries
// ("state": of the model and the training data, as "<section>/<name>").
void add_rank_objects(const Run& run, Snapshot& snap) {
  TensorList rng_t, state_t;
  rng_t.emplace_back("torch.cpu", at::detail::getDefaultCPUGenerator().get_state());
  if (at::hasCUDA())
    for (int d = 0; d < at::detail::getCUDAHooks().getNumGPUs(); ++d)
      rng_t.emplace_back("torch.cuda." + std::to_string(d),
                         at::detail::getCUDAHooks().getDefaultCUDAGenerator(d).get_state());
  snap.objects.emplace_back(rank_object(run, "rng"), std::move(rng_t));
  const auto add_state = [&](const auto& inst, const std::string& section) {
    using Abi = std::remove_pointer_t<decltype(inst.operator->())>;
    if (!KEEL_HAS_SLOT(inst, Abi, state_save)) return;
    for (auto& [name, t] : save_state(inst)) state_t.emplace_back(section + "/" + name, t);
  };
  add_state(run.components.model, "model");
  add_state(run.components.train_data, "data.train");
  snap.objects.emplace_back(rank_object(run, "state"), std::move(state_t));
  // This rank's part of the optimizer state changes only in the optimizer step, as rank 0's
  // whole one does (add_replicated_objects): deferred too.
  if (run.shards && KEEL_HAS_SLOT(run.components.optimizer, keel_optimizer, state_save)) {
    TensorList opt = save_state(run.components.optimizer);
    for (const auto& [name, t] : opt) snap.deferred.insert(t.unsafeGetTensorImpl());
    snap.objects.emplace_back(optimizer_object(run), std::move(opt));
  }
}

// trainer_state.toml's fields (checkpoint/meta.hpp) and the metrics retention ranks by.
void fill_meta(const Run& run, Snapshot& snap) {
  const keel_trainer_state& p = run.progress;
  const Window& w = run.window;
  CheckpointMeta& m = snap.meta;
  m.run_id = run.run_id;
  m.step = p.step;
  m.epoch = run.epoch.finished ? p.epoch + 1 : p.epoch;
  m.epoch_batches = run.epoch.finished ? 0 : run.epoch.batches;
  m.samples = p.samples;
  m.tokens = p.tokens;
  m.skipped_steps = p.skipped_steps;
  m.last_eval_step = run.records.last_eval_step;
  m.world_size = run.ranks.world;
  m.keel_version = KEEL_VERSION;
  m.manifest_hash = hash_string(hash_text(run.resolved_manifest));
  m.loss_scale = run.plan.scaler ? run.plan.scaler->scale() : 0.0;
  m.loss_scale_clean_steps = run.plan.scaler ? run.plan.scaler->clean_steps() : 0;
  m.window = {w.loss, w.grad_norm, w.steps, w.norms, w.samples, w.tokens};
  m.plugins = plugin_versions(run);
  for (const auto& r : run.records.train) m.train_metrics.emplace_back(r.key, r.value);
  for (const auto& r : run.records.eval) m.eval_metrics.emplace_back(r.key, r.value);
  for (const auto& [k, v] : m.train_metrics) snap.metrics["train." + k] = v;
  for (const auto& [k, v] : m.eval_metrics) snap.metrics["test." + k] = v;
  snap.manifest = run.resolved_manifest;
}

// Everything a checkpoint holds, gathered now (at a step boundary). With several ranks, rank 0
// holds the replicated objects (model, optimizer, hooks) and its own "rng" and "state"; rank
// r > 0 only its own, as "rank<r>.rng" and "rank<r>.state". With [distributed] shard the
// optimizer state is each rank's own too, as "rank<r>.optimizer" (optimizer_object).
Snapshot snapshot(const Run& run) {
  Snapshot snap;
  if (run.ranks.rank == 0) add_replicated_objects(run, snap);
  add_rank_objects(run, snap);
  // Backends take CPU tensors: a synchronous save copies device tensors now (an asynchronous
  // one copies every tensor to the CPU itself).
  if (!run.ranks.device.is_cpu() && !run.config.checkpointing.async)
    for (auto& [stem, tensors] : snap.objects)
      for (auto& [name, t] : tensors) t = t.cpu();
  fill_meta(run, snap);
  return snap;
}

void announce_commit(Run& run, const std::string& dir) {
  spdlog::info("checkpoint committed: {}", dir);
  emit(run, KEEL_EVENT_CHECKPOINT_SAVED, nullptr, nullptr, dir.c_str());
}

}  // namespace

std::string rank_object(const Run& run, const std::string& stem) {
  return run.ranks.rank == 0 ? stem : "rank" + std::to_string(run.ranks.rank) + "." + stem;
}

std::string optimizer_object(const Run& run) {
  return run.shards ? "rank" + std::to_string(run.ranks.rank) + ".optimizer" : "optimizer";
}

std::vector<std::pair<std::string, std::string>> plugin_versions(const Run& run) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const ComponentSpec* sp : used_components(run.config)) {
    const LoadedPlugin* pl = sp->component->plugin;
    const std::pair<std::string, std::string> pv{pl->name, pl->version};
    if (std::none_of(out.begin(), out.end(), [&](const auto& o) { return o.first == pv.first; }))
      out.push_back(pv);
  }
  return out;
}

bool save_due(Run& run, Moment moment) {
  const RunConfig& c = run.config;
  if (!run.components.store) return false;
  const bool saved_now = run.records.last_saved_step == run.progress.step;
  switch (moment) {
    case Moment::kStart:
      return c.checkpointing.initial && !run.resume.active();
    case Moment::kStepEnd:
      return (c.checkpointing.every_steps > 0 && run.progress.step % c.checkpointing.every_steps == 0) ||
             run.requests.checkpoint();
    case Moment::kEpochEnd:
      return run.requests.checkpoint() && !saved_now;
    case Moment::kFinish:
      return c.checkpointing.at_end && !saved_now;
    case Moment::kEpochOver:
      break;
  }
  return false;
}

void save_checkpoint(Run& run) {
  CheckpointStore& store = *run.components.store;
  const AddElapsed timed(run.window.checkpoint_s);
  profile_begin(run, "checkpoint");
  finish_async_save(run, /*block=*/true);  // at most one in flight
  // shard = "parameters" (never asynchronous, run/parameters.cpp): the whole model while the
  // save writes it, freed after.
  if (run.residency)
    run.residency->gather_all("gathering the model for the checkpoint of step " +
                              std::to_string(run.progress.step));
  Snapshot snap = snapshot(run);
  run.records.last_saved_step = run.progress.step;
  if (run.config.checkpointing.async) {
    Ranks& ranks = run.ranks;
    if (!ranks.group) {
      store.save_async(std::move(snap));
    } else {
      if (!ranks.writer_store) ranks.writer_store = std::make_shared<StoreClient>(*ranks.group);
      save_async_on_every_rank(store, ranks.writer_store, ranks.rank, ranks.world,
                               ranks.async_saves++, std::move(snap));
    }
    profile_end(run, "checkpoint");
    spdlog::debug("checkpoint of step {} being written in the background", run.progress.step);
    return;
  }
  const std::string dir =
      run.ranks.group ? save_on_every_rank(store, *run.ranks.group, run.ranks.rank, snap)
                      : store.save(snap);
  if (run.residency) run.residency->free_all();
  profile_end(run, "checkpoint");
  announce_commit(run, dir);
}

bool async_save_done(const Run& run) {
  const CheckpointStore* store = run.components.store.get();
  return !store || !store->in_flight() || store->ready();
}

void finish_async_save(Run& run, bool block) {
  CheckpointStore* store = run.components.store.get();
  if (!store || !store->in_flight() || (!block && !store->ready())) return;
  announce_commit(run, store->wait());
}

}  // namespace keel
