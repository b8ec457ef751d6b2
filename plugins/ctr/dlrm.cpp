// model `dlrm`: a DLRM-style click-through-rate model (Naumov et al. 2019) whose embeddings are
// hash tables (keel::EmbeddingTable, <keel/embedding.hpp>).
//
// Input (dataset `criteo`, docs/recommendation.md "Batch layout"), either
//  - columns: `inputs` float64 [B, 39]; columns 0..12 the numeric features (already
//    transformed), columns 13..38 the 26 categorical ids (integers, -1 = missing): dense =
//    columns 0..12 as float32, feature f's bag = the one id in column 13 + f; or
//  - named (a named batch, keel.model.batch/1, without `inputs`): `dense` float [B, 13],
//    `sparse_ids` int64 [B, L] and `sparse_offsets` int64 [B, 27]: sample b's bag of feature f
//    is sparse_ids[b, sparse_offsets[b, f] .. sparse_offsets[b, f + 1]) (multi-hot and ragged:
//    any number of ids per bag, none included; ids past sparse_offsets[b, 26] and negative ids
//    are ignored, so a row may be padded with -1).
// Output: logits [B] (float32), one per sample, for loss `bce`.
//
//   x = bottom(dense)            Linear + ReLU per width of bottom_mlp (an empty list: x = dense)
//   e_f = pool(rows of feature f's id)   f = 1..26, [B, embedding_dim]; a missing id gives zeros
//   interaction "dot": z = [x, <v_i, v_j> for i > j] over v = (x, e_1, .., e_26) (DLRM's
//                      pairwise dot products, 27 * 26 / 2 = 351 of them); x must be
//                      embedding_dim wide
//               "cat": z = [x, e_1, .., e_26]
//   logit = top(z)               Linear + ReLU per width of top_mlp, then Linear(.., 1)
//
// Tables: "per_feature" gives each feature a table of its own, named C1 .. C26 (Criteo's column
// names); "shared" gives all features one table, named `categorical`, in which feature f's id
// is keel::EmbeddingTable::shared_id(f, id) (f = 0..25). Either way forward looks every table
// up once for all the features using it: bags = B (per feature) or B x 26 (shared), bag
// b * 26 + f holding sample b's ids of feature f. `pooling` decides how a bag of several ids
// combines (sum, or mean over the bag's ids >= 0, an id without a row counting as a zero row);
// Criteo's fields are single-valued, and with one id per bag sum and mean both give that id's
// row, and zeros for a missing id (an empty bag gives zeros too). The tables get the
// run's seed, the options min_count, ttl_steps, max_rows, max_pending and init_std, and the
// run's keel_comm (so that with several ranks they are sharded by id over the ranks);
// set_training reaches them; Model::tables() shows them to the kernel, which hands them to the
// [sparse_optimizer] and saves them with the checkpoints.
//
// Dense parameters (named bottom0.weight, bottom0.bias, .., top0.weight, .., out.weight,
// out.bias) use LibTorch's default initialisation, drawn from the global generator, which the
// kernel seeds before it creates the model.
//
// FLOPs (flops_per_sample), as keel-models counts them: one multiply-accumulate (MAC) = 2
// FLOPs; counted are the MACs of the Linear layers (bottom, top and the output layer: in * out
// each) and, with "dot", of the batched matrix product forward computes (27 x 27 x
// embedding_dim: every pair, though 351 pairs are kept); not counted are the table lookups and
// pooling (memory traffic, no MACs), biases, activations and the sparse update. A training
// step counts 3 x the forward (the backward computes the gradients of inputs and weights).
#include <ATen/ops/arange.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "components.hpp"
#include "keel/embedding.hpp"
#include "keel/plugin.hpp"
#include "keel/tensor.hpp"

