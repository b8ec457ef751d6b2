// The state of one run, grouped into named parts; the loop's files (kernel/run/) each work on
// the parts they name. Trainer (trainer.hpp) owns one Run.
//
// ~Run releases the parts in one stated order (run/teardown.cpp: the step's modes first, then
// the gradient synchronisation, the components in reverse order of creation, the residency and
// the shards, the components' keel_comm, the process group, and the run directory last), each
// only while the parts it needs still exist; the declaration order below does not matter. The
// plugins themselves stay loaded until the caller's Registry goes, after the Trainer (plugin code
// must outlive its instances).
#pragma once

#include <ATen/core/Tensor.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/meta.hpp"
#include "checkpoint/store.hpp"
#include "components.hpp"
#include "distributed/comm.hpp"
#include "distributed/grad_sync.hpp"
#include "distributed/process_group.hpp"
#include "distributed/residency.hpp"
#include "distributed/sharding.hpp"
#include "distributed/store_client.hpp"
#include "keel/abi.h"
#include "loss_scaler.hpp"
#include "run/agreement.hpp"
#include "run/checkpoint_backend.hpp"
#include "run/eval_metrics.hpp"
#include "run/model_calls.hpp"
#include "run/model_view.hpp"
#include "run/observers.hpp"
#include "run/own_step.hpp"
#include "run/requests.hpp"
#include "run/run_directory.hpp"
#include "run/step_modes.hpp"
#include "run/tables.hpp"
#include "run_config.hpp"
#include "run/trainer.hpp"

