#include "run/evaluate.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <string>
#include <vector>

#include "run/autocast.hpp"
#include "run/events.hpp"
#include "run/model_calls.hpp"
#include "run/run.hpp"

namespace keel {

namespace {

// ---- task metrics ----
// The kernel's guess of the task from the shapes of outputs and targets: a classification
// ([batch, classes] outputs for [batch] integer targets) reports accuracy; next-token
// prediction ([batch, time, vocab] outputs for [batch, time] integer targets) reports the mean
// loss in bits (bits per character for a character-level language model, for a cross-entropy
// loss in nats, as every first-party loss computes it).
struct TaskMetrics {
  double correct = 0, rows = 0;
  bool classification = true, sequence = true;

  void add_batch(const at::Tensor& out, const at::Tensor& y) {
    if (classification && out.dim() == 2 && y.dim() == 1 && !y.is_floating_point() &&
        out.size(0) == y.size(0)) {
      correct += static_cast<double>(out.argmax(1).eq(y).sum().item<int64_t>());
      rows += static_cast<double>(y.size(0));
    } else {
      classification = false;
    }
    sequence = sequence && out.dim() == 3 && y.dim() == 2 && !y.is_floating_point() &&
               out.size(0) == y.size(0) && out.size(1) == y.size(1);
  }
  // As sums over ranks: counts, and "not this task" flags (any rank's says no).
  std::vector<double> sums() const {
    return {correct, rows, classification ? 0.0 : 1.0, sequence ? 0.0 : 1.0};
  }
  void set_sums(const double* v) {
    correct = v[0];
    rows = v[1];
    classification = v[2] == 0;
    sequence = v[3] == 0;
  }
  // Appends the metrics of the guessed task to the test record.
  void append(double loss_sum, int64_t items, int64_t batches,
              std::vector<keel_metric>& record) const {
    if (classification && rows > 0) record.push_back({"accuracy", correct / rows});
    if (sequence && batches > 0 && items > 0)
      record.push_back({"bits_per_token", loss_sum / items / std::log(2.0)});
  }
};
// ---- end of task metrics ----

// Sums over the test split.
struct EvalSums {
  double loss_sum = 0;
  int64_t items = 0, samples = 0, batches = 0;
  TaskMetrics task;
};

// Runs the model over the test split (up to eval_max_batches batches).
EvalSums run_test_split(Run& run) {
  const Instance<keel_dataset>& data = run.components.test_data;
  EvalSums sums;
  data.call("start_epoch", data->start_epoch, int64_t{0});
  while (run.config.train.eval_max_batches == 0 || sums.batches < run.config.train.eval_max_batches) {
    keel_batch b{};
    int has = 0;
    data.call("next", data->next, &b, &has);
    if (!has) break;
    const MicroBatch mb = on_device(run, checked_batch(data, b));
    at::Tensor out;
    int64_t count = 0;
    double batch_loss = 0;
    {
      const Autocast autocast(run.config.train.precision, run.ranks.device);
      out = forward(run, mb.inputs);
      batch_loss = compute_loss(run, out, mb.targets, &count, false).item<double>();
    }
    sums.loss_sum += batch_loss * static_cast<double>(count);
    sums.items += count;
    sums.samples += mb.samples;
    sums.task.add_batch(out, mb.targets);
    ++sums.batches;
  }
  return sums;
}

// Exact over the ranks' shards: sums of losses, items, samples and the task's counts.
void reduce_across_ranks(Run& run, EvalSums& sums) {
  if (!run.ranks.group) return;
  std::vector<double> local = {sums.loss_sum, double(sums.items), double(sums.samples)};
  for (double v : sums.task.sums()) local.push_back(v);
  const std::vector<double> v = run.ranks.group->sum(
      local, "reducing the evaluation at step " + std::to_string(run.progress.step));
  sums.loss_sum = v[0];
  sums.items = static_cast<int64_t>(v[1]);
  sums.samples = static_cast<int64_t>(v[2]);
  sums.task.set_sums(&v[3]);
}

}  // namespace

bool evaluation_due(Run& run, Moment moment, bool epoch_complete) {
  const RunConfig& c = run.config;
  if (moment == Moment::kStepEnd)
    return (c.eval_every_steps > 0 && run.progress.step % c.eval_every_steps == 0) ||
           run.requests.evaluate();
  return (c.eval_each_epoch && epoch_complete) || run.end.decided() || run.requests.evaluate();
}

void evaluate(Run& run) {
  if (!run.components.test_data || run.records.last_eval_step == run.progress.step) return;
  const Instance<keel_model>& model = run.components.model;
  const AddElapsed timed(run.window.eval_s);
  run.records.last_eval_step = run.progress.step;
  emit(run, KEEL_EVENT_EVAL_START, "test");
  profile_begin(run, "eval");
  const at::NoGradGuard no_grad;  // to the end, the events below included
  model.run("set_training", model->set_training, 0);
  EvalSums sums = run_test_split(run);
  model.run("set_training", model->set_training, 1);
  reduce_across_ranks(run, sums);
  profile_end(run, "eval");
  std::vector<keel_metric>& record = run.records.eval;
  record = {{"step", double(run.progress.step)},
            {"epoch", double(run.progress.epoch)},
            {"loss", sums.items ? sums.loss_sum / sums.items : NAN}};
  sums.task.append(sums.loss_sum, sums.items, sums.batches, record);
  record.push_back({"samples", static_cast<double>(sums.samples)});
  run.summary.eval_loss = record[2].value;
  for (const keel_metric& m : record)
    if (std::string(m.key) == "accuracy") run.summary.eval_accuracy = m.value;
  run.progress.eval_metrics = record.data();
  run.progress.eval_metric_count = record.size();
  emit(run, KEEL_EVENT_EVAL_END, "test");
  emit(run, KEEL_EVENT_METRICS, "test", &record);
}

}  // namespace keel
