// The checkpoint commit protocol (kernel/checkpoint/): a backend that fails half-way leaves no
// checkpoint and no staging directory behind; the commit record's sizes and checksums catch
// damaged files; retention only ever touches this run's checkpoints and never the newest;
// re-saving a step replaces it atomically; stale staging directories are removed unless their
// save is alive; asynchronous saves report their errors; trainer_state.toml round-trips; which
// directories a run directory may be in (kernel/files/owned_dir.hpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checksum.hpp"
#include "checkpoint/commit.hpp"
#include "checkpoint/meta.hpp"
#include "checkpoint/reshard.hpp"
#include "checkpoint/store.hpp"
#include "keel/tensor.hpp"
#include "run/checkpoint_backend.hpp"
#include "run/resume.hpp"
#include "files/owned_dir.hpp"
#include "support.hpp"

namespace unit_checkpoint_store {  // keel_units is one unity build: each file's names stay its own

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

// A backend written against the C ABI: writes "<stem>.bin" with the first tensor's first float
// (so that two saves can be told apart), padded with spaces to the bytes its tensors hold (the
// store refuses a record whose tensors claim more bytes than their object's files hold), a
// partial file and an error when told to fail.
struct FlakyBackend {
  keel_checkpoint vt{};
  bool fail = false;
  static keel_status save(void* self, const char* dir, const char* stem,
                          const keel_named_tensor* t, size_t n, keel_error* err) {
    std::ofstream out(fs::path(dir) / (std::string(stem) + ".bin"));
    std::ostringstream value;
    value << (n ? keel::borrow(t[0].tensor).flatten()[0].item<float>() : 0.0f);
    const std::string first = value.str();
    size_t bytes = 0;
    for (size_t i = 0; i < n; ++i) bytes += keel::borrow(t[i].tensor).nbytes();
    out << first << std::string(bytes > first.size() ? bytes - first.size() : 0, ' ');
    if (!static_cast<FlakyBackend*>(self)->fail) return KEEL_OK;
    std::snprintf(err->message, KEEL_ERROR_CAPACITY, "disk full (simulated)");
    return KEEL_ERR;
  }
  static keel_status load(void*, const char* dir, const char* stem, const keel_named_tensor* t,
                          size_t n, keel_error*) {
    std::ifstream in(fs::path(dir) / (std::string(stem) + ".bin"));
    float v = 0;
    in >> v;
    if (n) keel::borrow(t[0].tensor).fill_(v);
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

// The value FlakyBackend wrote into `file` (without its padding).
std::string value_in(const fs::path& file) {
  std::string s = keel_test::read(file);
  return s.substr(0, s.find(' '));
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

keel::Snapshot snap(int64_t step, float value = 1.0f, double test_loss = NAN) {
  keel::Snapshot s;
  s.objects.push_back({"model", {{"w", at::full({2}, value)}}});
  s.meta.step = step;
  s.manifest = "[run]\nseed = 1\n";
  if (!std::isnan(test_loss)) s.metrics["test.loss"] = test_loss;
  return s;
}

struct Fixture {
  TempDir d;
  FlakyBackend backend;
  keel::Instance<keel_checkpoint> instance{&backend.vt, "checkpoint 'flaky' (plugin test)"};
  keel::PluginCheckpointBackend plugin_backend{instance};  // the store's view of it
  ~Fixture() { instance.reset(); }
  keel::CheckpointStore store(const std::string& run, keel::CheckpointKeys keep = {}) {
    return keel::CheckpointStore(d.path.string(), &plugin_backend, keep, run);
  }
};

// [checkpoint] keep_last / keep_best (best_metric "test.loss") / best_mode.
keel::CheckpointKeys retention(int64_t keep_last, int64_t keep_best = 0,
                               keel::BestMode mode = keel::BestMode::kMin) {
  keel::CheckpointKeys k;
  k.keep_last = keep_last;
  k.keep_best = keep_best;
  k.best_metric = "test.loss";
  k.best_mode = mode;
  return k;
}

void flip_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  f.seekg(0);
  f.get(c);
  f.seekp(0);
  f.put(static_cast<char>(c ^ 0x01));
}

}  // namespace

TEST_CASE("a committed checkpoint holds a commit record that lists and verifies every file") {
  Fixture f;
  auto store = f.store("run-a");
  const std::string dir = store.save(snap(1));
  CHECK(fs::path(dir).filename() == "step-1");
  CHECK(entries(dir) == std::vector<std::string>{"commit.json", "commit.json.xxh3",
                                                 "manifest.resolved.toml", "model.bin",
                                                 "trainer_state.toml"});
  const keel::CommitRecord r = keel::verify_checkpoint(dir);
  CHECK(r.run_id == "run-a");
  CHECK(r.step == 1);
  CHECK(r.files.size() == 3);
  REQUIRE(r.tensors.count("model") == 1);
  CHECK(r.tensors.at("model")[0].name == "w");
  CHECK(r.tensors.at("model")[0].dtype == "F32");
  CHECK(r.tensors.at("model")[0].shape == std::vector<int64_t>{2});
  // Only the commit record and the checkpoint: no staging directory, lock file or trash.
  CHECK(entries(f.d.path) == std::vector<std::string>{"step-1"});
}

TEST_CASE("verification names the damaged file: a flipped byte, a truncation, a stray file") {
  Fixture f;
  auto store = f.store("run-a");
  const fs::path dir = store.save(snap(1));
  flip_byte(dir / "model.bin");
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir); })
            .rfind((dir / "model.bin").string() + ": checksum mismatch", 0) == 0);
  flip_byte(dir / "model.bin");  // back
  keel::verify_checkpoint(dir);
  fs::resize_file(dir / "trainer_state.toml", 3);
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir); })
            .rfind((dir / "trainer_state.toml").string() + ": size 3 bytes", 0) == 0);
  const fs::path dir2 = store.save(snap(2));
  std::ofstream(dir2 / "extra.txt") << "x";
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir2); })
            .find("extra.txt: not listed in the commit record") != std::string::npos);
  fs::remove(dir2 / "commit.json");
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir2); })
            .rfind((dir2 / "commit.json").string() + ": missing", 0) == 0);
  // Listing ignores a directory without a commit record.
  const auto listed = keel::CheckpointStore::list(f.d.path.string());
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].dir == dir.string());
}

