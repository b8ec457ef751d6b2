// model component `gpt`: a decoder-only transformer as nanoGPT's (Karpathy's model.py).
//
//   tokens [B, T] (int64, T <= context)
//   x = wte(tokens) + wpe(0..T-1), dropout
//   `layers` x block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
//     attn: causal multi-head self-attention, qkv from one Linear(width, 3 width), an explicit
//           masked softmax (LibTorch 1.13 has no scaled_dot_product_attention), dropout on the
//           attention weights, output Linear(width, width), dropout; computed by CausalAttention
//           below (attention = "fused", the default) or by nanoGPT's operators ("reference")
//     mlp:  Linear(width, 4 width), GELU (erf form), Linear(4 width, width), dropout; the
//           GELU by FusedGelu (fused_gelu.hpp; gelu = "fused", the default) or LibTorch's gelu
//           ("reference"); every Linear by split_linear (split_linear.hpp; linear = "split",
//           the default) or LibTorch's linear ("reference")
//   logits [B, T, vocab] = ln_f(x) @ wte^T   (weight tying: the output layer IS wte)
// With bias = false (nanoGPT's option) the Linear layers and LayerNorms have no bias; the
// output layer never has one.
//
// Parameter names are nanoGPT's state_dict names (transformer.wte.weight, transformer.h.0.ln_1.
// weight, transformer.h.0.attn.c_attn.weight, ..., transformer.ln_f.bias, lm_head.weight), so
// a PyTorch reference loads them as they are. The tied weight is listed under both
// transformer.wte.weight and lm_head.weight as the same tensor; keel trains, counts and saves
// a shared parameter once, under its first name (transformer.wte.weight).
//
// `keel export` (export_state, ABI 1.7) gives the weights as Hugging Face's GPT2LMHeadModel
// names and lays them out: the same names, less lm_head.weight (tied: transformers ties it to
// transformer.wte.weight); the four Linear weights transposed to GPT-2's Conv1D layout [in, out];
// zeros for the biases a model with bias = false lacks (GPT-2 always has them; a zero bias
// computes the same). Its config.json says "gelu" (GELU's erf form, as here; "gelu_new" is the
// tanh approximation), layer_norm_epsilon 1e-5 and tied embeddings, as this model computes, so
// every configuration of it is a GPT-2 and the export never refuses one.
//
// Units (ABI 1.8, for [distributed] shard = "parameters"): block N is unit N; the embeddings,
// ln_f and the tied output layer are the root.
//
// Initialisation (nanoGPT's): Linear and Embedding weights ~ N(0, 0.02), biases 0, the two
// residual projections (attn.c_proj, mlp.c_proj) ~ N(0, 0.02 / sqrt(2 layers)), LayerNorm
// weights 1 and biases 0; drawn from LibTorch's default generator, which keel seeds with
// [run] seed before it creates the model (as for the models plugin), so a seed gives the same
// weights every run.
//
// Training FLOPs per sample (PaLM appendix B, nanoGPT's estimate_mfu): T * (6N + 12*L*H*Q*T)
// with T = context, L = layers, H = heads, Q = width / heads (so H*Q = width), and N the
// parameters less the position embedding (a lookup, no matmul), the tied wte counted once (as
// the output layer's matmul; its lookup is free). 6N: the estimate charges every parameter one
// multiply-add (2 FLOPs) per token forward and two backward; 12*L*H*Q*T: attention's two
// matmuls (q k^T and att v) per layer, 2 * 2 * T * width FLOPs per token forward, times 3 for
// the training step. Counted for full context-length windows (T = context). See docs/mfu.md.
#include <ATen/ops/linear.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "keel/module_model.hpp"
#include "keel/plugin.hpp"
#include "keel/tensor.hpp"
#include "fused_gelu.hpp"
#include "parallel.hpp"
#include "split_linear.hpp"

namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kVocabSize = keel::opt_int(
    "vocab_size", nullptr, "token ids are 0..vocab_size-1 (vocab.json's size)", 1, 1e9);
constexpr auto kContext = keel::opt_int(
    "context", "128", "longest sequence (position embeddings)", 1, 1e7);
