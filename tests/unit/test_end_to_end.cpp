// A short training on a Fashion-MNIST subset: the loss falls, the run directory matches the
// contract in docs/run-directory.md, checkpoints commit atomically and load back, and a seed
// repeats.

#include <regex>

#include "manifest.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "run/trainer.hpp"

namespace unit_end_to_end {  // keel_units is one unity build: each file's names stay its own

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

keel::RunSummary train(const fs::path& manifest, std::vector<std::string> sets = {}) {
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(manifest.string(), sets), registry);
  keel::apply_process_settings(rc);
  keel::Trainer trainer(rc);
  return trainer.train();
}

std::vector<std::string> records(const fs::path& jsonl, const std::string& split) {
  std::vector<std::string> out;
  std::stringstream s(keel_test::read(jsonl));
  for (std::string l; std::getline(s, l);)
    if (l.find("\"split\": \"" + split + "\"") != std::string::npos) out.push_back(l);
  return out;
}

double field(const std::string& record, const std::string& key) {
  std::smatch m;
  const std::regex re("\"" + key + "\": ([-0-9.eE+]+)");
  REQUIRE_MESSAGE(std::regex_search(record, m, re), key << " missing in " << record);
  return std::stod(m[1]);
}

std::string strip_timing(const std::string& record) {
  static const std::regex timing(
      "\"(samples_per_s|tokens_per_s|step_time_ms|data_time_ms|eval_time_s|checkpoint_time_s)\": [-0-9.eE+]+");
  return std::regex_replace(record, timing, "");
}

const char* kCheckpoint = "[checkpoint]\ntype = \"safetensors\"\nevery_steps = 8\nkeep_last = 2\n";

// Runs in `dir` as the working directory until it goes out of scope.
struct WorkingDirectory {
  fs::path previous = fs::current_path();
  explicit WorkingDirectory(const fs::path& dir) { fs::current_path(dir); }
  ~WorkingDirectory() { fs::current_path(previous); }
};

std::vector<std::string> all_records(const fs::path& jsonl) {
  std::vector<std::string> out;
  std::stringstream s(keel_test::read(jsonl));
  for (std::string l; std::getline(s, l);) out.push_back(strip_timing(l));
  return out;
}

}  // namespace

TEST_CASE("loss falls and the run directory matches the contract") {
  TempDir d;
  const fs::path run = d.path / "run";
  const auto p = d.write("m.toml", keel_test::small_run(run) + kCheckpoint);
  const keel::RunSummary s = train(p, {"train.epochs=4"});
  CHECK(s.steps == 32);
  CHECK(s.samples == 32 * 32);

  // manifest.resolved.toml: parses, and holds the defaults too.
  const toml::table resolved = toml::parse_file((run / "manifest.resolved.toml").string());
  CHECK(resolved["model"]["type"].value<std::string>() == "mlp");
  CHECK(resolved["optimizer"]["nesterov"].value<bool>() == false);

  // metrics.jsonl: train records every log_every steps with the contract's keys.
  const auto train_records = records(run / "metrics.jsonl", "train");
  REQUIRE(train_records.size() == 8);
  for (const char* key : {"step", "epoch", "loss", "lr", "samples_per_s"})
    for (const auto& r : train_records) field(r, key);
  CHECK(field(train_records.front(), "step") == 4);
  CHECK(field(train_records.back(), "step") == 32);
  CHECK(field(train_records.back(), "loss") < 0.7 * field(train_records.front(), "loss"));

  const auto eval_records = records(run / "metrics.jsonl", "test");
  REQUIRE(eval_records.size() == 4);
  for (const auto& r : eval_records) {
    field(r, "step");
    field(r, "loss");
    const double acc = field(r, "accuracy");
    CHECK(acc >= 0.0);
    CHECK(acc <= 1.0);
  }
  CHECK(field(eval_records.back(), "accuracy") > 0.5);  // chance is 0.1
  CHECK(field(eval_records.back(), "loss") == doctest::Approx(s.eval_loss));

  // checkpoints: every 8 steps, keep_last = 2, nothing left staged.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run / "checkpoints"))
    names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"step-24", "step-32"});
  CHECK(fs::file_size(run / "checkpoints/step-32/model.safetensors") > 0);
  CHECK(keel_test::read(run / "checkpoints/step-32/trainer_state.toml").find("step = 32") !=
        std::string::npos);
}

