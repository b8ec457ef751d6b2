// loss components, all a mean over their items (reduction = mean):
//   cross_entropy          torch::nn::functional::cross_entropy (what PyTorch's F.cross_entropy
//                          calls), classes along `class_dim` (default 1: [N, C] logits)
//   token_cross_entropy    per-token cross entropy of a language model: [batch, time, vocab]
//                          logits, [batch, time] next-token ids (cross_entropy, class_dim = -1)
//   chunked_cross_entropy  the same value and gradient, computed over chunks of `chunk_tokens`
//                          tokens so that no full-size log-softmax is kept for the backward
//                          (a logits-sized gradient is, instead) and backward allocates
//                          nothing logits-sized (ChunkedCrossEntropyFn below); with a model
//                          that offers forward_features (ABI 1.5, e.g. gpt), training steps
//                          give it the final hidden states and the output layer's weight
//                          instead, and it makes the logits one chunk at a time, never whole
//                          (MindSpeed-LLM's chunk loss; LinearCrossEntropyFn below)
//
// ignore_index: the option schema (abi.h) has no "optional, no default" option (a NULL default
// means required), so absence is a sentinel default, kNoIgnore (the smallest int64, which is
// never a class index). With that value, every class-index target counts: count and
// count_items are the target's numel, with no host sync, and a negative target is an error
// (except kNoIgnore itself, which the losses leave out of the mean although it is counted).
// With ignore_index set, the targets equal to it are left out of the mean and counting them
// syncs with the host once (.item()).
// A batch of class indices in which none counts (all ignored, or none at all) has loss 0 and
// gradient 0; PyTorch's mean gives NaN (0/0) there, which would make keel's step loss (each
// micro-batch's loss times its weight, here 0) and evaluation sum (loss times count) NaN too.
//
// Evaluation metrics (abi.h, "Evaluation metrics of a loss", ABI 1.6), in every evaluation
// record after the loss:
//   cross_entropy          accuracy: the share of the class-index targets that count (as above)
//                          whose class is the output's argmax along class_dim; state {correct,
//                          counted}. Batches of class probabilities add nothing; without any
//                          class-index target counted, no accuracy.
//   token_cross_entropy,   bits_per_token: the mean loss over ln 2 (bits per character for a
//   chunked_cross_entropy  character-level model); state {sum of loss * count, sum of count};
//                          none when no token counted.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "keel/plugin.hpp"
#include "keel/tensor.hpp"

