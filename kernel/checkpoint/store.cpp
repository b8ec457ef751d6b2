#include "checkpoint/store.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <random>

#include "checkpoint/checksum.hpp"
#include "error.hpp"
#include "files/files.hpp"
#include "keel/tensor.hpp"

namespace fs = std::filesystem;

namespace keel {

struct AsyncResult {
  std::atomic<bool> done{false};
  std::string dir;
  std::exception_ptr error;
  std::mutex mutex;
  std::condition_variable copied_cv;
  bool copied = false;  // the deferred tensors are copied (or the copy failed)
};

namespace {

// The store whose asynchronous save this thread runs (nullptr on every other thread).
thread_local const CheckpointStore* writing_for = nullptr;

// The flock'd lock file of one save; unlocked and removed by release().
class SaveLock {
 public:
  explicit SaveLock(const std::string& path) : path_(path) {
    // Lock, then check that the name still refers to the locked file: remove_stale() of
    // another process may have removed a lock file between our open and flock.
    for (int attempt = 0; attempt < 100; ++attempt) {
      fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0)
        throw Error("cannot create " + path + ": " + std::strerror(errno) +
                    "; hint: check that the run directory is writable");
      if (::flock(fd_, LOCK_EX) == 0) {
        struct stat a {}, b {};
        if (::fstat(fd_, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev)
          return;
      }
      ::close(fd_);
      fd_ = -1;
    }
    throw Error("cannot lock " + path + "; hint: another process keeps removing it");
  }
  ~SaveLock() { release(); }
  void release() {
    if (fd_ < 0) return;
    ::unlink(path_.c_str());
    ::close(fd_);
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// True when nobody holds the lock at `path` (and it was removed), or there is none.
bool lock_is_stale(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  if (free) ::unlink(path.c_str());
  ::close(fd);
  return free;
}

// The hint for a file-system failure of a save (files/files.hpp leaves hints to its callers).
std::string save_hint(int code) {
  return code == ENOSPC || code == EFBIG || code == EDQUOT
             ? "free space in the run directory or lower [checkpoint] keep_last"
             : "check that the run directory is writable";
}

// Deletes a committed or staged directory: renamed to trash first, so that a kill midway never
// leaves a partial directory under a checkpoint's name.
void trash(const fs::path& dir) {
  const fs::path bin = dir.parent_path() / (".trash-" + random_token());
  durable_rename(dir.string(), bin.string());
  std::error_code ec;
  fs::remove_all(bin, ec);
}


// Every file of the staging directory (only regular files: `backend` names the writer in the
// error), fsync'd and checksummed: their commit-record entries, in name order.
std::vector<CommitRecord::File> checksum_files(const fs::path& staging,
                                               const std::string& backend) {
  std::vector<CommitRecord::File> files_out;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(staging)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files)
    if (!fs::is_regular_file(f))
      throw Error(backend + ": save wrote " + f.string() +
                  ", which is not a regular file; a backend writes only files");
  // Every file is fsync'd on a second thread while this one checksums them (reading the page
  // cache): the device's writeback and the hashing overlap, so the checksum adds little to
  // the save (bench/bench_checkpoint measures both).
  std::exception_ptr sync_error;
  std::thread syncer([&files, &sync_error] {
    try {
      for (const fs::path& f : files) fsync_path(f.string());
    } catch (...) {
      sync_error = std::current_exception();
    }
  });
  try {
    for (const fs::path& f : files) {
      CommitRecord::File entry;
      entry.name = f.filename().string();
      entry.xxh3 = hash_file(f.string(), &entry.size, /*sync=*/false);
      files_out.push_back(std::move(entry));
    }
  } catch (...) {
    syncer.join();
    throw;
  }
  syncer.join();
  if (sync_error) std::rethrow_exception(sync_error);
  return files_out;
}

// Commits `staging` as `name` (step-<N>), or as <name>-<run_id> when a committed checkpoint of
// another run holds that name; a committed one of this run is replaced. Returns the path.
std::string rename_into_place(const fs::path& staging, const fs::path& name,
                              const std::string& run_id) {
  std::error_code ec;
  // The name: step-<N>, unless a committed step-<N> of another run holds it. Another run
  // sharing the directory may commit its step-<N> between the check and the rename: the
  // rename then refuses to replace it, and the name is chosen again (step-<N>-<run_id>).
  for (int attempt = 0;; ++attempt) {
    fs::path target = name;
    bool exists = fs::exists(target, ec);
    if (exists) {
      std::string owner;
      try {
        owner = read_commit_file(target.string()).run_id;
      } catch (const Error&) {
      }
      if (owner != run_id) {
        target = name.string() + "-" + run_id;
        exists = fs::exists(target, ec);
      }
    }
    if (!exists) {
      if (durable_rename_new(staging.string(), target.string())) return target.string();
      if (attempt < 3) continue;
      throw Error("cannot commit " + staging.string() + " as " + target.string() +
                  ": another process keeps taking that name; hint: give each run its own "
                  "[run] output_dir");
    }
    if (durable_exchange(staging.string(), target.string())) {
      trash(staging);  // the checkpoint it replaced
    } else {
      trash(target);  // no atomic exchange here: the old one goes first
      durable_rename(staging.string(), target.string());
    }
    return target.string();
  }
}

}  // namespace

std::string random_token() {
  static std::mutex m;
  static std::mt19937_64 gen(std::random_device{}() ^
                             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                             (static_cast<uint64_t>(::getpid()) << 32));
  std::lock_guard<std::mutex> lock(m);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(gen()));
  return buf;
}

std::string dtype_name(at::ScalarType type) {
  const Dtype* d = dtype_of(type);
  return d ? d->name : at::toString(type);
}

at::ScalarType dtype_of_name(const std::string& name) {
  const Dtype* d = dtype_named(name);
  return d ? d->torch : at::ScalarType::Undefined;
}

void Snapshot::copy_tensors(bool deferred_ones) {
  std::set<c10::DeviceIndex> devices;  // CUDA devices copied from without waiting
  for (auto& [stem, list] : objects)
    for (auto& [name, t] : list) {
      if ((deferred.count(t.unsafeGetTensorImpl()) > 0) != deferred_ones) continue;
      const at::Tensor source = t.detach();
      if (source.is_cuda()) {
        // Into pinned host memory (LibTorch's caching host allocator keeps the blocks for the
        // next save), queued on the device's current stream: the copies of one save overlap,
        // and one synchronisation per device below ends them before any byte is read.
        at::Tensor host = at::empty(source.sizes(),
                                    source.options().device(at::kCPU).pinned_memory(true));
        host.copy_(source, /*non_blocking=*/true);
        devices.insert(source.get_device());
        t = host;
      } else {
        t = source.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      }
    }
  for (const c10::DeviceIndex d : devices) at::detail::getCUDAHooks().deviceSynchronize(d);
}

CheckpointStore::CheckpointStore(std::string root, const CheckpointBackend* backend,
                                 CheckpointKeys retention, std::string run_id)
    : root_(std::move(root)),
      backend_(backend),
      retention_(std::move(retention)),
      run_id_(std::move(run_id)) {}

CheckpointStore::~CheckpointStore() {
  if (!worker_.joinable()) return;
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("asynchronous checkpoint save failed: {}", e.what());
  }
}