TEST_CASE("the same seed gives the same metrics; another seed does not") {
  TempDir d;
  const auto a = d.write("a.toml", keel_test::small_run(d.path / "a"));
  const auto b = d.write("b.toml", keel_test::small_run(d.path / "b"));
  const auto c = d.write("c.toml", keel_test::small_run(d.path / "c"));
  train(a);
  train(b);
  train(c, {"run.seed=8"});
  const auto ra = records(d.path / "a/metrics.jsonl", "train");
  const auto rb = records(d.path / "b/metrics.jsonl", "train");
  const auto rc = records(d.path / "c/metrics.jsonl", "train");
  REQUIRE(ra.size() == rb.size());
  for (size_t i = 0; i < ra.size(); ++i) CHECK(strip_timing(ra[i]) == strip_timing(rb[i]));
  CHECK(field(ra.back(), "loss") != field(rc.back(), "loss"));
}

TEST_CASE("init_from loads a committed checkpoint: evaluation matches the saved model") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") + kCheckpoint);
  const keel::RunSummary trained = train(p);
  // A run with lr 0 that starts from the last checkpoint must evaluate to the same loss.
  const auto q = d.write("q.toml", keel_test::small_run(d.path / "again") +
                                       "[checkpoint]\ntype = \"safetensors\"\nat_end = false\n"
                                       "init_from = \"" + (d.path / "run/checkpoints/step-16").string() + "\"\n");
  const keel::RunSummary again = train(q, {"optimizer.lr=0", "train.epochs=1"});
  CHECK(again.eval_loss == doctest::Approx(trained.eval_loss).epsilon(1e-6));
  CHECK(again.eval_accuracy == trained.eval_accuracy);
}

TEST_CASE("init_from without a commit record: the torch backend loads it only when told to") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[checkpoint]\ntype = \"torch\"\n");
  const keel::RunSummary trained = train(p);
  // The final model.pt alone in a directory of its own: files from elsewhere, no commit.json.
  const fs::path loose = d.path / "loose";
  fs::create_directory(loose);
  fs::copy_file(d.path / "run/checkpoints/step-16/model.pt", loose / "model.pt");
  const std::string init = "[checkpoint]\ntype = \"torch\"\nat_end = false\ninit_from = \"" +
                           loose.string() + "\"\n";
  const auto q = d.write("q.toml", keel_test::small_run(d.path / "again") + init);
  const std::vector<std::string> sets = {"optimizer.lr=0", "train.epochs=1"};
  CHECK(keel_test::error_of([&] { train(q, sets); }) ==
        "checkpoint.init_from: '" + loose.string() + "' has no commit record (commit.json: not "
        "committed by keel), and only the safetensors backend loads such a directory unasked, "
        "not checkpoint 'torch' (plugin keel-torch-checkpoint); hint: if you trust its files, "
        "set [checkpoint] init_from_unverified = true (or --set "
        "checkpoint.init_from_unverified=true)");
  CHECK_FALSE(fs::exists(d.path / "again"));
  std::vector<std::string> unverified = sets;
  unverified.push_back("checkpoint.init_from_unverified=true");
  const keel::RunSummary again = train(q, unverified);
  CHECK(again.eval_loss == doctest::Approx(trained.eval_loss).epsilon(1e-6));
  CHECK(again.eval_accuracy == trained.eval_accuracy);
}

