// keel export RUN_DIR|CHECKPOINT --format safetensors [--output DIR] [--since CHECKPOINT]: a
// checkpoint's model weights as one full-precision safetensors file, under the names of the
// model's export_state (abi.h, ABI 1.7) when it has one, and its sparse tables' rows.
//
// What it exports: CHECKPOINT, a checkpoint directory (one with commit.json, verified first), or
// the newest checkpoint of RUN_DIR/checkpoints that verifies (CheckpointStore::newest_verified,
// as `keel evaluate` picks one). One process, no process group.
//
// How: the checkpoint's manifest.resolved.toml is resolved with run.device = cpu and no lock.
// That manifest came with the checkpoint and is data: its [plugins] paths are never searched
// (a console line says so) and a manifest with `extends` is refused; plugins come from
// --plugins DIR (repeatable), KEEL_PLUGIN_PATH, the installed packages and keel's own plugin
// directory, each file under the loader's checks (docs/security.md). Only its [model] is created (on the CPU, with a
// scratch directory as its run directory), and the checkpoint's `model` object is read into the model's state with the
// checkpoint's own backend ([checkpoint] type), after its shapes were checked against the commit
// record. Rank 0 writes the whole model there today, so a checkpoint saved by several ranks
// exports the same way. Then:
//   - the model has export_state: the tensors it puts, under its names (gpt: Hugging Face's
//     GPT2LMHeadModel), and the config.json it writes (none when it writes "");
//   - else: the model's own state names (each tensor once, as checkpoints hold them), no
//     config.json, and a log line saying so.
// Floating-point tensors are written as float32, others as they are. With --weights-from LABEL
// the model's tensors are read from the checkpoint's `hooks` object instead, the entries
// LABEL.<name> of a hook that keeps a copy of every model tensor (the ema hook's average), each
// checked against the commit record's dtype and shape; a missing or different one is an error
// naming it.
//
// Where: DIR (--output), else RUN/exports/<checkpoint>/ for a checkpoint in RUN/checkpoints/,
// else <checkpoint>-export beside the checkpoint. DIR must not exist: keel export writes a new
// directory and never replaces anything. The directory that holds DIR is opened first, before
// anything is loaded, under a run directory's rules (files/owned_dir.hpp, DirUse::sticky_ok):
// created when missing, not a symlink (a RUN/exports planted as one is refused), yours, and
// nobody else can write it unless it is sticky, nor any directory on the way. The files are written into a
// staging directory created in it (mkdirat, .<DIR's name>.tmp-<token>) with the keel-safetensors plugin's safetensors component
// (model.safetensors) and the kernel (config.json), fsync'd, and the staging directory is renamed
// to DIR (without replacing: a DIR created meanwhile is an error too). A failure removes the
// staging directory and the directories the export created. On success it prints one line: DIR, the tensors, the checkpoint and its
// step.
//
// Sparse tables (export_tables.hpp): a checkpoint whose model has tables also gets
// tables.safetensors, every table's rows under `<table>.ids` (int64 [n], ascending) and
// `<table>.values` (float32 [n, dim]). With --since OLD (an older checkpoint, or run directory,
// of the same model) it gets tables.delta.safetensors instead: `<table>.ids` and
// `<table>.values` of the rows added or changed since OLD, and `<table>.removed_ids` of the rows
// OLD held and the checkpoint no longer does, plus delta.json ({"since": OLD's directory,
// "since_step": its step, "step": the checkpoint's step}), so that OLD's export plus the delta
// is the checkpoint's export (model.safetensors is always whole). OLD must be of the same run
// (its commit record's run_id; a resumed run keeps it) unless --since-any-run, and hold the
// same tables (by name) in any case; it is read with its own backend (the [checkpoint] type of
// its own manifest, read like the checkpoint's: no plugin directory of its). --since without
// tables, with an OLD that is not older, of another run (without --since-any-run) or with other
// tables is an error.
//
// A missing, extra or empty argument, a missing --format or a format other than safetensors
// throws UsageError (exit 2 with export's usage line); a path that is neither a run directory
// nor a checkpoint, a checkpoint that does not verify, a model that does not match it, an
// existing DIR or a failed write throws keel::Error (exit 1).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace keel::cli {

struct ExportArgs {
  std::vector<std::string> positional;  // RUN_DIR or CHECKPOINT
  std::optional<std::string> format;    // --format
  std::optional<std::string> output;    // --output, -o
  std::optional<std::string> since;     // --since: an older checkpoint (tables' delta)
  std::vector<std::string> plugin_dirs; // --plugins: directories searched for plugins first
  bool since_any_run = false;           // --since-any-run: --since may name another run's
  std::optional<std::string> weights_from;  // --weights-from: a hook's label (its copy of the weights)
};

int export_checkpoint(const ExportArgs& args);

}  // namespace keel::cli