constexpr auto kLayers = keel::opt_int("layers", "4", "transformer blocks", 1, 1e4);
constexpr auto kHeads = keel::opt_int(
    "heads", "4", "attention heads per block (divides width)", 1, 1e4);
constexpr auto kWidth = keel::opt_int("width", "128", "embedding width", 1, 1e6);
constexpr auto kDropout = keel::opt_float(
    "dropout", "0.0", "dropout on embeddings, attention weights and residuals", 0, 1);
constexpr auto kBias = keel::opt_bool(
    "bias", "true", "biases in the Linear layers and LayerNorms (not lm_head)");
constexpr auto kAttention = keel::opt_string(
    "attention", "\"fused\"",
    "how causal attention runs: 'fused' (one (batch, head) block at a time, "
    "for float32 on the CPU without attention dropout; otherwise as "
    "'reference') or 'reference' (nanoGPT's LibTorch operators); the same "
    "function either way",
    "fused|reference");
constexpr auto kLinear = keel::opt_string(
    "linear", "\"split\"",
    "how the Linear layers and the output layer run: 'split' (each product "
    "split into blocks of rows that the intra-op threads take as they ask, "
    "one single-threaded BLAS call per block, for float32 on the CPU; "
    "otherwise as 'reference') or "
    "'reference' (LibTorch's linear, as PyTorch's F.linear); the same function "
    "either way, within float32 rounding",
    "split|reference");
constexpr auto kGelu = keel::opt_string(
    "gelu", "\"fused\"",
    "how the MLP's GELU (erf form) runs: 'fused' (one pass computes it and its "
    "slope, the backward multiplies by the slope; for float32 on the CPU, "
    "otherwise as 'reference') or 'reference' (LibTorch's gelu); the same "
    "function either way, within float32 rounding and 1.5e-7 (its erf's error)",
    "fused|reference");

namespace text = keel::text;

namespace nn = torch::nn;

struct Config {
  int64_t vocab, context, layers, heads, width;
  double dropout;
  bool bias;
  bool fused_attention;
  bool split_linear;
  bool fused_gelu;
};

// `v` as the shortest JSON number text that reads back the same double ("0", "0.1", "1e-05").
std::string json_number(double v) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return nn::Linear(nn::LinearOptions(in, out).bias(bias));
}

// A Linear layer: with `linear = "split"` (the default) its products split by rows over the
// intra-op threads (split_linear.hpp); with "reference" as PyTorch's F.linear applies it: ATen's
// `linear`, which runs a contiguous [B, T, in] input with a bias as one addmm on [B*T, in]. (The
// C++ frontend's LinearImpl::forward, LibTorch 1.13 torch/nn/functional/linear.h, takes that
// path for 2-D inputs only; for [B, T, in] it runs matmul and then adds the bias in place, which
// cost the char-GPT about 7% of a training step on the 2-core machine: bench/README.md,
// bench_char_gpt.py.) An undefined bias: none.
at::Tensor run_linear(bool split, const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias = {}) {
  return split ? gpt::split_linear(x, weight, bias) : at::linear(x, weight, bias);
}

// nanoGPT's LayerNorm: a weight and an optional bias (torch::nn::LayerNorm has both or none),
// eps 1e-5.
struct NormImpl : nn::Module {
  NormImpl(int64_t width, bool with_bias) : width(width) {
    weight = register_parameter("weight", at::ones({width}));
    if (with_bias) bias = register_parameter("bias", at::zeros({width}));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::layer_norm(x, {width}, weight, bias, 1e-5);  // an undefined bias: none
  }
  int64_t width;
  at::Tensor weight, bias;
};
TORCH_MODULE(Norm);

