// Hooks: a hook written in plain C (tests/fixtures/c_hook.c) is loaded by the kernel, sees
// every event, and sees them in the order documented in abi.h.
#include "manifest.hpp"
#include "registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "trainer.hpp"

using keel_test::TempDir;

namespace {

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string l; std::getline(s, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("the C hook sees every event in the documented order") {
  TempDir d;
  const auto log = d.path / "events.log";
  const auto p = d.write(
      "m.toml", keel_test::small_run(d.path / "run") +
                    "[checkpoint]\ntype = \"safetensors\"\nevery_steps = 8\n"
                    "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n"
                    "[[hooks]]\ntype = \"c_event_log\"\npath = \"" + log.string() + "\"\n");
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  REQUIRE(rc.hooks.size() == 1);
  CHECK(rc.hooks[0].component->plugin->descriptor->fingerprint.torch_version == nullptr);
  {
    keel::Trainer trainer(rc);
    trainer.train();
  }

  // 256 samples / batch 32 = 8 steps an epoch, a train record every 4 steps, 2 epochs.
  std::vector<std::string> expected = {"TRAIN_START"};
  for (int epoch = 0; epoch < 2; ++epoch) {
    expected.push_back("EPOCH_START");
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < 4; ++i)
        for (const char* e :
             {"STEP_START", "AFTER_DATA", "AFTER_BACKWARD", "BEFORE_OPTIMIZER_STEP", "STEP_END"})
          expected.push_back(e);
      expected.push_back("METRICS train");
    }
    expected.push_back("CHECKPOINT_SAVED");
    expected.push_back("EPOCH_END");
    expected.push_back("EVAL_START");
    expected.push_back("EVAL_END");
    expected.push_back("METRICS test");
  }
  expected.push_back("TRAIN_END");
  CHECK(lines(keel_test::read(log)) == expected);
}

TEST_CASE("a failing hook ends the run with an error naming the hook") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n"
                                       "[[hooks]]\ntype = \"c_event_log\"\npath = \"" +
                                       (d.path / "no/such/dir/x.log").string() + "\"\n");
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  const std::string err = keel_test::error_of([&] { keel::Trainer trainer(rc); });
  CHECK(err.rfind("[hooks[0]] hook 'c_event_log' (plugin ", 0) == 0);
  CHECK(err.find("no/such/dir/x.log") != std::string::npos);
}

TEST_CASE("hooks run in ascending priority, ties in manifest order") {
  TempDir d;
  const auto log = (d.path / "events.log").string();
  auto hook = [&](const char* tag, int priority) {
    return "[[hooks]]\ntype = \"c_event_log\"\npath = \"" + log + "\"\ntag = \"" + tag +
           "\"\npriority = " + std::to_string(priority) + "\n";
  };
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n" +
                                       hook("a", 5) + hook("b", -1) + hook("c", 5));
  keel::Registry registry;
  const keel::RunConfig rc =
      keel::resolve(keel::load_manifest(p.string(), {"train.epochs=1"}), registry);
  {
    keel::Trainer trainer(rc);
    trainer.train();
  }
  const auto got = lines(keel_test::read(log));
  REQUIRE(got.size() % 3 == 0);
  for (size_t i = 0; i < got.size(); i += 3) {
    CHECK(got[i].rfind("b ", 0) == 0);
    CHECK(got[i + 1].rfind("a ", 0) == 0);
    CHECK(got[i + 2].rfind("c ", 0) == 0);
    CHECK(got[i].substr(2) == got[i + 1].substr(2));
  }
}
