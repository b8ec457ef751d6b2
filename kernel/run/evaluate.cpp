#include "run/evaluate.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "run/autocast.hpp"
#include "run/eval_metrics.hpp"
#include "run/events.hpp"
#include "run/model_calls.hpp"
#include "run/model_view.hpp"
#include "run/decisions.hpp"
#include "run/run.hpp"
#include "run/signals.hpp"

namespace keel {

namespace {

// Runs the model over one evaluation set (up to eval_max_batches batches), adding each batch
// to the evaluation's sums (run/eval_metrics.hpp) and lending it to the hooks that see
// evaluation batches (keel.hook.observe/1).
void run_set(Run& run, const char* split, const DataSource& source) {
  const Instance<keel_dataset>& data = *source.data;
  EvalMetrics& sums = run.components.eval_metrics;
  sums.begin();
  data.call("start_epoch", data->start_epoch, int64_t{0});
  const int64_t max_batches = run.config.train.eval_max_batches;
  for (int64_t batches = 0; max_batches == 0 || batches < max_batches; ++batches) {
    MicroBatch mb;
    const NextResult result = next_batch(source, run.ranks.device, &mb);
    if (result == NextResult::kStopped)
      spdlog::warn("evaluation at step {}: {} stopped while waiting for data; the record covers "
                   "the {} batch(es) read before", run.progress.step, data.label(), batches);
    if (result != NextResult::kBatch) break;
    Named outputs;
    at::Tensor loss;
    int64_t count = 0;
    {
      const Autocast autocast(run.config.train.precision, run.ranks.device);
      outputs = forward(run.components.model_calls, mb);
      loss = compute_loss(run.components.loss_calls, outputs, mb, &count, false);
    }
    const double batch_loss = loss.item<double>();
    sums.update(outputs, mb, batch_loss, count);
    if (!run.components.observers.empty()) {
      // "loss": the loss plugin's (one the model put is replaced, keel/ext/hook_observe.h).
      outputs.erase(std::remove_if(outputs.begin(), outputs.end(),
                                   [](const auto& kv) { return kv.first == "loss"; }),
                    outputs.end());
      outputs.emplace_back("loss", loss.to(at::kDouble));
      run.components.observers.eval_batch(split, mb.tensors, outputs);
    }
  }
}

// Evaluates one set and records it: EVAL_START, the batches, EVAL_END and its METRICS record
// (split = the set's name), which becomes the set's latest record in run.records.eval.
void evaluate_set(Run& run, const Components::EvalSet& set) {
  const char* split = set.name.c_str();
  emit(run, KEEL_EVENT_EVAL_START, split);
  run_set(run, split, set.source);
  EvalMetrics& sums = run.components.eval_metrics;
  if (run.ranks.group)  // exact over the ranks' shards: sums of losses, items, samples, task state
    sums.reduce([&](std::vector<double> v) {
      return run.ranks.group->sum(std::move(v), fmt::format("reducing the evaluation of {} at "
                                                            "step {}", set.name, run.progress.step));
    });
  MetricList values;
  for (const keel_metric& m : sums.finish(run.progress.step, run.progress.epoch))
    values.emplace_back(m.key, m.value);
  run.components.observers.metrics(split, values);  // hooks' own (keel.hook.observe/1)
  std::vector<EvalRecord>& records = run.records.eval;
  auto record = std::find_if(records.begin(), records.end(),
                             [&](const EvalRecord& r) { return r.split == set.name; });
  if (record == records.end())
    record = records.emplace(records.end(), set.name, std::move(values));
  else
    *record = EvalRecord(set.name, std::move(values));
  if (&set == &run.components.eval_sets.front()) {  // the run's summary: the first set's
    run.summary.eval_set = set.name;
    run.summary.eval_loss = sums.loss();
    for (const auto& [key, value] : record->values)  // the loss's accuracy, when it reports one
      if (key == "accuracy") run.summary.eval_accuracy = value;
  }
  run.progress.eval_metrics = record->metrics.data();
  run.progress.eval_metric_count = record->metrics.size();
  emit(run, KEEL_EVENT_EVAL_END, split);
  emit(run, KEEL_EVENT_METRICS, split, &record->metrics);
}

}  // namespace

bool evaluation_due(Run& run, Moment moment, bool epoch_complete) {
  const RunConfig& c = run.config;
  if (moment == Moment::kStart)
    return c.train.eval_at_start && !run.resume.active() && run.progress.step == 0;
  if (moment == Moment::kStepEnd)
    return (c.train.eval_every_steps > 0 && run.progress.step % c.train.eval_every_steps == 0) ||
           run.requests.evaluate();
  return (c.train.eval_each_epoch && epoch_complete) || run.end.decided() || run.requests.evaluate();
}

void evaluate(Run& run) {
  if (run.components.eval_sets.empty() || run.records.last_eval_step == run.progress.step) return;
  const Instance<keel_model>& model = run.components.model;
  const AddElapsed timed(run.window.eval_s);
  run.records.last_eval_step = run.progress.step;
  profile_begin(run, "eval");
  const at::NoGradGuard no_grad;  // to the end, the events below included
  model.run("set_training", model->set_training, 0);
  // shard = "parameters": the whole model for the evaluation's duration (the ranks' shards of a
  // set may differ in batches, so units are not gathered one by one here).
  if (run.residency)
    run.residency->gather_all(
        fmt::format("gathering the model for the evaluation at step {}", run.progress.step));
  {
    // A hook's weights, when one set them (keel.hook.model/1), for the evaluation's duration;
    // written into the model's tensors only once an asynchronous save copied their own values.
    const ModelViews* views = run.components.model_views.get();
    if (views && views->has_eval_weights() && run.components.store)
      run.components.store->wait_copied();
    ModelViews::ForEvaluation weights(views);
    for (const Components::EvalSet& set : run.components.eval_sets) evaluate_set(run, set);
    weights.restore();
  }
  if (run.residency) run.residency->free_all();
  model.run("set_training", model->set_training, 1);
  profile_end(run, "eval");
}

}  // namespace keel