// Causal multi-head attention over the fused q|k|v projection, one (batch, head) pair at a time:
//
//   qkv [B, T, 3C] -> y [B, T, C],  for each b, h (Q, K, V: [T, D] column blocks of qkv[b]):
//     P = softmax(scale * Q K^T + M)   M: 0 on and below the diagonal, -inf above
//     Y = P V                          (written into y[b]'s columns h*D .. h*D+D-1)
//   backward, from dY and the saved P:
//     dV = P^T dY;  dP = dY V^T;  dS = P * (dP - rowsum(P * dP));  dQ = scale dS K;
//     dK = scale dS^T Q
//
// The same function as the reference path (CausalSelfAttentionImpl::reference: matmul, scale,
// masked_fill, softmax, matmul, with transposes and copies between [B, T, H, D] and
// [B, H, T, D]); how it runs differs:
// - each pair's [T, T] scores are produced, softmaxed and consumed while they are in the cache,
//   where the reference makes three passes over the whole [B, H, T, T] tensor in memory
//   forward (scale, mask, softmax) and three backward;
// - the scale and the mask ride on the score matmul (addmm's alpha and its added matrix);
// - Q, K and V are read where they lie in qkv, and dQ, dK, dV written there (no copies to and
//   from [B, H, T, D]);
// - the B*H pairs go to LibTorch's intra-op threads as they ask for them (gpt::parallel_blocks,
//   parallel.hpp), and one pair's matmuls run on the thread that takes the pair; a pair's
//   results do not depend on the thread, so they are the same on any number of threads.
// Softmax and its backward are ATen's kernels (the reference's), on one pair's [T, T] block at a
// time. P, [B, H, T, T], is saved for the backward, as the reference's autograd saves
// softmax's output. bench/bench_char_gpt.py measures a training run with each (bench/README.md).
//
// Float32 on the CPU, without attention dropout (in training mode with dropout > 0, attention
// weights are dropped, which this does not do); CausalSelfAttentionImpl::forward takes the
// reference path otherwise.
struct CausalAttention : torch::autograd::Function<CausalAttention> {
  // One (b, h) pair's [T, D] block of a [B, T, W] tensor: rows of b, columns col .. col + D.
  static at::Tensor block(const at::Tensor& x, int64_t b, int64_t col, int64_t d) {
    return x.select(0, b).narrow(1, col, d);
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv_in,
                            int64_t heads) {
    const at::Tensor qkv = qkv_in.contiguous();
    const int64_t b_n = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    at::Tensor probs = at::empty({b_n, heads, t, t}, qkv.options());
    at::Tensor y = at::empty({b_n, t, c}, qkv.options());
    const at::Tensor mask = at::full({t, t}, -std::numeric_limits<double>::infinity(),
                                     qkv.options()).triu_(1);
    gpt::parallel_blocks(b_n * heads, [&](gpt::Blocks& pairs) {
      // Grad mode is thread-local: the pool's threads have it on. Below autograd, as ATen's
      // own kernels run (and without its per-call dispatch).
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      at::Tensor scores = at::empty({t, t}, qkv.options());
      for (int64_t i = 0; pairs.next(i);) {
        const int64_t b = i / heads, col = (i % heads) * d;
        at::Tensor p = probs.select(0, b).select(0, i % heads);
        at::addmm_out(scores, mask, block(qkv, b, col, d), block(qkv, b, c + col, d).t(), 1.0,
                      scale);
        at::_softmax_out(p, scores, -1, false);
        at::Tensor y_block = block(y, b, col, d);
        at::mm_out(y_block, p, block(qkv, b, 2 * c + col, d));
      }
    });
    ctx->save_for_backward({qkv, probs});
    ctx->saved_data["heads"] = heads;
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& qkv = saved[0];
    const at::Tensor& probs = saved[1];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const at::Tensor dy = grads[0].contiguous();
    const int64_t b_n = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    at::Tensor dqkv = at::empty_like(qkv);
    gpt::parallel_blocks(b_n * heads, [&](gpt::Blocks& pairs) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      at::Tensor dp = at::empty({t, t}, qkv.options());
      at::Tensor ds = at::empty({t, t}, qkv.options());
      for (int64_t i = 0; pairs.next(i);) {
        const int64_t b = i / heads, col = (i % heads) * d;
        const at::Tensor p = probs.select(0, b).select(0, i % heads);
        const at::Tensor dy_block = block(dy, b, col, d);
        const at::Tensor q = block(qkv, b, col, d), k = block(qkv, b, c + col, d);
        at::Tensor dq = block(dqkv, b, col, d), dk = block(dqkv, b, c + col, d),
                   dv = block(dqkv, b, 2 * c + col, d);
        at::mm_out(dv, p.t(), dy_block);
        at::mm_out(dp, dy_block, block(qkv, b, 2 * c + col, d).t());
        at::_softmax_backward_data_out(ds, dp, p, -1, p.scalar_type());
        at::addmm_out(dq, dq, ds, k, 0.0, scale);  // beta 0: dq's old contents are ignored
        at::addmm_out(dk, dk, ds.t(), q, 0.0, scale);
      }
    });
    return {dqkv, at::Tensor()};
  }
};

