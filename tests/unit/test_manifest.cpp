// Manifest parsing (extends, --set) and every validation error: each names file:line:col or
// the --set argument, the dotted key, and a hint.
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "config/keys.hpp"
#include "config/resume_changes.hpp"
#include "config/toml_text.hpp"
#include "host.hpp"
#include "keel/plugin.hpp"
#include "manifest.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"

namespace unit_manifest {  // keel_units is one unity build: each file's names stay its own

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
  CHECK(rc.run.name == "t");
  CHECK(rc.train.epochs == 2);
  CHECK(rc.train.log_every == 4);
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
  CHECK(rc.train.epochs == 3);
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
  CHECK(rc.run.name == "renamed");  // unquoted text is taken as a string

  CHECK(error_of([&] { resolve_file(p, {"optimizer.lr=-1"}); }) ==
        "--set optimizer.lr=-1: optimizer.lr: must be >= 0, got -1; hint: use a value >= 0 "
        "(learning rate)");
  CHECK(error_of([&] { resolve_file(p, {"optimizer.lr=fast"}); }) ==
        "--set optimizer.lr=fast: optimizer.lr: expected float >= 0, got \"fast\"; hint: e.g. "
        "lr = 0.01 (the default); `keel plugins show sgd` describes it");
  CHECK(error_of([&] { resolve_file(p, {"optimizer"}); }).find("expected KEY=VALUE") !=
        std::string::npos);
}

TEST_CASE("unknown key: file:line:col and the closest valid key") {
  TempDir d;
  const std::string err = resolve_error(
      d, keel_test::small_run(d.path / "run") + "[grad_clipper]\ntype = \"norm\"\nmax_nrom = 1.0\n");
  CHECK(err == (d.path / "m.toml").string() +
                   ":30:1: unknown key 'max_nrom' in [grad_clipper]; hint: did you mean "
                   "'max_norm'? `keel plugins show norm` lists every option");
}

TEST_CASE("unknown section and unknown [data.*] table") {
  TempDir d;
  CHECK(resolve_error(d, keel_test::small_run(d.path / "run") + "[optimiser]\nlr = 1\n")
            .find(":28:2: unknown section 'optimiser'; hint: did you mean 'optimizer'?") !=
        std::string::npos);
  CHECK(resolve_error(d, keel_test::small_run(d.path / "run") + "[data.tset]\ntype = \"x\"\n")
            .find("unknown table [data.tset]; hint: did you mean 'test'?") != std::string::npos);
}

TEST_CASE("wrong type names the dotted key and what was expected") {
  TempDir d;
  std::string text = keel_test::small_run(d.path / "run");
  text.replace(text.find("hidden = [32]"), 13, "hidden = 32");
  CHECK(resolve_error(d, text) == (d.path / "m.toml").string() +
                                      ":10:10: model.hidden: expected list of integers in "
                                      "[1, 1e+09], got 32; hint: e.g. hidden = [256, 128] (the "
                                      "default); `keel plugins show mlp` describes it");
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
                                    "hint: did you mean \"test\"?") != std::string::npos);
}

TEST_CASE("unknown component type lists what is available") {
  TempDir d;
  std::string text = keel_test::small_run(d.path / "run");
  text.replace(text.find("type = \"sgd\""), 12, "type = \"sdg\"");
  const std::string err = resolve_error(d, text);
  CHECK(err.find(":23:8: [optimizer].type: no optimizer named 'sdg' (available: ") !=
        std::string::npos);
  CHECK(err.find("; hint: did you mean 'sgd'? `keel plugins` lists") != std::string::npos);
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
            .find("--set train.epochs=0: train.epochs: no stop target is set") !=
        std::string::npos);
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