int CheckpointStore::remove_stale() {
  int removed = 0;
  std::error_code ec;
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(root_, ec)) entries.push_back(e.path());
  for (const fs::path& p : entries) {
    const std::string name = p.filename().string();
    const bool staging = name.rfind(".step-", 0) == 0 && name.size() > 4 &&
                         name.compare(name.size() - 4, 4, ".tmp") == 0;
    if (staging) {
      const std::string lock = p.string().substr(0, p.string().size() - 4) + ".lock";
      if (!lock_is_stale(lock)) continue;  // a live save of another process
      spdlog::info("removing {}, left by an interrupted checkpoint save", p.string());
      fs::remove_all(p, ec);
      ++removed;
    } else if (name.rfind(".trash-", 0) == 0) {
      fs::remove_all(p, ec);
      ++removed;
    } else if (name.rfind(".step-", 0) == 0 && name.size() > 5 &&
               name.compare(name.size() - 5, 5, ".lock") == 0) {
      // A lock without its staging directory: a save killed before it created the directory,
      // or after the commit renamed it. Ones that go with a staging directory are handled
      // (and removed) with it above.
      const std::string staging_dir = p.string().substr(0, p.string().size() - 5) + ".tmp";
      if (fs::exists(staging_dir, ec) || !fs::exists(p, ec)) continue;
      if (!lock_is_stale(p.string())) continue;  // a live save, before its mkdir
      ++removed;
    }
  }
  return removed;
}