namespace {

constexpr int64_t kNoIgnore = std::numeric_limits<int64_t>::min();
// kNoIgnore as the option's TOML default.
constexpr const char* kNoIgnoreToml = "-9223372036854775808";

// class_dim's bounds, checked when the manifest is validated (LibTorch itself has no such
// limit; an output with more dimensions can still put its classes within these).
constexpr double kMaxClassDims = 64;
constexpr const char* kIgnoreHelp =
    "target value left out of the mean; the default (the smallest int64) means none: every "
    "target counts, and counting them needs no host sync";

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kIgnoreIndex = keel::opt_int("ignore_index", kNoIgnoreToml, kIgnoreHelp);
constexpr auto kLabelSmoothing = keel::opt_float(
    "label_smoothing", "0.0", "mass spread uniformly over all classes", 0, 1);
constexpr auto kClassDim = keel::opt_int(
    "class_dim", "1",
    "dimension of the output that holds the classes (negative: from the end, -1 "
    "for [batch, time, vocab]); a dimension the output lacks is an error at its "
    "first batch",
    -kMaxClassDims, kMaxClassDims - 1);
constexpr auto kChunkTokens = keel::opt_int(
    "chunk_tokens", "1024", "tokens (rows of logits) per chunk", 1, 1e12);

namespace text = keel::text;

namespace F = torch::nn::functional;

// Class-index targets that count: all of them (numel, no host sync) without an ignore_index,
// else those not equal to it (one host sync).
int64_t count_targets(const at::Tensor& ids, int64_t ignore_index) {
  if (ignore_index == kNoIgnore) return ids.numel();
  return ids.ne(ignore_index).sum().item<int64_t>();
}

// Class indices along `class_dim` of `output`: the target must be the output's shape without
// that dimension. Throws one line naming both shapes otherwise. Returns the non-negative dim.
// Reads sizes only (no host sync).
int64_t check_index_target(const std::string& who, const at::Tensor& output,
                           const at::Tensor& target, int64_t class_dim) {
  const int64_t nd = output.dim();
  if (nd < 1 || class_dim < -nd || class_dim >= nd)
    throw std::invalid_argument(who + ": class_dim = " + std::to_string(class_dim) +
                                " is out of range for a model output of shape " +
                                text::shape(output.sizes()) + "; hint: class_dim counts from 0 " +
                                "(1 for [N, C] logits) or from the end (-1 for [batch, time, vocab])");
  const int64_t dim = class_dim < 0 ? class_dim + nd : class_dim;
  std::vector<int64_t> expected = output.sizes().vec();
  expected.erase(expected.begin() + dim);
  if (target.sizes() != at::IntArrayRef(expected))
    throw std::invalid_argument(who + ": model output " + text::shape(output.sizes()) +
                                " and target " + text::shape(target.sizes()) +
                                " do not match: with class_dim = " + std::to_string(class_dim) +
                                " the target must be " + text::shape(expected) +
                                " (one class index per position); hint: check the model's "
                                "output size and the dataset's targets");
  return dim;
}

// Runs `body` (a loss over class-index targets); on the CPU a target outside [0, classes)
// fails inside LibTorch ("Target -100 is out of bounds."), which this rethrows naming the loss,
// and, when no ignore_index is set, pointing at it: PyTorch ignores -100 by default, keel does
// not. (On CUDA such a target trips a device-side assert instead, which this does not catch.)
template <class Body>
at::Tensor with_target_hint(const std::string& who, int64_t ignore_index, Body&& body) {
  try {
    return body();
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find("out of bounds") == std::string::npos) throw;
    std::string line = what.substr(0, what.find('\n'));
    while (!line.empty() && (line.back() == '.' || line.back() == ' ')) line.pop_back();
    throw std::invalid_argument(
        who + ": a target class index is out of range (" + line + "); hint: " +
        (ignore_index == kNoIgnore
             ? "no ignore_index is set, so every target must be a class index; set "
               "ignore_index (e.g. -100, PyTorch's default) to leave padding out of the loss"
             : "targets must be class indices from 0 to the number of classes - 1, or " +
                   std::to_string(ignore_index) + " (ignore_index)"));
  }
}

// F::cross_entropy of class-index targets, as a mean over the `count` targets that count; when
// none does, the sum over none: 0, with a zero gradient (F::cross_entropy's mean would be NaN).
at::Tensor index_cross_entropy(const at::Tensor& logits, const at::Tensor& ids, int64_t count,
                               F::CrossEntropyFuncOptions options) {
  options.reduction(count > 0 ? F::CrossEntropyFuncOptions::reduction_t(torch::kMean)
                              : F::CrossEntropyFuncOptions::reduction_t(torch::kSum));
  return F::cross_entropy(logits, ids, options);
}

// The accuracy of class-index targets: argmax along `dim` equal to the target, among the
// targets that count. State {correct, counted}. One host sync per batch (.item()).
void add_accuracy(const at::Tensor& output, const at::Tensor& labels, int64_t dim,
                  int64_t ignore_index, keel::MetricState state) {
  at::Tensor hits = output.argmax(dim).eq(labels);
  if (ignore_index != kNoIgnore) hits.logical_and_(labels.ne(ignore_index));
  state[0] += static_cast<double>(hits.sum().item<int64_t>());
  state[1] += static_cast<double>(count_targets(labels, ignore_index));
}

class CrossEntropy : public keel::Loss {
 public:
  explicit CrossEntropy(const keel::Context& ctx)
      : class_dim_(ctx.get(kClassDim)),
        ignore_index_(ctx.get(kIgnoreIndex)),
        options_(F::CrossEntropyFuncOptions()
                     .ignore_index(ignore_index_)
                     .label_smoothing(ctx.get(kLabelSmoothing))) {}