// --resume reads trainer_state.toml and manifest.resolved.toml after rank 0 verified the
// checkpoint (another rank reads them unverified): a read that fails still says what to do.
TEST_CASE("a resumed checkpoint's file that cannot be read: the error line has a hint") {
  Fixture f;
  auto store = f.store("run-a");
  const fs::path dir = store.save(snap(1));
  CHECK(keel::read_resume_file(dir.string(), "trainer_state.toml") ==
        keel_test::read(dir / "trainer_state.toml"));
  fs::remove(dir / "trainer_state.toml");
  fs::remove(dir / "manifest.resolved.toml");
  fs::create_directory(dir / "manifest.resolved.toml");  // opens, but read() fails (EISDIR)
  for (const auto& case_ : std::vector<std::pair<std::string, std::string>>{
           {"trainer_state.toml", "opening " + (dir / "trainer_state.toml").string() +
                                      " failed: No such file or directory"},
           {"manifest.resolved.toml", "reading " + (dir / "manifest.resolved.toml").string() +
                                          " failed: Is a directory"}}) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& name = case_.first;
    const auto& what = case_.second;
    CAPTURE(name);
    CHECK(keel_test::error_of([&] { keel::read_resume_file(dir.string(), name); }) ==
          what + "; hint: the checkpoint is incomplete or damaged, resume from another one "
                 "(--resume PATH)");
  }
}

TEST_CASE("a failed save leaves committed checkpoints alone and nothing half-written") {
  Fixture f;
  auto store = f.store("run-a");
  const std::string first = store.save(snap(1));
  f.backend.fail = true;
  const std::string err = keel_test::error_of([&] { store.save(snap(2)); });
  CHECK(err == "checkpoint 'flaky' (plugin test): save failed: disk full (simulated)");
  CHECK(entries(f.d.path) == std::vector<std::string>{"step-1"});  // no step-2, staging, lock
  keel::verify_checkpoint(first);
}

TEST_CASE("keep_last prunes only this run's checkpoints, by step, after the commit") {
  Fixture f;
  auto other = f.store("run-b");
  other.save(snap(10));
  other.save(snap(20));
  auto mine = f.store("run-a", retention(/*keep_last=*/2));
  for (int64_t step : {10, 20, 30}) mine.save(snap(step));
  // run-b's step-10 and step-20 hold those names; run-a's are suffixed with its run id, and
  // its oldest was pruned; run-b's are untouched.
  CHECK(entries(f.d.path) ==
        std::vector<std::string>{"step-10", "step-20", "step-20-run-a", "step-30"});
  CHECK(keel::read_commit_file((f.d.path / "step-10").string()).run_id == "run-b");
  f.backend.fail = true;
  keel_test::error_of([&] { mine.save(snap(40)); });
  CHECK(entries(f.d.path) ==
        std::vector<std::string>{"step-10", "step-20", "step-20-run-a", "step-30"});
  // keep_last = 1 with a resumed run saving an older step: the new one stays, though a later
  // step exists (the newest commit is never deleted).
  f.backend.fail = false;
  auto resumed = f.store("run-a", retention(/*keep_last=*/1));
  resumed.save(snap(25));
  CHECK(entries(f.d.path) == std::vector<std::string>{"step-10", "step-20", "step-25", "step-30"});
}

