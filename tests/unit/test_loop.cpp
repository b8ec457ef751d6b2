// The loop's semantics: stop targets, gradient accumulation, non-finite policies, evaluation
// cadence and run modes, bf16, parameter groups, and hook requests.
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <regex>

#include "components.hpp"
#include "host.hpp"
#include "keel/tensor.hpp"
#include "manifest.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "run/teardown.hpp"
#include "run/trainer.hpp"

namespace unit_loop {  // keel_units is one unity build: each file's names stay its own

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

struct Run {
  keel::Registry registry;
  keel::RunConfig config;
  std::unique_ptr<keel::Trainer> trainer;
  Run(const fs::path& manifest, const std::vector<std::string>& sets) {
    config = keel::resolve(keel::load_manifest(manifest.string(), sets), registry);
    // The cases train one after another into their test's run directory, each a new run over
    // the previous one's records (as `keel train --overwrite`).
    config.overwrite = true;
    keel::apply_process_settings(config);
    trainer = std::make_unique<keel::Trainer>(config);
  }
};

keel::RunSummary train(const TempDir& d, std::vector<std::string> sets,
                       const std::string& extra = "") {
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") + extra);
  Run r(p, sets);
  return r.trainer->train();
}

// The records of `split` in run directory `run_dir`'s metrics.jsonl.
std::vector<std::string> records_in(const fs::path& run_dir, const std::string& split) {
  std::vector<std::string> out;
  std::stringstream s(keel_test::read(run_dir / "metrics.jsonl"));
  for (std::string l; std::getline(s, l);)
    if (l.find("\"split\": \"" + split + "\"") != std::string::npos) out.push_back(l);
  return out;
}

std::vector<std::string> records(const TempDir& d, const std::string& split) {
  return records_in(d.path / "run", split);
}

double field(const std::string& record, const std::string& key) {
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(record, m, std::regex("\"" + key + "\": ([-0-9.eE+]+)")),
                  key << " missing in " << record);
  return std::stod(m[1]);
}

// A tensor of a committed checkpoint of the run in `d`.
at::Tensor weights_of(const TempDir& d, const std::string& checkpoint, const std::string& name);

const std::string kFixtures = "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n";
const std::string kFixtureHook = "[[hooks]]\ntype = \"c_event_log\"\n";

}  // namespace

// small_run: 256 samples, batch 32 -> 8 batches an epoch; 2 epochs; log every 4 steps.

TEST_CASE("stop targets: whichever of epochs, steps, samples, tokens comes first") {
  TempDir d;
  CHECK(train(d, {}).steps == 16);
  CHECK(train(d, {"train.max_steps=5"}).steps == 5);
  CHECK(train(d, {"train.max_samples=100"}).samples == 128);  // 4 batches of 32
  CHECK(train(d, {"train.max_tokens=64", "train.epochs=0"}).steps == 2);
  CHECK(train(d, {"train.epochs=0", "train.max_steps=20"}).steps == 20);  // past epoch ends
}

TEST_CASE("gradient accumulation: k micro-batches per optimizer step") {
  TempDir d;
  const keel::RunSummary s = train(d, {"train.grad_accum=3"});
  // 8 batches an epoch -> steps of 3, 3, 2 micro-batches: 3 steps an epoch.
  CHECK(s.steps == 6);
  CHECK(s.samples == 512);
  const auto r = records(d, "train");
  REQUIRE(!r.empty());
  CHECK(field(r.back(), "step") == 6);
}

TEST_CASE("accumulating k equal micro-batches equals one k-times larger batch") {
  // Mean normalisation over 4 batches of 8 == one batch of 32 (same samples, same order).
  TempDir a, b;
  const std::string ckpt = "[checkpoint]\ntype = \"safetensors\"\n";
  train(a, {"data.train.batch_size=8", "train.grad_accum=4", "train.max_steps=6"}, ckpt);
  train(b, {"train.max_steps=6"}, ckpt);
  const at::Tensor wa = weights_of(a, "step-6", "fc1.weight");
  const at::Tensor wb = weights_of(b, "step-6", "fc1.weight");
  CHECK(wa.sub(wb).abs().max().item<double>() < 1e-6);
}