  // output: logits with the classes along class_dim; target: class indices shaped like the
  // output without class_dim (any integer type), or class probabilities shaped like the output.
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) override {
    if (target.is_floating_point()) {
      if (target.sizes() != output.sizes())
        throw std::invalid_argument("cross_entropy: model output " + text::shape(output.sizes()) +
                                    " and target " + text::shape(target.sizes()) +
                                    " do not match: class probabilities must be shaped like the "
                                    "output; hint: check the model's output size and the "
                                    "dataset's targets");
      const int64_t dim = check_dim(output);
      *count = output.dim() < 2 ? 1 : output.numel() / std::max<int64_t>(1, output.size(dim));
      return F::cross_entropy(to_class_dim_1(output, dim), to_class_dim_1(target, dim), options_);
    }
    const int64_t dim = check_index_target("cross_entropy", output, target, class_dim_);
    const at::Tensor labels = target.to(at::kLong);
    *count = count_targets(labels, ignore_index_);
    return with_target_hint("cross_entropy", ignore_index_, [&] {
      return index_cross_entropy(to_class_dim_1(output, dim), labels, *count, options_);
    });
  }

  // What compute reports as count: rows of probabilities, or class indices (all of them
  // without ignore_index, with no host sync; those other than ignore_index otherwise).
  int64_t count_items(const at::Tensor& target) override {
    if (target.is_floating_point()) {
      const int64_t dim = class_dim_ < 0 ? class_dim_ + target.dim() : class_dim_;
      return target.dim() < 2 ? 1 : target.numel() / std::max<int64_t>(1, target.size(dim));
    }
    return count_targets(target, ignore_index_);
  }

  size_t metric_state_size() override { return 2; }
  void metric_update(const at::Tensor& output, const at::Tensor& target, double /*loss*/,
                     int64_t /*count*/, keel::MetricState state) override {
    if (target.is_floating_point()) return;  // class probabilities: no accuracy
    const int64_t dim = check_index_target("cross_entropy", output, target, class_dim_);
    add_accuracy(output, target.to(at::kLong), dim, ignore_index_, state);
  }
  keel::Metrics metric_finish(const std::vector<double>& state) override {
    if (state[1] <= 0) return {};
    return {{"accuracy", state[0] / state[1]}};
  }

 private:
  int64_t check_dim(const at::Tensor& output) const {
    const int64_t nd = output.dim();
    if (nd >= 1 && class_dim_ >= -nd && class_dim_ < nd) return class_dim_ < 0 ? class_dim_ + nd : class_dim_;
    throw std::invalid_argument("cross_entropy: class_dim = " + std::to_string(class_dim_) +
                                " is out of range for a model output of shape " +
                                text::shape(output.sizes()) + "; hint: class_dim counts from 0 " +
                                "(1 for [N, C] logits) or from the end (-1 for [batch, time, vocab])");
  }
  // F::cross_entropy takes the classes in dimension 1 (or 0 for a 1-d output).
  static at::Tensor to_class_dim_1(const at::Tensor& t, int64_t dim) {
    return (t.dim() < 2 || dim == 1) ? t : t.movedim(dim, 1);
  }

  int64_t class_dim_;
  int64_t ignore_index_;
  F::CrossEntropyFuncOptions options_;
};

// One chunk of float64 logits `z` [rows, v] against ids `y` [rows]: subtracts the summed
// log-likelihood of the rows whose id is not ignore_index from `total`; returns, when `grad`,
// d(mean)/dz = (softmax - onehot) * scale on those rows and 0 on the others (float64), else an
// undefined tensor.
at::Tensor chunk_nll(const at::Tensor& z, const at::Tensor& y, int64_t ignore_index, double scale,
                     bool grad, at::Tensor& total) {
  const at::Tensor keep = y.ne(ignore_index);
  const at::Tensor safe = at::where(keep, y, at::zeros_like(y));
  at::Tensor logp = at::log_softmax(z, 1);
  const at::Tensor picked = logp.gather(1, safe.unsqueeze(1)).squeeze(1);
  total.sub_(at::where(keep, picked, at::zeros_like(picked)).sum());
  if (!grad) return {};
  at::Tensor g = logp.exp_();
  g.scatter_add_(1, safe.unsqueeze(1), at::full({z.size(0), 1}, -1.0, g.options()));
  return g.mul_(keep.unsqueeze(1).to(at::kDouble) * scale);
}

