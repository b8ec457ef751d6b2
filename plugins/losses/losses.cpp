// loss components: cross_entropy, computed by torch::nn::functional::cross_entropy (what
// PyTorch's F.cross_entropy calls), always with reduction = mean.
#include <sstream>
#include <string>

#include "keel/plugin.hpp"

namespace {

namespace F = torch::nn::functional;

class CrossEntropy : public keel::Loss {
 public:
  explicit CrossEntropy(const keel::Context& ctx)
      : options_(F::CrossEntropyFuncOptions()
                     .ignore_index(ctx.get_int("ignore_index"))
                     .label_smoothing(ctx.get_float("label_smoothing"))
                     .reduction(torch::kMean)) {}

  // output: logits [N, C] or [N, C, d1, ...]; target: class indices [N] or [N, d1, ...] (any
  // integer type), or class probabilities shaped like the output.
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) override {
    if (target.is_floating_point()) {
      check(target.sizes() == output.sizes(), output, target);
      *count = output.dim() < 2 ? 1 : output.numel() / std::max<int64_t>(1, output.size(1));
      return F::cross_entropy(output, target, options_);
    }
    std::vector<int64_t> expected = output.sizes().vec();
    if (!expected.empty()) expected.erase(expected.begin() + (expected.size() > 1 ? 1 : 0));
    check(target.sizes() == at::IntArrayRef(expected), output, target);
    const at::Tensor labels = target.to(at::kLong);
    *count = labels.ne(options_.ignore_index()).sum().item<int64_t>();
    return F::cross_entropy(output, labels, options_);
  }

  // Targets that count: class indices other than ignore_index, or rows of probabilities.
  int64_t count_items(const at::Tensor& target) override {
    if (target.is_floating_point())
      return target.dim() < 2 ? 1 : target.numel() / std::max<int64_t>(1, target.size(1));
    return target.ne(options_.ignore_index()).sum().item<int64_t>();
  }

 private:
  static void check(bool ok, const at::Tensor& output, const at::Tensor& target) {
    if (ok) return;
    std::ostringstream s;
    s << "cross_entropy: model output " << output.sizes() << " and target " << target.sizes()
      << " do not match: the target must hold one class index per row of the output ([N] for "
         "[N, C] logits) or class probabilities shaped like the output; hint: check the "
         "model's num_classes and the dataset's targets";
    throw std::invalid_argument(s.str());
  }

  F::CrossEntropyFuncOptions options_;
};

const keel_option_desc kOptions[] = {
    keel::opt_int("ignore_index", "-100", "target value that is ignored (not averaged over)"),
    keel::opt_float("label_smoothing", "0.0", "mass spread uniformly over all classes", 0, 1),
};
const keel_component_desc kComponents[] = {
    keel::component<CrossEntropy>("cross_entropy", "softmax cross-entropy, mean over targets",
                                  kOptions),
};

}  // namespace

KEEL_PLUGIN("keel-losses", "0.1.0", "Loss functions", kComponents)