namespace keel_ctr {
namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kEmbeddingDim = keel::opt_int(
    "embedding_dim", "16", "floats per embedding row", 1, 4096);
constexpr auto kBottomMlp = keel::opt_int_list(
    "bottom_mlp", "[64, 16]",
    "widths of the bottom MLP over the 13 numeric features (Linear + ReLU "
    "each; [] for none); with interaction = \"dot\" the last width must equal "
    "embedding_dim",
    1, 1e6);
constexpr auto kTopMlp = keel::opt_int_list(
    "top_mlp", "[128, 64]",
    "widths of the top MLP's hidden layers (Linear + ReLU each); a Linear "
    "layer to the one logit follows",
    1, 1e6);
constexpr auto kInteraction = keel::opt_string(
    "interaction", "\"dot\"",
    "how the bottom MLP's output and the 26 embeddings meet: their pairwise dot "
    "products (dot) or their concatenation (cat), beside the bottom output",
    "dot|cat");
constexpr auto kTables = keel::opt_string(
    "tables", "\"per_feature\"",
    "one embedding table per categorical feature (C1 .. C26), or one table for "
    "all of them (shared, named categorical) with the feature mixed into each id",
    "per_feature|shared");
constexpr auto kPooling = keel::opt_string(
    "pooling", "\"sum\"",
    "how a bag of several ids combines (sum or mean of the rows); Criteo fields "
    "hold one id, so both give that id's row, and zeros for a missing id",
    "sum|mean");
constexpr auto kMinCount = keel::opt_int(
    "min_count", "1",
    "an id gets a row at its min_count-th sighting in training (until then it "
    "reads zeros); 1: at once",
    1, 1e9);
constexpr auto kTtlSteps = keel::opt_int(
    "ttl_steps", "0", "evict rows not looked up in training for this many steps (0: never)", 0,
    1e15);
constexpr auto kMaxRows = keel::opt_int(
    "max_rows", "0",
    "most rows per table on one rank (more is an error naming the table); 0: no " "limit", 0, 1e15);
constexpr auto kMaxPending = keel::opt_int(
    "max_pending", "0",
    "most ids waiting for admission (min_count > 1) per table on one rank after a "
    "step; past it the oldest steps' ids are forgotten until half wait; 0: 4 x "
    "max_rows, or 1048576 without max_rows",
    0, 1e15);
constexpr auto kInitStd = keel::opt_float(
    "init_std", "0.01", "a new row starts as N(0, init_std^2), drawn from (seed, table, id) alone",
    0, 1e3);
constexpr auto kTableDevice = keel::opt_string(
    "table_device", "\"run\"",
    "where the tables keep their rows: the run's device ([run] device; on a "
    "GPU, device memory) or the CPU's memory (then the pooled rows move to the "
    "GPU and their gradients back)",
    "run|cpu");
constexpr auto kTableTensorOps = keel::opt_bool(
    "table_tensor_ops", "false",
    "CPU tables: read and write the rows with tensor operations and hand them to "
    "the sparse optimizer as tensors, as tables in device memory do (the same "
    "values, slower at small batches; to check that path on the CPU)");

namespace nn = torch::nn;
namespace text = keel::text;

constexpr int64_t kNumeric = 13, kCategorical = 26, kColumns = kNumeric + kCategorical;

class Dlrm : public keel::Model {
 public:
  explicit Dlrm(const keel::Context& ctx)
      : dim_(ctx.get(kEmbeddingDim)),
        dot_(ctx.get(kInteraction) == "dot"),
        pooling_(ctx.get(kPooling) == "mean" ? keel::Pooling::kMean
                                                     : keel::Pooling::kSum) {
    int64_t width = kNumeric;
    for (int64_t w : ctx.get(kBottomMlp)) width = add(bottom_, "bottom", width, w);
    if (dot_ && width != dim_)
      throw std::invalid_argument(
          "dlrm: interaction = \"dot\" needs the bottom MLP's output as wide as the "
          "embeddings, but bottom_mlp ends at width " + std::to_string(width) +
          " and embedding_dim is " + std::to_string(dim_) + "; hint: make bottom_mlp's last "
          "width " + std::to_string(dim_) + ", or set interaction = \"cat\"");
    const int64_t vectors = 1 + kCategorical;
    width = dot_ ? width + vectors * (vectors - 1) / 2 : width + kCategorical * dim_;
    for (int64_t w : ctx.get(kTopMlp)) width = add(top_, "top", width, w);
    out_ = root_->register_module("out", nn::Linear(width, 1));
    forward_macs_ += static_cast<double>(width);
    if (dot_) {
      forward_macs_ += static_cast<double>(vectors * vectors * dim_);
      // The strict lower triangle of the [27, 27] products, as flat indices.
      std::vector<int64_t> pairs;
      for (int64_t i = 0; i < vectors; ++i)
        for (int64_t j = 0; j < i; ++j) pairs.push_back(i * vectors + j);
      pairs_ = at::tensor(pairs, at::kLong);
    }
    make_tables(ctx);
  }

  at::Tensor forward(const at::Tensor& input) override {
    if (input.dim() != 2 || input.size(1) != kColumns || !input.is_floating_point())
      throw std::invalid_argument(
          "dlrm: expected inputs float64 [B, 39] (13 numeric features, then 26 categorical "
          "ids), got " + std::string(c10::toString(input.scalar_type())) + " " +
          text::shape(input.sizes()) + "; hint: use dataset criteo (its batch layout)");
    const at::Tensor x = bottom(input.slice(1, 0, kNumeric));
    // The lookups return the pooled rows on the tables' device (table_device): they go to the
    // device of the dense part (a no-op when they are there), and backward brings their
    // gradient back.
    return top(x, embed(input.slice(1, kNumeric, kColumns).to(at::kLong).contiguous())
                      .to(x.device()));
  }

