// sparse_optimizer components (ABI 1.9): adagrad and adamw over the rows of the model's sparse
// embedding tables (keel::Context::tables()). A step updates only the rows the step touched
// (keel_sparse_table.touched: duplicate ids are merged by the table), each from its gradient;
// the per-row state lives in the table's slots beside each row, so it grows with the table, is
// evicted with its row, and is saved and loaded with the table's rows. Neither keeps state of
// its own (no state_save): `keel train --resume` restores everything from the tables.
//
// adagrad (torch.optim.Adagrad without lr_decay and weight_decay): one slot per float, the sum
// of the squared gradients since the row was created; s = initial_accumulator_value + slot;
//   slot += g^2;  w -= lr * g / (sqrt(s) + eps)
// adamw (torch.optim.AdamW, decoupled weight decay): slots m[dim], v[dim] and the row's own
// step count t (one float: exact up to 2^24 = 16777216 updates of that row, after which it
// stops counting up; the bias correction is then 1 to float precision anyway). Weight decay
// applies to the rows the step touched only (an untouched row is not decayed).
//   t += 1;  w *= 1 - lr * weight_decay;  m = beta1 m + (1 - beta1) g;
//   v = beta2 v + (1 - beta2) g^2;  w -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
// Rows are updated in parallel (at::parallel_for) when a table has many touched rows. A table
// that hands its rows as tensors (ABI 1.11, keel_sparse_table.rows_as_tensors: rows in device
// memory) is updated with the same arithmetic as tensor operations on the rows' copies, which
// the table writes back at end_step.
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/sqrt.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "keel/plugin.hpp"
#include "keel/tensor.hpp"

namespace {

void check(bool ok, const std::string& what, const std::string& hint) {
  if (!ok) throw std::invalid_argument(what + "; hint: " + hint);
}

// Options, each declared once per optimizer (the two declare lr and eps with their own
// defaults): the schemas at the end list them, the optimizers read them as the types they
// declare (ctx.get).
namespace adagrad {
constexpr auto kLr = keel::opt_float(
    "lr", "0.01", "learning rate (the [lr_scheduler]'s factor applies to it)", 0, 1e9);
constexpr auto kEps =
    keel::opt_float("eps", "1e-10", "added to the root of the sum of squares", 0, 1);
constexpr auto kInitialAccumulatorValue =
    keel::opt_float("initial_accumulator_value", "0.0",
                    "the sum of squares of a row before its first update", 0, 1e9);
}  // namespace adagrad
namespace adamw {
constexpr auto kLr = keel::opt_float(
    "lr", "0.001", "learning rate (the [lr_scheduler]'s factor applies to it)", 0, 1e9);
constexpr auto kBeta1 =
    keel::opt_float("beta1", "0.9", "decay of the first moment", 0, keel::below(1));
constexpr auto kBeta2 =
    keel::opt_float("beta2", "0.999", "decay of the second moment", 0, keel::below(1));
constexpr auto kEps =
    keel::opt_float("eps", "1e-8", "added to the root of the second moment", 0, 1);
constexpr auto kWeightDecay =
    keel::opt_float("weight_decay", "0.01",
                    "decoupled weight decay, applied to the rows a step touches only", 0, 1e9);
}  // namespace adamw

// The rows of the tables, as a sparse optimizer sees them.
class RowOptimizer : public keel::SparseOptimizer {
 public:
  // lr: the optimizer's declaration of its learning rate.
  RowOptimizer(const keel::Context& ctx, const keel::Option<double>& lr, size_t floats_per_dim,
               size_t extra)
      : lr_(ctx.get(lr)), tables_(ctx.tables()) {
    check(!tables_.empty(), "the sparse optimizer got no tables",
          "[sparse_optimizer] trains the sparse embedding tables of a model that has them");
    for (const keel_sparse_table* t : tables_) {
      const size_t width = floats_per_dim * static_cast<size_t>(t->dim) + extra;
      keel_error err{};
      if (t->reserve_slots(t->self, width, &err) != KEEL_OK)
        throw std::runtime_error(std::string("table '") + t->name + "': reserve_slots failed: " +
                                 err.message);
      widths_.push_back(width);
    }
  }
  void step() override {
    for (size_t i = 0; i < tables_.size(); ++i) {
      const keel_sparse_table* t = tables_[i];
      keel_sparse_rows rows{};
      rows.struct_size = sizeof(rows);
      keel_error err{};
      if (t->touched(t->self, &rows, &err) != KEEL_OK)
        throw std::runtime_error(std::string("table '") + t->name + "': touched failed: " +
                                 err.message);
      if (rows.count == 0) continue;
      const bool tensors =
          KEEL_HAS_FIELD(t, keel_sparse_table, rows_as_tensors) && t->rows_as_tensors;
      const bool complete = tensors ? rows.row_values && rows.row_grads && rows.row_slots
                                    : rows.values && rows.grads && rows.slots;
      if (!complete || rows.slot_width != widths_[i])
        throw std::runtime_error(std::string("table '") + t->name + "': touched gave rows " +
                                 "without " + (tensors ? "tensors of " : "") +
                                 "values, gradients or the reserved slots (width " +
                                 std::to_string(rows.slot_width) + ", reserved " +
                                 std::to_string(widths_[i]) + ")");
      if (tensors) {
        at::Tensor w = keel::borrow(rows.row_values), s = keel::borrow(rows.row_slots);
        update_tensors(w, keel::borrow(rows.row_grads), s);
        continue;
      }
      const int64_t dim = t->dim;
      // A row is 3 to 10 flops per float: split only when a chunk has enough of them.
      const int64_t grain = std::max<int64_t>(1, 16384 / dim);
      at::parallel_for(0, static_cast<int64_t>(rows.count), grain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) update(rows.values[r], rows.grads[r], rows.slots[r], dim);
      });
    }
  }
  double get_lr() override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }

 protected:
  virtual void update(float* w, const float* g, float* slots, int64_t dim) const = 0;
  // The same update on every row of w [rows, dim], g [rows, dim] and slots [rows, width], in
  // place, with the float operations of update() in its order.
  virtual void update_tensors(at::Tensor& w, const at::Tensor& g, at::Tensor& slots) const = 0;
  double lr_;

 private:
  std::vector<const keel_sparse_table*> tables_;
  std::vector<size_t> widths_;
};