TEST_CASE("non-finite values: error names the step; skip counts and aborts after max_skips") {
  TempDir d;
  const std::string err = keel_test::error_of([&] { train(d, {"optimizer.lr=1e30"}); });
  CHECK(std::regex_search(err, std::regex("non-finite (loss|gradient norm) at step [0-9]+")));
  CHECK(err.find("train.nonfinite = \"skip\"") != std::string::npos);

  const std::string skip_err = keel_test::error_of([&] {
    train(d, {"optimizer.lr=1e30", "train.nonfinite=skip", "train.max_skips=3"});
  });
  CHECK(skip_err.find("more than train.max_skips = 3 steps skipped") != std::string::npos);
}

namespace {

// A run on the C fixture's synthetic dataset (tests/fixtures/c_hook.c): one epoch of 16 batches
// of 16 random samples, AdamW, a checkpoint after every step (and step-0), one skip allowed.
std::string synthetic_run(const fs::path& run_dir, const std::string& data_options) {
  return kFixtures + "[run]\noutput_dir = \"" + run_dir.string() + "\"\nseed = 7\n" +
         "[train]\nepochs = 1\nlog_every = 1\nnonfinite = \"skip\"\nmax_skips = 1\n"
         "[model]\ntype = \"mlp\"\nhidden = [32]\n"
         "[data.train]\ntype = \"c_synthetic\"\nbatches = 16\nbatch_size = 16\n" +
         data_options +
         "[optimizer]\ntype = \"adamw\"\nlr = 0.01\n"
         "[loss]\ntype = \"cross_entropy\"\n"
         "[checkpoint]\ntype = \"safetensors\"\nevery_steps = 1\ninitial = true\n"
         "[[hooks]]\ntype = \"jsonl\"\n";
}

// Every tensor of two committed checkpoints of the runs in `a` and `b` is bit-equal: the files
// are byte-equal (the safetensors backend writes the tensors in the model's fixed order and a
// constant header, so equal bytes <=> every tensor equal), and each parameter compares equal.
void check_same_model(const TempDir& a, const std::string& ca, const TempDir& b,
                      const std::string& cb) {
  INFO("run A " << ca << " vs run B " << cb);
  const auto file = [](const TempDir& d, const std::string& c) {
    return d.path / "run/checkpoints" / c / "model.safetensors";
  };
  REQUIRE(fs::exists(file(a, ca)));
  REQUIRE(fs::exists(file(b, cb)));
  CHECK(keel_test::read(file(a, ca)) == keel_test::read(file(b, cb)));
  for (const char* name : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}) {
    INFO(name);
    CHECK(at::equal(weights_of(a, ca, name), weights_of(b, cb, name)));
  }
}

}  // namespace

TEST_CASE("a skipped step leaves the weights and the optimizer state untouched") {
  // Run A: batch 3 (0-based) holds a NaN, so step 4's loss is NaN and the step is skipped.
  // Run B: the same data without batch 3. After the skip, A's step k + 1 sees B's step k's
  // batch. Had the skipped step touched AdamW (its moments, its step count used for bias
  // correction, the decoupled weight decay) or left NaN gradients behind, A's later weights
  // would differ from B's; so A's step k + 1 must equal B's step k bit for bit, for every k.
  TempDir a, b;
  const auto pa = a.write("m.toml", synthetic_run(a.path / "run", "nan_batch = 3\n"));
  const auto pb = b.write("m.toml", synthetic_run(b.path / "run", "skip_batch = 3\n"));
  const keel::RunSummary sa = Run(pa, {}).trainer->train();
  const keel::RunSummary sb = Run(pb, {}).trainer->train();
  CHECK(sa.steps == 16);
  CHECK(sa.skipped_steps == 1);
  CHECK(sb.steps == 15);
  CHECK(sb.skipped_steps == 0);

  // The skipped step is reported: skipped_steps is 0 up to step 3 and 1 from step 4 on.
  const auto r = records(a, "train");
  REQUIRE(r.size() == 16);
  CHECK(field(r[2], "skipped_steps") == 0);
  CHECK(field(r[3], "skipped_steps") == 1);
  CHECK(field(r.back(), "skipped_steps") == 1);

  // Directly: every tensor right after the skipped step 4 equals right before it, while the
  // steps around it do change the weights.
  check_same_model(a, "step-3", a, "step-4");
  CHECK(!at::equal(weights_of(a, "step-2", "fc1.weight"), weights_of(a, "step-3", "fc1.weight")));
  CHECK(!at::equal(weights_of(a, "step-4", "fc1.weight"), weights_of(a, "step-5", "fc1.weight")));

  // Indirectly, the optimizer state: B's step k equals A's step k for k <= 3, and A's step k + 1
  // for k > 3 (A's step 4 is the skipped one).
  for (int k = 0; k <= 15; ++k)
    check_same_model(a, "step-" + std::to_string(k <= 3 ? k : k + 1), b,
                     "step-" + std::to_string(k));
  // Not vacuous: checkpoints of A and B of the same step number after the skip differ.
  CHECK(!at::equal(weights_of(a, "step-10", "fc1.weight"), weights_of(b, "step-10", "fc1.weight")));
}