namespace keel {

using Clock = std::chrono::steady_clock;

// The processes of a data-parallel run (a launcher started several; `group` is null when this
// process runs alone), and this process's device.
struct Ranks {
  std::unique_ptr<ProcessGroup> group;
  int rank = 0, world = 1;
  at::Device device{at::kCPU};
  std::string device_name = "cpu";  // device.str(): keel_create_context.device (1.11)
  // With several ranks and [checkpoint] async: the checkpoint writer's own store client
  // (created at the first save; the writer thread shares it) and the saves started so far,
  // which keep each save's keys apart (checkpoint/multi_rank.hpp).
  std::shared_ptr<StoreClient> writer_store;
  int64_t async_saves = 0;
};

// The component instances, in creation order (destroyed in reverse).
struct Components {
  Instance<keel_model> model;
  Instance<keel_dataset> train_data;
  // The evaluation sets' datasets, in the order of RunConfig::eval_sets (only when the run
  // evaluates).
  struct EvalSet {
    std::string name;
    Instance<keel_dataset> data;
    DataSource source;  // over `data`
  };
  std::vector<EvalSet> eval_sets;
  Instance<keel_optimizer> optimizer;
  Instance<keel_sparse_optimizer> sparse_optimizer;  // when the model has sparse tables
  Instance<keel_lr_scheduler> scheduler;
  Instance<keel_loss> loss;
  // The model's, the loss's and the datasets' calls over named batches (run/model_calls.hpp),
  // through their extensions of keel/ext/batch.h where they offer one.
  DataSource train_source;  // over train_data
  ModelCalls model_calls;   // over model
  LossCalls loss_calls;     // over loss
  EvalMetrics eval_metrics;  // the evaluation's sums and the loss's task metrics (over `loss`)
  // [step] and the frozen [models.NAME] it runs (run/own_step.hpp); empty without a [step].
  OwnStep own_step;
  Instance<keel_grad_clipper> clipper;
  Instance<keel_mfu> mfu;
  Instance<keel_profiler> profiler;
  Instance<keel_checkpoint> checkpoint;
  std::optional<PluginCheckpointBackend> backend;  // over `checkpoint`
  std::unique_ptr<CheckpointStore> store;          // writes with `backend`; null: no checkpoints
  // Hooks' views of the model (extension keel.hook.model/1), when a hook asked for one.
  std::unique_ptr<ModelViews> model_views;
  std::vector<Instance<keel_hook>> hooks;  // in call order (priority, then manifest)
  Observers observers;  // the hooks that offer keel.hook.observe/1, in call order
};

// The model's tensors as the run uses them.
struct Parameters {
  // Trainable parameters, each once (a shared one under its first name): what the optimizer,
  // clipper and mfu get.
  std::vector<keel_tensor*> handles;
  std::vector<const char*> names;
  std::vector<at::Tensor> tensors;
  std::vector<size_t> model_index;  // each one's index in the model's param()
  std::vector<keel_named_tensor> model_state;  // what checkpoints hold of the model
  // Hooks' checkpointed state, named "<label>.<name>" (the names are kept in hook_state_names).
  std::vector<keel_named_tensor> hook_state;
  std::vector<std::string> hook_state_names;
  std::vector<std::string> hook_state_labels;  // the label of each one's hook
  std::vector<double> base_lrs;  // per optimizer group, before the schedule's factor
};

// How training steps run, decided at assembly.
struct StepPlan {
  // The planned length (0: unknown), for schedules and progress; with several ranks the
  // shortest of any rank's (run/agreement.hpp).
  int64_t total_steps = 0;
  // Micro-batches per rank and optimizer step: [train] grad_accum, or derived from
  // [train] global_batch (global_batch / (batch_size x ranks)).
  int64_t grad_accum = 1;
  // With several ranks: the micro-batches every rank takes per epoch without asking the others,
  // the fewest batches_per_epoch of any rank (run/agreement.hpp); 0 when running alone or on a
  // stream.
  int64_t epoch_batches = 0;
  // The training data is a stream (batches_per_epoch -1, ABI 1.9): its epochs (windows) end
  // when next says so, the run plans no length from it, with several ranks every step agrees
  // its micro-batches (and every rank must have as many), and an epoch without any batch ends
  // the run (docs/loop.md, "Streams").
  bool stream = false;
  double flops_per_sample = 0;   // the model's (0: unknown)
  double mfu_peak = 0;           // FLOP/s the mfu divides by (keel_mfu.peak_flops), 0: not reported
  // Micro-batches weighted by their items (count_items); with several ranks, by their share of
  // the items of every rank's micro-batches of the step (run/step.cpp).
  bool items_normalization = false;
  // Training steps compute the loss from the model's features and output weight (model
  // forward_features and loss compute_linear, ABI 1.5) instead of forward and compute.
  bool linear_loss = false;
  std::optional<LossScaler> scaler;  // fp16: dynamic loss scaling
};

// The checkpoint this run resumes from (`dir` empty: a fresh run).
struct ResumePoint {
  std::string dir;
  CommitRecord record;
  CheckpointMeta meta;
  bool active() const { return !dir.empty(); }
};

// Where the run is inside the current epoch.
struct EpochPosition {
  int64_t batches = 0;    // micro-batches of the current epoch consumed
  // With several ranks: micro-batches of the agreed count that this rank's data did not yield
  // for the current step (its data ended early; the step fails on every rank).
  int64_t missing = 0;
  // The signal with which the training data stopped while waiting for data
  // (KEEL_BATCH_STOPPED, ABI 1.10; with several ranks, agreed by them); 0: it did not.
  int stopped = 0;
  bool finished = false;  // its end events ran: a checkpoint saved now points at the next epoch
};

// Sums over one log_every window.
struct Window {
  double loss = 0, grad_norm = 0, data_s = 0;
  // Evaluation and checkpoint time inside the window: not training, so not in its throughput.
  double eval_s = 0, checkpoint_s = 0;
  int64_t steps = 0, norms = 0, samples = 0, tokens = 0;
  Clock::time_point start = Clock::now();
};

// One evaluation set's latest record: its values, and the same as keel_metric entries whose keys
// point into `values`. It moves but does not copy.
struct EvalRecord {
  std::string split;
  MetricList values;
  std::vector<keel_metric> metrics;

