// loss components, all a mean over their items (reduction = mean):
//   cross_entropy          torch::nn::functional::cross_entropy (what PyTorch's F.cross_entropy
//                          calls), classes along `class_dim` (default 1: [N, C] logits)
//   token_cross_entropy    per-token cross entropy of a language model: [batch, time, vocab]
//                          logits, [batch, time] next-token ids (cross_entropy, class_dim = -1)
//   chunked_cross_entropy  the same value and gradient, computed over chunks of `chunk_tokens`
//                          tokens so that no full-size log-softmax is kept for the backward
//                          (MindSpeed-LLM's chunk loss; see ChunkedCrossEntropy below)
#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>

#include "keel/plugin.hpp"

namespace {

namespace F = torch::nn::functional;

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream s;
  s << shape;
  return s.str();
}

// Class indices along `class_dim` of `output`: the target must be the output's shape without
// that dimension. Throws one line naming both shapes otherwise. Returns the non-negative dim.
int64_t check_index_target(const char* who, const at::Tensor& output, const at::Tensor& target,
                           int64_t class_dim) {
  const int64_t nd = output.dim();
  if (nd < 1 || class_dim < -nd || class_dim >= nd)
    throw std::invalid_argument(std::string(who) + ": class_dim = " + std::to_string(class_dim) +
                                " is out of range for a model output of shape " +
                                shape_str(output.sizes()) + "; hint: class_dim counts from 0 " +
                                "(1 for [N, C] logits) or from the end (-1 for [batch, time, vocab])");
  const int64_t dim = class_dim < 0 ? class_dim + nd : class_dim;
  std::vector<int64_t> expected = output.sizes().vec();
  expected.erase(expected.begin() + dim);
  if (target.sizes() != at::IntArrayRef(expected))
    throw std::invalid_argument(std::string(who) + ": model output " + shape_str(output.sizes()) +
                                " and target " + shape_str(target.sizes()) +
                                " do not match: with class_dim = " + std::to_string(class_dim) +
                                " the target must be " + shape_str(expected) +
                                " (one class index per position); hint: check the model's "
                                "output size and the dataset's targets");
  return dim;
}

class CrossEntropy : public keel::Loss {
 public:
  explicit CrossEntropy(const keel::Context& ctx)
      : class_dim_(ctx.get_int("class_dim")),
        options_(F::CrossEntropyFuncOptions()
                     .ignore_index(ctx.get_int("ignore_index"))
                     .label_smoothing(ctx.get_float("label_smoothing"))
                     .reduction(torch::kMean)) {}

  // output: logits with the classes along class_dim; target: class indices shaped like the
  // output without class_dim (any integer type), or class probabilities shaped like the output.
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) override {
    if (target.is_floating_point()) {
      if (target.sizes() != output.sizes())
        throw std::invalid_argument("cross_entropy: model output " + shape_str(output.sizes()) +
                                    " and target " + shape_str(target.sizes()) +
                                    " do not match: class probabilities must be shaped like the "
                                    "output; hint: check the model's output size and the "
                                    "dataset's targets");
      const int64_t dim = check_dim(output);
      *count = output.dim() < 2 ? 1 : output.numel() / std::max<int64_t>(1, output.size(dim));
      return F::cross_entropy(to_class_dim_1(output, dim), to_class_dim_1(target, dim), options_);
    }
    const int64_t dim = check_index_target("cross_entropy", output, target, class_dim_);
    const at::Tensor labels = target.to(at::kLong);
    *count = labels.ne(options_.ignore_index()).sum().item<int64_t>();
    return F::cross_entropy(to_class_dim_1(output, dim), labels, options_);
  }

  // Targets that count: class indices other than ignore_index, or rows of probabilities.
  int64_t count_items(const at::Tensor& target) override {
    if (target.is_floating_point()) {
      const int64_t dim = class_dim_ < 0 ? class_dim_ + target.dim() : class_dim_;
      return target.dim() < 2 ? 1 : target.numel() / std::max<int64_t>(1, target.size(dim));
    }
    return target.ne(options_.ignore_index()).sum().item<int64_t>();
  }

 private:
  int64_t check_dim(const at::Tensor& output) const {
    const int64_t nd = output.dim();
    if (nd >= 1 && class_dim_ >= -nd && class_dim_ < nd) return class_dim_ < 0 ? class_dim_ + nd : class_dim_;
    throw std::invalid_argument("cross_entropy: class_dim = " + std::to_string(class_dim_) +
                                " is out of range for a model output of shape " +
                                shape_str(output.sizes()));
  }
  // F::cross_entropy takes the classes in dimension 1 (or 0 for a 1-d output).
  static at::Tensor to_class_dim_1(const at::Tensor& t, int64_t dim) {
    return (t.dim() < 2 || dim == 1) ? t : t.movedim(dim, 1);
  }

  int64_t class_dim_;
  F::CrossEntropyFuncOptions options_;
};

