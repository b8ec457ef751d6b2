// model components: mlp and cnn (the Fashion-MNIST reference net).
//
// FLOPs convention (flops_per_sample): one multiply-accumulate (MAC) counts as 2 FLOPs and only
// the MACs of linear and conv layers are counted (bias, activations, pooling and dropout are
// ignored). Per sample:
//   linear(in -> out)                     forward FLOPs = 2 * in * out
//   conv(c_in -> c_out, k x k, H_out x W_out) forward FLOPs = 2 * c_in * c_out * k * k * H_out *
//   W_out
// and a training step (forward + backward) costs 3 x forward: the backward pass computes the
// gradients of both inputs and weights, each as many MACs as the forward.
//
// Layers are named ("fc1", "conv1", ...) so parameter names are stable: "fc1.weight", ...
// Parameters use LibTorch's default initialisation (as PyTorch's), drawn from the global
// generator, which the kernel seeds before it creates the model.
#include <numeric>
#include <string>
#include <vector>

#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/tanh.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "keel/module_model.hpp"
#include "keel/plugin.hpp"
#include "keel/tensor.hpp"

namespace {

namespace text = keel::text;

namespace nn = torch::nn;

nn::AnyModule make_activation(const std::string& name) {
  if (name == "gelu") return nn::AnyModule(nn::GELU());
  if (name == "tanh") return nn::AnyModule(nn::Tanh());
  return nn::AnyModule(nn::ReLU());
}

// Options, each declared once per model (the two declare num_classes, dropout and hidden with
// their own defaults or types): the schemas at the end list them, the models read them as the
// types they declare (ctx.get).
namespace mlp {
constexpr auto kInputShape =
    keel::opt_int_list("input_shape", "[1, 28, 28]", "per-sample input shape (flattened)", 1, 1e9);
constexpr auto kHidden =
    keel::opt_int_list("hidden", "[256, 128]", "widths of the hidden layers", 1, 1e9);
constexpr auto kNumClasses = keel::opt_int("num_classes", "10", "output width", 1, 1e9);
constexpr auto kActivation =
    keel::opt_string("activation", "\"relu\"", "hidden-layer activation", "relu|gelu|tanh");
constexpr auto kDropout =
    keel::opt_float("dropout", "0.0", "dropout after each hidden activation", 0, 1);
}  // namespace mlp
namespace cnn {
constexpr auto kInChannels = keel::opt_int("in_channels", "1", "input channels", 1, 1e6);
constexpr auto kImageSize =
    keel::opt_int("image_size", "28", "input height and width (divisible by 4)", 4, 1e6);
constexpr auto kNumClasses = keel::opt_int("num_classes", "10", "output width", 1, 1e9);
constexpr auto kDropout =
    keel::opt_float("dropout", "0.4", "dropout before the output layer", 0, 1);
constexpr auto kHidden =
    keel::opt_int("hidden", "1024", "width of the fully connected layer", 1, 1e9);
}  // namespace cnn

class Mlp : public keel::ModuleModel<nn::Sequential> {
 public:
  explicit Mlp(const keel::Context& ctx) : ModuleModel(nn::Sequential()) {
    input_shape_ = ctx.get(mlp::kInputShape);
    if (input_shape_.empty())
      throw std::runtime_error(
          "mlp: input_shape is empty; hint: give the per-sample shape, "
          "e.g. input_shape = [1, 28, 28]");
    in_features_ = std::accumulate(input_shape_.begin(), input_shape_.end(), int64_t{1},
                                   std::multiplies<int64_t>());
    if (in_features_ < 1)
      throw std::runtime_error("mlp: input_shape " + text::shape(input_shape_) +
                               " has no elements; hint: every extent must be >= 1");
    const std::string activation = ctx.get(mlp::kActivation);
    const double dropout = ctx.get(mlp::kDropout);

    std::vector<int64_t> widths = ctx.get(mlp::kHidden);
    widths.insert(widths.begin(), in_features_);
    widths.push_back(ctx.get(mlp::kNumClasses));
    const size_t layers = widths.size() - 1;
    for (size_t i = 0; i < layers; ++i) {
      const std::string id = std::to_string(i + 1);
      nn::Linear fc(widths[i], widths[i + 1]);
      module_->push_back("fc" + id, fc);
      forward_flops_ += 2.0 * static_cast<double>(widths[i] * widths[i + 1]);
      steps_.push_back({fc, false});
      if (i + 1 == layers) break;  // no activation after the output layer
      module_->push_back("act" + id, make_activation(activation));
      steps_.push_back({nullptr, true});
      if (dropout > 0) module_->push_back("drop" + id, nn::Dropout(dropout));
    }
    activation_ = activation == "gelu" ? Act::kGelu : activation == "tanh" ? Act::kTanh : Act::kRelu;
    dropout_ = dropout;
  }