TEST_CASE("keep_best keeps the best checkpoints by metric, and always the newest") {
  Fixture f;
  keel::CheckpointKeys keep = retention(/*keep_last=*/1, /*keep_best=*/1);
  auto store = f.store("run-a", keep);
  store.save(snap(1, 1, 0.9));
  store.save(snap(2, 1, 0.3));
  store.save(snap(3, 1, 0.5));
  store.save(snap(4, 1, 0.7));
  CHECK(entries(f.d.path) == std::vector<std::string>{"step-2", "step-4"});
  keep.best_mode = keel::BestMode::kMax;
  auto max_store = f.store("run-a", keep);
  max_store.save(snap(5, 1, 0.1));  // the best by max among 2, 4, 5 is step-4 (0.7)
  CHECK(entries(f.d.path) == std::vector<std::string>{"step-4", "step-5"});
}

TEST_CASE("re-saving a committed step of the same run replaces it atomically") {
  Fixture f;
  auto store = f.store("run-a");
  const std::string dir = store.save(snap(5, 1.0f));
  CHECK(store.save(snap(5, 2.0f)) == dir);
  CHECK(value_in(fs::path(dir) / "model.bin") == "2");
  keel::verify_checkpoint(dir);
  CHECK(entries(f.d.path) == std::vector<std::string>{"step-5"});  // no trash left
  // A failing re-save keeps the committed one.
  f.backend.fail = true;
  keel_test::error_of([&] { store.save(snap(5, 3.0f)); });
  CHECK(value_in(fs::path(dir) / "model.bin") == "2");
  keel::verify_checkpoint(dir);
}

