// What changed between the manifest a checkpoint was saved with and the one resuming it.
// LibTorch-free.
#pragma once

#include <string>
#include <vector>

namespace keel {

struct ManifestChange {
  std::string key;       // dotted key: "optimizer.lr", "hooks[1].type"
  std::string before;    // TOML text of the value ("(absent)" when there was none)
  std::string after;
  bool harmless = false;  // does not affect the exactness of resumed training
};

// Every key whose value differs between two resolved manifests (manifest.resolved.toml
// texts), in key order. Harmless: [run] name, output_dir, threads, malloc_tuning and mode;
// [train] log_every, epochs, max_steps, max_samples, max_tokens and the eval_* keys; every
// key of [checkpoint], [[hooks]], [profiler], [mfu], [data.test] and [plugins]. Everything
// else (model, optimizer, data.train, loss, schedule, clipping, seed, batch layout,
// precision, ...) changes what training computes.
std::vector<ManifestChange> manifest_changes(const std::string& saved, const std::string& now);

}  // namespace keel
