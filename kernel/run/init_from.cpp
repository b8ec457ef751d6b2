// [checkpoint] init_from: a warm start from another run's checkpoint (run/resume.hpp).
#include <spdlog/spdlog.h>

#include <filesystem>
#include <optional>
#include <regex>

#include "checkpoint/meta.hpp"
#include "checkpoint/reshard.hpp"
#include "files/files.hpp"
#include "keel/tensor.hpp"
#include "run/resume.hpp"
#include "run/run.hpp"
#include "run/tables.hpp"

namespace fs = std::filesystem;

namespace keel {

namespace {

// The commit record of init_from, verified; none for a directory without one, which only the
// safetensors backend loads unasked (its files hold no code, and its reader checks every
// tensor against the file's size) unless the manifest says init_from_unverified = true.
std::optional<CommitRecord> init_from_record(const RunConfig& cfg) {
  const std::string& dir = cfg.checkpointing.init_from;
  if (!fs::is_directory(dir))
    throw Error("checkpoint.init_from: '" + dir + "' is not a checkpoint directory; hint: point "
                "it at runs/<name>/checkpoints/step-<N>");
  if (fs::exists(fs::path(dir) / "commit.json")) {
    try {
      return verify_checkpoint(dir);
    } catch (const Error& e) {
      throw Error(std::string("checkpoint.init_from: ") + e.what());
    }
  }
  const Component* backend = cfg.checkpoint ? cfg.checkpoint->component : nullptr;
  const bool safetensors = backend && backend->name == "safetensors" && backend->plugin &&
                           backend->plugin->name == "keel-safetensors";
  if (!safetensors && !cfg.checkpointing.init_from_unverified)
    throw Error("checkpoint.init_from: '" + dir + "' has no commit record (commit.json: not "
                "committed by keel), and only the safetensors backend loads such a directory "
                "unasked, not " + (backend ? backend->label() : std::string("this backend")) +
                "; hint: if you trust its files, set [checkpoint] init_from_unverified = true "
                "(or --set checkpoint.init_from_unverified=true)");
  spdlog::warn("checkpoint.init_from: {} has no commit record (not committed by keel): its "
               "files are loaded unverified", dir);
  return std::nullopt;
}

// `keel evaluate`: the model is the checkpoint's, so the progress is put at the checkpoint's
// step (its commit record's) and at the epoch that step belonged to (trainer_state.toml's epoch
// is the next one when the checkpoint was saved at an epoch's end, with no batch of it taken),
// so that the evaluation's record carries the step and epoch of the training record of the
// same weights.
void position_at_checkpoint(Run& run, const CommitRecord& rec, const std::string& dir) {
  keel_trainer_state& p = run.progress;
  p.step = rec.step;
  const fs::path meta_path = fs::path(dir) / "trainer_state.toml";
  if (!fs::exists(meta_path)) return;
  const CheckpointMeta m = read_checkpoint_meta(read_file(meta_path.string()), meta_path.string());
  p.epoch = m.epoch > 0 && m.epoch_batches == 0 && m.step > 0 ? m.epoch - 1 : m.epoch;
}

}  // namespace

void load_init_from(Run& run) {
  const RunConfig& cfg = run.config;
  const std::string& dir = cfg.checkpointing.init_from;
  const std::optional<CommitRecord> rec = init_from_record(cfg);
  const std::regex include(cfg.checkpointing.init_include), exclude(cfg.checkpointing.init_exclude);
  TensorList into;
  std::vector<std::string> kept;
  for (const auto& nt : run.parameters.model_state) {
    const std::string name = nt.name;
    if ((!cfg.checkpointing.init_include.empty() && !std::regex_search(name, include)) ||
        (!cfg.checkpointing.init_exclude.empty() && std::regex_search(name, exclude))) {
      kept.push_back(name);
      continue;
    }
    std::string stored = name;  // the checkpoint's name: init_rename maps it to the model's
    for (const auto& [from, to] : cfg.checkpointing.init_rename)
      if (name.rfind(to, 0) == 0) {
        stored = from + name.substr(to.size());
        break;
      }
    into.emplace_back(stored, borrow(nt.tensor));
  }
  if (into.empty())
    throw Error("checkpoint.init_from: init_include / init_exclude select none of the model's "
                "tensors; hint: `keel train` logs their names at debug level (--log-level debug)");
  if (rec) {  // from whichever chunks hold them (a checkpoint of any world size and shard mode)
    check_model_tensors(run.components.model.label(), *rec, dir, into,
                        "choose the tensors to load with [checkpoint] init_include / "
                        "init_exclude, and map names with [checkpoint.init_rename]");
    std::vector<ChunkReader::Request> requests;
    for (const auto& [name, t] : into) requests.push_back({"model", name, 0, t});
    ChunkReader(*run.components.backend, dir, *rec).read(requests);
  } else {
    run.components.store->load(dir, "model", into);
  }
  spdlog::info("init_from {}: loaded {} model tensor(s), {} kept their initialisation", dir,
               into.size(), kept.size());
  for (const auto& [name, t] : into) spdlog::debug("  loaded {}", name);
  for (const auto& name : kept) spdlog::debug("  kept {}", name);
  if (rec) load_hook_state(run, *rec, dir, /*fresh_on_mismatch=*/true);
  load_init_tables(run, rec ? &*rec : nullptr, dir);
  if (rec) check_unchanged(dir, *rec);  // every file loaded is still the one verified
  // (Weights without a commit record have no known step: the evaluation records step 0.)
  if (rec && cfg.run.mode == RunMode::kEvaluate) position_at_checkpoint(run, *rec, dir);
}

}  // namespace keel
