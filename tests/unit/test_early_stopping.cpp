// early_stopping (plugins/hooks): the rule on hand-made METRICS events (min_delta, mode,
// patience, state tensors), then a real run that it stops.
#include <ATen/core/Tensor.h>

#include "components.hpp"
#include "host.hpp"
#include "keel/tensor.hpp"
#include "manifest.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "run/trainer.hpp"

namespace unit_early_stopping {  // keel_units is one unity build: each file's names stay its own

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

// A run whose only hooks are early_stopping (with `options`) and jsonl.
fs::path manifest(const TempDir& d, const std::string& options) {
  return d.write("m.toml", keel_test::small_run(d.path / "run") +
                               "[[hooks]]\ntype = \"early_stopping\"\n" + options +
                               "\n[[hooks]]\ntype = \"jsonl\"\n");
}

// The early_stopping hook of that manifest, created on its own.
struct Stopper {
  TempDir dir;
  keel::Registry registry;
  keel::RunConfig config;
  keel::Instance<keel_hook> hook;

  explicit Stopper(const std::string& options)
      : config(keel::resolve(keel::load_manifest(manifest(dir, options).string(), {}), registry)) {
    const keel::ComponentSpec& spec = config.hooks.at(0);
    keel_create_context ctx{};
    ctx.host = keel::host();
    ctx.options = &spec.options;
    ctx.section = spec.section.c_str();
    ctx.run_dir = dir.path.c_str();
    hook = keel::create_instance<keel_hook>(*spec.component, ctx);
  }

  // Sends an event of `kind`, with `record` (METRICS); returns the requests the hook set.
  uint32_t event(keel_event_kind kind, const char* split = nullptr,
                 std::vector<keel_metric> record = {}, int64_t step = 0) {
    keel_trainer_state state{};
    state.struct_size = sizeof state;
    state.step = step;
    keel_event ev{};
    ev.struct_size = sizeof ev;
    ev.kind = kind;
    ev.state = &state;
    ev.split = split;
    ev.metrics = record.data();
    ev.metric_count = record.size();
    hook.call("on_event", hook->on_event, &ev);
    return ev.requests;
  }
  // Sends one METRICS record; returns the requests the hook set.
  uint32_t send(const char* split, std::vector<keel_metric> record, int64_t step = 0) {
    return event(KEEL_EVENT_METRICS, split, std::move(record), step);
  }
  uint32_t loss(double value) { return send("test", {{"step", 0}, {"loss", value}}); }

  // One evaluation of `splits`, as the kernel sends it: per set EVAL_START, EVAL_END, METRICS.
  void evaluation(const std::vector<const char*>& splits) {
    for (const char* split : splits) {
      event(KEEL_EVENT_EVAL_START, split);
      event(KEEL_EVENT_EVAL_END, split);
      send(split, {{"step", 0}, {"loss", 1.0}});
    }
  }

  // The state tensor `name`, as a checkpoint would save and load it.
  at::Tensor state(const std::string& name) const {
    for (size_t i = 0; i < hook->state_count(hook.self()); ++i) {
      const char* n = nullptr;
      keel_tensor* t = nullptr;
      hook.call("state", hook->state, i, &n, &t);
      if (name == n) return keel::borrow(t);
    }
    FAIL("no state tensor " << name);
    return {};
  }
};

// Trains `manifest` with `sets`; returns the steps taken and the evaluations in metrics.jsonl.
std::pair<int64_t, size_t> train(const fs::path& manifest, const std::vector<std::string>& sets) {
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(manifest.string(), sets), registry);
  keel::apply_process_settings(rc);
  keel::Trainer trainer(rc);
  const keel::RunSummary summary = trainer.train();
  size_t evals = 0;
  std::stringstream s(keel_test::read(fs::path(summary.run_dir) / "metrics.jsonl"));
  for (std::string l; std::getline(s, l);) evals += l.find("\"split\": \"test\"") != l.npos;
  return {summary.steps, evals};
}

}  // namespace