TEST_CASE("evaluation cadence and run modes") {
  TempDir d;
  train(d, {"train.eval_every_steps=4", "train.eval_each_epoch=false"});
  auto evals = records(d, "test");
  REQUIRE(evals.size() == 4);  // steps 4, 8, 12, 16 (the end does not evaluate twice)
  CHECK(field(evals[0], "step") == 4);
  CHECK(field(evals[3], "step") == 16);

  train(d, {"train.eval_every_steps=4", "train.eval_max_batches=1"});
  evals = records(d, "test");
  CHECK(evals.size() == 4);  // 4, 8 (also epoch end), 12, 16
  CHECK(field(evals[0], "samples") == 100);  // one batch of the test split

  train(d, {"run.mode=train"});
  CHECK(records(d, "test").empty());
  CHECK(records(d, "train").size() == 4);

  // An evaluation writes into a directory of its own inside the run directory, eval-<UTC
  // time>; the training run's records stay as they were.
  const keel::RunSummary e = train(d, {"run.mode=evaluate"});
  CHECK(e.steps == 0);
  CHECK(fs::path(e.run_dir).parent_path() == d.path / "run");
  CHECK(fs::path(e.run_dir).filename().string().rfind("eval-", 0) == 0);
  CHECK(records_in(e.run_dir, "train").empty());
  CHECK(records_in(e.run_dir, "test").size() == 1);
  CHECK(records(d, "train").size() == 4);
  CHECK(records(d, "test").empty());
  CHECK(e.eval_accuracy >= 0);
}

TEST_CASE("bf16 autocast trains, close to but not the same as fp32") {
  TempDir a, b;
  const keel::RunSummary fp32 = train(a, {});
  const keel::RunSummary bf16 = train(b, {"train.precision=bf16"});
  CHECK(bf16.last_loss != fp32.last_loss);
  CHECK(bf16.last_loss == doctest::Approx(fp32.last_loss).epsilon(0.1));
  CHECK(field(records(b, "train").back(), "loss") < field(records(b, "train").front(), "loss"));
}

TEST_CASE("parameter groups: per-group learning rates") {
  TempDir d;
  const std::string extra = "[checkpoint]\ntype = \"safetensors\"\ninitial = true\n"
                            "[[optimizer.groups]]\nparams = \"fc1\\\\..*\"\nlr = 0.0\n";
  train(d, {}, extra);
  // fc1.* trains with lr 0: unchanged; the other layers moved.
  CHECK(weights_of(d, "step-0", "fc1.weight").sub(weights_of(d, "step-16", "fc1.weight"))
            .abs().max().item<double>() == 0.0);
  CHECK(weights_of(d, "step-0", "fc2.weight").sub(weights_of(d, "step-16", "fc2.weight"))
            .abs().max().item<double>() > 0.0);

  const std::string bad = "[[optimizer.groups]]\nparams = \"nothing.*\"\nlr = 0.0\n";
  CHECK(keel_test::error_of([&] { train(d, {}, bad); })
            .find("optimizer.groups[0].params = \"nothing.*\" matches no parameter") !=
        std::string::npos);
}