TEST_CASE("remove_stale removes dead saves, lone locks and trash, not a save whose lock is held") {
  Fixture f;
  fs::create_directory(f.d.path / ".step-3-dead.tmp");
  std::ofstream(f.d.path / ".step-3-dead.tmp" / "model.bin") << "half";
  fs::create_directory(f.d.path / ".trash-0123");
  std::ofstream(f.d.path / ".step-9-gone.lock") << "";  // killed before mkdir or after rename
  fs::create_directory(f.d.path / ".step-4-live.tmp");
  const int fd = ::open((f.d.path / ".step-4-live.lock").c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  auto store = f.store("run-a");
  CHECK(store.remove_stale() == 3);
  CHECK(entries(f.d.path) == std::vector<std::string>{".step-4-live.lock", ".step-4-live.tmp"});
  ::close(fd);  // the "live" save dies
  CHECK(store.remove_stale() == 1);
  CHECK(entries(f.d.path).empty());
}

TEST_CASE("an asynchronous save commits from its own copy; its failure surfaces at wait()") {
  Fixture f;
  auto store = f.store("run-a");
  keel::Snapshot s = snap(7, 4.0f);
  at::Tensor w = s.objects[0].second[0].second;
  store.save_async(std::move(s));
  w.fill_(5.0f);  // training goes on changing the model: the save holds a copy
  CHECK(store.in_flight());
  const std::string dir = store.wait();
  CHECK(value_in(fs::path(dir) / "model.bin") == "4");
  keel::verify_checkpoint(dir);
  // Deferred tensors (parameters, optimizer state) are copied on the writer thread: after
  // wait_copied() training may change them.
  keel::Snapshot d = snap(9, 6.0f);
  at::Tensor p = d.objects[0].second[0].second;
  d.deferred.insert(p.unsafeGetTensorImpl());
  store.save_async(std::move(d));
  store.wait_copied();
  p.fill_(7.0f);
  CHECK(value_in(fs::path(store.wait()) / "model.bin") == "6");
  f.backend.fail = true;
  store.save_async(snap(8));
  CHECK(keel_test::error_of([&] { store.wait(); }) ==
        "checkpoint 'flaky' (plugin test): save failed: disk full (simulated)");
  CHECK(entries(f.d.path) == std::vector<std::string>{"step-7", "step-9"});
  // A given `finish` (several ranks: checkpoint/multi_rank.cpp) runs on the writer thread with
  // the copy, and may save from there; a save from any other thread is still refused.
  f.backend.fail = false;
  keel::Snapshot g = snap(11, 2.0f);
  at::Tensor q = g.objects[0].second[0].second;
  g.deferred.insert(q.unsafeGetTensorImpl());
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  store.save_async(std::move(g), [&](const keel::Snapshot& copy) {
    started.wait();
    return store.save(copy);
  });
  CHECK(keel_test::error_of([&] { store.save(snap(12)); }) ==
        "internal: synchronous save while an asynchronous one is in flight");
  go.set_value();
  store.wait_copied();
  q.fill_(3.0f);
  CHECK(value_in(fs::path(store.wait()) / "model.bin") == "2");
  CHECK(entries(f.d.path) == std::vector<std::string>{"step-11", "step-7", "step-9"});
}

TEST_CASE("trainer_state.toml reads back every field it writes") {
  keel::CheckpointMeta m;
  m.run_id = "abc";
  m.step = 12;
  m.epoch = 3;
  m.epoch_batches = 5;
  m.samples = 700;
  m.tokens = 900;
  m.skipped_steps = 1;
  m.last_eval_step = -1;
  m.objects = {"model", "optimizer"};
  m.keel_version = "0.3.0";
  m.manifest_hash = "xxh3:0011223344556677";
  m.loss_scale = 32768.0;
  m.loss_scale_clean_steps = 4;
  m.window = {0.1 + 0.2, NAN, 2, 0, 128, 128};
  m.plugins = {{"keel-optimizers", "0.1.0"}, {"my plugin", "1.0"}};
  m.train_metrics = {{"step", 12}, {"loss", 1.0 / 3.0}, {"lr", 1e-300}};
  // Two evaluation sets, "valid" evaluated before "test": read back in the written order.
  m.eval_metrics = {{"valid", {{"loss", 2.5}, {"accuracy", 0.5}}}, {"test", {{"loss", -0.0}}}};
  const std::string text = keel::write_checkpoint_meta(m);
  CHECK(keel::read_checkpoint_meta(text, "t.toml") == m);
  // Older keel wrote [metrics.test] always, empty when the run had not evaluated: no record.
  keel::CheckpointMeta no_eval = m;
  no_eval.eval_metrics.clear();
  std::string older = keel::write_checkpoint_meta(no_eval) + "\n[metrics.test]\nkeys = []\nvalues = []\n";
  CHECK(keel::read_checkpoint_meta(older, "t.toml") == no_eval);
  // A split name that is not an evaluation set's (it could name a file outside the run).
  std::string escaping = text;
  escaping.replace(escaping.find("[metrics.valid]"), 15, "[metrics.\"../x\"]");
  CHECK(keel_test::error_of([&] { keel::read_checkpoint_meta(escaping, "t.toml"); })
            .find("[metrics.../x]: not an evaluation set's name") != std::string::npos);
  CHECK(keel_test::error_of([&] { keel::read_checkpoint_meta("bogus = 1\n", "t.toml"); })
            .rfind("t.toml:1:1: invalid checkpoint metadata: unknown key \"bogus\"", 0) == 0);
  CHECK(keel_test::error_of([&] { keel::read_checkpoint_meta("step = 1\n", "t.toml"); })
            .rfind("t.toml:1:1: invalid checkpoint metadata: no 'run_id'", 0) == 0);
  std::string bad = text;
  bad.replace(bad.find("epoch_batches = 5"), 17, "epoch_batches = -5");
  CHECK(keel_test::error_of([&] { keel::read_checkpoint_meta(bad, "t.toml"); })
            .find("'epoch_batches' must be an integer >= 0") != std::string::npos);
}

// A commit record with these fields and no tensors, chunks or metrics.
keel::CommitRecord record_of(std::string run_id, int64_t step, int64_t committed_unix_ns,
                             std::vector<keel::CommitRecord::File> files) {
  keel::CommitRecord r;
  r.run_id = std::move(run_id);
  r.step = step;
  r.committed_unix_ns = committed_unix_ns;
  r.files = std::move(files);
  return r;
}

TEST_CASE("the commit record rejects what it cannot trust") {
  const std::string ok = keel::write_commit_record(record_of("r", 1, 5, {{"m.bin", 3, 42}}));
  CHECK(keel::read_commit_record(ok, "c.json").files[0].xxh3 == 42);
  const auto err = [&](std::string text) {
    return keel_test::error_of([&] { keel::read_commit_record(text, "c.json"); });
  };
  CHECK(err("{").rfind("c.json: invalid commit record: not JSON", 0) == 0);
  std::string s = ok;
  s.replace(s.find("\"m.bin\""), 7, "\"../x\"");
  CHECK(err(s).find("'../x' is not a plain file name") != std::string::npos);
  s = ok;
  s.replace(s.find("\"version\": 2"), 12, "\"version\": 3");
  CHECK(err(s).find("'version' is not 1 or 2") != std::string::npos);
  s = ok;  // version 2 needs its chunk index
  s.replace(s.find("\"chunks\""), 8, "\"chunkz\"");
  CHECK(err(s).find("has no 'chunks'") != std::string::npos);
  // One object naming a tensor twice (found by fuzz_commit_record: in a version 1 record the
  // second entry's shape was taken for the first one's chunk).
  keel::CommitRecord twice = record_of("r", 1, 5, {{"m.bin", 3, 42}});
  twice.tensors["model"] = {{"w", "F32", {2}}, {"w", "F64", {3}}};
  CHECK(err(keel::write_commit_record(twice)).find("tensor 'w' is listed twice in 'model'") !=
        std::string::npos);
}

// A chunk index of one model tensor [5, 2] cut into rows 0..2 (rank 0) and 3..4 (rank 1), and
// one optimizer entry like it.
keel::CommitRecord chunked_record() {
  keel::CommitRecord r = record_of("r", 7, 9, {{"model.st", 3, 42}});
  r.tensors["model"] = {{"w", "F32", {3, 2}}};
  r.tensors["rank1.model"] = {{"w", "F32", {2, 2}}};
  using C = keel::CommitRecord::Chunk;
  r.chunks["model"]["w"] = {"F32", {5, 2}, "", {C{{0, 0}, {3, 2}, "model", "model.st"},
                                                C{{3, 0}, {2, 2}, "rank1.model", ""}}};
  r.chunks["optimizer"]["w.exp_avg"] = {"F32", {5, 2}, "w", {C{{0, 0}, {3, 2}, "rank0.optimizer", ""},
                                                             C{{3, 0}, {2, 2}, "rank1.optimizer", ""}}};
  r.chunks["optimizer"]["w.step"] = {"I64", {}, "", {C{{}, {}, "rank0.optimizer", ""}}};
  return r;
}

TEST_CASE("commit record v2: the chunk index round-trips and is checked") {
  const keel::CommitRecord r = chunked_record();
  const std::string text = keel::write_commit_record(r);
  CHECK(text.find("\"version\": 2") != std::string::npos);
  const keel::CommitRecord back = keel::read_commit_record(text, "c.json");
  CHECK(back.version == 2);
  CHECK((back.chunks == r.chunks));  // (( )): doctest cannot print a chunk index
  CHECK(back.tensors.at("rank1.model")[0].shape == std::vector<int64_t>{2, 2});
  const auto err = [&](std::string s) {
    return keel_test::error_of([&] { keel::read_commit_record(s, "c.json"); });
  };
  keel::CommitRecord past = r;  // a chunk reaching past its tensor's rows
  past.chunks["model"]["w"].chunks[1].offset = {4, 0};
  CHECK(err(keel::write_commit_record(past)).find("a chunk of tensor 'w' lies outside its shape") !=
        std::string::npos);
  // Two ranks' parts join in offset order; parts that disagree on a tensor are refused.
  keel::CommitRecord all, rank0 = r, rank1 = r;
  rank0.chunks["model"]["w"].chunks.pop_back();
  rank1.chunks["model"]["w"].chunks.erase(rank1.chunks["model"]["w"].chunks.begin());
  keel::merge_part(all, rank1);
  keel::merge_part(all, rank0);
  CHECK(all.chunks["model"]["w"].chunks.size() == 2);
  CHECK(all.chunks["model"]["w"].chunks[0].object == "model");
  rank1.chunks["model"]["w"].shape = {6, 2};
  CHECK(keel_test::error_of([&] { keel::merge_part(all, rank1); })
            .find("disagree on model tensor 'w'") != std::string::npos);
}

TEST_CASE("commit record v1: its chunks are synthesised, whole or by the shard layout") {
  const std::string v1 = R"({"format": "keel-checkpoint", "version": 1, "run_id": "r",
    "step": 3, "committed_unix_ns": 1, "files": [],
    "tensors": {"model": [{"name": "w", "dtype": "F32", "shape": [5, 2]},
                          {"name": "b", "dtype": "F32", "shape": []}],
                "optimizer": [{"name": "w.exp_avg", "dtype": "F32", "shape": [5, 2]},
                              {"name": "w.step", "dtype": "I64", "shape": []},
                              {"name": "param_groups.0.lr", "dtype": "F64", "shape": []}]},
    "metrics": {}})";
  const keel::CommitRecord r = keel::read_commit_record(v1, "c.json");
  CHECK(r.version == 1);
  CHECK(r.chunks.at("model").at("w").chunks.at(0).size == std::vector<int64_t>{5, 2});
  CHECK(r.chunks.at("optimizer").at("w.exp_avg").like == "w");
  CHECK(r.chunks.at("optimizer").at("w.step").like.empty());
  CHECK(r.chunks.at("optimizer").at("param_groups.0.lr").chunks.at(0).object == "optimizer");
  // Written back, it is a v2 record with the same chunks.
  CHECK((keel::read_commit_record(keel::write_commit_record(r), "c.json").chunks == r.chunks));
  // A v1 record of 2 ranks with [distributed] shard: each "rank<r>.optimizer" holds its rows
  // (ceil(5 / 2) = 3, then 2) of the elementwise entries; the 0-dim b's on rank 0 only.
  std::string sharded = v1;
  const std::string opt = R"("optimizer": [{"name": "w.exp_avg", "dtype": "F32", "shape": [5, 2]},)";
  sharded.replace(sharded.find(opt), opt.size(),
                  R"("rank1.optimizer": [{"name": "w.exp_avg", "dtype": "F32", "shape": [2, 2]},
                     {"name": "b.exp_avg", "dtype": "F32", "shape": [0]},
                     {"name": "w.step", "dtype": "I64", "shape": []}],
                     "rank0.optimizer": [{"name": "w.exp_avg", "dtype": "F32", "shape": [3, 2]},
                     {"name": "b.exp_avg", "dtype": "F32", "shape": []},)");
  const keel::CommitRecord s = keel::read_commit_record(sharded, "c.json");
  const auto& w = s.chunks.at("optimizer").at("w.exp_avg");
  CHECK(w.shape == std::vector<int64_t>{5, 2});
  REQUIRE(w.chunks.size() == 2);
  CHECK(w.chunks[1].offset == std::vector<int64_t>{3, 0});
  CHECK(w.chunks[1].object == "rank1.optimizer");
  CHECK(s.chunks.at("optimizer").at("b.exp_avg").chunks.size() == 1);
  CHECK(s.chunks.at("optimizer").at("w.step").chunks.at(0).object == "rank0.optimizer");
  for (const auto& [name, g] : s.chunks.at("optimizer")) CHECK(keel::coverage_gap(g).empty());
}

