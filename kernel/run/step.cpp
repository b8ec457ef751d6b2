#include "run/step.hpp"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <string>

#include "distributed/process_group.hpp"
#include "error.hpp"
#include "keel/tensor.hpp"
#include "run/autocast.hpp"
#include "run/events.hpp"
#include "run/own_step.hpp"
#include "run/run.hpp"
#include "run/step_modes.hpp"
#include "run/tables.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// Weight of each micro-batch's mean loss in the step's loss: its share of the items when the
// loss reports item counts (token-normalised accumulation), else 1/k. With several ranks the
// share is of the items of every rank's micro-batches of the step, agreed with one all-reduce
// (MindSpeed-LLM's global item count), times the number of ranks (the gradient all-reduce
// averages over ranks): the step's gradient is then the gradient of the mean over all the
// step's items, as one process with the same global batch computes it. The all-reduce is
// issued before the first forward and waited for after it, so that the forward hides it.
class MicroBatchWeights {
 public:
  MicroBatchWeights(const Run& run, const std::vector<MicroBatch>& mbs)
      : run_(run), w_(mbs.size(), 1.0 / static_cast<double>(mbs.size())) {
    ProcessGroup* group = run.ranks.group.get();
    // One micro-batch on one process: weight 1.
    if (!run.plan.items_normalization || (mbs.size() == 1 && !group)) return;
    for (const auto& mb : mbs) {
      items_.push_back(count_items(run.components.loss_calls, mb));
      if (items_.back() < 0) {
        unreported_ = items_.back();
        break;
      }
      total_ += items_.back();
    }
    if (group)
      all_ = group->sum_async({static_cast<double>(total_), unreported_ < 0 ? 1.0 : 0.0},
                              "agreeing on the items of step " +
                                  std::to_string(run.progress.step + 1));
    settled_ = false;
  }

  // The weight of micro-batch i (after its forward: the first call waits for the ranks' sum).
  double operator()(size_t i) {
    settle();
    return w_[i];
  }

  // The ranks' item count received (a rank without micro-batches calls it, too).
  void settle() {
    if (settled_) return;
    settled_ = true;
    double all = static_cast<double>(total_);
    bool any_unreported = unreported_ < 0;
    if (all_.issued()) {
      const std::vector<double> v = all_.wait();
      all = v[0];
      any_unreported = v[1] > 0;
    }
    if (any_unreported) {
      // "auto": a loss that reports no count for these targets (on any rank) gets the mean.
      if (run_.config.train.accum_normalization == AccumNorm::kAuto) return;
      throw run_.components.loss.error(fmt::format(
          "count_items returned {} but train.accum_normalization = \"items\" needs item counts; "
          "hint: use \"mean\" or \"auto\"",
          unreported_ < 0 ? std::to_string(unreported_) : "a negative count on another rank"));
    }
    const double ranks = run_.ranks.group ? static_cast<double>(run_.ranks.world) : 1.0;
    for (size_t i = 0; i < w_.size(); ++i)
      w_[i] = all > 0 ? static_cast<double>(items_[i]) * ranks / all : 0.0;
  }

 private:
  const Run& run_;
  std::vector<double> w_;
  std::vector<int64_t> items_;
  int64_t total_ = 0, unreported_ = 0;
  PendingSum all_;
  bool settled_ = true;  // false until settle() computed item shares (the constructor's w_ stays)
};

// Forward and loss of one micro-batch under autocast, weighted by its share of the step.
at::Tensor micro_batch_loss(Run& run, const MicroBatch& mb, MicroBatchWeights& weights, size_t i,
                            bool last) {
  profile_begin(run, "forward");
  run.step_modes.before_forward(last);
  const Autocast autocast(run.config.train.precision, run.ranks.device);
  int64_t count = 0;
  const Components& c = run.components;
  at::Tensor loss;
  if (c.own_step) {  // [step]
    loss = own_step_loss(run, mb);
  } else if (run.plan.linear_loss) {
    loss = linear_loss_of(c.model, c.loss, mb, &count);
  } else {
    const Named outputs = forward(c.model_calls, mb);
    loss = with_aux_losses(c.model_calls, outputs,
                           compute_loss(c.loss_calls, outputs, mb, &count, true));
  }
  // A weight of 1 (no accumulation) adds nothing but a node to the autograd graph.
  const double weight = weights(i);
  if (weight != 1.0) loss = loss.mul(weight);
  profile_end(run, "forward");
  return loss;
}

