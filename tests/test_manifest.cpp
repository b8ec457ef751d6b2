// Manifest parsing (extends, --set) and every validation error: each names file:line:col or
// the --set argument, the dotted key, and a hint.
#include "manifest.hpp"
#include "registry.hpp"
#include "run_config.hpp"
#include "support.hpp"

using keel_test::error_of;
using keel_test::TempDir;

namespace {

// RunConfig points into the registry's components: the registry must outlive it.
keel::Registry& registry() {
  static keel::Registry r;
  return r;
}

keel::RunConfig resolve_file(const std::filesystem::path& p, std::vector<std::string> sets = {}) {
  return keel::resolve(keel::load_manifest(p.string(), sets), registry());
}

std::string resolve_error(const TempDir& d, const std::string& text,
                          std::vector<std::string> sets = {}) {
  const auto p = d.write("m.toml", text);
  return error_of([&] { resolve_file(p, sets); });
}

}  // namespace

TEST_CASE("a valid manifest resolves with defaults filled in") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run"));
  const keel::RunConfig rc = resolve_file(p);
  CHECK(rc.name == "t");
  CHECK(rc.epochs == 2);
  CHECK(rc.log_every == 4);
  CHECK(rc.model.component->name == "mlp");
  CHECK(std::get<std::vector<int64_t>>(rc.model.options.values.at("hidden")) ==
        std::vector<int64_t>{32});
  // A default the manifest left out.
  CHECK(std::get<double>(rc.optimizer.options.values.at("weight_decay")) == 0.0);
  // No [[hooks]]: console and jsonl by default.
  REQUIRE(rc.hooks.size() == 2);
  CHECK(rc.hooks[1].component->name == "jsonl");
  // The resolved table carries the defaults too.
  CHECK(rc.resolved["optimizer"]["momentum"].value<double>() == 0.9);
  CHECK(rc.resolved["optimizer"]["nesterov"].value<bool>() == false);
}

TEST_CASE("extends merges a base manifest, the including file wins") {
  TempDir d;
  d.write("base/base.toml", keel_test::small_run(d.path / "run") + "[lr_scheduler]\ntype = \"constant\"\n");
  const auto p = d.write("m.toml",
                         "extends = \"base/base.toml\"\n[optimizer]\nlr = 0.5\n[train]\nepochs = 3\n");
  const keel::RunConfig rc = resolve_file(p);
  CHECK(std::get<double>(rc.optimizer.options.values.at("lr")) == 0.5);
  CHECK(std::get<double>(rc.optimizer.options.values.at("momentum")) == 0.9);  // from the base
  CHECK(rc.epochs == 3);
  CHECK(rc.lr_scheduler->component->name == "constant");
}

TEST_CASE("an extends cycle is an error") {
  TempDir d;
  d.write("a.toml", "extends = \"b.toml\"\n");
  const auto b = d.write("b.toml", "extends = \"a.toml\"\n");
  CHECK(error_of([&] { keel::load_manifest(b.string(), {}); }).find("`extends` cycle") !=
        std::string::npos);
}

TEST_CASE("--set overrides any key with the same checks") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run"));
  const keel::RunConfig rc =
      resolve_file(p, {"optimizer.lr=3e-4", "data.train.batch_size=16", "run.name=renamed"});
  CHECK(std::get<double>(rc.optimizer.options.values.at("lr")) == doctest::Approx(3e-4));
  CHECK(std::get<int64_t>(rc.train_data.options.values.at("batch_size")) == 16);
  CHECK(rc.name == "renamed");  // unquoted text is taken as a string

  CHECK(error_of([&] { resolve_file(p, {"optimizer.lr=-1"}); }) ==
        "--set optimizer.lr=-1: optimizer.lr: must be >= 0, got -1");
  CHECK(error_of([&] { resolve_file(p, {"optimizer.lr=fast"}); }) ==
        "--set optimizer.lr=fast: optimizer.lr: expected float >= 0, got \"fast\"");
  CHECK(error_of([&] { resolve_file(p, {"optimizer"}); }).find("expected KEY=VALUE") !=
        std::string::npos);
}

TEST_CASE("unknown key: file:line:col and the closest valid key") {
  TempDir d;
  const std::string err = resolve_error(
      d, keel_test::small_run(d.path / "run") + "[grad_clipper]\ntype = \"norm\"\nmax_nrom = 1.0\n");
  CHECK(err == (d.path / "m.toml").string() +
                   ":30:1: unknown key 'max_nrom' in [grad_clipper]; did you mean "
                   "'max_norm'? (hint: `keel plugins show norm` lists every option)");
}