TEST_CASE("coverage: a tensor's chunks must cover every row, spanning the other dims") {
  using C = keel::CommitRecord::Chunk;
  struct Case {
    std::vector<int64_t> shape;
    std::vector<C> chunks;
    const char* gap;
  };
  const Case cases[] = {
      {{96, 32}, {C{{0, 0}, {48, 32}, "a", ""}, C{{48, 0}, {48, 32}, "b", ""}}, ""},
      {{96, 32}, {C{{0, 0}, {48, 32}, "a", ""}}, "rows 48..95 missing"},
      {{96, 32}, {C{{48, 0}, {48, 32}, "b", ""}}, "rows 0..47 missing"},
      {{9}, {C{{0}, {3}, "a", ""}, C{{6}, {2}, "c", ""}}, "rows 3..5, 8..8 missing"},
      {{9}, {C{{0}, {6}, "a", ""}, C{{3}, {6}, "b", ""}}, ""},  // overlaps are fine
      {{4, 2}, {C{{0, 0}, {4, 1}, "a", ""}}, "a chunk does not span dimension 1 whole"},
      {{}, {C{{}, {}, "a", ""}}, ""},
      {{}, {}, "no chunk holds it"},
      {{0, 3}, {}, ""},
  };
  for (const Case& c : cases) {
    const keel::CommitRecord::Global g{"F32", c.shape, "", c.chunks};
    CHECK(keel::coverage_gap(g) == c.gap);
  }
}

