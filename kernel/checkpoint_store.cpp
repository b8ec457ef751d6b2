#include "checkpoint_store.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <toml++/toml.h>

#include "error.hpp"
#include "manifest.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

// The step of a committed checkpoint directory name "step-<N>", or -1.
int64_t step_of(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("step-", 0) != 0) return -1;
  const std::string digits = name.substr(5);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

}  // namespace

std::vector<std::string> CheckpointStore::committed() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const int64_t s = step_of(e.path());
    if (s >= 0 && e.is_directory()) found.emplace_back(s, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string CheckpointStore::save(const std::vector<keel_named_tensor>& model_state,
                                  const std::vector<keel_named_tensor>& hook_state,
                                  const CheckpointMeta& meta) {
  const fs::path final_dir = fs::path(root_) / ("step-" + std::to_string(meta.step));
  const fs::path staging = fs::path(root_) / (".step-" + std::to_string(meta.step) + ".tmp");
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging);
  try {
    backend_->call("save", (*backend_)->save, staging.c_str(), "model", model_state.data(),
                   model_state.size());
    if (!hook_state.empty())
      backend_->call("save", (*backend_)->save, staging.c_str(), "hooks", hook_state.data(),
                     hook_state.size());
    std::ofstream state(staging / "trainer_state.toml");
    state << "step = " << meta.step << "\nepoch = " << meta.epoch << "\nsamples = " << meta.samples
          << "\ntokens = " << meta.tokens << "\nobjects = [\"model\""
          << (hook_state.empty() ? "" : ", \"hooks\"") << "]\n";
    state.close();
    if (!state) throw Error("cannot write " + (staging / "trainer_state.toml").string());
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step
    fs::rename(staging, final_dir);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  if (keep_last_ > 0) {
    auto all = committed();
    for (size_t i = 0; i + static_cast<size_t>(keep_last_) < all.size(); ++i)
      fs::remove_all(all[i], ec);
  }
  return final_dir.string();
}

void CheckpointStore::load(const std::string& dir,
                           const std::vector<keel_named_tensor>& model_state,
                           const std::vector<keel_named_tensor>& hook_state) const {
  if (!fs::is_directory(dir))
    throw Error("checkpoint.init_from: '" + dir + "' is not a checkpoint directory; hint: point "
                "it at runs/<name>/checkpoints/step-<N>");
  backend_->call("load", (*backend_)->load, dir.c_str(), "model", model_state.data(),
                 model_state.size());
  if (hook_state.empty()) return;
  // Hook state is loaded only when the checkpoint has it (trainer_state.toml lists "hooks").
  const fs::path meta = fs::path(dir) / "trainer_state.toml";
  bool has_hooks = false;
  try {
    const toml::table state = toml::parse_file(meta.string());
    if (const toml::array* objects = state["objects"].as_array())
      for (const auto& o : *objects) has_hooks = has_hooks || o.value<std::string>() == "hooks";
  } catch (const toml::parse_error& e) {
    throw Error(where(e.source()) + ": invalid checkpoint metadata: " +
                std::string(e.description()));
  }
  if (!has_hooks) return;
  backend_->call("load", (*backend_)->load, dir.c_str(), "hooks", hook_state.data(),
                 hook_state.size());
}

}  // namespace keel