// Mean cross entropy of rows of logits [n, v] against ids [n] (`count` of them not equal to
// ignore_index), computed chunk by chunk. Forward walks chunks of `chunk` rows: for each it
// computes the log-softmax in float64, adds the chunk's loss, and, when `need_grad`, writes the
// chunk's gradient of the mean, (softmax - onehot) / count on the rows that count and 0 on the
// others, into one gradient buffer shaped like the logits (in their dtype). Backward takes that
// buffer out of the context, scales it in place by the incoming gradient and returns it.
//
// Memory, in units of one logits-sized tensor L (the logits themselves, an input, are not
// counted, and neither is their gradient once backward has returned it):
//  - F::cross_entropy under autograd keeps the log-softmax (1 L) from forward to backward; its
//    backward then allocates nll_loss's gradient (1 L) and log_softmax's (1 L) while the saved
//    log-softmax is still held: a peak of about 3 L.
//  - here the gradient buffer (1 L) is held from forward to backward, and backward allocates
//    nothing logits-sized: a peak of 1 L plus the float64 temporaries of one chunk,
//    a few [chunk, v] tensors of 8-byte values. Without need_grad (evaluation) there is no
//    buffer at all.
// tests/plugins/test_lm_losses.py measures both peaks (the growth of the process's peak RSS).
class ChunkedCrossEntropyFn : public torch::autograd::Function<ChunkedCrossEntropyFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& ids, int64_t ignore_index, int64_t chunk,
                            int64_t count, bool need_grad) {
    at::NoGradGuard no_grad;
    const int64_t n = logits.size(0);
    at::Tensor grad = need_grad ? at::empty_like(logits, at::MemoryFormat::Contiguous) : at::Tensor();
    at::Tensor total = at::zeros({}, logits.options().dtype(at::kDouble));
    // With no target counted (all ignored, or no rows) the loss and the gradient are 0.
    const double scale = 1.0 / static_cast<double>(std::max<int64_t>(count, 1));
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t end = std::min(n, begin + chunk);
      const at::Tensor g = chunk_nll(logits.slice(0, begin, end).to(at::kDouble),
                                     ids.slice(0, begin, end), ignore_index, scale, need_grad,
                                     total);
      if (need_grad) grad.slice(0, begin, end).copy_(g);
    }
    if (need_grad) ctx->saved_data["grad"] = grad;
    return (total * scale).to(logits.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto it = ctx->saved_data.find("grad");
    if (it == ctx->saved_data.end())
      throw std::runtime_error("chunked_cross_entropy: backward ran a second time through the "
                               "same loss, whose gradient buffer the first backward consumed; "
                               "hint: compute the loss again");
    at::Tensor grad = it->second.toTensor();
    ctx->saved_data.erase(it);
    grad.mul_(grad_out[0].to(grad.scalar_type()));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Mean cross entropy of rows of logits = features @ weight^T (features [n, f], weight [v, f],
// ids [n], `count` of them not equal to ignore_index), computed chunk by chunk so that the
// logits exist one chunk ([chunk, v]) at a time, never whole (MindSpeed-LLM's chunk loss with
// the output layer inside it). Forward, for each chunk of `chunk` rows: its logits (a matmul
// in the weight's dtype, autocast off), their log-softmax in float64 and the chunk's loss;
// then, for the inputs that need a gradient, g = (softmax - onehot) / count on the rows that
// count (0 on the others), the chunk's rows of the features' gradient, g @ weight, written
// into an [n, f] buffer, and its share of the weight's gradient, g^T @ features_chunk, added
// into a [v, f] buffer. Backward scales the two buffers in place by the incoming gradient and
// returns them. Memory beyond the inputs: the two buffers (the size of the features and of the
// weight) and one chunk's logits and float64 temporaries; test_lm_losses.py measures it.
class LinearCrossEntropyFn : public torch::autograd::Function<LinearCrossEntropyFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& features,
                            const at::Tensor& weight, const at::Tensor& ids, int64_t ignore_index,
                            int64_t chunk, int64_t count, bool features_grad, bool weight_grad) {
    at::NoGradGuard no_grad;
    // The matmuls in the weight's dtype (the master weights' under mixed precision, where the
    // features may come in bf16), not autocast's.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const at::ScalarType dtype = weight.scalar_type();
    const int64_t n = features.size(0);
    at::Tensor grad_f = features_grad ? at::empty_like(features, at::MemoryFormat::Contiguous)
                                      : at::Tensor();
    at::Tensor grad_w = weight_grad ? at::zeros_like(weight, at::MemoryFormat::Contiguous)
                                    : at::Tensor();
    at::Tensor total = at::zeros({}, features.options().dtype(at::kDouble));
    const double scale = 1.0 / static_cast<double>(std::max<int64_t>(count, 1));
    const bool need_grad = features_grad || weight_grad;
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t end = std::min(n, begin + chunk);
      const at::Tensor f = features.slice(0, begin, end).to(dtype);
      const at::Tensor g = chunk_nll(at::mm(f, weight.t()).to(at::kDouble),
                                     ids.slice(0, begin, end), ignore_index, scale, need_grad,
                                     total);
      if (!need_grad) continue;
      const at::Tensor gz = g.to(dtype);
      if (features_grad) {
        at::Tensor rows = grad_f.slice(0, begin, end);
        if (rows.scalar_type() == dtype)
          at::mm_out(rows, gz, weight);
        else
          rows.copy_(at::mm(gz, weight));
      }
      if (weight_grad) grad_w.addmm_(gz.t(), f);
    }
    if (features_grad) ctx->saved_data["grad_features"] = grad_f;
    if (weight_grad) ctx->saved_data["grad_weight"] = grad_w;
    return (total * scale).to(features.scalar_type());
  }
  // Only called when features or weight needed a gradient, so at least one buffer was saved.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    at::Tensor grads[2];
    const char* const keys[2] = {"grad_features", "grad_weight"};
    for (int i = 0; i < 2; ++i) {
      const auto it = ctx->saved_data.find(keys[i]);
      if (it == ctx->saved_data.end()) continue;
      grads[i] = it->second.toTensor();
      ctx->saved_data.erase(it);
      grads[i].mul_(grad_out[0].to(grads[i].scalar_type()));
    }
    if (!grads[0].defined() && !grads[1].defined())
      throw std::runtime_error("chunked_cross_entropy: backward ran a second time through the "
                               "same loss, whose gradient buffers the first backward consumed; "
                               "hint: compute the loss again");
    return {grads[0], grads[1], at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// Shared by token_cross_entropy and chunked_cross_entropy: [batch, time, vocab] logits,
// [batch, time] integer targets.
class TokenLossBase : public keel::Loss {
 public:
  explicit TokenLossBase(const keel::Context& ctx, const char* name)
      : name_(name), ignore_index_(ctx.get(kIgnoreIndex)) {}

  // What compute reports as count: every token without ignore_index (no host sync), those
  // other than ignore_index otherwise.
  int64_t count_items(const at::Tensor& target) override {
    return count_targets(target, ignore_index_);
  }

  // Batches of named tensors (keel.loss.batch/1): the model's "logits" against the batch's
  // "labels" (-100: ignored, whatever ignore_index is; packed documents' padding) when it has
  // them, else its "targets" as compute takes them.
  at::Tensor compute_batch(const keel::NamedTensors& outputs, const keel::NamedTensors& batch,
                           int64_t* count) override {
    const at::Tensor& logits = keel::need(outputs, "logits");
    if (const at::Tensor* labels = keel::find(batch, "labels"))
      return loss_of(logits, *labels, kLabelsIgnored, count);
    return compute(logits, keel::need(batch, "targets"), count);
  }
  int64_t count_items_batch(const keel::NamedTensors& batch) override {
    if (const at::Tensor* labels = keel::find(batch, "labels"))
      return count_targets(*labels, kLabelsIgnored);
    return count_items(keel::need(batch, "targets"));
  }
  void metric_update_batch(const keel::NamedTensors&, const keel::NamedTensors&, double loss,
                           int64_t count, keel::MetricState state) override {
    metric_update({}, {}, loss, count, state);
  }
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) override {
    return loss_of(output, target, ignore_index_, count);
  }

  size_t metric_state_size() override { return 2; }
  void metric_update(const at::Tensor& /*output*/, const at::Tensor& /*target*/, double loss,
                     int64_t count, keel::MetricState state) override {
    state[0] += loss * static_cast<double>(count);
    state[1] += static_cast<double>(count);
  }
  keel::Metrics metric_finish(const std::vector<double>& state) override {
    if (state[1] <= 0) return {};
    return {{"bits_per_token", state[0] / state[1] / std::log(2.0)}};
  }

 protected:
  static constexpr int64_t kLabelsIgnored = -100;  // Hugging Face's, in "labels"
  // The mean loss of `output` against `target` without the ids equal to `ignore`.
  virtual at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, int64_t ignore,
                             int64_t* count) = 0;
  // `output` must be [batch, time, vocab] logits (or a meta tensor of their shape) and `target`
  // [batch, time] token ids; one error line otherwise. Sizes and dtypes only.
  void check_target(const at::Tensor& output, const at::Tensor& target) const {
    if (output.dim() != 3)
      throw std::invalid_argument(name_ + ": model output " + text::shape(output.sizes()) +
                                  " is not [batch, time, vocab] logits; hint: use cross_entropy "
                                  "(with class_dim) for other shapes");
    check_index_target(name_, output, target, -1);
    if (target.is_floating_point())
      throw std::invalid_argument(name_ + ": the target holds floating-point values; it must "
                                  "hold token ids (integers); hint: check the dataset's targets");
  }
  // The logits as rows [batch * time, vocab] and the targets as [batch * time] int64.
  std::pair<at::Tensor, at::Tensor> rows(const at::Tensor& output, const at::Tensor& target) const {
    check_target(output, target);
    return {output.reshape({-1, output.size(2)}), target.reshape({-1}).to(at::kLong)};
  }
  std::string name_;
  int64_t ignore_index_;
};