struct CausalSelfAttentionImpl : nn::Module {
  CausalSelfAttentionImpl(const Config& c)
      : heads(c.heads),
        fused(c.fused_attention),
        split(c.split_linear),
        c_attn(register_module("c_attn", linear(c.width, 3 * c.width, c.bias))),
        c_proj(register_module("c_proj", linear(c.width, c.width, c.bias))),
        attn_dropout(register_module("attn_dropout", nn::Dropout(c.dropout))),
        resid_dropout(register_module("resid_dropout", nn::Dropout(c.dropout))) {}

  // `mask`: true where a token may not attend: [T, T] above the diagonal (the future
  // positions), or [B, 1, T, T] for packed documents (also every other document's positions),
  // which only the reference attention takes.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask) {
    const at::Tensor qkv = run_linear(split, x, c_attn->weight, c_attn->bias);
    const bool dropping = is_training() && attn_dropout->options.p() > 0;
    const bool can_fuse =
        qkv.device().is_cpu() && qkv.scalar_type() == at::kFloat && mask.dim() == 2;
    const at::Tensor y = fused && can_fuse && !dropping ? CausalAttention::apply(qkv, heads)
                                                        : reference(qkv, mask);
    return resid_dropout->forward(run_linear(split, y, c_proj->weight, c_proj->bias));
  }

  // nanoGPT's attention, in LibTorch operators: [B, T, 3C] -> [B, T, C].
  at::Tensor reference(const at::Tensor& qkv_all, const at::Tensor& mask) {
    const int64_t b = qkv_all.size(0), t = qkv_all.size(1), c = qkv_all.size(2) / 3,
                  q = c / heads;
    const auto qkv = qkv_all.split(c, 2);
    const at::Tensor qh = qkv[0].view({b, t, heads, q}).transpose(1, 2);
    const at::Tensor kh = qkv[1].view({b, t, heads, q}).transpose(1, 2);
    const at::Tensor vh = qkv[2].view({b, t, heads, q}).transpose(1, 2);
    at::Tensor att = at::matmul(qh, kh.transpose(-2, -1)) * (1.0 / std::sqrt(double(q)));
    att = at::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
    att = attn_dropout->forward(att);
    return at::matmul(att, vh).transpose(1, 2).contiguous().view({b, t, c});
  }

  int64_t heads;
  bool fused, split;
  nn::Linear c_attn, c_proj;
  nn::Dropout attn_dropout, resid_dropout;
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : nn::Module {
  explicit MlpImpl(const Config& c)
      : split(c.split_linear),
        gelu_fused(c.fused_gelu),
        c_fc(register_module("c_fc", linear(c.width, 4 * c.width, c.bias))),
        c_proj(register_module("c_proj", linear(4 * c.width, c.width, c.bias))),
        dropout(register_module("dropout", nn::Dropout(c.dropout))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor pre = run_linear(split, x, c_fc->weight, c_fc->bias);
    const at::Tensor h = gelu_fused ? gpt::fused_gelu(pre) : at::gelu(pre);
    return dropout->forward(run_linear(split, h, c_proj->weight, c_proj->bias));
  }
  bool split, gelu_fused;
  nn::Linear c_fc, c_proj;
  nn::Dropout dropout;
};
TORCH_MODULE(Mlp);

struct BlockImpl : nn::Module {
  explicit BlockImpl(const Config& c)
      : ln_1(register_module("ln_1", Norm(c.width, c.bias))),
        attn(register_module("attn", CausalSelfAttention(c))),
        ln_2(register_module("ln_2", Norm(c.width, c.bias))),
        mlp(register_module("mlp", Mlp(c))) {}
  at::Tensor forward(at::Tensor x, const at::Tensor& mask) {
    x = x + attn->forward(ln_1->forward(x), mask);
    return x + mlp->forward(ln_2->forward(x));
  }
  Norm ln_1;
  CausalSelfAttention attn;
  Norm ln_2;
  Mlp mlp;
};
TORCH_MODULE(Block);