TEST_CASE("every --set error names the argument and the key, with a hint") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[[hooks]]\ntype = \"console\"\n[[hooks]]\ntype = \"jsonl\"\n");
  // {argument, what the message must also say}
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hooks[x].path=a", "'x' in 'hooks[x]' is not an index"},
      {"hooks[-1].path=a", "negative index"},
      {"hooks[2].path=a", "index 2 is out of range: hooks holds 2 entries: hooks[0] (type "
                          "console), hooks[1] (type jsonl)"},
      {"hooks[99999999999999999999999].path=a", "out of range"},
      {"hooks[].path=a", "empty index"},
      {"hooks[1.path=a", "'[' without a closing ']'"},
      {"hooks]=1", "']' without an opening '['"},
      {"hooks[0][1].x=1", "one index per name"},
      {"run[0].name=x", "'run' is a table, not an array"},
      {"optimizer.lr.x=1", "'optimizer.lr' is a value (0.1), not a table"},
      {"hooks.type=csv", "'hooks' is an array, not a table"},
      {"=3", "the key before '=' is empty"},
      {"optimizer", "expected KEY=VALUE"},
      {"optimizer.lr=", "the value after '=' is empty"},
      {"optimizer.lr=  ", "the value after '=' is empty"},
      {"a..b=1", "empty name between dots"},
      {".a=1", "empty name between dots"},
      {"a.=1", "the key ends with '.'"},
      {"a b=1", "' ' cannot appear in a key"},
      {"hooks[0]=x", "cannot replace the whole entry 'hooks[0]'"},
      {"optimizer=sgd", "'optimizer' is a table; a value cannot replace it"},
      {"hooks=1", "'hooks' is an array of tables"},
      {"model.hidden=[1,2", "is not valid TOML"},
      {"run.name=\"abc", "is not valid TOML"},
      {"model.hidden[3]=1", "model.hidden holds 1 entry: model.hidden[0] = 32"},
      {"model.hidden[0].x=1", "'model.hidden[0]' is a value (32), not a table"},
      {"optimizer.groups[0].params=x", "'optimizer.groups' is not in the manifest"},
      {"extends=base.toml", "`extends` cannot be set with --set"},
  };
  for (const auto& case_ : cases) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& arg = case_.first;
    const auto& what = case_.second;
    CAPTURE(arg);
    const std::string err = error_of([&] { keel::load_manifest(p.string(), {arg}); });
    CHECK(err.rfind("--set " + arg + ": ", 0) == 0);
    CHECK(err.find(what) != std::string::npos);
    CHECK(err.find("; hint: ") != std::string::npos);
    CHECK(err.find("<manifest>") == std::string::npos);
    CHECK(err.find("stol") == std::string::npos);
  }
  // The key is named when there is one.
  CHECK(error_of([&] { keel::load_manifest(p.string(), {"hooks[x].path=a"}); })
            .find("key 'hooks[x].path'") != std::string::npos);
}

TEST_CASE("--set: tables it creates and values it sets name the argument in later errors") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run"));
  // A new table: its errors (missing type, missing option) name the --set argument.
  CHECK(error_of([&] { resolve_file(p, {"mfu.type=peak_flops"}); })
            .rfind("--set mfu.type=peak_flops: [mfu] needs 'peak_tflops'", 0) == 0);
  CHECK(error_of([&] { resolve_file(p, {"mfu.peak_tflops=1.0"}); })
            .rfind("--set mfu.peak_tflops=1.0: [mfu] needs type", 0) == 0);
  CHECK(error_of([&] { resolve_file(p, {"optimiser.lr=1"}); })
            .rfind("--set optimiser.lr=1: unknown section 'optimiser'", 0) == 0);
}

TEST_CASE("--set: array elements, whole arrays and inline tables") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[[hooks]]\ntype = \"console\"\n[[hooks]]\ntype = \"jsonl\"\n");
  CHECK(std::get<std::vector<int64_t>>(
            resolve_file(p, {"model.hidden[0]=64"}).model.options.values.at("hidden")) ==
        std::vector<int64_t>{64});
  CHECK(std::get<std::vector<int64_t>>(
            resolve_file(p, {"model.hidden=[8, 4]"}).model.options.values.at("hidden")) ==
        std::vector<int64_t>{8, 4});
  CHECK(resolve_file(p, {"hooks=[]"}).hooks.empty());
  CHECK(resolve_file(p, {"hooks[1].type=csv"}).hooks[1].component->name == "csv");
  CHECK(resolve_file(p, {"lr_scheduler={type = \"constant\"}"}).lr_scheduler->component->name ==
        "constant");
  CHECK(resolve_file(p, {" optimizer.lr = 0.5 "}).optimizer.options.values.at("lr") ==
        KeelOptionValue(0.5));
  CHECK(resolve_file(p, {"run.name=a=b"}).run.name == "a=b");  // the first '=' splits
  CHECK(resolve_file(p, {"run.name=\"\""}).run.name.empty());
}

