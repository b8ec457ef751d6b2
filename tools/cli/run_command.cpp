// keel train, evaluate and validate MANIFEST: the manifest resolved into a run's configuration,
// then checked (validate) or run (trainer.hpp).
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <toml++/toml.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "blas.hpp"
#include "checkpoint/store.hpp"
#include "cli/commands.hpp"
#include "distributed/launch.hpp"
#include "error.hpp"
#include "loader/registry.hpp"
#include "log.hpp"
#include "manifest.hpp"
#include "run_config.hpp"
#include "run/trainer.hpp"
#include "text/text.hpp"

namespace fs = std::filesystem;

namespace keel::cli {
namespace {

// The one MANIFEST of `keel train|evaluate|validate`, or a UsageError.
const std::string& manifest_argument(const std::string& command, const Parsed& p) {
  if (p.positional.empty()) {
    for (const auto& set : p.sets)
      if (set.find('=') == std::string::npos)  // `keel train --set m.toml`
        throw UsageError("--set " + set + ": --set took '" + set + "' as its KEY=VALUE, and "
                         "`keel " + command + "` has no MANIFEST; hint: keel " + command +
                         " MANIFEST --set KEY=VALUE",
                         command);
    throw UsageError("keel " + command + ": needs a MANIFEST (a .toml file); hint: keel " +
                         command + " configs/quickstart.toml",
                     command);
  }
  if (p.positional.size() > 1)
    throw UsageError(p.positional[1] + ": unexpected argument (`keel " + command +
                         "` takes one MANIFEST); hint: overrides go after --set, e.g. --set "
                         "optimizer.lr=3e-4",
                     command);
  if (p.positional[0].empty())
    throw UsageError("keel " + command + ": MANIFEST is an empty string; hint: name a .toml "
                     "file, e.g. keel " + command + " configs/quickstart.toml",
                     command);
  return p.positional[0];
}

// An evaluation without [checkpoint] init_from evaluates the run's newest verified checkpoint
// (CheckpointStore::newest_verified), said in one console line and written into the resolved
// manifest; with none, it is refused (freshly initialised weights are not worth evaluating).
void choose_evaluated_checkpoint(RunConfig& cfg, const std::string& manifest) {
  if (cfg.run.mode != RunMode::kEvaluate || !cfg.checkpointing.init_from.empty()) return;
  // No [checkpoint] table: its training saved nothing, and no backend could read weights.
  if (!cfg.checkpoint)
    throw Error(manifest + ": nothing to evaluate: the manifest has no [checkpoint] table, so "
                "training it saves no checkpoint (and no backend reads one); hint: add "
                "[checkpoint] with type = \"safetensors\" (at_end = true, the default, saves "
                "when training ends; every_steps = N or every_epochs = N also saves during it), "
                "train it (keel train " + manifest + " --overwrite), then evaluate");
  const std::string root = (fs::path(cfg.run.output_dir) / "checkpoints").string();
  const auto newest = CheckpointStore::newest_verified(
      root, [](const std::string& dir, const Error& e) {
        spdlog::warn("evaluate: skipping {}: {}", dir, e.what());
      });
  if (!newest)
    throw Error(manifest + ": nothing to evaluate: [checkpoint] init_from is not set and " +
                root + " holds no verified checkpoint; hint: name the weights with --set "
                "checkpoint.init_from=DIR (runs/<name>/checkpoints/step-<N>) or [checkpoint] "
                "init_from, or train the run first: keel train " + manifest);
  cfg.checkpointing.init_from = newest->dir;
  if (toml::table* t = cfg.resolved["checkpoint"].as_table())
    t->insert_or_assign("init_from", newest->dir);
  spdlog::info("evaluating {} (step {}), the newest verified checkpoint of the run, as "
               "[checkpoint] init_from is not set (set it to evaluate another checkpoint)",
               newest->dir, newest->record.step);
}

// The command that continues a stopped training run: keel as it was run, its manifest and every
// --set, then --resume (the newest checkpoint of the run directory those name).
std::string continue_command(const std::string& manifest, const std::vector<std::string>& sets) {
  std::string command = call_state().program + " train " + text::shell_word(manifest);
  for (const auto& set : sets) command += " --set " + text::shell_word(set);
  return command + " --resume";
}

// The process's peak resident memory so far, in MiB (getrusage's ru_maxrss, KiB on Linux): in
// `keel train` the run's peak; in a process that runs several (keel_inproc), the highest so far.
double peak_rss_mib() {
  rusage usage{};
  return getrusage(RUSAGE_SELF, &usage) == 0 ? usage.ru_maxrss / 1024.0 : 0.0;
}

// Sets the process up for the run (threads, malloc; cli_main puts the thread counts back),
// trains or evaluates, and says how it ended. Returns the exit status.
int run_trainer(const RunConfig& cfg, const std::string& manifest,
                const std::vector<std::string>& sets) {
  CallState& call = call_state();
  call.torch_threads_before = at::get_num_threads();
  call.blas_threads_before = blas_threads();
  apply_process_settings(cfg);
  Trainer trainer(cfg);
  RunSummary s;
  try {
    s = trainer.train();
  } catch (const std::exception& e) {
    // run.log ends with why the run ended (main prints it on stderr itself).
    const auto* c10 = dynamic_cast<const c10::Error*>(&e);
    run_log_only(spdlog::level::err,
                 "run failed: " + text::one_line(c10 ? c10->what_without_backtrace() : e.what()));
    throw;
  }
  if (cfg.run.mode == RunMode::kEvaluate)
    spdlog::info("done: evaluation loss {:.4f}{} ({}{}), peak RSS {:.1f} MiB, run directory {}",
                 s.eval_loss,
                 s.eval_accuracy >= 0 ? fmt::format(", accuracy {:.4f}", s.eval_accuracy) : "",
                 s.eval_set, cfg.eval_sets.size() > 1 ? "; every set's record: metrics.jsonl" : "",
                 peak_rss_mib(), s.run_dir);
  else
    spdlog::info("done: {} steps, {} samples, peak RSS {:.1f} MiB, run directory {}", s.steps,
                 s.samples, peak_rss_mib(), s.run_dir);
  if (s.stop_signal) {
    // Documented in docs/checkpoints.md ("Preemption"): 128 + the signal, as a shell reports a
    // process the signal ended, after the checkpoint of the last step was committed.
    spdlog::warn("stopped by {}; continue with: {}", s.stop_signal == SIGTERM ? "SIGTERM" : "SIGINT",
                 continue_command(manifest, sets));
    return 128 + s.stop_signal;
  }
  return 0;
}

}  // namespace

int run_manifest_command(const std::string& command, const Parsed& p) {
  const std::string& manifest = manifest_argument(command, p);
  std::vector<std::string> sets = p.sets;
  if (command == "evaluate") sets.push_back("run.mode=evaluate");
  const char* verb = command == "train" ? "training" : command == "evaluate" ? "evaluating"
                                                                               : "validating";
  call_state().activity = std::string("while ") + verb + " " + manifest;

  Registry registry;  // declared first: libraries outlive every instance
  const Manifest m = load_manifest(manifest, sets);
  spdlog::debug("manifest {} read ({} --set override{})", manifest, sets.size(),
                sets.size() == 1 ? "" : "s");
  RunConfig cfg = resolve(m, registry);
  if (p.resume) {
    cfg.resume = p.resume->empty() ? RunConfig::Resume::kLatest : RunConfig::Resume::kPath;
    cfg.resume_path = *p.resume;
    cfg.resume_changed = p.resume_changed;
  }
  cfg.overwrite = p.overwrite;
  log_registry(registry);
  spdlog::debug("run '{}' -> {}", cfg.run.name, cfg.run.output_dir);
  if (command == "validate") {
    // What `keel evaluate` (run.mode = "evaluate") would evaluate, or its refusal.
    choose_evaluated_checkpoint(cfg, manifest);
    check_run(cfg);
    std::printf("%s: ok (run '%s' -> %s)\n", cfg.manifest_path.c_str(), cfg.run.name.c_str(),
                cfg.run.output_dir.c_str());
    return 0;
  }
  if (const auto launch = detect_launch(); launch && launch->world_size > 1) {
    set_log_rank(launch->rank);
    call_state().rank_prefix = "rank " + std::to_string(launch->rank) + ": ";
  }
  choose_evaluated_checkpoint(cfg, manifest);
  return run_trainer(cfg, manifest, p.sets);
}

}  // namespace keel::cli
