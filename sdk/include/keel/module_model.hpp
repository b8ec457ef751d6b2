// keel::ModuleModel: adapts a torch::nn module holder (torch::nn::Sequential, or your own
// TORCH_MODULE) to keel::Model. Parameters and buffers come from the module itself.
#pragma once

#include <torch/nn/module.h>

#include "keel/plugin.hpp"

namespace keel {

template <class ModuleHolder>
class ModuleModel : public Model {
 public:
  explicit ModuleModel(ModuleHolder module) : module_(std::move(module)) {}

  at::Tensor forward(const at::Tensor& input) override { return module_->forward(input); }
  void set_training(bool training) override { module_->train(training); }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto& p : module_->named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
    return out;
  }
  NamedTensors named_state() override {
    NamedTensors out = named_parameters();
    for (const auto& b : module_->named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value());
    return out;
  }

 protected:
  ModuleHolder module_;
};

}  // namespace keel