TEST_CASE("only regular files are read: directory, FIFO, device, missing") {
  TempDir d;
  std::filesystem::create_directories(d.path / "dir");
  REQUIRE(mkfifo((d.path / "fifo").c_str(), 0600) == 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {(d.path / "dir").string(), "is a directory, not a manifest file"},
      {(d.path / "fifo").string(), "is a FIFO (named pipe), not a manifest file"},
      {"/dev/null", "is a character device, not a manifest file"},
      {(d.path / "missing.toml").string(), "manifest not found"},
      {(d.path / "m.toml" / "x.toml").string(), "manifest not found"},
  };
  d.write("m.toml", "");
  for (const auto& case_ : cases) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& path = case_.first;
    const auto& what = case_.second;
    CAPTURE(path);
    // As the manifest: the message starts with the path.
    const std::string err = error_of([&] { keel::load_manifest(path, {}); });
    CHECK(err.rfind(path + ": " + what, 0) == 0);
    CHECK(err.find("; hint: ") != std::string::npos);
    // As an extends target: file:line:col of the `extends` key, then the path.
    const auto m = d.write("ext.toml", "# base\nextends = \"" + path + "\"\n");
    const std::string e2 = error_of([&] { keel::load_manifest(m.string(), {}); });
    CHECK(e2.rfind(m.string() + ":2:1: extends = \"" + path + "\": " + path, 0) == 0);
    CHECK(e2.find("; hint: ") != std::string::npos);
  }
  CHECK(error_of([&] { keel::load_manifest("", {}); }).find("the manifest path is empty") !=
        std::string::npos);
}

TEST_CASE("an unreadable manifest is named") {
  if (geteuid() == 0) {
    MESSAGE("skipped: running as root, which reads any file (tests/cli/test_bad_input.py checks "
            "this case as user nobody)");
    return;
  }
  TempDir d;
  const auto p = d.write("m.toml", "[run]\n");
  std::filesystem::permissions(p, std::filesystem::perms::none);
  CHECK(error_of([&] { keel::load_manifest(p.string(), {}); })
            .rfind(p.string() + ": cannot be read: Permission denied", 0) == 0);
}

TEST_CASE("extends errors name file:line:col") {
  TempDir d;
  const auto p1 = d.write("a.toml", "extends = 3\n");
  CHECK(error_of([&] { keel::load_manifest(p1.string(), {}); })
            .rfind(p1.string() + ":1:11: `extends` must be a string", 0) == 0);
  const auto p2 = d.write("b.toml", "extends = \"\"\n");
  CHECK(error_of([&] { keel::load_manifest(p2.string(), {}); })
            .rfind(p2.string() + ":1:11: `extends` is empty", 0) == 0);
  d.write("c.toml", "# c\nextends = \"e.toml\"\n");
  const auto p3 = d.write("e.toml", "extends = \"c.toml\"\n");
  const std::string err = error_of([&] { keel::load_manifest(p3.string(), {}); });
  CHECK(err.rfind((d.path / "c.toml").string() + ":2:1: extends = \"e.toml\" makes an `extends` "
                  "cycle (" + p3.string() + " -> " + (d.path / "c.toml").string() + " -> " +
                  (d.path / "e.toml").string() + ")", 0) == 0);
  const auto p4 = d.write("f.toml", "extends = \"f.toml\"\n");
  CHECK(error_of([&] { keel::load_manifest(p4.string(), {}); }).find("cycle") !=
        std::string::npos);
  // A syntax error in a base names the base's position.
  d.write("bad.toml", "[run]\nname = \n");
  const auto p5 = d.write("g.toml", "extends = \"bad.toml\"\n");
  CHECK(error_of([&] { keel::load_manifest(p5.string(), {}); })
            .rfind((d.path / "bad.toml").string() + ":2:", 0) == 0);
}