class TokenCrossEntropy : public TokenLossBase {
 public:
  explicit TokenCrossEntropy(const keel::Context& ctx)
      : TokenLossBase(ctx, "token_cross_entropy") {}

 protected:
  at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, int64_t ignore,
                     int64_t* count) override {
    // (Not a structured binding: C++17 does not let the lambda below capture one.)
    at::Tensor logits, ids;
    std::tie(logits, ids) = rows(output, target);
    *count = count_targets(ids, ignore);
    return with_target_hint(name_, ignore, [&] {
      return index_cross_entropy(logits, ids, *count,
                                 F::CrossEntropyFuncOptions().ignore_index(ignore));
    });
  }
};

class ChunkedCrossEntropy : public TokenLossBase {
 public:
  explicit ChunkedCrossEntropy(const keel::Context& ctx)
      : TokenLossBase(ctx, "chunked_cross_entropy"), chunk_(ctx.get(kChunkTokens)) {}
  at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, int64_t ignore,
                     int64_t* count) override {
    // (Not a structured binding: C++17 does not let the lambda below capture one.)
    at::Tensor logits, ids;
    std::tie(logits, ids) = rows(output, target);
    *count = count_targets(ids, ignore);
    const bool need_grad = at::GradMode::is_enabled() && logits.requires_grad();
    return with_target_hint(name_, ignore, [&] {
      return ChunkedCrossEntropyFn::apply(logits, ids, ignore, chunk_, *count, need_grad);
    });
  }
  // The loss of the logits features @ weight^T ([batch, time, F] @ [vocab, F]^T) without them
  // existing whole (LinearCrossEntropyFn); the kernel calls it in training steps when the model
  // offers forward_features (gpt does).
  at::Tensor compute_linear(const at::Tensor& features, const at::Tensor& weight,
                            const at::Tensor& target, int64_t* count) override {
    if (features.dim() != 3 || weight.dim() != 2 || weight.size(1) != features.size(2))
      throw std::invalid_argument(name_ + ": model features " + text::shape(features.sizes()) +
                                  " and output weight " + text::shape(weight.sizes()) +
                                  " are not [batch, time, F] and [vocab, F]; hint: the model's "
                                  "forward_features must give a language model's final hidden "
                                  "states and its output layer's weight");
    // The target against the output forward would give, [batch, time, vocab] (a meta tensor:
    // sizes only).
    check_target(at::empty({features.size(0), features.size(1), weight.size(0)},
                           features.options().device(at::kMeta)),
                 target);
    const at::Tensor rows = features.reshape({-1, features.size(2)});
    const at::Tensor ids = target.reshape({-1}).to(at::kLong);
    *count = count_targets(ids, ignore_index_);
    const bool grad = at::GradMode::is_enabled();
    return with_target_hint(name_, ignore_index_, [&] {
      return LinearCrossEntropyFn::apply(rows, weight, ids, ignore_index_, chunk_, *count,
                                         grad && rows.requires_grad(),
                                         grad && weight.requires_grad());
    });
  }

 private:
  int64_t chunk_;
};

const keel_option_desc kOptions[] = {kIgnoreIndex, kLabelSmoothing, kClassDim};
const keel_option_desc kTokenOptions[] = {kIgnoreIndex};
const keel_option_desc kChunkedOptions[] = {kIgnoreIndex, kChunkTokens};
const keel_component_desc kComponents[] = {
    keel::component<CrossEntropy>("cross_entropy", "softmax cross-entropy, mean over targets",
                                  kOptions),
    keel::component<TokenCrossEntropy>(
        "token_cross_entropy",
        "per-token cross entropy of [batch, time, vocab] logits, mean over the tokens",
        kTokenOptions),
    keel::component<ChunkedCrossEntropy>(
        "chunked_cross_entropy",
        "token_cross_entropy computed in chunks of tokens: keeps a logits-sized gradient "
        "instead of the full log-softmax for the backward, which then allocates nothing "
        "logits-sized; in training, with a model that offers forward_features (gpt), it "
        "applies the output layer itself a chunk at a time, so the logits are never whole",
        kChunkedOptions),
};

}  // namespace

KEEL_PLUGIN("keel-losses", "0.3.0", "Loss functions", kComponents)