// Backward of one micro-batch's loss (`last`: the step's last).
void backward(Run& run, at::Tensor loss, bool last, StepOutcome& step) {
  profile_begin(run, "backward");
  run.step_modes.before_backward(loss, last, step);
  loss = run.step_modes.for_backward(loss);
  // Backward runs the autograd functions of the model's and the loss's operations (and the
  // modes' collectives: the gradient all-reduce, reduce-scatters).
  try {
    loss.backward();
    run.step_modes.after_backward();
  } catch (const c10::Error& e) {
    const std::string who = run.components.model.label() + " / " + run.components.loss.label();
    if (!run.step_modes.collective_backward(last))
      throw Error(who + ": backward failed: " + e.what_without_backtrace());
    throw run.ranks.group->failure(fmt::format("backward of step {} ({}, with the gradient "
                                               "all-reduce)", run.progress.step + 1, who),
                                   e.what_without_backtrace());
  }
  profile_end(run, "backward");
}

// Forward and backward of every micro-batch; gradients accumulate in the parameters. A rank
// with no micro-batch for the step runs the backward of a zero loss when a mode needs every
// rank's backward (its data ran short; the ranks' agreement then reports it).
StepOutcome forward_backward(Run& run, const std::vector<MicroBatch>& mbs) {
  StepOutcome step;
  for (const auto& mb : mbs) {
    step.samples += mb.samples;
    step.tokens += mb.tokens;
  }
  MicroBatchWeights weights(run, mbs);
  if (mbs.empty() && run.step_modes.stand_in()) {
    weights.settle();
    const std::vector<at::Tensor>& params = run.parameters.tensors;
    at::Tensor zero = params.at(0).sum().mul(0);
    for (size_t i = 1; i < params.size(); ++i) zero = zero.add(params[i].sum().mul(0));
    run.step_modes.before_forward(/*last=*/true);
    backward(run, zero, /*last=*/true, step);
  }
  for (size_t i = 0; i < mbs.size(); ++i) {
    const bool last = i + 1 == mbs.size();
    const at::Tensor loss = micro_batch_loss(run, mbs[i], weights, i, last);
    const double value = loss.item<double>();
    step.finite = step.finite && std::isfinite(value);
    step.loss += value;
    backward(run, loss, last, step);
  }
  return step;
}

// The gradient clipper's norm before clipping (NaN without a clipper); a non-finite norm makes
// the step non-finite.
void clip_gradients(Run& run, StepOutcome& step) {
  const Instance<keel_grad_clipper>& clipper = run.components.clipper;
  if (!clipper) return;
  double norm = NAN;
  profile_begin(run, "clip");
  clipper.call("clip", clipper->clip, &norm);
  profile_end(run, "clip");
  if (norm < 0)  // NaN passes on to the non-finite policy: the gradients may hold NaN
    throw clipper.error("clip reported a negative gradient norm (" + text::number(norm) +
                        "); the norm before clipping is >= 0");
  step.finite = step.finite && std::isfinite(norm);
  step.grad_norm = norm;
}