// The rows' defaults as validate_options fills them in, landed in a section struct and read
// back: the same TOML (each row's member fits its type; choices land in the right enum value).
template <class S>
void check_round_trip(const keel::KeyTable<S>& keys, const S& landed) {
  CAPTURE(keys.name);
  const keel_options defaults = keel::validate_options(toml::table{}, keys.name, "", keys.schema);
  S fresh;
  keys.land(defaults, fresh);
  CHECK(keys.resolved(fresh) == keel::to_toml(defaults));
  CHECK(keys.resolved(landed) == keel::to_toml(defaults));
  CHECK(keys.schema.size() == keys.keys.size());
}

TEST_CASE("kernel keys: the defaults of the rows are what resolve fills in") {
  TempDir d;
  // A manifest that sets none of [run]'s, [train]'s, [distributed]'s or [checkpoint]'s keys.
  const auto bare = d.write(
      "bare.toml", "[model]\ntype = \"mlp\"\nhidden = [8]\n"
                   "[data.train]\ntype = \"fashion_mnist\"\nsplit = \"train\"\nlimit = 64\n"
                   "[optimizer]\ntype = \"sgd\"\nlr = 0.1\n[loss]\ntype = \"cross_entropy\"\n");
  keel::RunConfig rc = resolve_file(bare);
  rc.run.output_dir = "";  // made absolute (runs/<name>) after landing
  check_round_trip(keel::run_keys(), rc.run);
  check_round_trip(keel::train_keys(), rc.train);
  check_round_trip(keel::distributed_keys(), rc.distributed);
  check_round_trip(keel::checkpoint_keys(), rc.checkpointing);  // without [checkpoint] too
  CHECK(rc.checkpointing.best_metric == "test.loss");
  CHECK(rc.checkpointing.at_end);
  CHECK(rc.run.mode == keel::RunMode::kTrainAndEvaluate);
  CHECK(rc.train.precision == keel::Precision::kFp32);
  // Choices land by their position in the row's list.
  const keel::RunConfig set = resolve_file(
      bare, {"data.test.type=fashion_mnist", "run.mode=evaluate", "train.precision=bf16",
             "train.nonfinite=skip", "train.accum_normalization=items",
             "checkpoint.type=safetensors", "checkpoint.best_mode=max"});
  CHECK(set.run.mode == keel::RunMode::kEvaluate);
  CHECK(set.train.precision == keel::Precision::kBf16);
  CHECK(set.train.nonfinite == keel::NonFinite::kSkip);
  CHECK(set.train.accum_normalization == keel::AccumNorm::kItems);
  CHECK(set.checkpointing.best_mode == keel::BestMode::kMax);
  CHECK(set.resolved["checkpoint"]["best_mode"].value<std::string>() == "max");
  CHECK(set.resolved["run"]["mode"].value<std::string>() == "evaluate");
  // `keel options` shows the rows.
  for (const keel::KernelTable& t : keel::kernel_tables()) CHECK(!t.schema->empty());
}

