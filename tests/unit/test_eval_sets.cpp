// Several evaluation sets ([data.test] and [data.eval.NAME], kernel/run_config.cpp) and [train]
// eval_at_start (kernel/run/evaluate.cpp): the manifest's rules, the order of the sets' records
// in metrics.jsonl, a set's record against a run where it is the only set, an early stop and a
// keep_best on a named set, and a resumed run's records against an uninterrupted run's.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "config/toml_text.hpp"
#include "manifest.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"

namespace unit_eval_sets {  // keel_units is one unity build: each file's names stay its own

using keel_test::TempDir;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Two more sets, listed out of name order: "zeta", the first 300 training images, and "alpha",
// the first 100 test images. The run evaluates test, alpha, zeta.
const char* kTwoMoreSets =
    "[data.eval.zeta]\ntype = \"fashion_mnist\"\nsplit = \"train\"\nbatch_size = 100\n"
    "limit = 300\nshuffle = false\n"
    "[data.eval.alpha]\ntype = \"fashion_mnist\"\nsplit = \"test\"\nbatch_size = 50\n"
    "limit = 100\nshuffle = false\n";

// The config of `manifest` with `sets`; its components live in `registry`.
// small_run's manifest in `d` with the two more sets and `more`.
fs::path three_sets(const TempDir& d, const std::string& more) {
  return d.write("m.toml", keel_test::small_run(d.path / "run") + kTwoMoreSets + more);
}

keel::RunConfig resolved(const fs::path& manifest, const std::vector<std::string>& sets,
                         keel::Registry& registry) {
  return keel::resolve(keel::load_manifest(manifest.string(), sets), registry);
}

using keel_test::train;

// metrics.jsonl's records of `run_dir`, in file order.
std::vector<json> records(const fs::path& run_dir) {
  return keel_test::jsonl(run_dir / "metrics.jsonl");
}

// The evaluation records' "split step" in file order.
std::vector<std::string> evaluations(const std::vector<json>& rs) {
  std::vector<std::string> out;
  for (const json& r : rs)
    if (r["split"] != "train")
      out.push_back(r["split"].get<std::string>() + " " + std::to_string(r["step"].get<int64_t>()));
  return out;
}

// The records of `split`, without the keys that measure time (samples_per_s, step_time_ms,
// eval_time_s, ...: names ending in "_s" or "_ms").
std::vector<json> of_split(const std::vector<json>& rs, const std::string& split) {
  auto ends = [](const std::string& s, const std::string& end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
  };
  std::vector<json> out;
  for (const json& r : rs) {
    if (r["split"] != split) continue;
    json kept = json::object();
    for (const auto& [key, value] : r.items())
      if (!ends(key, "_s") && !ends(key, "_ms")) kept[key] = value;
    out.push_back(kept);
  }
  return out;
}

std::string resolve_error(const TempDir& d, const std::string& text,
                          const std::vector<std::string>& sets = {}) {
  const fs::path p = d.write("m.toml", text);
  keel::Registry registry;
  return keel_test::error_of([&] { resolved(p, sets, registry); });
}

}  // namespace

