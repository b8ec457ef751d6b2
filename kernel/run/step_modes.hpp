// What a run's configuration adds around the plain single-process step (run/step.cpp). Each
// behaviour is one StepMode, chosen once at assembly (choose_step_modes) into run.step_modes;
// the step calls them all (StepModes), in that order, at each point below, and a point a mode
// does not override does nothing. The modes, in their order:
//
//   RankAgreement   several ranks: the ranks agree on the step's outcome (run/agreement.hpp)
//   GradientAllReduce  several ranks, gradients all-reduced whole (distributed/grad_sync.hpp):
//                   the last micro-batch's backward all-reduces (DDP)
//   SparseRows      a model with sparse embedding tables (run/tables.hpp)
//   ShardedParameters  [distributed] shard (distributed/sharding.hpp): ZeRO-1/2 and FSDP
//   WholeParameters shard = "parameters": the root gathered around each micro-batch
//                   (distributed/residency.hpp)
//   LossScaling     precision = "fp16": dynamic loss scaling (loss_scaler.hpp)
//
// One optimizer step, with the points (and what each mode does there):
//
//   zero_grad
//   start()                          ShardedParameters: the whole gradients dropped
//   no micro-batch on this rank:     GradientAllReduce: backward of a zero loss, so that every
//     stand_in()                     rank joins the gradient all-reduce
//   for each micro-batch (`last`: the step's last):
//     before_forward(last)           GradientAllReduce: the last backward will all-reduce;
//                                    WholeParameters: the root gathered
//     forward, loss, weight
//     loss = for_backward(loss)      LossScaling: scaled
//     before_backward(loss, last)    RankAgreement: the outcome agreement issued early (when it
//                                    can be: no shards, no sparse tables); GradientAllReduce
//     backward
//     after_backward()               ShardedParameters: this backward's reduce-scatters done;
//                                    WholeParameters: the root freed
//   gradients_done(outcome)          ShardedParameters: each shard's gradient bound;
//                                    LossScaling: gradients unscaled, their finiteness
//   AFTER_BACKWARD, clip
//   measured(outcome)                SparseRows: the row gradients' squares, their finiteness
//   agree(outcome)                   RankAgreement: loss, finiteness, samples, tokens and
//                                    squares over the ranks (a rank short of data fails all)
//   agreed(outcome)                  SparseRows: sparse_grad_norm; LossScaling: scale updated
//   optimizer step (a finite step), then after_update()
//                                    SparseRows: touched rows updated; ShardedParameters (not
//                                    "parameters"): the updated rows gathered
//   count the step, then end(step)   SparseRows: every table's end_step (skipped steps too)
//
// A mode borrows the parts of the run it works on; run.step_modes is destroyed before them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "distributed/process_group.hpp"

namespace keel {

struct Run;

// What a step computed, before and after the ranks agree on it.
struct StepOutcome {
  double loss = 0;            // the micro-batches' weighted losses summed (then: mean over ranks)
  bool finite = true;         // loss and gradients finite (on every rank)
  double grad_norm = NAN;     // before clipping (NaN: no clipper)
  double sparse_squares = 0;  // the sparse tables' row gradients' sum of squares (over ranks)
  int64_t samples = 0, tokens = 0;
  PendingSum agreed;          // the outcome agreement when issued before the last backward
};

class StepMode {
 public:
  virtual ~StepMode() = default;
  virtual void start() {}
  // Whether this rank, with no micro-batch for the step, must still run a backward.
  virtual bool stand_in() const { return false; }
  virtual void before_forward(bool /*last*/) {}
  virtual at::Tensor for_backward(at::Tensor loss) { return loss; }
  virtual void before_backward(const at::Tensor& /*loss*/, bool /*last*/, StepOutcome&) {}
  virtual void after_backward() {}
  // Whether a failing backward failed in a collective of the ranks (its error says so).
  virtual bool collective_backward(bool /*last*/) const { return false; }
  virtual void gradients_done(StepOutcome&) {}
  virtual void measured(StepOutcome&) {}
  virtual void agree(StepOutcome&) {}
  virtual void agreed(const StepOutcome&) {}
  virtual void after_update() {}
  virtual void end(int64_t /*step*/) {}
};

// A run's modes, in order: each call calls every mode's (stand_in and collective_backward:
// whether any mode says so; for_backward: each mode's in turn).
class StepModes final : public StepMode {
 public:
  StepModes() = default;
  explicit StepModes(std::vector<std::unique_ptr<StepMode>> modes) : modes_(std::move(modes)) {}
  void start() override { each(&StepMode::start); }
  bool stand_in() const override { return any(&StepMode::stand_in); }
  void before_forward(bool last) override { each(&StepMode::before_forward, last); }
  at::Tensor for_backward(at::Tensor loss) override {
    for (const auto& m : modes_) loss = m->for_backward(loss);
    return loss;
  }
  void before_backward(const at::Tensor& loss, bool last, StepOutcome& step) override {
    for (const auto& m : modes_) m->before_backward(loss, last, step);
  }
  void after_backward() override { each(&StepMode::after_backward); }
  bool collective_backward(bool last) const override {
    for (const auto& m : modes_)
      if (m->collective_backward(last)) return true;
    return false;
  }
  void gradients_done(StepOutcome& step) override { each(&StepMode::gradients_done, step); }
  void measured(StepOutcome& step) override { each(&StepMode::measured, step); }
  void agree(StepOutcome& step) override { each(&StepMode::agree, step); }
  void agreed(const StepOutcome& step) override { each(&StepMode::agreed, step); }
  void after_update() override { each(&StepMode::after_update); }
  void end(int64_t step) override { each(&StepMode::end, step); }

 private:
  template <class... P, class... A>
  void each(void (StepMode::*call)(P...), A&&... args) {
    for (const auto& m : modes_) ((*m).*call)(std::forward<A>(args)...);
  }
  bool any(bool (StepMode::*ask)() const) const {
    for (const auto& m : modes_)
      if (((*m).*ask)()) return true;
    return false;
  }
  std::vector<std::unique_ptr<StepMode>> modes_;
};

// The modes for the run as assembled (after its process group, shards, residency, sparse
// tables, gradient synchronisation and loss scaler exist).
StepModes choose_step_modes(Run& run);

}  // namespace keel