TEST_CASE("resume: which changed keys keep the continuation exact") {
  const std::vector<std::pair<const char*, bool>> cases = {
      // key, safe to change on --resume
      {"run.name", true}, {"run.output_dir", true}, {"run.threads", true},
      {"run.malloc_tuning", true}, {"run.mode", true}, {"run.seed", false},
      {"run.device", false}, {"run.no_such_key", false},
      {"distributed.timeout_s", true}, {"distributed.bucket_cap_mb", true},
      {"distributed.backend", false},
      {"train.log_every", true}, {"train.epochs", true}, {"train.max_steps", true},
      {"train.max_samples", true}, {"train.max_tokens", true}, {"train.eval_each_epoch", true},
      {"train.eval_every_steps", true}, {"train.eval_max_batches", true},
      {"train.grad_accum", false}, {"train.accum_normalization", false},
      {"train.precision", false}, {"train.nonfinite", false}, {"train.max_skips", false},
      {"checkpoint.type", true}, {"checkpoint.keep_last", true}, {"checkpoint.init_from", true},
      {"checkpoint.every_epochs", true},
      {"checkpoint.init_rename.a.", true}, {"checkpoint.dtype", true},
      {"hooks", true}, {"hooks[1].type", true}, {"hooks[0].label", true}, {"hooks[2].path", true},
      {"profiler.type", true}, {"mfu.peak_tflops", true}, {"data.test.limit", true},
      {"data.eval.valid.limit", true}, {"data.eval.valid", true}, {"train.eval_at_start", true},
      {"data.evaluation.x", false},
      {"plugins.paths", true}, {"plugins.require.acme", true},
      {"model.hidden", false}, {"model.type", false}, {"optimizer.lr", false},
      {"optimizer.groups[0].lr", false}, {"optimizer.groups[0].params", false},
      {"data.train.batch_size", false}, {"loss.type", false}, {"lr_scheduler.warmup_steps", false},
      {"grad_clipper.max_norm", false}, {"extends", false}, {"trainer.x", false},
  };
  for (const auto& case_ : cases) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& key = case_.first;
    const auto& safe = case_.second;
    CAPTURE(key);
    CHECK((keel::on_resume(key) == keel::OnResume::kSafe) == safe);
  }
  const keel::ResumeChanges changes = keel::resume_changes(
      "[run]\nname = \"a\"\nseed = 1\n[train]\nepochs = 1\n[[hooks]]\ntype = \"console\"\n",
      "[run]\nname = \"b\"\nseed = 2\n[train]\nepochs = 1\ngrad_accum = 2\n[[hooks]]\n"
      "type = \"jsonl\"\n");
  REQUIRE(changes.safe.size() == 2);
  CHECK(changes.safe[0].key == "hooks[0].type");
  CHECK(changes.safe[1].key == "run.name");
  REQUIRE(changes.breaking.size() == 2);
  CHECK(changes.breaking[0].key == "run.seed");
  CHECK(changes.breaking[0].before == "1");
  CHECK(changes.breaking[0].after == "2");
  CHECK(changes.breaking[1].key == "train.grad_accum");
  CHECK(changes.breaking[1].before == "(absent)");
  // A key the checkpoint's manifest lacks (a keel before the key existed) and that now has its
  // row's default changed nothing; at another value it is a change like any other.
  const keel::ResumeChanges added = keel::resume_changes(
      "[train]\nepochs = 1\n",
      "[train]\nepochs = 1\nglobal_batch = 0\naccum_normalization = \"auto\"\n"
      "[checkpoint]\nkeep_last = 0\n");
  CHECK(added.safe.empty());
  CHECK(added.breaking.empty());
  const keel::ResumeChanges other = keel::resume_changes(
      "[train]\nepochs = 1\n", "[train]\nepochs = 1\nglobal_batch = 64\n");
  REQUIRE(other.breaking.size() == 1);
  CHECK(other.breaking[0].key == "train.global_batch");
  // A key keel no longer writes (grad_accum beside global_batch, which derives it) that the
  // checkpoint's manifest has at its default changed nothing either.
  const keel::ResumeChanges dropped = keel::resume_changes(
      "[train]\nglobal_batch = 64\ngrad_accum = 1\n", "[train]\nglobal_batch = 64\n");
  CHECK(dropped.safe.empty());
  CHECK(dropped.breaking.empty());
  // Floats compare as numbers (a checkpoint written with 17 digits) and are named in their
  // shortest form, which --set reads back as the same number.
  CHECK(keel::resume_changes("[optimizer]\nlr = 0.00029999999999999997\n",
                             "[optimizer]\nlr = 3e-4\n").breaking.empty());
  const keel::ResumeChanges lr = keel::resume_changes("[optimizer]\nlr = 0.00029999999999999997\n",
                                                      "[optimizer]\nlr = 1e-3\n");
  REQUIRE(lr.breaking.size() == 1);
  CHECK(lr.breaking[0].before == "0.0003");
  CHECK(lr.breaking[0].after == "0.001");
}