// A committed checkpoint of `store` whose commit record is replaced by `edit(record)`, its
// checksum file (commit.json.xxh3) rewritten to match, as someone handing it over would.
void rewrite_record(const fs::path& dir, const std::function<void(keel::CommitRecord&)>& edit) {
  keel::CommitRecord r = keel::read_commit_file(dir.string());
  edit(r);
  const std::string text = keel::write_commit_record(r);
  std::ofstream(dir / "commit.json", std::ios::trunc) << text;
  std::ofstream(dir / "commit.json.xxh3", std::ios::trunc)
      << keel::hash_string(keel::hash_text(text)) << "\n";
}

// issue 43, finding 2: a chunk's object (and file, and an object of `tensors`) named
// "../outside/evil" had export, init_from and --resume load weights from outside the
// checkpoint, which still verified.
TEST_CASE("a commit record's objects and files are plain names") {
  const auto err = [&](keel::CommitRecord r) {
    return keel_test::error_of(
        [&] { keel::read_commit_record(keel::write_commit_record(r), "c.json"); });
  };
  for (const char* bad : {"../outside/evil", "a/b", "..", ".", ".hidden", "", "x\ny"}) {
    CAPTURE(std::string(bad));
    keel::CommitRecord r = chunked_record();
    r.chunks["model"]["w"].chunks[1].object = bad;
    CHECK(err(r).rfind("c.json: invalid commit record: ", 0) == 0);
    CHECK(err(r).find("is not a plain name") != std::string::npos);
    CHECK(err(r).find('\n') == std::string::npos);
    r = chunked_record();
    r.chunks["model"]["w"].chunks[0].file = bad;
    if (*bad) CHECK(err(r).find("is not a plain name") != std::string::npos);
    r = chunked_record();
    r.tensors[bad] = {{"w", "F32", {2}}};
    CHECK(err(r).find("is not a plain name") != std::string::npos);
  }
}