  // A named batch: `inputs` (the columns, as forward) or `dense`, `sparse_ids` and
  // `sparse_offsets` (multi-hot bags).
  keel::NamedTensors forward_batch(const keel::NamedTensors& batch) override {
    if (const at::Tensor* columns = keel::find(batch, "inputs")) return {{"logits", forward(*columns)}};
    const at::Tensor& dense = keel::need(batch, "dense");
    const at::Tensor& ids = keel::need(batch, "sparse_ids");
    const at::Tensor& offsets = keel::need(batch, "sparse_offsets");
    const int64_t b = dense.size(0);
    if (dense.dim() != 2 || dense.size(1) != kNumeric || !dense.is_floating_point() ||
        ids.dim() != 2 || ids.size(0) != b || ids.scalar_type() != at::kLong ||
        offsets.sizes() != at::IntArrayRef{b, kCategorical + 1} ||
        offsets.scalar_type() != at::kLong)
      throw std::invalid_argument(
          "dlrm: expected dense float [B, 13], sparse_ids int64 [B, L] and sparse_offsets "
          "int64 [B, 27], got dense " + layout(dense) + ", sparse_ids " + layout(ids) +
          " and sparse_offsets " + layout(offsets) + "; hint: dataset criteo with layout = "
          "\"named\" gives these");
    const at::Tensor x = bottom(dense);
    return {{"logits", top(x, embed_bags(ids, offsets).to(x.device()))}};
  }

 private:
  static std::string layout(const at::Tensor& t) {
    return std::string(c10::toString(t.scalar_type())) + " " + text::shape(t.sizes());
  }

  // The bottom MLP over the numeric features [B, 13].
  at::Tensor bottom(const at::Tensor& dense) {
    at::Tensor x = dense.to(at::kFloat);
    for (nn::Linear& fc : bottom_) x = at::relu(fc->forward(x));
    return x;
  }

  // The interaction of x [B, width] with the pooled embeddings e [B, 26, dim], and the top MLP
  // to one logit per sample.
  at::Tensor top(const at::Tensor& x, const at::Tensor& e) {
    at::Tensor z;
    if (dot_) {
      const at::Tensor v = at::cat({x.unsqueeze(1), e}, 1);  // [B, 27, dim]
      const at::Tensor products = at::bmm(v, v.transpose(1, 2)).flatten(1);
      z = at::cat({x, products.index_select(1, pairs_.to(products.device()))}, 1);
    } else {
      z = at::cat({x, e.flatten(1)}, 1);
    }
    for (nn::Linear& fc : top_) z = at::relu(fc->forward(z));
    return out_->forward(z).reshape({-1});
  }

 public:
  void set_training(bool training) override {
    root_->train(training);
    for (keel::EmbeddingTable& t : tables_) t.set_training(training);
  }
  keel::NamedTensors named_parameters() override {
    keel::NamedTensors out;
    for (const auto& p : root_->named_parameters(/*recurse=*/true))
      out.emplace_back(p.key(), p.value());
    return out;
  }
  double flops_per_sample() override { return 3.0 * 2.0 * forward_macs_; }
  std::vector<const keel_sparse_table*> tables() override {
    std::vector<const keel_sparse_table*> out;
    for (keel::EmbeddingTable& t : tables_) out.push_back(t.abi());
    return out;
  }

 private:
  // Appends Linear(in, out) named PREFIX<i> to `layers`; returns out.
  int64_t add(std::vector<nn::Linear>& layers, const std::string& prefix, int64_t in,
              int64_t out) {
    const std::string name = prefix + std::to_string(layers.size());
    layers.push_back(root_->register_module(name, nn::Linear(in, out)));
    forward_macs_ += static_cast<double>(in * out);
    return out;
  }

  void make_tables(const keel::Context& ctx) {
    keel::TableOptions options;
    options.dim = dim_;
    options.min_count = ctx.get(kMinCount);
    options.ttl_steps = ctx.get(kTtlSteps);
    options.max_rows = ctx.get(kMaxRows);
    options.max_pending = ctx.get(kMaxPending);
    options.init_std = ctx.get(kInitStd);
    options.seed = ctx.seed();
    if (ctx.get(kTableDevice) == "run") options.device = ctx.device();
    options.tensor_ops = ctx.get(kTableTensorOps);
    tables_.reserve(kCategorical);
    if (ctx.get(kTables) == "shared") {
      options.name = "categorical";
      tables_.emplace_back(options, ctx.comm());
      return;
    }
    for (int64_t f = 0; f < kCategorical; ++f) {
      options.name = "C" + std::to_string(f + 1);
      tables_.emplace_back(options, ctx.comm());
    }
  }