TEST_CASE("manifest.resolved.toml: a float is written in the shortest form that reads back") {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<double, const char*>> cases = {
      {3e-4, "0.0003"}, {0.1, "0.1"}, {1.0, "1.0"}, {100.0, "100.0"}, {-2.5, "-2.5"},
      {0.1 + 0.2, "0.30000000000000004"}, {1e-5, "1e-05"}, {1e16, "1e+16"},
      {123456.789, "123456.789"}, {-0.0, "-0.0"}, {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"}, {inf, "inf"}, {-inf, "-inf"},
      {std::nan(""), "nan"},
  };
  for (const auto& c : cases) {  // no structured binding: clang 14 cannot capture one (CAPTURE)
    const double value = c.first;
    const char* const text = c.second;
    CAPTURE(text);
    CHECK(keel::float_text(value) == text);
    // It reads back as the same double, in a document too.
    const toml::table back = toml::parse(keel::toml_text(toml::table{{"v", value}}));
    const double read = back["v"].value<double>().value();
    CHECK((std::isnan(value) ? std::isnan(read) : std::memcmp(&read, &value, sizeof read) == 0));
  }
  // Tables, arrays of tables, quoted keys, arrays and strings read back as they were.
  const toml::table t = toml::parse(
      "[a]\nx = [1.5, 3e-4]\ns = \"it's \\\"q\\\"\"\n[a.\"b.c\"]\ny = 1\n"
      "[[h]]\ntype = \"console\"\n[[h]]\ntype = \"jsonl\"\n[[o.groups]]\nlr = 0.1\n");
  const std::string text = keel::toml_text(t);
  CHECK(toml::parse(text) == t);
  CHECK(text.find("x = [ 1.5, 0.0003 ]") != std::string::npos);
}

// manifest.resolved.toml reruns the run it was written for: every shipped config (and one with
// [train] global_batch, whose derived grad_accum must not come back as a key of its own) resolves,
// saves checkpoints (what its docs export and evaluate), and the text keel writes for it resolves
// again to the same resolved manifest and the same text. Floats are written in their shortest
// form (--set optimizer.lr=3e-4 is "lr = 0.0003", not 17 digits).
TEST_CASE("shipped configs: each saves checkpoints and its manifest.resolved.toml reruns it") {
  TempDir d;
  struct Case {
    std::filesystem::path manifest;
    std::vector<std::string> sets;
  };
  std::vector<Case> cases;
  std::vector<std::filesystem::path> configs;
  for (const auto& e : std::filesystem::directory_iterator(KEEL_SOURCE_ROOT "/configs"))
    if (e.path().extension() == ".toml") configs.push_back(e.path());
  std::sort(configs.begin(), configs.end());
  REQUIRE(configs.size() >= 5);  // quickstart, fashion_mnist_cnn, char_gpt, ctr, ctr_small
  for (const auto& c : configs) cases.push_back({c, {}});
  const std::string quickstart = KEEL_SOURCE_ROOT "/configs/quickstart.toml";
  cases.push_back({quickstart, {"optimizer.lr=3e-4", "train.global_batch=128"}});
  for (const Case& c : cases) {
    const std::string manifest = c.manifest.string();
    CAPTURE(manifest);
    // A registry of its own for each manifest and for its resolved text: the suite's shared
    // one would discover the plugins again (resolved [plugins] paths) and warn of copies.
    keel::Registry registry, registry_again;
    const keel::RunConfig rc =
        keel::resolve(keel::load_manifest(c.manifest.string(), c.sets), registry);
    if (c.sets.empty()) {
      CHECK(rc.checkpoint.has_value());
      CHECK((rc.checkpointing.at_end || rc.checkpointing.every_steps > 0 ||
             rc.checkpointing.every_epochs > 0));
    }
    const std::string text = keel::resolved_text(rc);
    const auto resolved = d.write("resolved.toml", text);
    std::string again;
    REQUIRE(error_of([&] {
              again = keel::resolved_text(
                  keel::resolve(keel::load_manifest(resolved.string(), {}), registry_again));
            }) == "<no error>");
    // The same text after the first line (which names the manifest it was resolved from).
    CHECK(again.substr(again.find('\n')) == text.substr(text.find('\n')));
    if (!c.sets.empty()) {
      CHECK(text.find("\nlr = 0.0003\n") != std::string::npos);
      CHECK(text.find("global_batch = 128") != std::string::npos);
      CHECK(text.find("grad_accum") == std::string::npos);
    }
  }
}

// Log lines at info and above while `f` runs.
template <class F>
std::vector<std::string> logged(F&& f) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto logger = spdlog::default_logger();
  const spdlog::level::level_enum level = logger->level();
  logger->set_level(spdlog::level::info);
  logger->sinks().push_back(sink);
  struct Restore {
    std::shared_ptr<spdlog::logger> logger;
    spdlog::level::level_enum level;
    ~Restore() {
      logger->sinks().pop_back();
      logger->set_level(level);
    }
  } restore{logger, level};
  f();
  return sink->last_formatted();
}