  at::Tensor forward(const at::Tensor& input) override {
    if (input.dim() < 1 || input.numel() != input.size(0) * in_features_)
      throw std::runtime_error("mlp: expected inputs of shape [N, " +
                               text::shape(input_shape_).substr(1) + " (" +
                               std::to_string(in_features_) + " values per sample), got " +
                               text::shape(input.sizes()) + "; hint: set [model] input_shape");
    // The Sequential's layers, called directly: nn::Sequential::forward dispatches each one
    // through AnyModule (type-erased arguments and results), measurable at this model's size.
    at::Tensor x = input.reshape({input.size(0), in_features_});
    for (Step& step : steps_) {
      if (!step.activation) {
        x = step.fc->forward(x);
        continue;
      }
      x = activation_ == Act::kGelu ? at::gelu(x) : activation_ == Act::kTanh ? at::tanh(x) : at::relu(x);
      if (dropout_ > 0) x = at::dropout(x, dropout_, module_->is_training());
    }
    return x;
  }
  double flops_per_sample() override { return 3.0 * forward_flops_; }

 private:
  // One Linear layer, or the activation (and dropout) after it.
  struct Step {
    nn::Linear fc;
    bool activation;
  };
  std::vector<Step> steps_;
  enum class Act { kRelu, kGelu, kTanh } activation_ = Act::kRelu;
  double dropout_ = 0;
  std::vector<int64_t> input_shape_;
  int64_t in_features_ = 0;
  double forward_flops_ = 0;
};

class Cnn : public keel::ModuleModel<nn::Sequential> {
 public:
  explicit Cnn(const keel::Context& ctx)
      : ModuleModel(nn::Sequential()),
        in_channels_(ctx.get(cnn::kInChannels)),
        size_(ctx.get(cnn::kImageSize)) {
    if (size_ % 4 != 0)
      throw std::runtime_error("cnn: image_size " + std::to_string(size_) +
                               " is not divisible by 4 (two 2x2 max-pools); hint: pad or "
                               "resize the images, e.g. image_size = 28");
    const int64_t hidden = ctx.get(cnn::kHidden), classes = ctx.get(cnn::kNumClasses);
    const int64_t s2 = size_ / 2, s4 = size_ / 4, flat = 64 * s4 * s4;
    auto conv = [](int64_t in, int64_t out) {
      return nn::Conv2d(nn::Conv2dOptions(in, out, 5).padding(2));
    };
    module_->push_back("conv1", conv(in_channels_, 32));
    module_->push_back("relu1", nn::ReLU());
    module_->push_back("pool1", nn::MaxPool2d(2));
    module_->push_back("conv2", conv(32, 64));
    module_->push_back("relu2", nn::ReLU());
    module_->push_back("pool2", nn::MaxPool2d(2));
    module_->push_back("flatten", nn::Flatten());
    module_->push_back("fc1", nn::Linear(flat, hidden));
    module_->push_back("relu3", nn::ReLU());
    module_->push_back("dropout", nn::Dropout(ctx.get(cnn::kDropout)));
    module_->push_back("fc2", nn::Linear(hidden, classes));
    const double macs =
        static_cast<double>(in_channels_ * 32 * 25 * size_ * size_ + 32 * 64 * 25 * s2 * s2 +
                            flat * hidden + hidden * classes);
    forward_flops_ = 2.0 * macs;
  }

  at::Tensor forward(const at::Tensor& input) override {
    if (input.dim() != 4 || input.size(1) != in_channels_ || input.size(2) != size_ ||
        input.size(3) != size_)
      throw std::runtime_error("cnn: expected inputs of shape [N, " + std::to_string(in_channels_) +
                               ", " + std::to_string(size_) + ", " + std::to_string(size_) +
                               "], got " + text::shape(input.sizes()) +
                               "; hint: set [model] in_channels and image_size");
    return module_->forward(input);
  }
  double flops_per_sample() override { return 3.0 * forward_flops_; }

 private:
  int64_t in_channels_, size_;
  double forward_flops_ = 0;
};

const keel_option_desc kMlpOptions[] = {mlp::kInputShape, mlp::kHidden, mlp::kNumClasses,
                                       mlp::kActivation, mlp::kDropout};
const keel_option_desc kCnnOptions[] = {cnn::kInChannels, cnn::kImageSize, cnn::kNumClasses,
                                        cnn::kDropout, cnn::kHidden};
const keel_component_desc kComponents[] = {
    keel::component<Mlp>("mlp", "multi-layer perceptron over flattened inputs", kMlpOptions),
    keel::component<Cnn>("cnn",
                         "Fashion-MNIST reference CNN: 2 x (conv5x5 + relu + maxpool), "
                         "fc + relu + dropout, fc",
                         kCnnOptions),
};

}  // namespace

KEEL_PLUGIN("keel-models", "0.1.0", "Reference models: MLP and the Fashion-MNIST CNN", kComponents)