// nanoGPT's `transformer` ModuleDict: wte, wpe, drop, h, ln_f.
struct TransformerImpl : nn::Module {
  explicit TransformerImpl(const Config& c)
      : wte(register_module("wte", nn::Embedding(c.vocab, c.width))),
        wpe(register_module("wpe", nn::Embedding(c.context, c.width))),
        drop(register_module("drop", nn::Dropout(c.dropout))),
        h(register_module("h", nn::ModuleList())),
        ln_f(register_module("ln_f", Norm(c.width, c.bias))) {
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.push_back(Block(c));
      h->push_back(blocks.back());
    }
  }
  nn::Embedding wte, wpe;
  nn::Dropout drop;
  nn::ModuleList h;
  std::vector<Block> blocks;  // h's entries, typed
  Norm ln_f;
};
TORCH_MODULE(Transformer);

struct GptImpl : nn::Module {
  explicit GptImpl(const Config& c)
      : transformer(register_module("transformer", Transformer(c))), split(c.split_linear) {
    at::NoGradGuard no_grad;
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* lin = m->as<nn::Linear>()) {
        lin->weight.normal_(0.0, 0.02);
        if (lin->bias.defined()) lin->bias.zero_();
      } else if (auto* emb = m->as<nn::Embedding>()) {
        emb->weight.normal_(0.0, 0.02);
      }
    }
    for (auto& b : transformer->blocks) {
      b->attn->c_proj->weight.normal_(0.0, proj_std);
      b->mlp->c_proj->weight.normal_(0.0, proj_std);
    }
  }
  at::Tensor forward(const at::Tensor& tokens, keel::Units& units,
                     const at::Tensor& positions = {}, const at::Tensor& documents = {}) {
    // The output layer is the token embedding (weight tying).
    return run_linear(split, features(tokens, units, positions, documents),
                      transformer->wte->weight);
  }
  at::Tensor forward(const at::Tensor& tokens) {
    keel::Units none;  // no calls: enter and leave do nothing
    return forward(tokens, none);
  }
  // Everything but the output layer: ln_f's output [B, T, width]. Each block is a unit
  // (entered before it, left with its output). `positions` [B, T] (undefined: 0 .. T-1 in every
  // row) index the position embedding; `documents` [B, T] (undefined: one document a row)
  // confine attention to the positions of the same document id (packed documents).
  at::Tensor features(const at::Tensor& tokens, keel::Units& units,
                      const at::Tensor& positions = {}, const at::Tensor& documents = {}) {
    const int64_t t = tokens.size(1);
    const at::Tensor pos =
        positions.defined() ? positions : at::arange(t, tokens.options().dtype(at::kLong));
    at::Tensor x = transformer->drop->forward(transformer->wte->forward(tokens) +
                                              transformer->wpe->forward(pos));
    at::Tensor mask = at::ones({t, t}, tokens.options().dtype(at::kBool)).triu(1);
    if (documents.defined())  // [B, 1, T, T]: the future, and every other document
      mask = mask.logical_or(documents.unsqueeze(2).ne(documents.unsqueeze(1))).unsqueeze(1);
    for (size_t i = 0; i < transformer->blocks.size(); ++i) {
      units.enter(static_cast<int>(i));
      x = units.leave(static_cast<int>(i), transformer->blocks[i]->forward(x, mask));
    }
    return transformer->ln_f->forward(x);
  }
  Transformer transformer;
  bool split;
};
TORCH_MODULE(Gpt);

class GptModel : public keel::ModuleModel<Gpt> {
 public:
  explicit GptModel(const keel::Context& ctx) : ModuleModel(Gpt(config(ctx))), c_(config(ctx)) {
    // N: every parameter but the position embedding; the tied wte once (it is in the module
    // once; lm_head.weight is only an alias, added by named_parameters).
    int64_t n = 0;
    for (const auto& p : module_->named_parameters(/*recurse=*/true))
      if (p.key() != "transformer.wpe.weight") n += p.value().numel();
    const double t = static_cast<double>(c_.context);
    flops_per_sample_ = t * (6.0 * static_cast<double>(n) +
                             12.0 * static_cast<double>(c_.layers * c_.width) * t);
  }