TEST_CASE("no [[hooks]]: keel's own console and jsonl, also when another plugin has a console") {
  TempDir d;
  std::filesystem::create_directories(d.path / "plugins");
  std::filesystem::copy_file(KEEL_CONSOLE_ELSEWHERE, d.path / "plugins" / "console_elsewhere.so");
  const std::string base =
      keel_test::small_run(d.path / "run") + "[plugins]\npaths = [\"plugins\"]\n";
  struct Case {
    const char* hooks;       // the manifest's [[hooks]] ("": none)
    const char* error;       // the start of the error after "<file>:", or "" for none
    const char* plugin;      // the plugin of hooks[0]
    const char* type;        // its `type` in manifest.resolved.toml
  };
  const std::vector<Case> cases = {
      {"", "", "keel-sinks", "keel-sinks:console"},
      {"[[hooks]]\ntype = \"test-console-elsewhere:console\"\n", "", "test-console-elsewhere",
       "test-console-elsewhere:console"},
      {"[[hooks]]\ntype = \"keel-sinks:console\"\n", "", "keel-sinks", "keel-sinks:console"},
      {"[[hooks]]\ntype = \"console\"\n",
       ":2:8: [hooks[0]].type: 2 plugins provide hook 'console': test-console-elsewhere (", "",
       ""},
  };
  for (const Case& c : cases) {
    const std::string hooks = c.hooks;
    CAPTURE(hooks);
    keel::Registry registry;  // its own: the fixture stays out of the other cases' registry
    const auto p = d.write("m.toml", std::string(c.hooks) + base);
    std::vector<std::string> log;
    const std::string err = error_of([&] {
      log = logged([&] {
        const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
        REQUIRE(!rc.hooks.empty());
        CHECK(rc.hooks[0].component->plugin->name == c.plugin);
        CHECK(rc.hooks[0].label == "console");
        CHECK(rc.resolved["hooks"][0]["type"].value<std::string>() == c.type);
        if (!*c.hooks) {
          REQUIRE(rc.hooks.size() == 2);
          CHECK(rc.hooks[1].component->name == "jsonl");
          CHECK(rc.hooks[1].section == "hooks[1]");
        }
      });
    });
    if (*c.error) {
      CHECK(err.rfind(p.string() + c.error, 0) == 0);
      CHECK(err.find("type = \"keel-sinks:console\"") != std::string::npos);
      continue;
    }
    CHECK(err == "<no error>");
    // A default the user never wrote names the other provider in a note.
    bool noted = false;
    for (const std::string& line : log)
      noted |= line.find("has no [[hooks]]: the default hook 'console' comes from plugin "
                         "keel-sinks; plugin test-console-elsewhere (") != std::string::npos;
    CHECK(noted == !*c.hooks);
  }
}