std::string CheckpointStore::save(const Snapshot& snapshot, const SaveParts& parts) {
  if (writing_for != this && worker_.joinable())
    throw Error("internal: synchronous save while an asynchronous one is in flight");
  const std::string dir = commit(snapshot, parts);
  prune(dir);
  return dir;
}

CommitRecord CheckpointStore::write_part(const std::string& staging,
                                        const Snapshot& snapshot) const {
  CommitRecord part;
  for (const auto& [stem, tensors] : snapshot.objects) {
    if (tensors.empty()) continue;
    std::vector<keel_named_tensor> named;
    auto& entries = part.tensors[stem];
    for (const auto& [name, t] : tensors) {
      named.push_back({name.c_str(), peek(t)});
      entries.push_back({name, dtype_name(t.scalar_type()), t.sizes().vec()});
    }
    backend_->save(staging, stem, named);
    const auto placed = snapshot.placements.find(stem);
    if (placed == snapshot.placements.end()) continue;
    // The file the backend wrote the object to, when it wrote one named after it.
    std::string file;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(staging, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(stem + ".", 0) != 0) continue;
      file = file.empty() ? name : "";
      if (file.empty()) break;  // several: none named
    }
    for (const auto& entry : entries) {
      const auto p = placed->second.find(entry.name);
      if (p == placed->second.end()) continue;
      CommitRecord::Chunk c{std::vector<int64_t>(entry.shape.size(), 0), entry.shape, stem, file};
      if (!c.offset.empty()) c.offset[0] = p->second.begin;
      CommitRecord::Global& g = part.chunks[p->second.group][entry.name];
      g.dtype = entry.dtype;
      g.shape = p->second.shape;
      g.like = p->second.like;
      g.chunks.push_back(std::move(c));
    }
  }
  return part;
}

std::string CheckpointStore::commit(const Snapshot& snap, const SaveParts& parts) {
  const std::string step = std::to_string(snap.meta.step);
  const std::string token = random_token();
  const fs::path root(root_);
  const fs::path staging = root / (".step-" + step + "-" + token + ".tmp");
  SaveLock lock((root / (".step-" + step + "-" + token + ".lock")).string());
  std::error_code ec;
  if (!fs::create_directory(staging, ec))
    throw Error("cannot create " + staging.string() + ": " + ec.message() +
                "; hint: check that the run directory is writable");
  try {
    CommitRecord record;
    record.run_id = run_id_;
    record.step = snap.meta.step;
    record.metrics = snap.metrics;
    CheckpointMeta meta = snap.meta;
    if (parts.staged) parts.staged(staging.string());
    CommitRecord mine = write_part(staging.string(), snap);
    record.tensors = std::move(mine.tensors);
    record.chunks = std::move(mine.chunks);
    meta.objects.clear();
    for (const auto& [stem, tensors] : snap.objects)
      if (!tensors.empty()) meta.objects.push_back(stem);
    if (parts.written) {
      const CommitRecord others = parts.written();
      for (const auto& [stem, index] : others.tensors) meta.objects.push_back(stem);
      merge_part(record, others);
    }
    write_file_durably((staging / "trainer_state.toml").string(), write_checkpoint_meta(meta));
    write_file_durably((staging / "manifest.resolved.toml").string(), snap.manifest);
    record.files = checksum_files(staging, backend_->label());
    record.committed_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
    const std::string record_text = write_commit_record(record);
    write_file_durably((staging / "commit.json").string(), record_text);
    write_file_durably((staging / kRecordChecksumFile).string(), record_checksum_text(record_text));
    fsync_path(staging.string());
    return rename_into_place(staging, root / ("step-" + step), run_id_);
  } catch (const FileError& e) {
    fs::remove_all(staging, ec);
    throw Error(std::string(e.what()) + "; hint: " + save_hint(e.code()));
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

void CheckpointStore::prune(const std::string& committed) {
  if (retention_.keep_last <= 0 && retention_.keep_best <= 0) return;
  std::vector<Entry> mine;
  for (auto& e : list(root_))
    if (e.record.run_id == run_id_) mine.push_back(std::move(e));
  std::sort(mine.begin(), mine.end(), [](const Entry& a, const Entry& b) {
    return std::make_pair(a.record.step, a.record.committed_unix_ns) >
           std::make_pair(b.record.step, b.record.committed_unix_ns);
  });
  std::vector<bool> keep(mine.size(), false);
  for (size_t i = 0; i < mine.size(); ++i) {
    keep[i] = mine[i].dir == committed || static_cast<int64_t>(i) < retention_.keep_last;
  }
  if (retention_.keep_best > 0) {
    std::vector<size_t> ranked;
    for (size_t i = 0; i < mine.size(); ++i)
      if (mine[i].record.metrics.count(retention_.best_metric)) ranked.push_back(i);
    std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
      const double va = mine[a].record.metrics.at(retention_.best_metric);
      const double vb = mine[b].record.metrics.at(retention_.best_metric);
      return retention_.best_mode == BestMode::kMax ? va > vb : va < vb;
    });
    for (size_t k = 0; k < ranked.size() && static_cast<int64_t>(k) < retention_.keep_best; ++k)
      keep[ranked[k]] = true;
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (keep[i]) continue;
    try {
      trash(mine[i].dir);
      spdlog::debug("retention removed {}", mine[i].dir);
    } catch (const Error& e) {
      spdlog::warn("retention could not remove {}: {}", mine[i].dir, e.what());
    }
  }
}

