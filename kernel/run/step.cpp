#include "run/step.hpp"

#include <ATen/core/Tensor.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "distributed/process_group.hpp"
#include "error.hpp"
#include "keel/tensor.hpp"
#include "run/autocast.hpp"
#include "run/events.hpp"
#include "run/run.hpp"
#include "run/signals.hpp"
#include "run/tables.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// What a step computed, before and after the ranks agree on it.
struct StepOutcome {
  double loss = 0;       // the sum of the micro-batches' weighted losses (then: mean over ranks)
  bool finite = true;    // loss and gradients finite (on every rank)
  double grad_norm = NAN;  // before clipping (NaN: no clipper)
  double sparse_squares = 0;  // the sparse tables' row gradients' sum of squares (over ranks)
  int64_t samples = 0, tokens = 0;
  // The outcome agreement (run/agreement.hpp) when it is issued before the last backward.
  PendingSum agreed;
};

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
    const Instance<keel_loss>& loss = run.components.loss;
    for (const auto& mb : mbs) {
      items_.push_back(loss.get("count_items", loss->count_items, peek(mb.targets)));
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
      throw run_.components.loss.error(
          (unreported_ < 0 ? "count_items returned " + std::to_string(unreported_)
                           : std::string("count_items returned a negative count on another "
                                         "rank")) +
          " but train.accum_normalization = \"items\" needs item counts; hint: use \"mean\" "
          "or \"auto\"");
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
at::Tensor micro_batch_loss(Run& run, const MicroBatch& mb, MicroBatchWeights& weights,
                            size_t i) {
  profile_begin(run, "forward");
  // shard = "parameters": the root's whole parameters (the units' are gathered by the model's
  // enter calls).
  if (run.residency)
    run.residency->before_forward("forward of step " + std::to_string(run.progress.step + 1));
  const Autocast autocast(run.config.train.precision, run.ranks.device);
  int64_t count = 0;
  at::Tensor loss = run.plan.linear_loss
                        ? linear_loss_of(run, mb.inputs, mb.targets, &count)
                        : compute_loss(run, forward(run, mb.inputs), mb.targets, &count, true);
  // A weight of 1 (no accumulation) adds nothing but a node to the autograd graph.
  const double weight = weights(i);
  if (weight != 1.0) loss = loss.mul(weight);
  profile_end(run, "forward");
  return loss;
}

// Backward of one micro-batch's loss (scaled for fp16). `sync`: this backward all-reduces the
// gradients (the step's last micro-batch, with several ranks).
void backward(Run& run, const at::Tensor& loss, bool sync) {
  const Components& c = run.components;
  profile_begin(run, "backward");
  if (sync) run.grad_sync->before_backward(loss);
  // Backward runs the autograd functions of the model's and the loss's operations (and, when
  // synchronising, the gradient all-reduce).
  try {
    (run.plan.scaler ? run.plan.scaler->scale_loss(loss) : loss).backward();
    // shard = "gradients": this backward's reduce-scatters complete.
    if (run.shards) run.shards->after_backward("backward of step " +
                                               std::to_string(run.progress.step + 1));
    if (run.residency) run.residency->after_backward();  // "parameters": the root freed
  } catch (const c10::Error& e) {
    const std::string who = c.model.label() + " / " + c.loss.label();
    if (!sync) throw Error(who + ": backward failed: " + e.what_without_backtrace());
    throw run.ranks.group->failure("backward of step " + std::to_string(run.progress.step + 1) +
                                       " (" + who + ", with the gradient all-reduce)",
                                   e.what_without_backtrace());
  }
  profile_end(run, "backward");
}

// A rank whose data ended early with no micro-batch left for this step still takes part in
// the step's gradient all-reduce, with zero gradients, as every other rank does, so that all
// reach the agreement that reports the shortage (reduce_across_ranks) instead of waiting.
void stand_in_backward(Run& run) {
  const std::vector<at::Tensor>& params = run.parameters.tensors;
  at::Tensor zero = params.at(0).sum().mul(0);
  for (size_t i = 1; i < params.size(); ++i) zero = zero.add(params[i].sum().mul(0));
  run.grad_sync->before_forward();
  backward(run, zero, /*sync=*/true);
}

// The outcome agreement's fields (run/agreement.hpp, reduce_across_ranks).
std::vector<double> outcome_fields(const Run& run, const StepOutcome& step) {
  return {step.loss, step.finite ? 0.0 : 1.0, static_cast<double>(step.samples),
          static_cast<double>(step.tokens), run.epoch.missing > 0 ? 1.0 : 0.0,
          step.sparse_squares};
}

std::string reducing_what(const Run& run) {
  return "reducing the loss of step " + std::to_string(run.progress.step + 1);
}

// With several ranks, the outcome agreement goes out before the step's last backward, which
// hides it, when nothing in it is known only after backward: no sparse tables (their row
// gradients' squares are each rank's) and no [distributed] shard (each rank checks the
// finiteness of its shards only). When it does, every rank clips and checks the same
// all-reduced gradients, so only the losses' finiteness needs agreeing.
void issue_agreement_early(Run& run, StepOutcome& step) {
  if (!run.ranks.group || run.shards || run.sparse.any()) return;  // residency implies shards
  step.agreed = run.ranks.group->sum_async(outcome_fields(run, step), reducing_what(run));
}

// Forward and backward of every micro-batch; gradients accumulate in the parameters.
StepOutcome forward_backward(Run& run, const std::vector<MicroBatch>& mbs) {
  StepOutcome step;
  for (const auto& mb : mbs) {
    step.samples += mb.samples;
    step.tokens += mb.tokens;
  }
  MicroBatchWeights weights(run, mbs);
  if (mbs.empty() && run.grad_sync) {  // this rank's data ran short
    weights.settle();
    issue_agreement_early(run, step);
    stand_in_backward(run);
  }
  for (size_t i = 0; i < mbs.size(); ++i) {
    // Only the step's last backward all-reduces the gradients (the earlier ones accumulate
    // locally, as under DDP's no_sync).
    const bool last = i + 1 == mbs.size();
    const bool sync = run.grad_sync && last;
    if (sync) run.grad_sync->before_forward();
    const at::Tensor loss = micro_batch_loss(run, mbs[i], weights, i);
    const double value = loss.item<double>();
    step.finite = step.finite && std::isfinite(value);
    step.loss += value;
    if (last) issue_agreement_early(run, step);
    backward(run, loss, sync);
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

// The error of a step in which some rank's training data ended before the agreed
// micro-batches of the epoch: on such a rank, how many its data yielded; on the others, that
// another rank's data ended early.
Error short_data_error(const Run& run, int64_t short_ranks) {
  const Instance<keel_dataset>& data = run.components.train_data;
  const std::string step = std::to_string(run.progress.step + 1);
  const std::string epoch = std::to_string(run.progress.epoch);
  const std::string agreed = std::to_string(run.plan.epoch_batches);
  const std::string hint = "; hint: batches_per_epoch must count the batches next yields in "
                           "every epoch (the ranks take the fewest of any rank's count per "
                           "epoch without asking each other)";
  if (run.epoch.missing > 0)
    return data.error("yielded " + std::to_string(run.epoch.batches) + " batch(es) in epoch " +
                      epoch + ", fewer than the " + agreed + " per epoch agreed from "
                      "batches_per_epoch, at step " + step + hint);
  return data.error("the data of " + std::to_string(short_ranks) + " other rank(s) yielded "
                    "fewer batches in epoch " + epoch + " than the " + agreed + " per epoch "
                    "agreed from batches_per_epoch, at step " + step + " (the error of that "
                    "rank says how many)" + hint);
}

// With several ranks, the outcome agreement (a sum, run/agreement.hpp): the loss (mean over
// ranks), whether any rank saw a non-finite value (then every rank skips the step), samples
// and tokens, whether any rank's data ended before the agreed micro-batches (then every rank
// fails), and the sparse gradients' sum of squares (each rank's rows). Issued before the last
// backward (issue_agreement_early) it misses this rank's gradients' finiteness, which is then
// every rank's (the same all-reduced gradients).
void reduce_across_ranks(Run& run, StepOutcome& step) {
  if (run.ranks.group) {
    const std::vector<double> v =
        step.agreed.issued() ? step.agreed.wait()
                             : run.ranks.group->sum(outcome_fields(run, step), reducing_what(run));
    if (v[4] > 0) throw short_data_error(run, static_cast<int64_t>(v[4]));
    step.loss = v[0] / run.ranks.world;
    step.finite = v[1] == 0 && step.finite;
    step.samples = static_cast<int64_t>(v[2]);
    step.tokens = static_cast<int64_t>(v[3]);
    step.sparse_squares = v[5];
  }
  if (run.sparse.any()) run.sparse.grad_norm = std::sqrt(step.sparse_squares);
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
    sparse_update(run);  // the touched rows of the sparse tables
    // Shards: every rank's updated rows to every rank ("parameters": the next forward
    // gathers them).
    if (run.shards && !run.residency) run.shards->gather_parameters("gathering the parameters updated at step " +
                                                  std::to_string(next));
    profile_end(run, "optimizer");
  } else if (run.config.train.nonfinite == NonFinite::kError && !scaling) {
    throw Error("non-finite " + std::string(std::isfinite(step.loss) ? "gradient norm" : "loss") +
                " at step " + std::to_string(next) + " (loss " + text::number(step.loss) +
                ", grad norm " + text::number(step.grad_norm) +
                (run.sparse.any() ? ", sparse grad norm " + text::number(run.sparse.grad_norm)
                                  : std::string()) +
                "); hint: lower the learning rate, clip gradients, or set train.nonfinite = "
                "\"skip\"");
  } else {
    run.progress.skipped_steps += 1;
    spdlog::warn("step {}: non-finite loss or gradients, optimizer step skipped ({} so far)",
                 next, run.progress.skipped_steps);
    if (!scaling && run.progress.skipped_steps > run.config.train.max_skips)
      throw Error("more than train.max_skips = " + std::to_string(run.config.train.max_skips) +
                  " steps skipped for non-finite values (latest at step " +
                  std::to_string(next) + "); hint: lower the learning rate");
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

// Up to `count` micro-batches of the training data (fewer at the end of its epoch).
std::vector<MicroBatch> next_micro_batches(Run& run, int64_t count) {
  const Instance<keel_dataset>& data = run.components.train_data;
  std::vector<MicroBatch> out;
  for (int64_t i = 0; i < count; ++i) {
    keel_batch b{};
    int has = 0;
    data.call("next", data->next, &b, &has);
    const NextResult result = next_result(data, has);
    if (result == NextResult::kStopped) run.epoch.stopped = StopSignals::received();
    if (result != NextResult::kBatch) break;
    out.push_back(on_device(run, checked_batch(data, b)));
  }
  return out;
}

// Past the agreed micro-batches of the epoch: every rank takes as many as the rank with the
// fewest (none: the epoch ends on every rank), agreed with one all-reduce, so that all run
// the same gradient all-reduces.
void agree_on_fetched(Run& run, std::vector<MicroBatch>& out) {
  const size_t fewest = static_cast<size_t>(-run.ranks.group->max(
      {-static_cast<double>(out.size())},
      "agreeing on the batches of step " + std::to_string(run.progress.step + 1))[0]);
  if (fewest < out.size()) {
    spdlog::warn("{} has {} more micro-batch(es) in epoch {} than another rank: left out "
                 "(hint: shard the data evenly, e.g. fashion_mnist remainder = \"pad\" or "
                 "\"drop\")", run.components.train_data.label(), out.size() - fewest,
                 run.progress.epoch);
    out.resize(fewest);
  }
}

// A stream (no agreed count): every rank must take as many micro-batches as every other, so
// that all end each epoch at the same step. One all-reduce (a max over one field per rank,
// rank r's count in field r and -1 in the others) gives every rank each rank's count, and in
// one more field the signal with which a rank's data stopped while waiting (0: none), which
// every rank then takes as its own; unequal counts fail every rank at once with one line naming
// them.
void agree_on_stream(Run& run, const std::vector<MicroBatch>& out) {
  const int64_t step = run.progress.step + 1;
  std::vector<double> counts(static_cast<size_t>(run.ranks.world) + 1, -1.0);
  counts[static_cast<size_t>(run.ranks.rank)] = static_cast<double>(out.size());
  counts.back() = run.epoch.stopped;
  counts = run.ranks.group->max(counts, "agreeing on the batches of step " + std::to_string(step));
  run.epoch.stopped = static_cast<int>(counts.back());
  counts.pop_back();
  if (std::all_of(counts.begin(), counts.end(), [&](double c) { return c == counts[0]; })) return;
  std::string each;
  for (size_t r = 0; r < counts.size(); ++r)
    each += (r ? ", rank " : "rank ") + std::to_string(r) + " " +
            std::to_string(static_cast<int64_t>(counts[r]));
  throw run.components.train_data.error(
      "a stream whose ranks' data ends epoch " + std::to_string(run.progress.epoch) +
      " at different steps: micro-batches for step " + std::to_string(step) + " (up to " +
      std::to_string(run.plan.grad_accum) + "): " + each + ", after " +
      std::to_string(run.epoch.batches) + " in this epoch" +
      (run.epoch.stopped ? " (a rank's data stopped while waiting for data, another's did not)"
                         : "") +
      "; hint: a stream (batches_per_epoch -1) must give every rank the same number of batches "
      "in each window" +
      (run.epoch.stopped ? ", and a stop while waiting for data needs the signal on every rank"
                         : ""));
}

}  // namespace

std::vector<MicroBatch> fetch_micro_batches(Run& run) {
  const auto t0 = Clock::now();
  profile_begin(run, "data");
  // With several ranks, within the agreed micro-batches of the epoch every rank takes its
  // share without asking the others; a rank whose data yields fewer marks them missing.
  const int64_t left = run.plan.epoch_batches - run.epoch.batches;
  const bool within = run.ranks.group && left > 0;
  const int64_t want = within ? std::min(run.plan.grad_accum, left) : run.plan.grad_accum;
  std::vector<MicroBatch> out = next_micro_batches(run, want);
  profile_end(run, "data");
  if (run.epoch.stopped && run.ranks.group && !run.plan.stream)
    throw run.components.train_data.error(
        "stopped while waiting for data (KEEL_BATCH_STOPPED) in a run of " +
        std::to_string(run.ranks.world) + " ranks, which only a stream (batches_per_epoch -1) "
        "may do: the ranks could not agree on where the epoch stands; hint: run it on one "
        "process, or make the dataset a stream");
  run.epoch.missing = within ? want - static_cast<int64_t>(out.size()) : 0;
  if (run.ranks.group && !within) {
    if (run.plan.stream)
      agree_on_stream(run, out);
    else
      agree_on_fetched(run, out);
  }
  run.window.data_s += std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

double train_step(Run& run, const std::vector<MicroBatch>& batches) {
  emit(run, KEEL_EVENT_STEP_START);
  for (size_t i = 0; i < batches.size(); ++i)
    emit(run, KEEL_EVENT_AFTER_DATA, nullptr, nullptr, nullptr, static_cast<int64_t>(i));
  run.components.optimizer.run("zero_grad", run.components.optimizer->zero_grad);
  if (run.shards) run.shards->clear_gradients();  // zero_grad saw only the shards
  StepOutcome step = forward_backward(run, batches);
  if (run.shards) run.shards->bind_gradients();  // the shards' rows of the whole gradients
  if (run.plan.scaler)
    step.finite = run.plan.scaler->unscale(run.shards ? run.shards->tensors()
                                                      : run.parameters.tensors) &&
                  step.finite;
  emit(run, KEEL_EVENT_AFTER_BACKWARD);
  clip_gradients(run, step);
  run.progress.grad_norm = step.grad_norm;
  if (run.sparse.any()) {  // not clipped; a non-finite gradient makes the step non-finite
    step.sparse_squares = sparse_grad_squares(run);
    step.finite = step.finite && std::isfinite(step.sparse_squares);
  }
  reduce_across_ranks(run, step);
  if (run.plan.scaler) run.plan.scaler->update(step.finite);
  step_or_skip(run, step);
  count_step(run, step);
  end_sparse_step(run, run.progress.step);  // taken or skipped: the tables forget its gradients
  emit(run, KEEL_EVENT_STEP_END);
  return step.loss;
}

void set_lr_for(Run& run, int64_t step) {
  const Instance<keel_lr_scheduler>& scheduler = run.components.scheduler;
  const Instance<keel_optimizer>& optimizer = run.components.optimizer;
  const double f = scheduler ? scheduler.get("factor", scheduler->factor, step) : 1.0;
  if (!std::isfinite(f) || f < 0)
    throw scheduler.error("factor(" + std::to_string(step) + ") returned " + text::number(f) +
                          "; a schedule must return a finite value >= 0");
  const std::vector<double>& base = run.parameters.base_lrs;
  for (size_t g = 0; g < base.size(); ++g)
    optimizer.run("set_lr", optimizer->set_lr, g, base[g] * f);
  set_sparse_lr(run, f);  // the same schedule
  run.progress.lr = base.empty() ? 0 : base[0] * f;
}

}  // namespace keel