TEST_CASE("min mode: an improvement must beat the best by more than min_delta") {
  Stopper s("patience = 1\nmin_delta = 0.1");
  CHECK(s.loss(1.0) == 0);   // first value: the best
  CHECK(s.loss(0.95) == 0);  // within min_delta: 1 bad evaluation, tolerated
  CHECK(s.state("bad_evals").item<int64_t>() == 1);
  CHECK(s.loss(0.85) == 0);  // 0.85 < 1.0 - 0.1: new best, count reset
  CHECK(s.state("bad_evals").item<int64_t>() == 0);
  CHECK(s.state("best").item<double>() == 0.85);
  CHECK(s.loss(0.80) == 0);
  CHECK(s.loss(0.79) == KEEL_REQUEST_STOP);  // 2 bad evaluations > patience 1
}

TEST_CASE("max mode watches another metric; other splits are ignored") {
  Stopper s("metric = \"accuracy\"\nmode = \"max\"\npatience = 0");
  CHECK(s.send("test", {{"accuracy", 0.5}}, 10) == 0);
  CHECK(s.send("train", {{"loss", 1.0}}) == 0);  // not the watched split: no accuracy needed
  CHECK(s.send("test", {{"accuracy", 0.6}}, 20) == 0);
  CHECK(s.state("best_step").item<int64_t>() == 20);
  CHECK(s.send("test", {{"accuracy", 0.6}}, 30) == KEEL_REQUEST_STOP);  // equal is no better
}

TEST_CASE("a metric the record lacks is an error naming it and the keys there are") {
  Stopper s("metric = \"acc\"");
  const std::string err = keel_test::error_of([&] { s.loss(1.0); });
  CHECK(err.find("metric 'acc' is not in the 'test' record (it has: step, loss); hint: set "
                 "metric to one of these") != std::string::npos);
}

// A split no evaluation set has: refused at the first event after an evaluation without it.
TEST_CASE("a split that the run's evaluations do not record is an error naming theirs") {
  Stopper s("split = \"valid\"");
  s.event(KEEL_EVENT_STEP_START);  // no evaluation yet: nothing to say
  s.evaluation({"test", "zeta"});
  s.send("train", {{"loss", 1.0}});  // a train record after the evaluation changes nothing
  const std::string err = keel_test::error_of([&] { s.event(KEEL_EVENT_STEP_START); });
  CHECK(err.find("split 'valid' has no records: the run's evaluations record 'test', 'zeta'; "
                 "hint: set split to one of these, or \"train\"") != std::string::npos);
  Stopper failing("split = \"valid\"");  // a run failing after an evaluation keeps its error
  failing.evaluation({"test"});
  CHECK(keel_test::error_of([&] { failing.event(KEEL_EVENT_EXCEPTION); }) == "<no error>");
  Stopper ok("split = \"zeta\"");
  ok.evaluation({"test", "zeta"});
  CHECK(keel_test::error_of([&] { ok.event(KEEL_EVENT_TRAIN_END); }) == "<no error>");
  Stopper train("split = \"train\"");
  train.evaluation({"test"});
  CHECK(keel_test::error_of([&] { train.event(KEEL_EVENT_STEP_START); }) == "<no error>");
}

TEST_CASE("the state lives in the published tensors: a loaded checkpoint takes effect") {
  Stopper s("patience = 2");
  CHECK(s.state("best").dim() == 0);
  CHECK((s.state("bad_evals").scalar_type() == at::kLong));
  s.state("best").fill_(0.5);  // as CheckpointStore::load copies saved values in place
  s.state("bad_evals").fill_(2);
  CHECK(s.loss(0.6) == KEEL_REQUEST_STOP);  // third bad evaluation in a row
  CHECK(s.loss(0.4) == 0);                  // improves on the loaded best
}

// lr 0: the model never changes, so only a run's first evaluation can improve on the best.
TEST_CASE("a run stops after 1 + patience + 1 evaluations without improvement") {
  TempDir d;
  const auto [steps, evals] =
      train(manifest(d, "patience = 2"), {"train.epochs=30", "optimizer.lr=0"});
  CHECK(evals == 4);
  CHECK(steps == 4 * 8);  // 256 samples / batch 32 = 8 steps an epoch
}

