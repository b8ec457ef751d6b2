// Third-party losses, built by test_sdk_install.sh against the *installed* SDK only (nothing
// from this source tree is on the include path). Both compute the mean softmax cross-entropy
// over class indices:
//   my_cross_entropy          does not override count_items, so the SDK leaves the optional
//                             keel_loss.count_items slot NULL: "auto" accumulation must fall
//                             back to the mean and "items" must be refused;
//   my_counted_cross_entropy  overrides count_items, so "items" (and "auto") normalise each
//                             optimizer step by the item count of its micro-batches.
#include <ATen/core/Tensor.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/nll_loss.h>

#include <stdexcept>

#include "keel/plugin.hpp"

namespace {

at::Tensor cross_entropy(const at::Tensor& output, const at::Tensor& target, int64_t* count) {
  if (output.dim() != 2 || target.dim() != 1 || target.size(0) != output.size(0))
    throw std::invalid_argument("my_cross_entropy: expected [N, C] logits and [N] class indices");
  *count = target.size(0);
  return at::nll_loss(at::log_softmax(output, 1), target.to(at::kLong));
}

class MyCrossEntropy : public keel::Loss {
 public:
  explicit MyCrossEntropy(const keel::Context&) {}
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target,
                     int64_t* count) override {
    return cross_entropy(output, target, count);
  }
};

class MyCountedCrossEntropy : public keel::Loss {
 public:
  explicit MyCountedCrossEntropy(const keel::Context&) {}
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target,
                     int64_t* count) override {
    return cross_entropy(output, target, count);
  }
  int64_t count_items(const at::Tensor& target) override { return target.size(0); }
};

const keel_component_desc kComponents[] = {
    keel::component<MyCrossEntropy>("my_cross_entropy", "cross-entropy, no item counts"),
    keel::component<MyCountedCrossEntropy>("my_counted_cross_entropy",
                                           "cross-entropy that reports item counts"),
};

}  // namespace

KEEL_PLUGIN("my-losses", "1.0.0", "My losses", kComponents)