TEST_CASE("verification: no listed file through a link, commit.json covered by its checksum") {
  Fixture f;
  auto store = f.store("run-a");
  const fs::path dir = store.save(snap(1));
  CHECK(entries(dir) == std::vector<std::string>{"commit.json", "commit.json.xxh3",
                                                 "manifest.resolved.toml", "model.bin",
                                                 "trainer_state.toml"});
  keel::verify_checkpoint(dir.string());
  // A listed file that is a symbolic link to a file of the same bytes outside the checkpoint.
  fs::create_directory(f.d.path / "outside");
  fs::copy_file(dir / "model.bin", f.d.path / "outside/model.bin");
  fs::remove(dir / "model.bin");
  fs::create_symlink(f.d.path / "outside/model.bin", dir / "model.bin");
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir.string()); }) ==
        (dir / "model.bin").string() + ": a symbolic link, not a file of the checkpoint; hint: a "
        "checkpoint directory holds its files themselves, copy the checkpoint with its files "
        "(cp -rL) or resume from another one");
  // A flipped byte in commit.json (the step, 1 -> 3: still a valid record).
  const fs::path dir2 = store.save(snap(2));
  std::string text = keel_test::read(dir2 / "commit.json");
  text.replace(text.find("\"step\": 2"), 9, "\"step\": 3");
  std::ofstream(dir2 / "commit.json", std::ios::trunc) << text;
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir2.string()); })
            .rfind((dir2 / "commit.json").string() + ": checksum mismatch (", 0) == 0);
  // A chunk whose object names no listed file, or whose file is not listed.
  const fs::path dir3 = store.save(snap(3));
  rewrite_record(dir3, [](keel::CommitRecord& r) {
    r.chunks["model"]["w"] = {"F32", {2}, "", {{{0}, {2}, "other", ""}}};
  });
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir3.string()); }) ==
        (dir3 / "commit.json").string() + ": model tensor 'w' is held by object 'other', which "
        "has no file in the checkpoint; hint: the checkpoint is damaged or was not written by "
        "keel, resume from another one");
  rewrite_record(dir3, [](keel::CommitRecord& r) {
    r.chunks["model"]["w"] = {"F32", {2}, "", {{{0}, {2}, "model", "model.safetensors"}}};
  });
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir3.string()); })
            .find("model tensor 'w' is held by file 'model.safetensors', which the commit "
                  "record does not list") != std::string::npos);
  // A checkpoint of an earlier keel, without commit.json.xxh3, still verifies (with a warning).
  const fs::path dir4 = store.save(snap(4));
  fs::remove(dir4 / "commit.json.xxh3");
  CHECK(keel::verify_checkpoint(dir4.string()).step == 4);
  // A damaged checksum file is named.
  const fs::path dir5 = store.save(snap(5));
  std::ofstream(dir5 / "commit.json.xxh3", std::ios::trunc) << "nonsense\n";
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir5.string()); })
            .rfind((dir5 / "commit.json.xxh3").string() + ": not 'xxh3:' and 16 lowercase hex "
                   "digits", 0) == 0);
}

// The backends open a verified file again by name to load it: what they loaded must be what was
// hashed. check_unchanged, after a load, catches a file rewritten with the same bytes (its
// status change time moved) or replaced by a copy (another inode).
TEST_CASE("a listed file written or replaced between verification and load is named") {
  Fixture f;
  auto store = f.store("run-a");
  const fs::path dir = store.save(snap(1));
  const keel::CommitRecord r = keel::verify_checkpoint(dir.string());
  keel::check_unchanged(dir.string(), r);
  keel::check_unchanged(dir.string(), r, "model");
  const std::string changed = (dir / "model.bin").string() + ": changed while keel verified or "
                              "loaded it (written, replaced or renamed by another process)";
  const std::string bytes = keel_test::read(dir / "model.bin");
  usleep(20000);  // past the file system's timestamp granularity
  std::ofstream(dir / "model.bin", std::ios::trunc) << bytes;  // the same bytes, rewritten
  CHECK(keel_test::error_of([&] { keel::check_unchanged(dir.string(), r, "model"); })
            .rfind(changed, 0) == 0);
  keel::check_unchanged(dir.string(), r, "trainer_state");  // another object's files only
  const keel::CommitRecord again = keel::verify_checkpoint(dir.string());
  fs::copy_file(dir / "model.bin", f.d.path / "copy.bin");
  fs::rename(f.d.path / "copy.bin", dir / "model.bin");  // a copy renamed over it
  CHECK(keel_test::error_of([&] { keel::check_unchanged(dir.string(), again); })
            .rfind(changed, 0) == 0);
  // A record not verified by this process (another rank's read) is not checked.
  keel::check_unchanged(dir.string(), keel::read_commit_file(dir.string()));
}

