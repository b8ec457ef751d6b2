// model component `gpt`: a decoder-only transformer as nanoGPT's (Karpathy's model.py).
//
//   tokens [B, T] (int64, T <= context)
//   x = wte(tokens) + wpe(0..T-1), dropout
//   `layers` x block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
//     attn: causal multi-head self-attention, qkv from one Linear(width, 3 width), an explicit
//           masked softmax (LibTorch 1.13 has no scaled_dot_product_attention), dropout on the
//           attention weights, output Linear(width, width), dropout
//     mlp:  Linear(width, 4 width), GELU (erf form), Linear(4 width, width), dropout
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
#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>

#include "keel/module_model.hpp"
#include "keel/plugin.hpp"

namespace {

namespace nn = torch::nn;

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream s;
  s << shape;
  return s.str();
}

struct Config {
  int64_t vocab, context, layers, heads, width;
  double dropout;
  bool bias;
};

nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return nn::Linear(nn::LinearOptions(in, out).bias(bias));
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

struct CausalSelfAttentionImpl : nn::Module {
  explicit CausalSelfAttentionImpl(const Config& c)
      : heads(c.heads),
        c_attn(register_module("c_attn", linear(c.width, 3 * c.width, c.bias))),
        c_proj(register_module("c_proj", linear(c.width, c.width, c.bias))),
        attn_dropout(register_module("attn_dropout", nn::Dropout(c.dropout))),
        resid_dropout(register_module("resid_dropout", nn::Dropout(c.dropout))) {}

  // `mask`: [T, T], true above the diagonal (the future positions a token may not attend to).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), q = c / heads;
    const auto qkv = c_attn->forward(x).split(c, 2);
    const at::Tensor qh = qkv[0].view({b, t, heads, q}).transpose(1, 2);
    const at::Tensor kh = qkv[1].view({b, t, heads, q}).transpose(1, 2);
    const at::Tensor vh = qkv[2].view({b, t, heads, q}).transpose(1, 2);
    at::Tensor att = at::matmul(qh, kh.transpose(-2, -1)) * (1.0 / std::sqrt(double(q)));
    att = at::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
    att = attn_dropout->forward(att);
    const at::Tensor y = at::matmul(att, vh).transpose(1, 2).contiguous().view({b, t, c});
    return resid_dropout->forward(c_proj->forward(y));
  }

  int64_t heads;
  nn::Linear c_attn, c_proj;
  nn::Dropout attn_dropout, resid_dropout;
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : nn::Module {
  explicit MlpImpl(const Config& c)
      : c_fc(register_module("c_fc", linear(c.width, 4 * c.width, c.bias))),
        c_proj(register_module("c_proj", linear(4 * c.width, c.width, c.bias))),
        dropout(register_module("dropout", nn::Dropout(c.dropout))) {}
  at::Tensor forward(const at::Tensor& x) {
    return dropout->forward(c_proj->forward(at::gelu(c_fc->forward(x))));
  }
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
  explicit GptImpl(const Config& c) : transformer(register_module("transformer", Transformer(c))) {
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
  at::Tensor forward(const at::Tensor& tokens) {
    const int64_t t = tokens.size(1);
    const at::Tensor pos = at::arange(t, tokens.options().dtype(at::kLong));
    at::Tensor x = transformer->drop->forward(transformer->wte->forward(tokens) +
                                              transformer->wpe->forward(pos));
    const at::Tensor mask = at::ones({t, t}, tokens.options().dtype(at::kBool)).triu(1);
    for (auto& b : transformer->blocks) x = b->forward(x, mask);
    // The output layer is the token embedding (weight tying).
    return at::linear(transformer->ln_f->forward(x), transformer->wte->weight);
  }
  Transformer transformer;
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
    // Shapes and dtype only: no look at the values (that would synchronise with the device).
    if (input.dim() != 2 || input.scalar_type() != at::kLong || input.size(1) < 1 ||
        input.size(1) > c_.context)
      throw std::runtime_error("gpt: expected int64 token ids of shape [batch, time] with 1 <= "
                               "time <= context (" + std::to_string(c_.context) + "), got " +
                               std::string(c10::toString(input.scalar_type())) + " " +
                               shape_str(input.sizes()) +
                               "; hint: the data's context must not exceed [model] context");
    return module_->forward(input);
  }
  keel::NamedTensors named_parameters() override {
    keel::NamedTensors out = ModuleModel::named_parameters();
    out.emplace_back("lm_head.weight", module_->transformer->wte->weight);  // tied: same tensor
    return out;
  }
  keel::NamedTensors named_state() override { return named_parameters(); }  // no buffers
  double flops_per_sample() override { return flops_per_sample_; }

 private:
  static Config config(const keel::Context& ctx) {
    Config c{ctx.get_int("vocab_size"), ctx.get_int("context"), ctx.get_int("layers"),
             ctx.get_int("heads"),      ctx.get_int("width"),   ctx.get_float("dropout"),
             ctx.get_bool("bias")};
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
    keel::opt_int("vocab_size", nullptr, "token ids are 0..vocab_size-1 (vocab.json's size)", 1,
                  1e9),
    keel::opt_int("context", "128", "longest sequence (position embeddings)", 1, 1e7),
    keel::opt_int("layers", "4", "transformer blocks", 1, 1e4),
    keel::opt_int("heads", "4", "attention heads per block (divides width)", 1, 1e4),
    keel::opt_int("width", "128", "embedding width", 1, 1e6),
    keel::opt_float("dropout", "0.0", "dropout on embeddings, attention weights and residuals",
                    0, 1),
    keel::opt_bool("bias", "true", "biases in the Linear layers and LayerNorms (not lm_head)"),
};
const keel_component_desc kComponents[] = {
    keel::component<GptModel>("gpt",
                              "decoder-only transformer (nanoGPT): token and position "
                              "embeddings, pre-norm causal self-attention and GELU MLP blocks, "
                              "tied output layer; [B, T] token ids -> [B, T, vocab] logits",
                              kOptions),
};

}  // namespace

KEEL_PLUGIN("keel-gpt", "0.1.0", "GPT language model", kComponents)
