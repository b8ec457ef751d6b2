// Hooks that see the run's data (extension keel.hook.observe/1, kernel/run/observers.cpp), with
// the fixture hook `observer` (tests/fixtures/observer_hook.cpp, C++ SDK): the micro-batches lent
// to it add up to the record's samples; its accuracy from the lent evaluation logits equals the
// loss plugin's `accuracy` exactly and its loss-weighted mean of the lent per-batch losses equals
// the record's `loss` within 1e-12 relative; its metrics land in the records after the kernel's;
// a key the record has, and a lent tensor kept past the call, stop the run with one error naming
// the hook.
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "support.hpp"

namespace unit_observe {

using keel_test::TempDir;
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keeps the record's key order

namespace {

fs::path manifest(const TempDir& d, const std::string& hook_options) {
  return d.write("m.toml", keel_test::small_run(d.path / "run") +
                               "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n"
                               "[[hooks]]\ntype = \"observer\"\n" + hook_options +
                               "[[hooks]]\ntype = \"jsonl\"\n");
}

using keel_test::train;

std::vector<json> records(const fs::path& run_dir) {
  return keel_test::jsonl<json>(run_dir / "metrics.jsonl");
}

}  // namespace

TEST_CASE("a hook sees batches and evaluation outputs and adds its metrics to the records") {
  TempDir d;
  train(manifest(d, ""));
  int train_records = 0, eval_records = 0;
  for (const json& r : records(d.path / "run")) {
    CAPTURE(r.dump());
    std::vector<std::string> keys;
    for (const auto& [k, v] : r.items()) keys.push_back(k);
    if (r["split"] == "train") {
      ++train_records;
      // One micro-batch per step: as many as steps, as many samples as the record's.
      CHECK(r["observed_batches"].get<double>() == r["step"].get<double>());
      CHECK(r["observed_samples"].get<double>() == r["samples"].get<double>());
      REQUIRE(keys.size() >= 2);
      CHECK(keys[keys.size() - 2] == "observed_batches");  // after the kernel's keys
      CHECK(keys.back() == "observed_samples");
    } else {
      ++eval_records;
      CHECK(r["hook_accuracy"].get<double>() == r["accuracy"].get<double>());
      const double loss = r["loss"].get<double>();
      CHECK(std::abs(r["hook_loss"].get<double>() - loss) <= 1e-12 * std::abs(loss));
      CHECK(keys.back() == "hook_loss");
    }
  }
  CHECK(train_records == 4);  // steps 4, 8, 12, 16 (log_every 4)
  CHECK(eval_records == 2);   // after each of the 2 epochs
}

TEST_CASE("a hook that keeps a lent tensor, or puts a key the record has, is stopped") {
  struct Case {
    const char* options;
    const char* error;
  };
  const Case cases[] = {
      {"keep = \"batch\"\n",
       "hook 'observer' (plugin test-observer): on_batch kept a reference to the lent tensor "
       "'inputs' (or its storage) after returning; hint: lent tensors are valid only during the "
       "call: copy what the hook needs (.clone())"},
      {"keep = \"eval\"\n",
       "hook 'observer' (plugin test-observer): on_eval_batch kept a reference to the lent "
       "tensor 'logits'"},
      {"metric_key = \"loss\"\n",
       "hook 'observer' (plugin test-observer): put_metrics failed: metric 'loss': the train "
       "record has its own 'loss'"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.options);
    TempDir d;
    const fs::path m = manifest(d, c.options);
    CHECK_MESSAGE(keel_test::error_of([&] { train(m); }).find(c.error) != std::string::npos,
                  keel_test::error_of([&] { train(m); }));
  }
}

}  // namespace unit_observe
