#include "run/checkpointing.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <variant>

#include "checkpoint/checksum.hpp"
#include "checkpoint/reshard.hpp"
#include "compat/torch.hpp"
#include "checkpoint/multi_rank.hpp"
#include "distributed/store_client.hpp"
#include "keel/tensor.hpp"
#include "run/events.hpp"
#include "run/plugin_state.hpp"
#include "run/decisions.hpp"
#include "run/run.hpp"
#include "run/tables.hpp"

namespace keel {

namespace {

// The model's tensors as this rank writes them: without shards, rank 0 writes every one whole;
// with shards, every rank its rows of each parameter (from its shard, which holds them in
// every shard mode) and rank 0 the other tensors (buffers) whole. Each is placed in the
// checkpoint's chunk index ("model": global shape, first row). Parameters change only in the
// optimizer step: an asynchronous save copies them on its thread while the next step's
// forward and backward run (the step waits for that copy before BEFORE_OPTIMIZER_STEP).
void add_model(const Run& run, const std::vector<ParamRows>& layout, Snapshot& snap) {
  const Parameters& p = run.parameters;
  const std::string object = run.shards ? rank_object(run, "model") : "model";
  TensorList model_t;
  auto& placed = snap.placements[object];
  for (const auto& nt : p.model_state) {
    const at::Tensor t = borrow(nt.tensor);
    const auto it = std::find(p.handles.begin(), p.handles.end(), nt.tensor);
    const size_t i = static_cast<size_t>(it - p.handles.begin());
    if (it == p.handles.end() || !run.shards) {  // whole, from rank 0
      if (run.ranks.rank != 0) continue;
      model_t.emplace_back(nt.name, t);
      if (it != p.handles.end()) snap.deferred.insert(nt.tensor);
      placed[nt.name] = {"model", t.sizes().vec(), 0, ""};
      continue;
    }
    const ShardedParams::Rows rows = run.shards->rows_of(i);
    if (rows.count == 0 && rows.rows > 0) continue;  // no rows here
    model_t.emplace_back(nt.name, rows.shard);
    snap.deferred.insert(rows.shard.unsafeGetTensorImpl());
    placed[nt.name] = {"model", layout[i].shape, rows.begin, ""};
  }
  snap.objects.emplace_back(object, std::move(model_t));
}

// The optimizer's state as this rank writes it: its rows of every entry elementwise over a
// parameter (checkpoint/reshard.hpp), placed as that parameter's rows; every other entry from
// rank 0 only. With shards each rank writes "rank<r>.optimizer", else rank 0 "optimizer".
void add_optimizer(const Run& run, const std::vector<ParamRows>& layout, Snapshot& snap) {
  const Instance<keel_optimizer>& optimizer = run.components.optimizer;
  if (!KEEL_HAS_SLOT(optimizer, keel_optimizer, state_save)) return;
  if (!run.shards && run.ranks.rank != 0) return;
  const std::string object = optimizer_object(run);
  TensorList opt;
  auto& placed = snap.placements[object];
  for (auto& [name, t] : save_state(optimizer)) {
    const int64_t i = like_param(layout, name, t.scalar_type(), t.sizes().vec());
    if (i < 0) {
      const int64_t after = run.shards ? named_after(layout, name) : -1;
      if (after >= 0 && t.numel() > 1)
        throw optimizer.error(
            "state entry '" + name + "' has shape " + text::shape(t.sizes()) + ", neither this "
            "rank's rows of parameter '" + layout[after].name + "' " +
            text::shape(layout[after].local_shape()) + " nor one value; with distributed.shard "
            "a checkpoint saves elementwise state by rows and the rest once (docs/checkpoints.md);"
            " hint: set distributed.shard = \"none\", or keep per-parameter state elementwise");
      if (run.ranks.rank != 0) continue;
      placed[name] = {"optimizer", t.sizes().vec(), 0, ""};
    } else {
      const ParamRows& r = layout[i];
      if (r.count == 0 && r.rows > 0) continue;
      placed[name] = {"optimizer", r.shape, r.begin, r.name};
    }
    snap.deferred.insert(t.unsafeGetTensorImpl());
    opt.emplace_back(name, t);
  }
  snap.objects.emplace_back(object, std::move(opt));
}

// Every rank's own objects: its generators ("rng") and its plugins' state_save entries
// ("state": of the model and the training data, as "<section>/<name>").
void add_rank_objects(const Run& run, Snapshot& snap) {
  TensorList rng_t, state_t;
  rng_t.emplace_back("torch.cpu", at::detail::getDefaultCPUGenerator().get_state());
  if (at::hasCUDA())
    for (int d = 0; d < at::detail::getCUDAHooks().getNumGPUs(); ++d)
      rng_t.emplace_back("torch.cuda." + std::to_string(d),
                         compat::cuda_default_generator(d).get_state());
  snap.objects.emplace_back(rank_object(run, "rng"), std::move(rng_t));
  const auto add_state = [&](const auto& inst, const std::string& section) {
    using Abi = std::remove_pointer_t<decltype(inst.operator->())>;
    if (!KEEL_HAS_SLOT(inst, Abi, state_save)) return;
    for (auto& [name, t] : save_state(inst)) state_t.emplace_back(section + "/" + name, t);
  };
  add_state(run.components.model, "model");
  add_state(run.components.train_data, "data.train");
  snap.objects.emplace_back(rank_object(run, "state"), std::move(state_t));
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
  const int64_t batch = micro_batch_size(run.config);
  m.epoch_samples = m.epoch_batches * batch * run.ranks.world;
  m.global_batch = batch * run.plan.grad_accum * run.ranks.world;
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
  for (const EvalRecord& r : run.records.eval) m.eval_metrics.emplace_back(r.split, r.values);
  for (const auto& [k, v] : m.train_metrics) snap.metrics["train." + k] = v;
  for (const auto& [split, record] : m.eval_metrics)
    for (const auto& [k, v] : record) snap.metrics[split + "." + k] = v;
  snap.manifest = run.resolved_manifest;
}

// Everything a checkpoint holds, gathered now (at a step boundary). With several ranks, rank 0
// holds the replicated objects (model, optimizer, hooks, sparse_optimizer) and its own "rng",
// "state" and "tables"; rank r > 0 only its own, as "rank<r>.rng", "rank<r>.state" and
// "rank<r>.tables". With [distributed] shard every
// rank writes its rows of the model ("model" on rank 0, else "rank<r>.model") and of the
// optimizer state ("rank<r>.optimizer", optimizer_object).
Snapshot snapshot(const Run& run) {
  Snapshot snap;
  const std::vector<ParamRows> layout = param_rows(run);
  add_model(run, layout, snap);
  add_optimizer(run, layout, snap);
  if (run.ranks.rank == 0) {
    TensorList hooks_t;
    for (const auto& nt : run.parameters.hook_state) hooks_t.emplace_back(nt.name, borrow(nt.tensor));
    snap.objects.emplace_back("hooks", std::move(hooks_t));
  }
  add_rank_objects(run, snap);
  add_tables(run, snap);  // every rank's rows of the sparse tables
  // Backends take CPU tensors: a synchronous save copies device tensors now, through pinned host
  // memory (Snapshot::copy_tensors; an asynchronous one copies every tensor to the CPU itself).
  if (!run.ranks.device.is_cpu() && !run.config.checkpointing.async) {
    snap.copy_tensors(/*deferred_ones=*/false);
    snap.copy_tensors(/*deferred_ones=*/true);
  }
  fill_meta(run, snap);
  return snap;
}

void announce_commit(Run& run, const std::string& dir) {
  spdlog::info("checkpoint committed: {}", dir);
  emit(run, KEEL_EVENT_CHECKPOINT_SAVED, nullptr, nullptr, dir.c_str());
}

}  // namespace

int64_t micro_batch_size(const RunConfig& config) {
  const auto b = config.train_data.options.values.find("batch_size");
  if (b == config.train_data.options.values.end() || !std::holds_alternative<int64_t>(b->second))
    return 0;
  return std::get<int64_t>(b->second);
}

std::vector<ParamRows> param_rows(const Run& run) {
  std::vector<ParamRows> out;
  const Parameters& p = run.parameters;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    ParamRows r;
    r.name = p.names[i];
    r.shape = p.tensors[i].sizes().vec();
    r.dtype = p.tensors[i].scalar_type();
    r.rows = r.shape.empty() ? 1 : r.shape[0];
    r.count = r.rows;
    if (run.shards) {
      const ShardedParams::Rows rows = run.shards->rows_of(i);
      r.begin = rows.begin;
      r.count = rows.count;
    }
    out.push_back(std::move(r));
  }
  return out;
}

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
    case Moment::kEpochEnd:  // run.epoch.finished: the epoch was complete (its EPOCH_END ran)
      return ((c.checkpointing.every_epochs > 0 && run.epoch.finished &&
               (run.progress.epoch + 1) % c.checkpointing.every_epochs == 0) ||
              run.requests.checkpoint()) &&
             !saved_now;
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