// The optimizer step when the step is finite; otherwise train.nonfinite decides: "error" fails
// the run, "skip" (and fp16's loss scaling, which expects overflows) skips the update, up to
// train.max_skips times without loss scaling.
void step_or_skip(Run& run, const StepOutcome& step) {
  const bool scaling = run.plan.scaler.has_value();
  const int64_t next = run.progress.step + 1;
  if (step.finite) {
    if (run.components.store) run.components.store->wait_copied();  // an asynchronous save's copy
    emit(run, KEEL_EVENT_BEFORE_OPTIMIZER_STEP);
    profile_begin(run, "optimizer");
    run.components.optimizer.call("step", run.components.optimizer->step);
    run.step_modes.after_update();
    profile_end(run, "optimizer");
  } else if (run.config.train.nonfinite == NonFinite::kError && !scaling) {
    throw Error(fmt::format("non-finite {} at step {} (loss {}, grad norm {}{}); hint: lower the "
                            "learning rate, clip gradients, or set train.nonfinite = \"skip\"",
                            std::isfinite(step.loss) ? "gradient norm" : "loss", next,
                            text::number(step.loss), text::number(step.grad_norm),
                            run.sparse.any()
                                ? ", sparse grad norm " + text::number(run.sparse.grad_norm)
                                : std::string()));
  } else {
    run.progress.skipped_steps += 1;
    spdlog::warn("step {}: non-finite loss or gradients, optimizer step skipped ({} so far)",
                 next, run.progress.skipped_steps);
    if (!scaling && run.progress.skipped_steps > run.config.train.max_skips)
      throw Error(fmt::format("more than train.max_skips = {} steps skipped for non-finite "
                              "values (latest at step {}); hint: lower the learning rate",
                              run.config.train.max_skips, next));
  }
}

// The step counted: the progress hooks see and the log window's sums.
void count_step(Run& run, const StepOutcome& step) {
  keel_trainer_state& p = run.progress;
  Window& w = run.window;
  p.step += 1;
  p.samples += step.samples;
  p.tokens += step.tokens;
  p.loss = step.loss;
  w.samples += step.samples;
  w.tokens += step.tokens;
  w.loss += step.loss;
  w.steps += 1;
  if (std::isfinite(step.grad_norm)) {
    w.grad_norm += step.grad_norm;
    w.norms += 1;
  }
}

}  // namespace

double train_step(Run& run, const std::vector<MicroBatch>& batches) {
  emit(run, KEEL_EVENT_STEP_START);
  for (size_t i = 0; i < batches.size(); ++i) {
    emit(run, KEEL_EVENT_AFTER_DATA, nullptr, nullptr, nullptr, static_cast<int64_t>(i));
    if (!run.components.observers.empty())  // hooks that see the batch (keel.hook.observe/1)
      run.components.observers.batch(static_cast<int64_t>(i), batches[i].tensors);
  }
  StepModes& modes = run.step_modes;  // what ranks, shards, sparse tables, fp16 add
  run.components.optimizer.run("zero_grad", run.components.optimizer->zero_grad);
  modes.start();
  StepOutcome step = forward_backward(run, batches);
  modes.gradients_done(step);
  emit(run, KEEL_EVENT_AFTER_BACKWARD);
  clip_gradients(run, step);
  run.progress.grad_norm = step.grad_norm;
  modes.measured(step);
  modes.agree(step);
  modes.agreed(step);
  step_or_skip(run, step);
  count_step(run, step);
  modes.end(run.progress.step);
  emit(run, KEEL_EVENT_STEP_END);
  return step.loss;
}

void set_lr_for(Run& run, int64_t step) {
  const Instance<keel_lr_scheduler>& scheduler = run.components.scheduler;
  const Instance<keel_optimizer>& optimizer = run.components.optimizer;
  const double f = scheduler ? scheduler.get("factor", scheduler->factor, step) : 1.0;
  if (!std::isfinite(f) || f < 0)
    throw scheduler.error(fmt::format("factor({}) returned {}; a schedule must return a finite "
                                      "value >= 0", step, text::number(f)));
  const std::vector<double>& base = run.parameters.base_lrs;
  for (size_t g = 0; g < base.size(); ++g)
    optimizer.run("set_lr", optimizer->set_lr, g, base[g] * f);
  set_sparse_lr(run.components.sparse_optimizer, run.sparse, f);  // the same schedule
  run.progress.lr = base.empty() ? 0 : base[0] * f;
}

}  // namespace keel