TEST_CASE("evaluation sets: names, order and the resolved manifest") {
  TempDir d;
  const std::string base = keel_test::small_run(d.path / "run");
  const fs::path p = d.write("m.toml", base + kTwoMoreSets);
  keel::Registry registry;
  const keel::RunConfig rc = resolved(p, {}, registry);
  REQUIRE(rc.eval_sets.size() == 3);
  CHECK(rc.eval_sets[0].name == "test");
  CHECK(rc.eval_sets[0].data.section == "data.test");
  CHECK(rc.eval_sets[1].name == "alpha");
  CHECK(rc.eval_sets[2].name == "zeta");
  CHECK(rc.eval_sets[2].data.section == "data.eval.zeta");
  CHECK(rc.resolved["data"]["eval"]["zeta"]["limit"].value<int64_t>() == 300);
  // manifest.resolved.toml resolves again to the same sets.
  const fs::path again = d.write("resolved.toml", keel::resolved_text(rc));
  keel::Registry registry2;
  const keel::RunConfig rc2 = resolved(again, {}, registry2);
  REQUIRE(rc2.eval_sets.size() == 3);
  CHECK(rc2.eval_sets[2].name == "zeta");
  CHECK(keel::toml_text(*rc2.resolved["data"].as_table()) == keel::toml_text(*rc.resolved["data"].as_table()));

  const std::string set = "type = \"fashion_mnist\"\nsplit = \"test\"\n";
  const std::string line = std::to_string(std::count(base.begin(), base.end(), '\n') + 1);
  CHECK(resolve_error(d, base + "[data.eval.test]\n" + set)
            .find("m.toml:" + line + ":12: [data.eval.test]: the set named test is [data.test]; "
                  "hint: rename the table [data.test]") != std::string::npos);
  CHECK(resolve_error(d, base + "[data.eval.train]\n" + set)
            .find("[data.eval.train]: train is the training records' split; hint:") !=
        std::string::npos);
  CHECK(resolve_error(d, base + "[data.eval.\"../x\"]\n" + set)
            .find("[data.eval.../x]: an evaluation set's name is a letter, then letters, digits, "
                  "'_' or '-', at most 64 bytes; hint: e.g. [data.eval.valid]") !=
        std::string::npos);
  CHECK(resolve_error(d, base + "[data.eval]\n")
            .find("[data.eval] holds no evaluation set; hint:") != std::string::npos);
  CHECK(resolve_error(d, base + "[data.evl]\n" + set)
            .find("unknown table [data.evl]; hint: did you mean 'eval'?") != std::string::npos);
  // keep_best ranks by a split the run records.
  const std::string keep = "[checkpoint]\ntype = \"safetensors\"\nkeep_best = 1\nbest_metric = ";
  CHECK(resolve_error(d, base + kTwoMoreSets + keep + "\"zeta.loss\"\n") == "<no error>");
  const std::string err = resolve_error(d, base + kTwoMoreSets + keep + "\"valid.loss\"\n");
  CHECK(err.find(":43:15: checkpoint.best_metric = \"valid.loss\" names split \"valid\", which "
                 "this run does not record; hint: the splits are train, test, alpha, zeta") !=
        std::string::npos);
  // Only [data.eval.NAME] sets: `keel evaluate` evaluates them.
  const std::string no_test =
      base.substr(0, base.find("[data.test]")) + base.substr(base.find("[optimizer]"));
  CHECK(resolve_error(d, no_test + kTwoMoreSets, {"run.mode=evaluate"}) == "<no error>");
  CHECK(resolve_error(d, no_test, {"run.mode=evaluate"})
            .find("run.mode = \"evaluate\" needs an evaluation set ([data.test] or "
                  "[data.eval.NAME])") != std::string::npos);
}

// Each evaluation evaluates test, alpha and zeta in turn; eval_at_start adds one at step 0.
// zeta's records equal those of a run whose [data.test] is zeta's dataset (the same model at
// every step: the other sets change nothing in training), compared as JSON values, so exactly.
TEST_CASE("each set's records, in the sets' order, equal to a run where it is the only set") {
  TempDir d;
  const std::string base = keel_test::small_run(d.path / "run");
  const fs::path three = d.write("three.toml", base + kTwoMoreSets);
  const std::vector<json> a = records(train(three, {"train.eval_at_start=true"}).run_dir);
  CHECK(evaluations(a) == std::vector<std::string>{"test 0", "alpha 0", "zeta 0", "test 8",
                                                   "alpha 8", "zeta 8", "test 16", "alpha 16",
                                                   "zeta 16"});
  const fs::path one = d.write("one.toml", keel_test::small_run(d.path / "run1"));
  const std::vector<json> b = records(
      train(one, {"train.eval_at_start=true", "data.test.split=train", "data.test.limit=300"})
          .run_dir);
  std::vector<json> zeta = of_split(a, "zeta"), alone = of_split(b, "test");
  REQUIRE(zeta.size() == 3);
  REQUIRE(alone.size() == 3);
  for (size_t i = 0; i < zeta.size(); ++i) {
    zeta[i].erase("split");
    alone[i].erase("split");
    INFO("evaluation " << i << ": zeta " << zeta[i].dump() << ", alone " << alone[i].dump());
    CHECK(zeta[i] == alone[i]);
    CHECK(zeta[i].contains("accuracy"));
  }
  CHECK(of_split(a, "train") == of_split(b, "train"));
  // Without eval_at_start no evaluation at step 0.
  const std::vector<json> c = records(train(three, {"run.output_dir=" + (d.path / "run2").string()})
                                          .run_dir);
  CHECK(evaluations(c).front() == "test 8");
}

