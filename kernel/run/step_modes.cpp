// The step's modes (step_modes.hpp): each class below is one behaviour around the plain step.
#include "run/step_modes.hpp"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "error.hpp"
#include "run/run.hpp"
#include "run/tables.hpp"

namespace keel {

namespace {

std::string of_step(const Run& run) { return " of step " + std::to_string(run.progress.step + 1); }

// The outcome agreement's fields (run/agreement.hpp), and what it is called in errors.
std::vector<double> outcome_fields(const Run& run, const StepOutcome& step) {
  return {step.loss, step.finite ? 0.0 : 1.0, static_cast<double>(step.samples),
          static_cast<double>(step.tokens), run.epoch.missing > 0 ? 1.0 : 0.0,
          step.sparse_squares};
}
std::string reducing_what(const Run& run) { return "reducing the loss" + of_step(run); }

// The error of a step in which some rank's training data ended before the agreed
// micro-batches of the epoch: on such a rank, how many its data yielded; on the others, that
// another rank's data ended early.
Error short_data_error(const Run& run, int64_t short_ranks) {
  const Instance<keel_dataset>& data = run.components.train_data;
  const int64_t step = run.progress.step + 1;
  const int64_t epoch = run.progress.epoch;
  const int64_t agreed = run.plan.epoch_batches;
  const std::string hint = "; hint: batches_per_epoch must count the batches next yields in "
                           "every epoch (the ranks take the fewest of any rank's count per "
                           "epoch without asking each other)";
  if (run.epoch.missing > 0)
    return data.error(fmt::format("yielded {} batch(es) in epoch {}, fewer than the {} per epoch "
                                  "agreed from batches_per_epoch, at step {}{}",
                                  run.epoch.batches, epoch, agreed, step, hint));
  return data.error(fmt::format("the data of {} other rank(s) yielded fewer batches in epoch {} "
                                "than the {} per epoch agreed from batches_per_epoch, at step {} "
                                "(the error of that rank says how many){}",
                                short_ranks, epoch, agreed, step, hint));
}

// Several ranks: the outcome agreement (a sum, run/agreement.hpp): the loss (mean over ranks),
// whether any rank saw a non-finite value (then every rank skips the step), samples and
// tokens, whether any rank's data ended before the agreed micro-batches (then every rank
// fails), and the sparse gradients' sum of squares (each rank's rows). With no sparse tables
// and no shards it goes out before the last backward, which hides it: it then misses this
// rank's gradients' finiteness, which is every rank's (the same all-reduced gradients). With
// them, each rank knows only after backward what it adds (its rows, its shards' finiteness).
class RankAgreement final : public StepMode {
 public:
  explicit RankAgreement(Run& run) : run_(run), early_(!run.shards && !run.sparse.any()) {}
  void before_backward(const at::Tensor&, bool last, StepOutcome& step) override {
    if (last && early_)
      step.agreed = run_.ranks.group->sum_async(outcome_fields(run_, step), reducing_what(run_));
  }
  void agree(StepOutcome& step) override {
    ProcessGroup& group = *run_.ranks.group;
    const std::vector<double> v = step.agreed.issued()
                                      ? step.agreed.wait()
                                      : group.sum(outcome_fields(run_, step), reducing_what(run_));
    if (v[4] > 0) throw short_data_error(run_, static_cast<int64_t>(v[4]));
    step.loss = v[0] / run_.ranks.world;
    step.finite = v[1] == 0 && step.finite;
    step.samples = static_cast<int64_t>(v[2]);
    step.tokens = static_cast<int64_t>(v[3]);
    step.sparse_squares = v[5];
  }

 private:
  Run& run_;
  const bool early_;
};

// Gradients all-reduced whole (DDP): only the step's last backward all-reduces (the earlier
// ones accumulate locally, as under DDP's no_sync). A rank whose data ran short with no
// micro-batch left for the step still takes part, with a zero loss, as every other rank does,
// so that all reach the agreement that reports the shortage instead of waiting.
class GradientAllReduce final : public StepMode {
 public:
  explicit GradientAllReduce(GradSync& sync) : sync_(sync) {}
  bool stand_in() const override { return true; }
  void before_forward(bool last) override {
    if (last) sync_.before_forward();
  }
  void before_backward(const at::Tensor& loss, bool last, StepOutcome&) override {
    if (last) sync_.before_backward(loss);
  }
  bool collective_backward(bool last) const override { return last; }