TEST_CASE("hooks can request a checkpoint, an evaluation and a stop") {
  TempDir d;
  const std::string log = (d.path / "events.log").string();
  auto hook = [&](int step, int bits) {
    return kFixtureHook + "path = \"" + log + "\"\nrequest_at_step = " + std::to_string(step) +
           "\nrequests = " + std::to_string(bits) + "\n";
  };
  const std::string extra = kFixtures + "[checkpoint]\ntype = \"safetensors\"\nat_end = false\n" +
                            hook(3, KEEL_REQUEST_CHECKPOINT) + hook(5, KEEL_REQUEST_EVAL) +
                            hook(6, KEEL_REQUEST_STOP) + "[[hooks]]\ntype = \"jsonl\"\n";
  const keel::RunSummary s = train(d, {"train.eval_each_epoch=false"}, extra);
  CHECK(s.steps == 6);
  CHECK(fs::exists(d.path / "run/checkpoints/step-3"));
  const auto evals = records(d, "test");
  REQUIRE(evals.size() == 2);  // requested at 5, and the final one at 6
  CHECK(field(evals[0], "step") == 5);
}

TEST_CASE("a failing run sends EXCEPTION to the hooks") {
  TempDir d;
  const std::string log = (d.path / "events.log").string();
  keel_test::error_of([&] {
    train(d, {"optimizer.lr=1e30"}, kFixtures + kFixtureHook + "path = \"" + log + "\"\n");
  });
  const std::string events = keel_test::read(log);
  CHECK(events.substr(events.rfind('\n', events.size() - 2) + 1) == "EXCEPTION\n");
}

namespace {
at::Tensor weights_of(const TempDir& d, const std::string& checkpoint, const std::string& name) {
  // Read through the safetensors plugin itself: load into a tensor shaped like the model's.
  static keel::Registry registry;
  if (registry.plugins().empty()) registry.discover(keel::plugin_search_path({}));
  const keel::Component* c = registry.find(KEEL_KIND_CHECKPOINT, "safetensors");
  REQUIRE(c != nullptr);
  keel_options none;
  keel_create_context ctx{};
  ctx.host = keel::host();
  ctx.options = &none;
  ctx.section = "checkpoint";
  const auto backend = keel::create_instance<keel_checkpoint>(*c, ctx);
  // the mlp of small_run and synthetic_run: 784 -> 32 -> 10
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"fc1.weight", {32, 784}}, {"fc1.bias", {32}}, {"fc2.weight", {10, 32}}, {"fc2.bias", {10}}};
  at::Tensor t = at::zeros(shapes.at(name), at::kFloat);
  const keel_named_tensor into{name.c_str(), keel::peek(t)};
  const std::string dir = (d.path / "run/checkpoints" / checkpoint).string();
  backend.call("load", backend->load, dir.c_str(), "model", &into, size_t{1});
  return t;
}
}  // namespace

// ~Run releases the run's parts in teardown_order() (kernel/run/teardown.cpp), and that order
// releases every part before the parts it needs. The check catches a reordering: moving a part
// after one that it needs (swapping the two) is refused, for every such pair.
TEST_CASE("the run's teardown releases every part before the parts it needs") {
  const std::vector<keel::TeardownPart>& order = keel::teardown_order();
  CHECK(keel::check_teardown_order(order) == "");
  int pairs = 0;
  for (size_t i = 0; i < order.size(); ++i)
    for (size_t j = i + 1; j < order.size(); ++j) {
      const std::vector<const char*>& needs = order[i].needs;
      if (std::none_of(needs.begin(), needs.end(),
                       [&](const char* n) { return std::string(n) == order[j].name; }))
        continue;
      std::vector<keel::TeardownPart> swapped = order;
      std::swap(swapped[i], swapped[j]);
      INFO(order[i].name << " swapped with " << order[j].name);
      CHECK(keel::check_teardown_order(swapped).find("which it needs") != std::string::npos);
      ++pairs;
    }
  CHECK(pairs >= 20);
  // A part that needs a part the run does not have is refused too.
  std::vector<keel::TeardownPart> unknown = order;
  unknown.front().needs.push_back("no such part");
  CHECK(keel::check_teardown_order(unknown) ==
        "step modes needs no such part, which is not a part");
}

}  // namespace unit_loop