  at::Tensor forward(const at::Tensor& input) override {
    check_input(input);
    return module_->forward(input, units());
  }
  // A batch of named tensors (keel.model.batch/1): "inputs" as forward takes them, or packed
  // documents (the tokens dataset's pack_documents): "input_ids" [B, T], "position_ids" [B, T]
  // (from 0 at each packed piece) and "document_ids" [B, T] (attention stays within a piece:
  // a block-diagonal causal mask, computed by the reference attention).
  keel::NamedTensors forward_batch(const keel::NamedTensors& batch) override {
    const at::Tensor* ids = keel::find(batch, "input_ids");
    if (ids == nullptr) return {{"logits", forward(keel::need(batch, "inputs"))}};
    check_input(*ids);
    const at::Tensor* positions = keel::find(batch, "position_ids");
    const at::Tensor* documents = keel::find(batch, "document_ids");
    for (const at::Tensor* t : {positions, documents})
      if (t != nullptr && t->sizes() != ids->sizes())
        throw std::runtime_error("gpt: position_ids and document_ids must have input_ids' shape " +
                                 text::shape(ids->sizes()) + ", got " + text::shape(t->sizes()));
    return {{"logits", module_->forward(*ids, units(), positions ? *positions : at::Tensor(),
                                        documents ? *documents : at::Tensor())}};
  }
  // For a loss with compute_linear (chunked_cross_entropy): ln_f's output and the output
  // layer's weight, the tied token embedding.
  Features forward_features(const at::Tensor& input) override {
    check_input(input);
    return {module_->features(input, units()), module_->transformer->wte->weight};
  }
  // [distributed] shard = "parameters" (ABI 1.8 units): block N's parameters
  // (transformer.h.N.*) are unit N; the embeddings, ln_f and the tied output layer the root.
  int param_unit(const std::string& name) override {
    const std::string h = "transformer.h.";
    if (name.compare(0, h.size(), h) != 0) return -1;
    return std::stoi(name.substr(h.size()));
  }
  keel::NamedTensors named_parameters() override {
    keel::NamedTensors out = ModuleModel::named_parameters();
    out.emplace_back("lm_head.weight", module_->transformer->wte->weight);  // tied: same tensor
    return out;
  }
  keel::NamedTensors named_state() override { return named_parameters(); }  // no buffers
  double flops_per_sample() override { return flops_per_sample_; }
  // `keel export`: Hugging Face's GPT2LMHeadModel (see the comment at the top of the file).
  Export export_state() override { return {hf_tensors(), hf_config()}; }