  // ids int64 [B, 26] -> pooled rows [B, 26, dim]: one lookup per table, one id per bag.
  at::Tensor embed(const at::Tensor& ids) {
    const int64_t b = ids.size(0);
    if (tables_.size() == 1) {
      at::Tensor shared = at::empty({b * kCategorical}, at::kLong);
      const int64_t* in = ids.data_ptr<int64_t>();
      int64_t* out = shared.data_ptr<int64_t>();
      for (int64_t i = 0; i < b * kCategorical; ++i)
        out[i] = keel::EmbeddingTable::shared_id(i % kCategorical, in[i]);
      const at::Tensor offsets = at::arange(b * kCategorical, at::kLong);
      return tables_[0].lookup(shared, offsets, pooling_).view({b, kCategorical, dim_});
    }
    const at::Tensor offsets = at::arange(b, at::kLong);
    std::vector<at::Tensor> features;
    features.reserve(tables_.size());
    for (int64_t f = 0; f < kCategorical; ++f)
      features.push_back(tables_[f].lookup(ids.select(1, f).contiguous(), offsets, pooling_));
    return at::stack(features, 1);
  }

  // Multi-hot bags (forward_batch): ids int64 [B, L], offsets int64 [B, 27] -> pooled rows
  // [B, 26, dim], one lookup per table, as embed.
  at::Tensor embed_bags(const at::Tensor& ids, const at::Tensor& offsets) {
    const at::Tensor id = ids.to(at::kCPU).contiguous(), off = offsets.to(at::kCPU).contiguous();
    const int64_t b = id.size(0), width = id.size(1);
    const int64_t* in = id.data_ptr<int64_t>();
    const int64_t* o = off.data_ptr<int64_t>();
    for (int64_t s = 0; s < b; ++s)
      for (int64_t f = 0; f <= kCategorical; ++f) {
        const int64_t at = o[s * (kCategorical + 1) + f];
        const int64_t before = f == 0 ? 0 : o[s * (kCategorical + 1) + f - 1];
        if (at < before || at > width)
          throw std::invalid_argument(
              "dlrm: sparse_offsets[" + std::to_string(s) + ", " + std::to_string(f) + "] = " +
              std::to_string(at) + ": a sample's offsets are non-decreasing, from >= 0 to at "
              "most sparse_ids' width " + std::to_string(width));
      }
    const bool shared = tables_.size() == 1;
    // Per table: the ids of its bags in bag order, and each bag's start.
    std::vector<std::vector<int64_t>> flat(tables_.size()), starts(tables_.size());
    for (int64_t s = 0; s < b; ++s)
      for (int64_t f = 0; f < kCategorical; ++f) {
        const size_t t = shared ? 0 : static_cast<size_t>(f);
        starts[t].push_back(static_cast<int64_t>(flat[t].size()));
        const int64_t* bag = o + s * (kCategorical + 1) + f;
        for (int64_t k = bag[0]; k < bag[1]; ++k)
          flat[t].push_back(shared ? keel::EmbeddingTable::shared_id(f, in[s * width + k])
                                   : in[s * width + k]);
      }
    if (shared)
      return tables_[0].lookup(at::tensor(flat[0], at::kLong), at::tensor(starts[0], at::kLong),
                               pooling_).view({b, kCategorical, dim_});
    std::vector<at::Tensor> features;
    features.reserve(tables_.size());
    for (size_t t = 0; t < tables_.size(); ++t)
      features.push_back(tables_[t].lookup(at::tensor(flat[t], at::kLong),
                                           at::tensor(starts[t], at::kLong), pooling_));
    return at::stack(features, 1);
  }

  int64_t dim_;
  bool dot_;
  keel::Pooling pooling_;
  std::shared_ptr<nn::Module> root_ = std::make_shared<nn::Module>("dlrm");
  std::vector<nn::Linear> bottom_, top_;
  nn::Linear out_{nullptr};
  at::Tensor pairs_;  // "dot": flat indices of the kept pairs in the [27, 27] products
  double forward_macs_ = 0;
  std::vector<keel::EmbeddingTable> tables_;
};

const keel_option_desc kOptions[] = {
    kEmbeddingDim, kBottomMlp, kTopMlp, kInteraction, kTables, kPooling, kMinCount, kTtlSteps,
    kMaxRows, kMaxPending, kInitStd, kTableDevice, kTableTensorOps,
};

}  // namespace

keel_component_desc dlrm_component() {
  return keel::component<Dlrm>(
      "dlrm",
      "DLRM-style click-through-rate model over dataset criteo's batches ([B, 39] inputs, or "
      "named dense, sparse_ids and sparse_offsets with multi-hot bags): bottom MLP on the 13 "
      "numeric features, hash-table embeddings (keel::EmbeddingTable) for the 26 categorical "
      "ones, dot or concatenation interaction, top MLP to one logit per sample",
      kOptions);
}

}  // namespace keel_ctr