class Adagrad : public RowOptimizer {
 public:
  explicit Adagrad(const keel::Context& ctx)
      : RowOptimizer(ctx, adagrad::kLr, 1, 0),
        eps_(ctx.get(adagrad::kEps)),
        init_(ctx.get(adagrad::kInitialAccumulatorValue)) {}

 private:
  void update(float* w, const float* g, float* s, int64_t dim) const override {
    const float lr = static_cast<float>(lr_), eps = static_cast<float>(eps_);
    const float init = static_cast<float>(init_);
    for (int64_t d = 0; d < dim; ++d) {
      s[d] += g[d] * g[d];
      w[d] -= lr * g[d] / (std::sqrt(init + s[d]) + eps);
    }
  }
  void update_tensors(at::Tensor& w, const at::Tensor& g, at::Tensor& s) const override {
    const float lr = static_cast<float>(lr_), eps = static_cast<float>(eps_);
    const float init = static_cast<float>(init_);
    s.add_(g * g);
    w.sub_((g * lr).div_((s + init).sqrt_().add_(eps)));
  }
  double eps_, init_;
};

class AdamW : public RowOptimizer {
 public:
  explicit AdamW(const keel::Context& ctx)
      : RowOptimizer(ctx, adamw::kLr, 2, 1),
        beta1_(ctx.get(adamw::kBeta1)),
        beta2_(ctx.get(adamw::kBeta2)),
        eps_(ctx.get(adamw::kEps)),
        weight_decay_(ctx.get(adamw::kWeightDecay)) {}

 private:
  void update(float* w, const float* g, float* slots, int64_t dim) const override {
    float* m = slots;
    float* v = slots + dim;
    float& t = slots[2 * dim];
    if (t < 16777216.0f) t += 1.0f;  // 2^24: the last count a float holds exactly
    const double bc1 = 1 - std::pow(beta1_, t), bc2 = 1 - std::pow(beta2_, t);
    const float step = static_cast<float>(lr_ / bc1);
    const float root_bc2 = static_cast<float>(std::sqrt(bc2));
    const float decay = static_cast<float>(1 - lr_ * weight_decay_);
    const float b1 = static_cast<float>(beta1_), b2 = static_cast<float>(beta2_);
    const float eps = static_cast<float>(eps_);
    for (int64_t d = 0; d < dim; ++d) {
      w[d] *= decay;
      m[d] += (g[d] - m[d]) * (1 - b1);
      v[d] = b2 * v[d] + (1 - b2) * g[d] * g[d];
      w[d] -= step * m[d] / (std::sqrt(v[d]) / root_bc2 + eps);
    }
  }
  void update_tensors(at::Tensor& w, const at::Tensor& g, at::Tensor& slots) const override {
    const int64_t dim = w.size(1);
    at::Tensor m = slots.narrow(1, 0, dim), v = slots.narrow(1, dim, dim);
    at::Tensor t = slots.narrow(1, 2 * dim, 1);
    t.add_((t < 16777216.0f).to(at::kFloat));  // 2^24, as update()
    // Per row, in double as update() computes them: lr / (1 - beta1^t), sqrt(1 - beta2^t).
    const at::Tensor td = t.to(at::kDouble);
    const at::Tensor step = (lr_ / (1 - at::pow(beta1_, td))).to(at::kFloat);
    const at::Tensor root_bc2 = (1 - at::pow(beta2_, td)).sqrt_().to(at::kFloat);
    const float decay = static_cast<float>(1 - lr_ * weight_decay_);
    const float b1 = static_cast<float>(beta1_), b2 = static_cast<float>(beta2_);
    const float eps = static_cast<float>(eps_);
    w.mul_(decay);
    m.add_((g - m).mul_(1 - b1));
    v.copy_(v * b2 + (g * (1 - b2)).mul_(g));
    w.sub_((step * m).div_(v.sqrt().div_(root_bc2).add_(eps)));
  }
  double beta1_, beta2_, eps_, weight_decay_;
};

const keel_option_desc kAdagradOptions[] = {adagrad::kLr, adagrad::kEps,
                                           adagrad::kInitialAccumulatorValue};
const keel_option_desc kAdamWOptions[] = {adamw::kLr, adamw::kBeta1, adamw::kBeta2, adamw::kEps,
                                          adamw::kWeightDecay};
const keel_component_desc kComponents[] = {
    keel::component<Adagrad>("adagrad", "Adagrad over the touched rows of sparse tables "
                             "(state: one sum of squares per float)", kAdagradOptions),
    keel::component<AdamW>("adamw", "AdamW over the touched rows of sparse tables (state: "
                           "m, v and a step count per row)", kAdamWOptions),
};

}  // namespace

KEEL_PLUGIN("keel-sparse-optimizers", "0.1.0",
            "Adagrad and AdamW for the rows of sparse embedding tables", kComponents)
