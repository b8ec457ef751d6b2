// The run directory as the run uses it: rank 0 opens (and, for a fresh training run, claims)
// it, the components get its path (a scratch directory when only validating), and run.log is
// attached to the log once the run is assembled. What this start created is recorded in
// `created` (the Trainer removes it again when the start fails; files/owned_dir.hpp).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "run_config.hpp"
#include "files/owned_dir.hpp"

namespace keel {

// A directory removed, with what is in it, when this goes.
class ScratchDirectory {
 public:
  ScratchDirectory() = default;
  ~ScratchDirectory();
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  // Creates keel-validate-XXXXXX in the temporary directory; returns its path.
  const std::string& create();
  // Removes it, with what is in it (the destructor does too).
  void remove();

 private:
  std::string path_;
};

// run.log attached to the log (log.hpp) while this lives.
class AttachedRunLog {
 public:
  AttachedRunLog() = default;
  ~AttachedRunLog();
  AttachedRunLog(const AttachedRunLog&) = delete;
  AttachedRunLog& operator=(const AttachedRunLog&) = delete;
  void attach(int fd, const std::string& path);
  // Detaches it (the destructor does too).
  void detach();

 private:
  bool attached_ = false;
};

struct RunDirectory {
  std::filesystem::path path;  // the components' run directory (validating: the scratch one)
  // Rank 0: the run directory, opened (files/owned_dir.hpp), and its entries' identities then.
  std::optional<OwnedDir> dir;
  std::vector<std::pair<dev_t, ino_t>> before;
  CreatedEntries* created = nullptr;  // the Trainer's, while it assembles the run
  bool claimed = false;  // a fresh run: manifest.resolved.toml created at the start (O_EXCL)
  // Released last of the run (run/teardown.cpp): run.log detached, then the scratch directory
  // removed, then the run directory closed.
  ScratchDirectory scratch;
  AttachedRunLog run_log;
};

// Rank 0: opens config.run.output_dir (created when missing, checked trusted and writable). An
// evaluation gets a new eval-<UTC time>/ inside it; a fresh training run (no --resume, no
// --overwrite) refuses one holding an earlier run's records and claims it by creating
// manifest.resolved.toml (`resolved_manifest`). `validate_only`: probes it, and for a training
// run refuses what a start would refuse (earlier records without --resume or --overwrite, an
// untrusted checkpoints/), claiming nothing. Returns the run directory's path.
std::string prepare_run_directory(RunDirectory& directory, const RunConfig& config,
                                  const std::string& resolved_manifest, bool validate_only);

// Validating a training run, once every component exists: refuses what start_run_log would
// refuse (a run.log, manifest.resolved.toml or plugins.json keel does not write), with the
// same error lines, writing nothing (a run.log created for the check is recorded in
// `created`, and removed again after validation).
void check_run_files(RunDirectory& directory);

// Rank 0, once every component exists: writes manifest.resolved.toml (when not claimed) and
// plugins.json, and attaches run.log (appended to) with a header line naming this run.
void start_run_log(RunDirectory& directory, const RunConfig& config,
                   const std::string& resolved_manifest, const std::string& run_id);

}  // namespace keel