 private:
  // Shapes and dtype only: no look at the values (that would synchronise with the device).
  void check_input(const at::Tensor& input) const {
    if (input.dim() != 2 || input.scalar_type() != at::kLong || input.size(1) < 1 ||
        input.size(1) > c_.context)
      throw std::runtime_error("gpt: expected int64 token ids of shape [batch, time] with 1 <= "
                               "time <= context (" + std::to_string(c_.context) + "), got " +
                               std::string(c10::toString(input.scalar_type())) + " " +
                               text::shape(input.sizes()) +
                               "; hint: the data's context must not exceed [model] context");
  }
  // The weights as GPT2LMHeadModel's state dict names and lays them out, in its order, less
  // lm_head.weight (tied to transformer.wte.weight). Its Conv1D layers hold weights as
  // [in, out] (y = x W + b), the transpose of a Linear's [out, in]; a bias the model lacks
  // (bias = false) is zeros, which gives the same function, since GPT-2 always has them.
  keel::NamedTensors hf_tensors() const {
    const TransformerImpl& t = *module_->transformer;
    keel::NamedTensors out;
    const auto bias_of = [](const at::Tensor& bias, int64_t size, const at::Tensor& like) {
      return bias.defined() ? bias : at::zeros({size}, like.options());
    };
    const auto norm = [&](const std::string& name, const Norm& n) {
      out.emplace_back(name + ".weight", n->weight);
      out.emplace_back(name + ".bias", bias_of(n->bias, n->width, n->weight));
    };
    const auto conv1d = [&](const std::string& name, const nn::Linear& l) {
      out.emplace_back(name + ".weight", l->weight.t());
      out.emplace_back(name + ".bias", bias_of(l->bias, l->weight.size(0), l->weight));
    };
    out.emplace_back("transformer.wte.weight", t.wte->weight);
    out.emplace_back("transformer.wpe.weight", t.wpe->weight);
    for (size_t i = 0; i < t.blocks.size(); ++i) {
      const BlockImpl& b = *t.blocks[i];
      const std::string h = "transformer.h." + std::to_string(i) + ".";
      norm(h + "ln_1", b.ln_1);
      conv1d(h + "attn.c_attn", b.attn->c_attn);
      conv1d(h + "attn.c_proj", b.attn->c_proj);
      norm(h + "ln_2", b.ln_2);
      conv1d(h + "mlp.c_fc", b.mlp->c_fc);
      conv1d(h + "mlp.c_proj", b.mlp->c_proj);
    }
    norm("transformer.ln_f", t.ln_f);
    return out;
  }
  // GPT2Config's fields this model determines: the sizes, exact GELU ("gelu"; "gelu_new" is
  // the tanh approximation), LayerNorm's eps 1e-5, the tied output layer, attention scaled by
  // 1/sqrt(head width) only, the MLP's 4 x width, and `dropout` as all three dropouts.
  std::string hf_config() const {
    const std::string p = json_number(c_.dropout);
    const auto i = [](int64_t v) { return std::to_string(v); };
    return "{\n"
           "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
           "  \"model_type\": \"gpt2\",\n"
           "  \"vocab_size\": " + i(c_.vocab) + ",\n"
           "  \"n_positions\": " + i(c_.context) + ",\n"
           "  \"n_ctx\": " + i(c_.context) + ",\n"
           "  \"n_embd\": " + i(c_.width) + ",\n"
           "  \"n_layer\": " + i(c_.layers) + ",\n"
           "  \"n_head\": " + i(c_.heads) + ",\n"
           "  \"n_inner\": " + i(4 * c_.width) + ",\n"
           "  \"activation_function\": \"gelu\",\n"
           "  \"layer_norm_epsilon\": 1e-05,\n"
           "  \"resid_pdrop\": " + p + ",\n"
           "  \"embd_pdrop\": " + p + ",\n"
           "  \"attn_pdrop\": " + p + ",\n"
           "  \"scale_attn_weights\": true,\n"
           "  \"scale_attn_by_inverse_layer_idx\": false,\n"
           "  \"reorder_and_upcast_attn\": false,\n"
           "  \"tie_word_embeddings\": true,\n"
           "  \"torch_dtype\": \"float32\"\n"
           "}\n";
  }
  static Config config(const keel::Context& ctx) {
    Config c{ctx.get(kVocabSize), ctx.get(kContext), ctx.get(kLayers),
             ctx.get(kHeads),     ctx.get(kWidth),   ctx.get(kDropout),
             ctx.get(kBias),      ctx.get(kAttention) == "fused",
             ctx.get(kLinear) == "split", ctx.get(kGelu) == "fused"};
    if (c.width % c.heads != 0)
      throw std::runtime_error("gpt: width (" + std::to_string(c.width) +
                               ") is not divisible by heads (" + std::to_string(c.heads) +
                               "); hint: pick a width that is a multiple of heads");
    return c;
  }
  Config c_;
  double flops_per_sample_ = 0;
};

const keel_option_desc kOptions[] = {
    kVocabSize, kContext, kLayers, kHeads, kWidth, kDropout, kBias, kAttention, kLinear, kGelu,
};
const keel_component_desc kComponents[] = {
    keel::component<GptModel>("gpt",
                              "decoder-only transformer (nanoGPT): token and position "
                              "embeddings, pre-norm causal self-attention and GELU MLP blocks, "
                              "tied output layer; [B, T] token ids -> [B, T, vocab] logits",
                              kOptions),
};

}  // namespace

KEEL_PLUGIN("keel-gpt", "0.4.0", "GPT language model", kComponents)
