#include "run/evaluate.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "run/autocast.hpp"
#include "run/eval_metrics.hpp"
#include "run/events.hpp"
#include "run/model_calls.hpp"
#include "run/decisions.hpp"
#include "run/run.hpp"
#include "run/signals.hpp"

namespace keel {

namespace {

// Runs the model over the test split (up to eval_max_batches batches), adding each batch to
// the evaluation's sums (run/eval_metrics.hpp).
void run_test_split(Run& run) {
  const Instance<keel_dataset>& data = run.components.test_data;
  EvalMetrics& sums = run.components.eval_metrics;
  sums.begin();
  data.call("start_epoch", data->start_epoch, int64_t{0});
  const int64_t max_batches = run.config.train.eval_max_batches;
  for (int64_t batches = 0; max_batches == 0 || batches < max_batches; ++batches) {
    keel_batch b{};
    int has = 0;
    data.call("next", data->next, &b, &has);
    const NextResult result = next_result(data, has);
    if (result == NextResult::kStopped)
      spdlog::warn("evaluation at step {}: {} stopped while waiting for data; the record covers "
                   "the {} batch(es) read before", run.progress.step, data.label(), batches);
    if (result != NextResult::kBatch) break;
    const MicroBatch mb = on_device(run.ranks.device, checked_batch(data, b));
    at::Tensor out;
    int64_t count = 0;
    double batch_loss = 0;
    {
      const Autocast autocast(run.config.train.precision, run.ranks.device);
      out = forward(run.components.model, mb.inputs);
      batch_loss =
          compute_loss(run.components.loss, out, mb.targets, &count, false).item<double>();
    }
    sums.update(out, mb.targets, batch_loss, count, mb.samples);
  }
}

}  // namespace

bool evaluation_due(Run& run, Moment moment, bool epoch_complete) {
  const RunConfig& c = run.config;
  if (moment == Moment::kStepEnd)
    return (c.train.eval_every_steps > 0 && run.progress.step % c.train.eval_every_steps == 0) ||
           run.requests.evaluate();
  return (c.train.eval_each_epoch && epoch_complete) || run.end.decided() || run.requests.evaluate();
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
  // shard = "parameters": the whole model for the evaluation's duration (the ranks' test
  // shards may differ in batches, so units are not gathered one by one here).
  if (run.residency)
    run.residency->gather_all("gathering the model for the evaluation at step " +
                              std::to_string(run.progress.step));
  run_test_split(run);
  if (run.residency) run.residency->free_all();
  model.run("set_training", model->set_training, 1);
  if (run.ranks.group)  // exact over the ranks' shards: sums of losses, items, samples, task state
    run.components.eval_metrics.reduce([&](std::vector<double> v) {
      return run.ranks.group->sum(
          std::move(v), "reducing the evaluation at step " + std::to_string(run.progress.step));
    });
  profile_end(run, "eval");
  std::vector<keel_metric>& record = run.records.eval;
  record = run.components.eval_metrics.finish(run.progress.step, run.progress.epoch);
  run.summary.eval_loss = run.components.eval_metrics.loss();
  for (const keel_metric& m : record)  // the loss's accuracy, when it reports one
    if (std::string(m.key) == "accuracy") run.summary.eval_accuracy = m.value;
  run.progress.eval_metrics = record.data();
  run.progress.eval_metric_count = record.size();
  emit(run, KEEL_EVENT_EVAL_END, "test");
  emit(run, KEEL_EVENT_METRICS, "test", &record);
}

}  // namespace keel