TEST_CASE("[[hooks]] without keel's metric sinks: one warning, naming the base's hooks replaced") {
  TempDir d;
  const std::string run = keel_test::small_run(d.path / "run");
  const std::string sinks = "[[hooks]]\ntype = \"console\"\n[[hooks]]\ntype = \"jsonl\"\n";
  const auto base = d.write("base.toml", run + sinks);
  const std::string early = "[[hooks]]\ntype = \"early_stopping\"\n";
  struct Case {
    std::string text;     // m.toml
    std::string warning;  // what the one warning holds after "m.toml:", "" for none
  };
  const std::vector<Case> cases = {
      // One [[hooks]] table in a manifest that extends another replaces the base's array.
      {"extends = \"base.toml\"\n" + early,
       ":2:1: [[hooks]] (early_stopping) replaces the base's (console, jsonl; " +
           base.string() + ":"},
      {run + early, ":28:1: [[hooks]] (early_stopping) holds none of keel's metric sinks"},
      {"extends = \"base.toml\"\n" + early + "[[hooks]]\ntype = \"csv\"\n", ""},
      {"extends = \"base.toml\"\n" + early + sinks, ""},
      {"extends = \"base.toml\"\n[optimizer]\nlr = 0.5\n", ""},  // the base's hooks
      {"hooks = []\n" + run, ""},  // asks for no hooks at all
      {run, ""},                   // keel's console and jsonl
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    const auto p = d.write("m.toml", c.text);
    keel::Registry registry;  // its own: no other case's plugins in the log
    std::vector<std::string> warnings;
    for (const std::string& line : logged(
             [&] { keel::resolve(keel::load_manifest(p.string(), {}), registry); }))
      if (line.find("metric sinks") != std::string::npos) warnings.push_back(line);
    if (c.warning.empty()) {
      CHECK(warnings.empty());
      continue;
    }
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find(p.string() + c.warning) != std::string::npos);
    CHECK(warnings[0].find("hint: add [[hooks]] type = \"console\" and [[hooks]] type = "
                           "\"jsonl\"") != std::string::npos);
  }
}

// A plugin's option, declared once (keel::opt_* returns a keel::Option<T>), goes into the
// schema as it is and reads back through Context::get as the type it declares.
namespace typed {
constexpr auto kFlag = keel::opt_bool("flag", "false", "a bool");
constexpr auto kCount = keel::opt_int("count", "3", "an int", 0, 100);
constexpr auto kRate = keel::opt_float("rate", "0.5", "a float", 0, 1);
constexpr auto kMode = keel::opt_string("mode", "\"a\"", "a choice", "a|b");
constexpr auto kDir = keel::opt_path("dir", "\"\"", "a path");
constexpr auto kSizes = keel::opt_int_list("sizes", "[1, 2]", "ints");
constexpr auto kBetas = keel::opt_float_list("betas", "[0.9]", "floats");
constexpr auto kUndeclared = keel::opt_int("undeclared", "0", "not in the schema");
const keel::Context* kContext = nullptr;
static_assert(std::is_same_v<decltype(kContext->get(kFlag)), bool>);
static_assert(std::is_same_v<decltype(kContext->get(kCount)), int64_t>);
static_assert(std::is_same_v<decltype(kContext->get(kRate)), double>);
static_assert(std::is_same_v<decltype(kContext->get(kMode)), std::string>);
static_assert(std::is_same_v<decltype(kContext->get(kDir)), std::string>);
static_assert(std::is_same_v<decltype(kContext->get(kSizes)), std::vector<int64_t>>);
static_assert(std::is_same_v<decltype(kContext->get(kBetas)), std::vector<double>>);
}  // namespace typed

TEST_CASE("a plugin's typed options: declared once, listed in the schema, read as their type") {
  using namespace typed;
  const keel::Schema schema = {kFlag, kCount, kRate, kMode, kDir, kSizes, kBetas};
  CHECK(schema[1].type == KEEL_OPT_INT);
  CHECK(std::string(schema[3].choices) == "a|b");
  CHECK(keel::check_schema(schema) == "");
  const keel_options values = keel::validate_options(
      toml::parse("flag = true\ncount = 7\nrate = 1\nmode = \"b\"\ndir = \"/x\"\n"
                  "sizes = [4, 5, 6]\n"),
      "model", "keel plugins show typed", schema);
  keel_create_context raw{};
  raw.struct_size = sizeof raw;
  raw.host = keel::host();
  raw.options = &values;
  const keel::Context ctx(&raw);
  CHECK(ctx.get(kFlag) == true);
  CHECK(ctx.get(kCount) == 7);
  CHECK(ctx.get(kRate) == 1.0);  // an integer for a float option
  CHECK(ctx.get(kMode) == "b");
  CHECK(ctx.get(kDir) == "/x");
  CHECK(ctx.get(kSizes) == std::vector<int64_t>{4, 5, 6});
  CHECK(ctx.get(kBetas) == std::vector<double>{0.9});  // the default
  std::string message = "<no error>";
  try {
    ctx.get(kUndeclared);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  CHECK(message == "option 'undeclared' is not declared as int in this component's schema");
}

}  // namespace unit_manifest
