#include <sstream>
#include <stdexcept>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/log_softmax.h>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kLabelSmoothing = keel::opt_float(
    "label_smoothing", "0.1",
    "share of the target spread evenly over all classes (0: plain cross-entropy)", 0.0, 1.0);

// Cross-entropy with label smoothing, averaged over the batch: logits [N, C], targets [N]
// (class indices). Each sample's target distribution puts 1 - label_smoothing on its class and
// spreads label_smoothing evenly over all C classes, as torch.nn.CrossEntropyLoss does.
class @{Class} final : public keel::Loss {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx) : smoothing_(ctx.get(kLabelSmoothing)) {}
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target,
                     int64_t* count) override {
    if (output.dim() != 2 || target.dim() != 1 || target.size(0) != output.size(0)) {
      std::ostringstream s;
      s << "expected logits [N, C] and class indices [N], got " << output.sizes() << " and "
        << target.sizes() << "; hint: use a model that outputs one logit per class";
      throw std::invalid_argument(s.str());
    }
    *count = target.size(0);  // the loss is the mean over these items
    const at::Tensor log_p = at::log_softmax(output, 1);
    const at::Tensor nll = -log_p.gather(1, target.to(at::kLong).unsqueeze(1)).squeeze(1);
    const at::Tensor uniform = -log_p.mean(1);
    return ((1 - smoothing_) * nll + smoothing_ * uniform).mean();
  }
  // Lets gradient accumulation weigh each micro-batch by its item count.
  int64_t count_items(const at::Tensor& target) override { return target.size(0); }

  // Evaluation records also get `accuracy`. Its state is sums the kernel can add up over
  // batches and ranks, {correct, rows}; metric_finish turns the totals into the value.
  size_t metric_state_size() override { return 2; }
  void metric_update(const at::Tensor& output, const at::Tensor& target, double /*loss*/,
                     int64_t /*count*/, keel::MetricState state) override {
    state[0] += static_cast<double>(output.argmax(1).eq(target).sum().item<int64_t>());
    state[1] += static_cast<double>(target.size(0));
  }
  keel::Metrics metric_finish(const std::vector<double>& state) override {
    if (state[1] == 0) return {};  // nothing evaluated: no accuracy
    return {{"accuracy", state[0] / state[1]}};
  }

 private:
  double smoothing_;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kLabelSmoothing};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