void CheckpointStore::save_async(Snapshot snapshot, Finish finish) {
  if (worker_.joinable()) throw Error("internal: asynchronous save while another is in flight");
  // Everything but the deferred tensors is copied here (buffers, hook state, generators: they
  // may change before the next optimizer step).
  snapshot.copy_tensors(/*deferred_ones=*/false);
  result_ = std::make_shared<AsyncResult>();
  if (!finish) finish = [this](const Snapshot& snap) { return save(snap); };
  worker_ = std::thread([this, snap = std::move(snapshot), finish = std::move(finish),
                         result = result_]() mutable {
    writing_for = this;
    const auto mark_copied = [&] {
      std::lock_guard<std::mutex> lock(result->mutex);
      result->copied = true;
      result->copied_cv.notify_all();
    };
    try {
      snap.copy_tensors(/*deferred_ones=*/true);
      mark_copied();
      result->dir = finish(snap);
    } catch (...) {
      result->error = std::current_exception();
      mark_copied();
    }
    snap.objects.clear();  // free the copies before signalling
    result->done = true;
  });
}

void CheckpointStore::wait_copied() {
  if (!result_) return;
  std::unique_lock<std::mutex> lock(result_->mutex);
  result_->copied_cv.wait(lock, [&] { return result_->copied; });
}

bool CheckpointStore::ready() const { return result_ && result_->done; }

std::string CheckpointStore::wait() {
  if (!worker_.joinable()) return "";
  worker_.join();
  auto result = std::move(result_);
  if (result->error) std::rethrow_exception(result->error);
  return result->dir;
}

std::vector<CheckpointStore::Entry> CheckpointStore::list(const std::string& root) {
  std::vector<Entry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !e.is_directory(ec)) continue;
    try {
      out.push_back({e.path().string(), read_commit_file(e.path().string())});
    } catch (const Error& err) {
      spdlog::debug("ignoring {}: {}", e.path().string(), err.what());
    }
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.record.committed_unix_ns < b.record.committed_unix_ns;
  });
  return out;
}

std::optional<CheckpointStore::Entry> CheckpointStore::newest_verified(
    const std::string& root,
    const std::function<void(const std::string& dir, const Error& why)>& skipped) {
  const std::vector<Entry> entries = list(root);
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    try {
      return Entry{it->dir, verify_checkpoint(it->dir)};
    } catch (const Error& e) {
      if (skipped) skipped(it->dir, e);
    }
  }
  return std::nullopt;
}

void CheckpointStore::load(const std::string& dir, const std::string& stem,
                           const TensorList& into) const {
  if (into.empty()) return;
  std::vector<keel_named_tensor> named;
  for (const auto& [name, t] : into) named.push_back({name.c_str(), peek(t)});
  backend_->load(dir, stem, named);
}

}  // namespace keel