// lr 0: the model never changes, so only the watched set's first evaluation improves on the
// best; early_stopping watching "zeta" stops after 1 + patience + 1 of zeta's evaluations.
TEST_CASE("early_stopping watches a named set") {
  TempDir d;
  const fs::path p = three_sets(d, "[[hooks]]\ntype = \"early_stopping\"\nsplit = \"zeta\"\n"
                                  "patience = 1\n[[hooks]]\ntype = \"jsonl\"\n");
  const keel::RunSummary s = train(p, {"train.epochs=30", "optimizer.lr=0"});
  CHECK(s.steps == 3 * 8);  // 256 samples / batch 32 = 8 steps an epoch
  CHECK(of_split(records(s.run_dir), "zeta").size() == 3);
}

// keep_best = 1 by zeta's loss with best_mode "max" (the worst, so that the kept checkpoint is
// not simply the newest): the run keeps the newest and the one whose zeta loss was highest.
TEST_CASE("keep_best ranks checkpoints by a named set's record") {
  TempDir d;
  const fs::path p = three_sets(d, "[checkpoint]\ntype = \"safetensors\"\nevery_epochs = 1\n"
                                  "keep_last = 1\nkeep_best = 1\nbest_metric = \"zeta.loss\"\n"
                                  "best_mode = \"max\"\n");
  const keel::RunSummary s = train(p, {"train.epochs=3"});
  REQUIRE(s.steps == 24);
  int64_t worst_step = -1;
  double worst = -1;
  for (const json& r : of_split(records(s.run_dir), "zeta"))
    if (r["loss"].get<double>() > worst) {
      worst = r["loss"].get<double>();
      worst_step = r["step"].get<int64_t>();
    }
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(fs::path(s.run_dir) / "checkpoints"))
    kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  REQUIRE(worst_step != 24);
  std::vector<std::string> expected = {"step-24", "step-" + std::to_string(worst_step)};
  std::sort(expected.begin(), expected.end());
  CHECK(kept == expected);
  const std::string meta = keel_test::read(fs::path(s.run_dir) / "checkpoints" / "step-24" /
                                           "trainer_state.toml");
  CHECK(meta.find("[metrics.zeta]") != std::string::npos);
  CHECK(meta.find("[metrics.alpha]") != std::string::npos);
}

// A run stopped after its first epoch and resumed records what an uninterrupted run records:
// every set's evaluations (the resumed process does not evaluate again at step 8, nor at start).
TEST_CASE("a resumed run's evaluation records equal an uninterrupted run's") {
  TempDir d;
  const std::string sets = std::string(kTwoMoreSets) +
                           "[checkpoint]\ntype = \"safetensors\"\nevery_epochs = 1\n";
  const fs::path whole = d.write("whole.toml", keel_test::small_run(d.path / "whole") + sets);
  const fs::path part = d.write("part.toml", keel_test::small_run(d.path / "part") + sets);
  const std::vector<json> a = records(train(whole, {"train.eval_at_start=true"}).run_dir);
  train(part, {"train.eval_at_start=true", "train.epochs=1"});
  const std::vector<json> b =
      records(train(part, {"train.eval_at_start=true"}, /*resume=*/true).run_dir);
  CHECK(evaluations(b) == evaluations(a));
  for (const char* split : {"test", "alpha", "zeta"}) {
    INFO(split);
    CHECK(of_split(b, split) == of_split(a, split));
  }
}

}  // namespace unit_eval_sets