TEST_CASE("unknown section and unknown [data.*] table") {
  TempDir d;
  CHECK(resolve_error(d, keel_test::small_run(d.path / "run") + "[optimiser]\nlr = 1\n")
            .find(":28:2: unknown section 'optimiser'; did you mean 'optimizer'?") !=
        std::string::npos);
  CHECK(resolve_error(d, keel_test::small_run(d.path / "run") + "[data.tset]\ntype = \"x\"\n")
            .find("unknown table [data.tset]; did you mean 'test'?") != std::string::npos);
}

TEST_CASE("wrong type names the dotted key and what was expected") {
  TempDir d;
  std::string text = keel_test::small_run(d.path / "run");
  text.replace(text.find("hidden = [32]"), 13, "hidden = 32");
  CHECK(resolve_error(d, text) == (d.path / "m.toml").string() +
                                      ":10:10: model.hidden: expected list of integers in "
                                      "[1, 1e+09], got 32");
  text = keel_test::small_run(d.path / "run");
  text.replace(text.find("epochs = 2"), 10, "epochs = \"two\"");
  CHECK(resolve_error(d, text).find(":6:10: train.epochs: expected integer in [0, 1e+09], "
                                    "got \"two\"") != std::string::npos);
}

TEST_CASE("out-of-range value and a string outside its choices") {
  TempDir d;
  std::string text = keel_test::small_run(d.path / "run");
  text.replace(text.find("momentum = 0.9"), 14, "momentum = -0.5");
  CHECK(resolve_error(d, text).find("optimizer.momentum: must be >= 0, got -0.5") !=
        std::string::npos);
  text = keel_test::small_run(d.path / "run");
  text.replace(text.find("split = \"test\""), 14, "split = \"tset\"");
  CHECK(resolve_error(d, text).find("data.test.split: expected one of train|test, got \"tset\"; "
                                    "did you mean \"test\"?") != std::string::npos);
}

TEST_CASE("unknown component type lists what is available") {
  TempDir d;
  std::string text = keel_test::small_run(d.path / "run");
  text.replace(text.find("type = \"sgd\""), 12, "type = \"sdg\"");
  const std::string err = resolve_error(d, text);
  CHECK(err.find(":23:8: [optimizer].type: no optimizer named 'sdg'; did you mean 'sgd'?") !=
        std::string::npos);
  CHECK(err.find("available: ") != std::string::npos);
}

TEST_CASE("missing required table, required option, and a run that would never end") {
  TempDir d;
  std::string text = keel_test::small_run(d.path / "run");
  text.replace(text.find("[loss]"), std::string::npos, "");
  CHECK(resolve_error(d, text).find("the manifest has no [loss] table") != std::string::npos);
  CHECK(resolve_error(d, keel_test::small_run(d.path / "run") + "[mfu]\ntype = \"peak_flops\"\n")
            .find("[mfu] needs 'peak_tflops'") != std::string::npos);
  CHECK(resolve_error(d, keel_test::small_run(d.path / "run"), {"train.epochs=0"})
            .find("sets no stop target") != std::string::npos);
}

TEST_CASE("invalid TOML reports the parser's position") {
  TempDir d;
  const auto p = d.write("m.toml", "[run]\nname = \n");
  CHECK(error_of([&] { keel::load_manifest(p.string(), {}); })
            .rfind(p.string() + ":2:", 0) == 0);
  CHECK(error_of([&] { keel::load_manifest((d.path / "nope.toml").string(), {}); })
            .find("manifest not found") != std::string::npos);
}

TEST_CASE("extends: a table whose type changes is replaced, not merged") {
  TempDir d;
  d.write("base.toml", keel_test::small_run(d.path / "run"));
  // The base's mlp options (hidden = [32]) would be invalid for the cnn.
  const auto p = d.write("m.toml", "extends = \"base.toml\"\n[model]\ntype = \"cnn\"\n");
  const keel::RunConfig rc = resolve_file(p);
  CHECK(rc.model.component->name == "cnn");
  CHECK(std::get<int64_t>(rc.model.options.values.at("hidden")) == 1024);
}

TEST_CASE("hooks = [] means no hooks; a non-table hook entry is an error") {
  TempDir d;  // a top-level key must come before the first table in TOML
  CHECK(resolve_file(d.write("a.toml", "hooks = []\n" + keel_test::small_run(d.path / "run")))
            .hooks.empty());
  const std::string err =
      resolve_error(d, "hooks = [1]\n" + keel_test::small_run(d.path / "run"));
  CHECK(err.find(":1:9: hooks must be an array of tables") != std::string::npos);
}