  EvalRecord(std::string split_name, MetricList record)
      : split(std::move(split_name)), values(std::move(record)) {
    for (const auto& [key, value] : values) metrics.push_back({key.c_str(), value});
  }
  EvalRecord(EvalRecord&&) = default;
  EvalRecord& operator=(EvalRecord&&) = default;
  EvalRecord(const EvalRecord&) = delete;
  EvalRecord& operator=(const EvalRecord&) = delete;
};

// The latest records, which keel_trainer_state points at, and the steps of the latest record,
// evaluation and save.
struct Records {
  std::vector<keel_metric> train;
  std::vector<std::string> restored_keys;  // storage of the keys of a train record a resume restored
  std::set<std::string> hook_keys;  // storage of the keys hooks put into train records
  // Each evaluation set's latest record, in the sets' order (a set not yet evaluated has none);
  // keel_trainer_state.eval_metrics points at the one evaluated last.
  std::vector<EvalRecord> eval;
  int64_t last_train_step = -1, last_eval_step = -1, last_saved_step = -1;
  bool mfu_above_one = false;  // an mfu above 1 was left out of a record (and warned about)
};

// The reason the run ends, once decided (run/decisions.cpp, decide_end).
struct RunEnd {
  std::string reason;  // "": still running
  int stop_signal = 0;  // SIGTERM / SIGINT that stopped the run
  bool decided() const { return !reason.empty(); }
};

struct Run {
  RunConfig config;
  RunDirectory directory;
  Ranks ranks;
  // The ranks as every component's creation context gets them (keel_comm, ABI 1.9; alone when
  // `ranks.group` is null). After `ranks` (it uses the group) and before the components, which
  // hold its struct: destroyed after them.
  std::unique_ptr<ComponentComm> comm;
  // [distributed] shard with several ranks: the optimizer's and clipper's shards (null
  // otherwise). Before the components, which borrow its handles: destroyed after them.
  std::unique_ptr<ShardedParams> shards;
  // shard = "parameters" with several ranks: where the whole parameters live (null otherwise).
  // After `shards` (it holds them) and before the components (the model calls it): destroyed
  // after the model, before the shards.
  std::unique_ptr<Residency> residency;
  Components components;
  Parameters parameters;
  SparseTables sparse;  // the model's sparse embedding tables (ABI 1.9), borrowed from it
  StepPlan plan;
  ResumePoint resume;
  std::string run_id;             // kept by a resumed run (retention only touches its own)
  std::string resolved_manifest;  // the text of manifest.resolved.toml
  keel_trainer_state progress{};  // step, epoch, counters, latest records: what hooks see
  EpochPosition epoch;
  Window window;
  Records records;
  Requests requests;
  CollectiveTally collectives;  // with several ranks: the collectives of the steps, for the log
  RunEnd end;
  RunSummary summary;  // what train() returns, filled in as the run goes
  std::unique_ptr<GradSync> grad_sync;  // several ranks, unless shard = "gradients"/"parameters"
  // What several ranks, shards, sparse tables and fp16 add to each step (run/step_modes.hpp),
  // chosen at assembly.
  StepModes step_modes;

  Run() = default;
  ~Run();  // run/teardown.cpp
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  bool evaluates() const { return config.run.mode != RunMode::kTrain; }
};

// Seconds from its construction to its destruction, added to `to`.
class AddElapsed {
 public:
  explicit AddElapsed(double& to) : to_(to) {}
  ~AddElapsed() { to_ += std::chrono::duration<double>(Clock::now() - t0_).count(); }
  AddElapsed(const AddElapsed&) = delete;
  AddElapsed& operator=(const AddElapsed&) = delete;

 private:
  double& to_;
  Clock::time_point t0_ = Clock::now();
};

}  // namespace keel
