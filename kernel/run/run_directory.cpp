#include "run/run_directory.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <system_error>
#include <vector>

#include "error.hpp"
#include "log.hpp"
#include "text/text.hpp"

namespace fs = std::filesystem;

namespace keel {

namespace {

// The current UTC time: "20261126T004105Z" (compact, for names) or "2026-11-26 00:41:05 UTC".
std::string utc_stamp(bool compact) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, compact ? "%Y%m%dT%H%M%SZ" : "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The files by which run directory `dir` shows that an earlier run wrote it, comma-separated
// ("" when none): manifest.resolved.toml, plugins.json and metrics.jsonl (the jsonl sink's
// default name), and checkpoints/step-<N> directories.
std::string earlier_records(const OwnedDir& dir) {
  std::vector<std::string> found;
  for (const char* name : {"manifest.resolved.toml", "plugins.json", "metrics.jsonl"})
    if (dir.has(name)) found.push_back(name);
  size_t steps = 0;
  for (const std::string& name : dir.entries("checkpoints")) steps += name.rfind("step-", 0) == 0;
  if (steps > 0)
    found.push_back(fmt::format("{} checkpoint{} in checkpoints/", steps, steps > 1 ? "s" : ""));
  return text::join(found);
}

[[noreturn]] void refuse_earlier_records(const std::string& dir, const std::string& records) {
  throw Error("run directory " + dir + " holds an earlier run's records (" + records +
              "), which a new run would overwrite; hint: continue that run with --resume, "
              "choose another output_dir (--set run.output_dir=DIR), or start a new run over "
              "them with --overwrite");
}

// A fresh training run: refused when `run` holds an earlier run's records; claimed by creating
// manifest.resolved.toml, so that a second fresh run starting into it meanwhile is refused.
void claim(RunDirectory& directory, OwnedDir& run, const std::string& shown,
           const std::string& resolved_manifest) {
  const std::string records = earlier_records(run);
  if (!records.empty()) refuse_earlier_records(shown, records);
  const int fd = run.open_file("manifest.resolved.toml", O_EXCL, *directory.created);
  if (fd < 0) refuse_earlier_records(shown, "manifest.resolved.toml");
  const bool ok = write_all(fd, resolved_manifest);
  if (::close(fd) != 0 || !ok)
    throw Error("cannot write " + run.path_of("manifest.resolved.toml") + ": " +
                std::strerror(errno) + "; hint: set [run] output_dir to a writable directory");
  directory.claimed = true;
}

}  // namespace

ScratchDirectory::~ScratchDirectory() { remove(); }

void ScratchDirectory::remove() {
  std::error_code ec;
  if (!path_.empty()) fs::remove_all(path_, ec);
  path_.clear();
}

const std::string& ScratchDirectory::create() {
  std::string tmpl = (fs::temp_directory_path() / "keel-validate-XXXXXX").string();
  if (!mkdtemp(tmpl.data()))
    throw Error("cannot create a scratch directory in " + fs::temp_directory_path().string() +
                ": " + std::strerror(errno) + "; hint: set TMPDIR to a writable directory");
  path_ = tmpl;
  return path_;
}

AttachedRunLog::~AttachedRunLog() { detach(); }

void AttachedRunLog::detach() {
  if (attached_) detach_run_log();
  attached_ = false;
}

void AttachedRunLog::attach(int fd, const std::string& path) {
  attach_run_log(fd, path);  // with what was logged until now
  attached_ = true;
}

std::string prepare_run_directory(RunDirectory& directory, const RunConfig& config,
                                  const std::string& resolved_manifest, bool validate_only) {
  const fs::path out = config.run.output_dir;
  CreatedEntries& created = *directory.created;
  OwnedDir run = OwnedDir::open(out.string(), created);
  run.probe_writable(created);
  if (validate_only) {
    // What a training run's start checks here too, with the same error lines, writing nothing
    // that stays: an earlier run's records refused, checkpoints/ trusted (created when missing,
    // and removed again with the rest of what validation created). The run's own files are
    // checked once the components exist (check_run_files), where the start writes them.
    if (config.run.mode != RunMode::kEvaluate) {
      if (config.resume == RunConfig::Resume::kNo && !config.overwrite) {
        const std::string records = earlier_records(run);
        if (!records.empty()) refuse_earlier_records(out.string(), records);
      }
      run.subdir("checkpoints", created);
      directory.dir = std::move(run);
      directory.before = directory.dir->identities();
    }
    return out.string();
  }
  if (config.run.mode == RunMode::kEvaluate) {
    // A place of its own: the training run's files stay as they are.
    directory.dir = run.new_subdir("eval-" + utc_stamp(/*compact=*/true), created);
  } else {
    if (config.resume == RunConfig::Resume::kNo && !config.overwrite)
      claim(directory, run, out.string(), resolved_manifest);
    run.subdir("checkpoints", created);
    directory.dir = std::move(run);
  }
  directory.before = directory.dir->identities();
  return directory.dir->path();
}

void check_run_files(RunDirectory& directory) {
  if (!directory.dir) return;  // an evaluation: its eval-<time>/ is new
  OwnedDir& dir = *directory.dir;
  const int log_fd = dir.open_file("run.log", O_APPEND, *directory.created);
  ::close(log_fd);
  for (const char* name : {"manifest.resolved.toml", "plugins.json"}) dir.check_replaceable(name);
}

void start_run_log(RunDirectory& directory, const RunConfig& config,
                   const std::string& resolved_manifest, const std::string& run_id) {
  // Written last (a fresh run's manifest.resolved.toml excepted: it claimed the directory), so
  // that a resumed or --overwrite run failing before step 1 leaves the earlier ones untouched.
  // run.log is opened first: a run.log keel refuses to write leaves the earlier files as they
  // were. It is appended to, each run's part starting with a line naming it.
  OwnedDir& dir = *directory.dir;
  CreatedEntries& created = *directory.created;
  bool had_log = false;
  const int log_fd = dir.open_file("run.log", O_APPEND, created, &had_log);
  try {
    if (!directory.claimed) dir.write_file("manifest.resolved.toml", resolved_manifest, created);
    dir.write_file("plugins.json", used_plugins_json(config), created);
  } catch (...) {
    ::close(log_fd);
    throw;
  }
  const std::string header =
      fmt::format("{}===== keel {}, run {}, {}, pid {} =====\n", had_log ? "\n" : "",
                  config.run.mode == RunMode::kEvaluate ? "evaluate" : "train", run_id,
                  utc_stamp(/*compact=*/false), ::getpid());
  if (!write_all(log_fd, header)) {
    ::close(log_fd);
    throw Error("cannot write " + dir.path_of("run.log") + ": " + std::strerror(errno) +
                "; hint: set [run] output_dir to a writable directory");
  }
  directory.run_log.attach(log_fd, dir.path_of("run.log"));
}

}  // namespace keel
