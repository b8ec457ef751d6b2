// The checkpoint store's backend (checkpoint/backend.hpp) over a keel_checkpoint plugin
// instance: the store's save and load become the instance's save and load slots.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/backend.hpp"
#include "components.hpp"

namespace keel {

class PluginCheckpointBackend final : public CheckpointBackend {
 public:
  // `instance` outlives this backend.
  explicit PluginCheckpointBackend(const Instance<keel_checkpoint>& instance)
      : instance_(instance) {}

  const std::string& label() const override { return instance_.label(); }
  void save(const std::string& dir, const std::string& stem,
            const std::vector<keel_named_tensor>& tensors) const override {
    instance_.call("save", instance_->save, dir.c_str(), stem.c_str(), tensors.data(),
                   tensors.size());
  }
  void load(const std::string& dir, const std::string& stem,
            const std::vector<keel_named_tensor>& into) const override {
    instance_.call("load", instance_->load, dir.c_str(), stem.c_str(), into.data(), into.size());
  }

 private:
  const Instance<keel_checkpoint>& instance_;
};

}  // namespace keel