// The bug: a stop requested by an end-of-epoch evaluation of a non-final epoch ended the run
// without a record of the steps since the last log_every record.
TEST_CASE("a run stopped at an end-of-epoch evaluation records its last steps") {
  TempDir d;
  // lr 0, patience 0: the evaluation after epoch 2 (step 16) is the first bad one and stops the
  // run of 30 epochs. log_every 3 does not divide 16: records at 3, 6, ..., 15 and one at 16.
  const auto [steps, evals] =
      train(manifest(d, "patience = 0"),
            {"train.epochs=30", "train.log_every=3", "optimizer.lr=0"});
  CHECK(evals == 2);
  REQUIRE(steps == 16);
  std::vector<std::string> records;  // metrics.jsonl, in order
  std::stringstream s(keel_test::read(d.path / "run/metrics.jsonl"));
  for (std::string l; std::getline(s, l);) records.push_back(l);
  std::vector<std::string> train_steps;
  for (const std::string& r : records)
    if (r.find("\"split\": \"train\"") != r.npos)
      train_steps.push_back(r.substr(r.find("\"step\": "), r.find(',', r.find("\"step\": ")) -
                                                              r.find("\"step\": ")));
  CHECK(train_steps == std::vector<std::string>{"\"step\": 3", "\"step\": 6", "\"step\": 9",
                                                "\"step\": 12", "\"step\": 15",
                                                "\"step\": 16"});
  // The last record is that of steps 16 (of epoch 1), after the evaluation that stopped the run.
  REQUIRE(records.size() >= 2);
  CHECK(records.back().rfind("{\"split\": \"train\", \"step\": 16, \"epoch\": 1,", 0) == 0);
  CHECK(records[records.size() - 2].rfind("{\"split\": \"test\", \"step\": 16,", 0) == 0);
}

// The plugin logs under its section (the SDK's default origin); the kernel names the hook as the
// user does: its label, else its type, not its position "hooks[0]".
TEST_CASE("the stop's log line names the hook by its label, else its type") {
  for (const auto& case_ : std::vector<std::pair<std::string, std::string>>{
           {"label = \"stopper\"\n", "[stopper]"}, {"", "[early_stopping]"}}) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& label = case_.first;
    const auto& shown = case_.second;
    CAPTURE(shown);
    TempDir d;
    train(manifest(d, label + "patience = 0"), {"train.epochs=30", "optimizer.lr=0"});
    const std::string log = keel_test::read(d.path / "run/run.log");
    CHECK(log.find("] [info] " + shown + " stopping: test loss has not improved on ") !=
          std::string::npos);
    CHECK(log.find("[hooks[") == std::string::npos);
  }
  // A label two hooks share (here the stopper's default, its type, and a sink's) names neither:
  // the line keeps the hook's position.
  TempDir d;
  train(manifest(d, "patience = 0\n[[hooks]]\ntype = \"csv\"\nlabel = \"early_stopping\""),
        {"train.epochs=30", "optimizer.lr=0"});
  const std::string log = keel_test::read(d.path / "run/run.log");
  CHECK(log.find("] [info] [hooks[0]] stopping: test loss has not improved on ") !=
        std::string::npos);
}

TEST_CASE("a run started from a checkpoint goes on counting from the saved state") {
  TempDir d;
  const fs::path p = manifest(d, "patience = 5\n[checkpoint]\ntype = \"safetensors\"");
  CHECK(train(p, {"optimizer.lr=0"}).second == 2);  // saved at the end: 1 bad evaluation
  const auto [steps, evals] =
      train(p, {"train.epochs=30", "optimizer.lr=0", "hooks[0].patience=2",
                "run.output_dir=" + (d.path / "again").string(),
                "checkpoint.init_from=" + (d.path / "run/checkpoints/step-16").string()});
  CHECK(evals == 2);  // 2 and 3 bad evaluations: no new best to start from
  CHECK(steps == 2 * 8);
}

}  // namespace unit_early_stopping