// Mean cross entropy of rows of logits [n, v] against ids [n], ignoring `ignore_index`,
// computed chunk by chunk. Forward walks chunks of `chunk` rows: for each it computes the
// log-softmax in float64, adds the chunk's loss, and writes the chunk's gradient of the mean,
// (softmax - onehot) / count, into one gradient buffer shaped like the logits. Backward scales
// that buffer by the incoming gradient. What autograd would keep for F::cross_entropy is the
// full [n, v] log-softmax (plus the full-size temporaries of its backward); here the only
// full-size tensor besides the logits is the gradient buffer, which backward has to produce
// anyway, and the float64 temporaries are [chunk, v].
class ChunkedCrossEntropyFn : public torch::autograd::Function<ChunkedCrossEntropyFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& ids, int64_t ignore_index, int64_t chunk,
                            int64_t count) {
    at::NoGradGuard no_grad;
    const int64_t n = logits.size(0);
    at::Tensor grad = at::empty_like(logits);
    at::Tensor total = at::zeros({}, logits.options().dtype(at::kDouble));
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t end = std::min(n, begin + chunk);
      const at::Tensor z = logits.slice(0, begin, end).to(at::kDouble);
      const at::Tensor y = ids.slice(0, begin, end);
      const at::Tensor keep = y.ne(ignore_index);
      const at::Tensor safe = at::where(keep, y, at::zeros_like(y));
      const at::Tensor logp = at::log_softmax(z, 1);
      const at::Tensor picked = logp.gather(1, safe.unsqueeze(1)).squeeze(1);
      total.sub_(at::where(keep, picked, at::zeros_like(picked)).sum());
      // d(mean)/dz = (softmax - onehot) / count on kept rows, 0 on ignored ones.
      at::Tensor g = logp.exp();
      g.scatter_add_(1, safe.unsqueeze(1), at::full({end - begin, 1}, -1.0, g.options()));
      g.mul_(keep.unsqueeze(1).to(at::kDouble) / static_cast<double>(std::max<int64_t>(count, 1)));
      grad.slice(0, begin, end).copy_(g);
    }
    ctx->saved_data["grad"] = grad;
    // All targets ignored: NaN, as F::cross_entropy's mean gives (0/0).
    return (total / static_cast<double>(count)).to(logits.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const at::Tensor grad = ctx->saved_data["grad"].toTensor();
    return {grad * grad_out[0].to(grad.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// Shared by token_cross_entropy and chunked_cross_entropy: [batch, time, vocab] logits,
// [batch, time] integer targets.
class TokenLossBase : public keel::Loss {
 public:
  explicit TokenLossBase(const keel::Context& ctx, const char* name)
      : name_(name), ignore_index_(ctx.get_int("ignore_index")) {}

  int64_t count_items(const at::Tensor& target) override {
    return target.ne(ignore_index_).sum().item<int64_t>();
  }

 protected:
  // The logits as rows [batch * time, vocab] and the targets as [batch * time] int64.
  std::pair<at::Tensor, at::Tensor> rows(const at::Tensor& output, const at::Tensor& target) const {
    if (output.dim() != 3)
      throw std::invalid_argument(name_ + ": model output " + shape_str(output.sizes()) +
                                  " is not [batch, time, vocab] logits; hint: use cross_entropy "
                                  "(with class_dim) for other shapes");
    check_index_target(name_.c_str(), output, target, -1);
    if (target.is_floating_point())
      throw std::invalid_argument(name_ + ": the target holds floating-point values; it must "
                                  "hold token ids (integers)");
    return {output.reshape({-1, output.size(2)}), target.reshape({-1}).to(at::kLong)};
  }
  std::string name_;
  int64_t ignore_index_;
};

class TokenCrossEntropy : public TokenLossBase {
 public:
  explicit TokenCrossEntropy(const keel::Context& ctx)
      : TokenLossBase(ctx, "token_cross_entropy") {}
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) override {
    const auto [logits, ids] = rows(output, target);
    *count = ids.ne(ignore_index_).sum().item<int64_t>();
    return F::cross_entropy(logits, ids,
                            F::CrossEntropyFuncOptions().ignore_index(ignore_index_).reduction(torch::kMean));
  }
};

class ChunkedCrossEntropy : public TokenLossBase {
 public:
  explicit ChunkedCrossEntropy(const keel::Context& ctx)
      : TokenLossBase(ctx, "chunked_cross_entropy"), chunk_(ctx.get_int("chunk_tokens")) {}
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) override {
    const auto [logits, ids] = rows(output, target);
    *count = ids.ne(ignore_index_).sum().item<int64_t>();
    return ChunkedCrossEntropyFn::apply(logits, ids, ignore_index_, chunk_, *count);
  }

 private:
  int64_t chunk_;
};

const char* const kIgnoreHelp = "target value that is ignored (not averaged over)";
const keel_option_desc kOptions[] = {
    keel::opt_int("ignore_index", "-100", kIgnoreHelp),
    keel::opt_float("label_smoothing", "0.0", "mass spread uniformly over all classes", 0, 1),
    keel::opt_int("class_dim", "1",
                  "dimension of the output that holds the classes (negative: from the end, -1 "
                  "for [batch, time, vocab])"),
};
const keel_option_desc kTokenOptions[] = {
    keel::opt_int("ignore_index", "-100", kIgnoreHelp),
};
const keel_option_desc kChunkedOptions[] = {
    keel::opt_int("ignore_index", "-100", kIgnoreHelp),
    keel::opt_int("chunk_tokens", "1024", "tokens (rows of logits) per chunk", 1, 1e12),
};
const keel_component_desc kComponents[] = {
    keel::component<CrossEntropy>("cross_entropy", "softmax cross-entropy, mean over targets",
                                  kOptions),
    keel::component<TokenCrossEntropy>(
        "token_cross_entropy",
        "per-token cross entropy of [batch, time, vocab] logits, mean over the tokens",
        kTokenOptions),
    keel::component<ChunkedCrossEntropy>(
        "chunked_cross_entropy",
        "token_cross_entropy computed in chunks of tokens: no full-size log-softmax kept for "
        "the backward",
        kChunkedOptions),
};

}  // namespace

KEEL_PLUGIN("keel-losses", "0.2.0", "Loss functions", kComponents)
