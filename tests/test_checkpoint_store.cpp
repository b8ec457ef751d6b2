// The checkpoint commit protocol: a backend that fails half-way leaves no checkpoint and no
// staging directory behind, committed checkpoints survive, and the error names the backend.
#include <algorithm>
#include <fstream>

#include "checkpoint_store.hpp"
#include "support.hpp"

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

// A backend written against the C ABI that writes a partial file, then fails on demand.
struct FlakyBackend {
  keel_checkpoint vt{};
  bool fail = false;
  static keel_status save(void* self, const char* dir, const char* stem, const keel_named_tensor*,
                          size_t, keel_error* err) {
    std::ofstream(fs::path(dir) / (std::string(stem) + ".partial")) << "half a file";
    if (!static_cast<FlakyBackend*>(self)->fail) return KEEL_OK;
    std::snprintf(err->message, KEEL_ERROR_CAPACITY, "disk full (simulated)");
    return KEEL_ERR;
  }
  static keel_status load(void*, const char*, const char*, const keel_named_tensor*, size_t,
                          keel_error*) {
    return KEEL_OK;
  }
  FlakyBackend() {
    vt.struct_size = sizeof(vt);
    vt.self = this;
    vt.destroy = [](void*) {};
    vt.save = save;
    vt.load = load;
  }
};

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("a failed save leaves committed checkpoints alone and nothing half-written") {
  TempDir d;
  FlakyBackend backend;
  keel::Instance<keel_checkpoint> instance(&backend.vt, "checkpoint 'flaky' (plugin test)");
  keel::CheckpointStore store(d.path.string(), &instance, /*keep_last=*/0);

  const std::string first = store.save({}, {}, {1, 0, 32, 32});
  CHECK(fs::exists(fs::path(first) / "model.partial"));
  CHECK(keel_test::read(fs::path(first) / "trainer_state.toml").find("step = 1") !=
        std::string::npos);

  backend.fail = true;
  const std::string err = keel_test::error_of([&] { store.save({}, {}, {2, 0, 64, 64}); });
  CHECK(err == "checkpoint 'flaky' (plugin test): save failed: disk full (simulated)");
  CHECK(entries(d.path) == std::vector<std::string>{"step-1"});  // no step-2, no .step-2.tmp
  CHECK(store.committed() == std::vector<std::string>{first});
  instance.reset();
}

TEST_CASE("keep_last prunes the oldest committed checkpoints only after a commit") {
  TempDir d;
  FlakyBackend backend;
  keel::Instance<keel_checkpoint> instance(&backend.vt, "checkpoint 'flaky' (plugin test)");
  keel::CheckpointStore store(d.path.string(), &instance, /*keep_last=*/2);
  for (int64_t step : {10, 20, 30}) store.save({}, {}, {step, 0, 0, 0});
  CHECK(entries(d.path) == std::vector<std::string>{"step-20", "step-30"});
  backend.fail = true;
  keel_test::error_of([&] { store.save({}, {}, {40, 0, 0, 0}); });
  CHECK(entries(d.path) == std::vector<std::string>{"step-20", "step-30"});
  instance.reset();
}
