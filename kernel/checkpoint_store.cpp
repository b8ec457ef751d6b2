#include "checkpoint_store.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "error.hpp"

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
    CheckpointMeta saved = meta;
    saved.objects = {"model"};
    if (!hook_state.empty()) saved.objects.push_back("hooks");
    std::ofstream state(staging / "trainer_state.toml");
    state << write_checkpoint_meta(saved);
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

CheckpointMeta CheckpointStore::load(const std::string& dir,
                                    const std::vector<keel_named_tensor>& model_state,
                                    const std::vector<keel_named_tensor>& hook_state) const {
  if (!fs::is_directory(dir))
    throw Error("checkpoint.init_from: '" + dir + "' is not a checkpoint directory; hint: point "
                "it at runs/<name>/checkpoints/step-<N>");
  // trainer_state.toml first: a corrupt one fails before any tensor is touched.
  const fs::path meta_path = fs::path(dir) / "trainer_state.toml";
  CheckpointMeta meta;
  if (fs::exists(meta_path)) {
    std::ifstream in(meta_path, std::ios::binary);
    if (!in) throw Error(meta_path.string() + ": cannot read checkpoint metadata");
    std::stringstream text;
    text << in.rdbuf();
    meta = read_checkpoint_meta(text.str(), meta_path.string());
  } else if (!hook_state.empty()) {
    throw Error(meta_path.string() + ": missing; hint: init_from needs a checkpoint directory "
                "committed by keel (runs/<name>/checkpoints/step-<N>)");
  }
  backend_->call("load", (*backend_)->load, dir.c_str(), "model", model_state.data(),
                 model_state.size());
  // Hook state is loaded only when the checkpoint has it (trainer_state.toml lists "hooks").
  if (hook_state.empty() ||
      std::find(meta.objects.begin(), meta.objects.end(), "hooks") == meta.objects.end())
    return meta;
  backend_->call("load", (*backend_)->load, dir.c_str(), "hooks", hook_state.data(),
                 hook_state.size());
  return meta;
}

}  // namespace keel