// issue 43, finding 9: optimizer and state entries claiming [2^62, 4] or 8 TiB ended in
// "internal error ... this is a bug in keel" (exit 70) when --resume allocated them.
TEST_CASE("claimed shapes that overflow or exceed their object's files: one line naming both") {
  Fixture f;
  auto store = f.store("run-a");
  const fs::path dir = store.save(snap(1));
  const std::string record = (dir / "commit.json").string();
  const std::string hint = "; hint: the checkpoint is damaged or was not written by keel, "
                           "resume from another one";
  rewrite_record(dir, [](keel::CommitRecord& r) {
    r.tensors["model"].push_back({"fc.weight.exp_avg", "F32", {int64_t{1} << 62, 4}});
  });
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir.string()); }) ==
        record + ": tensor 'fc.weight.exp_avg' of object 'model' claims shape "
                 "[4611686018427387904, 4] of F32, more bytes than 64 bits count" + hint);
  rewrite_record(dir, [](keel::CommitRecord& r) {  // 8 TiB
    r.tensors["model"].back() = {"state.big", "F32", {int64_t{1} << 41}};
  });
  const std::string size = std::to_string(fs::file_size(dir / "model.bin"));
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir.string()); }) ==
        record + ": tensor 'state.big' of object 'model' claims 8796093022208 bytes ([2199023255552] "
                 "F32), more than its files hold (model.bin: " + size + " bytes)" + hint);
  rewrite_record(dir, [](keel::CommitRecord& r) {  // the chunk index's claim
    r.tensors["model"].pop_back();
    r.chunks["optimizer"]["w.exp_avg"] = {"F32", {int64_t{1} << 62, 4}, "",
                                          {{{0, 0}, {int64_t{1} << 62, 4}, "model", ""}}};
  });
  CHECK(keel_test::error_of([&] { keel::verify_checkpoint(dir.string()); }) ==
        record + ": optimizer tensor 'w.exp_avg' of object 'model' claims shape "
                 "[4611686018427387904, 4] of F32, more bytes than 64 bits count" + hint);
}

// What the loaders allocate from a record's claims (bounded by its files' size) may still not
// fit this machine: 256 TiB, more than x86-64's user address space, is one line, not
// LibTorch's error (an "internal error" once it reached the command line).
TEST_CASE("a claimed tensor that cannot be allocated is one error line naming it") {
  const std::string err = keel_test::error_of([] {
    keel::allocate_claimed({int64_t{1} << 46}, at::kFloat, "optimizer tensor 'x'", "/c/step-1");
  });
  CHECK(err.rfind("/c/step-1: cannot allocate optimizer tensor 'x' [70368744177664] "
                  "(281474976710656 bytes) to load it (", 0) == 0);
  CHECK(err.find("); hint: load the checkpoint on a machine with more memory") != std::string::npos);
  CHECK(err.find('\n') == std::string::npos);
  CHECK(keel_test::error_of([] {
          keel::allocate_claimed({2}, at::ScalarType::Undefined, "optimizer tensor 'x'", "/c");
        }) == "/c: optimizer tensor 'x' has a dtype keel cannot load; hint: the checkpoint was "
              "not written by keel train");
}

// kernel/files/owned_dir.hpp's rule for the directories a run is written into, case by case: a
// directory on the way may be root's or ours and, when others can write it, must be sticky;
// the run directory itself must be ours and writable by no one else.
TEST_CASE("run directories: which directories are trusted") {
  const uid_t me = geteuid();
  const uid_t other = me == 65534 ? 65533 : 65534;
  struct Case {
    uid_t owner;
    mode_t mode;
    bool run_dir;
    const char* why;  // "" when trusted, else the start of the reason
  };
  const Case cases[] = {
      {me, 0755, true, ""},
      {me, 0700, false, ""},
      {0, 0755, false, ""},
      {0, 01777, false, ""},  // /tmp: others add entries, cannot remove ours
      {me, 01777, false, ""},
      {0, 0777, false, "is writable by every user (mode 0777, no sticky bit)"},
      {me, 0757, false, "is writable by every user"},
      {other, 0755, false, "belongs to another user"},
      {other, 01777, false, "belongs to another user"},
      {other, 0700, true, "belongs to another user"},
      {0, 0755, true, me == 0 ? "" : "belongs to another user"},
      {me, 01777, true, "is writable by every user (mode 1777)"},  // others could plant entries
      {me, 0777, true, "is writable by every user"},
  };
  for (const Case& c : cases) {
    struct stat st {};
    st.st_mode = S_IFDIR | c.mode;
    st.st_uid = c.owner;
    st.st_gid = 0;
    const std::string why = keel::untrusted_directory(st, c.run_dir);
    INFO("owner " << c.owner << " mode " << std::oct << c.mode << " run_dir " << c.run_dir
                  << ": " << why);
    if (*c.why == '\0')
      CHECK(why.empty());
    else
      CHECK(why.rfind(c.why, 0) == 0);
  }
  // Group write: refused unless the group is the user's private one (no such group here).
  struct stat shared {};
  shared.st_mode = S_IFDIR | 0775;
  shared.st_uid = me;
  shared.st_gid = 54321;
  CHECK(keel::untrusted_directory(shared, true) == "is writable by its group (mode 0775)");
  CHECK(keel::untrusted_directory(shared, false).rfind("is writable by its group", 0) == 0);
  shared.st_mode |= S_ISVTX;
  CHECK(keel::untrusted_directory(shared, false).empty());
  struct stat file {};
  file.st_mode = S_IFREG | 0644;
  file.st_uid = me;
  CHECK(keel::untrusted_directory(file, true) == "is not a directory");
}

}  // namespace unit_checkpoint_store