TEST_CASE("manifest.resolved.toml reruns the run from another working directory") {
  // Every path of the manifest is relative: the data directory and the plugin directory
  // (symlinks next to the manifest), init_from, the C hook's log file (a KEEL_OPT_PATH, like
  // the data path) and output_dir (relative to the working directory).
  TempDir d;
  const fs::path w1 = d.path / "w1", w2 = d.path / "w2";
  fs::create_directories(w1);
  fs::create_directories(w2);
  fs::create_directory_symlink("/usr/share/datasets/fashion-mnist", w1 / "data");
  fs::create_directory_symlink(KEEL_FIXTURE_DIR, w1 / "fixtures");
  train(d.write("base.toml", keel_test::small_run(d.path / "base") + kCheckpoint),
        {"train.epochs=1"});
  REQUIRE(fs::exists(d.path / "base/checkpoints/step-8"));
  d.write("w1/m.toml",
          "[plugins]\npaths = [\"fixtures\"]\n"
          "[run]\nname = \"rel\"\noutput_dir = \"out\"\nseed = 7\n"
          "[train]\nepochs = 2\nlog_every = 3\n"
          "[model]\ntype = \"mlp\"\nhidden = [32]\n"
          "[data.train]\ntype = \"fashion_mnist\"\npath = \"data\"\nsplit = \"train\"\n"
          "batch_size = 32\nlimit = 256\n"
          "[data.test]\ntype = \"fashion_mnist\"\npath = \"data\"\nsplit = \"test\"\n"
          "batch_size = 100\nlimit = 200\nshuffle = false\n"
          "[optimizer]\ntype = \"adamw\"\nlr = 1e-3\n"
          "[loss]\ntype = \"cross_entropy\"\n"
          "[checkpoint]\ntype = \"safetensors\"\ninit_from = \"../base/checkpoints/step-8\"\n"
          "[[hooks]]\ntype = \"jsonl\"\n"
          "[[hooks]]\ntype = \"c_event_log\"\npath = \"events.log\"\n");
  {
    WorkingDirectory in(w1);
    train("m.toml");
  }
  const fs::path first = w1 / "out", resolved_path = first / "manifest.resolved.toml";
  REQUIRE(fs::exists(resolved_path));

  // Every path in the resolved manifest is absolute and names what the relative one named.
  const toml::table resolved = toml::parse_file(resolved_path.string());
  const auto path_of = [&](const toml::node_view<const toml::node>& v) {
    const std::string p = v.value<std::string>().value_or("");
    INFO("'" << p << "'");
    CHECK(fs::path(p).is_absolute());
    return fs::path(p);
  };
  CHECK(path_of(resolved["run"]["output_dir"]) == first);
  CHECK(fs::equivalent(path_of(resolved["plugins"]["paths"][0]), KEEL_FIXTURE_DIR));
  CHECK(fs::equivalent(path_of(resolved["data"]["train"]["path"]), w1 / "data"));
  CHECK(fs::equivalent(path_of(resolved["data"]["test"]["path"]), w1 / "data"));
  CHECK(fs::equivalent(path_of(resolved["checkpoint"]["init_from"]),
                       d.path / "base/checkpoints/step-8"));
  CHECK(path_of(resolved["hooks"][1]["path"]) == w1 / "events.log");

  // Rerun it as is from another working directory, into a new run directory.
  {
    WorkingDirectory in(w2);
    train(resolved_path, {"run.output_dir=rerun"});
  }
  const fs::path second = w2 / "rerun";
  REQUIRE(fs::exists(second / "metrics.jsonl"));
  const auto a = all_records(first / "metrics.jsonl"), b = all_records(second / "metrics.jsonl");
  CHECK(a.size() == 8);  // 16 steps: train records at 3, 6, ..., 15 and 16; 2 evaluations
  CHECK(a == b);
  // The hook wrote to the same absolute file both times, after loading the checkpoint.
  CHECK(!fs::exists(w2 / "events.log"));
  const std::string events = keel_test::read(w1 / "events.log");
  size_t loaded = 0;
  for (size_t at = events.find("CHECKPOINT_LOADED"); at != std::string::npos;
       at = events.find("CHECKPOINT_LOADED", at + 1))
    ++loaded;
  CHECK(loaded == 2);

  // The rerun resolved to the same manifest but for its run directory.
  toml::table again = toml::parse_file((second / "manifest.resolved.toml").string());
  CHECK(again["run"]["output_dir"].value<std::string>() == second.string());
  again["run"].as_table()->insert_or_assign("output_dir", first.string());
  CHECK(again == resolved);
}

}  // namespace unit_end_to_end