 private:
  GradSync& sync_;
};

// The model's sparse embedding tables (ABI 1.9): their row gradients (not clipped) checked and
// measured with the dense ones, their touched rows updated after the optimizer, and every
// step, taken or skipped, ended.
class SparseRows final : public StepMode {
 public:
  SparseRows(SparseTables& sparse, const Instance<keel_sparse_optimizer>& optimizer)
      : sparse_(sparse), optimizer_(optimizer) {}
  void measured(StepOutcome& step) override {
    step.sparse_squares = sparse_grad_squares(sparse_);
    step.finite = step.finite && std::isfinite(step.sparse_squares);
  }
  void agreed(const StepOutcome& step) override {
    sparse_.grad_norm = std::sqrt(step.sparse_squares);
  }
  void after_update() override { sparse_update(optimizer_); }
  void end(int64_t step) override { end_sparse_step(sparse_, step); }

 private:
  SparseTables& sparse_;
  const Instance<keel_sparse_optimizer>& optimizer_;
};

// [distributed] shard: the optimizer and the clipper work on this rank's shards.
class ShardedParameters final : public StepMode {
 public:
  ShardedParameters(Run& run, ShardedParams& shards)
      : run_(run), shards_(shards), gather_(!run.residency) {}
  void start() override { shards_.clear_gradients(); }  // zero_grad saw only the shards
  void after_backward() override { shards_.after_backward("backward" + of_step(run_)); }
  void gradients_done(StepOutcome&) override { shards_.bind_gradients(); }
  // Every rank's updated rows to every rank ("parameters": the next forward gathers them).
  void after_update() override {
    if (gather_) shards_.gather_parameters("gathering the parameters updated at step " +
                                           std::to_string(run_.progress.step + 1));
  }

 private:
  Run& run_;
  ShardedParams& shards_;
  const bool gather_;
};

// shard = "parameters": the root's whole parameters for each micro-batch (the units' are
// gathered by the model's enter calls), freed after its backward.
class WholeParameters final : public StepMode {
 public:
  WholeParameters(Run& run, Residency& residency) : run_(run), residency_(residency) {}
  void before_forward(bool) override { residency_.before_forward("forward" + of_step(run_)); }
  void after_backward() override { residency_.after_backward(); }

 private:
  Run& run_;
  Residency& residency_;
};

// precision = "fp16": the loss scaled for backward, the gradients (the shards', when sharded)
// unscaled and checked, the scale updated once the ranks agreed whether the step is finite.
class LossScaling final : public StepMode {
 public:
  explicit LossScaling(Run& run) : run_(run), scaler_(*run.plan.scaler) {}
  at::Tensor for_backward(at::Tensor loss) override { return scaler_.scale_loss(loss); }
  void gradients_done(StepOutcome& step) override {
    step.finite =
        scaler_.unscale(run_.shards ? run_.shards->tensors() : run_.parameters.tensors) &&
        step.finite;
  }
  void agreed(const StepOutcome& step) override { scaler_.update(step.finite); }

 private:
  Run& run_;
  LossScaler& scaler_;
};

}  // namespace

StepModes choose_step_modes(Run& run) {
  std::vector<std::unique_ptr<StepMode>> modes;
  if (run.ranks.group) modes.push_back(std::make_unique<RankAgreement>(run));
  if (run.grad_sync) modes.push_back(std::make_unique<GradientAllReduce>(*run.grad_sync));
  if (run.sparse.any())
    modes.push_back(std::make_unique<SparseRows>(run.sparse, run.components.sparse_optimizer));
  if (run.shards) modes.push_back(std::make_unique<ShardedParameters>(run, *run.shards));
  if (run.residency) modes.push_back(std::make_unique<WholeParameters>(run, *run.residency));
  if (run.plan.scaler) modes.push_back(std::make_unique<LossScaling>(run));
  return StepModes(std::move(modes));
}

}  // namespace keel
