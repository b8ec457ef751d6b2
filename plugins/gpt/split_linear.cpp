#include "split_linear.hpp"

#include <ATen/Parallel.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "parallel.hpp"

namespace gpt {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int64_t kMinRows = 32;          // a block has at least this many rows
constexpr int64_t kBlockRows = 512;       // and, from 8 blocks on, at most about this many
constexpr int64_t kBlocksAtLeast = 8;     // the blocks' number, where rows allow

// How many row blocks `rows` rows make: kBlocksAtLeast of at least kMinRows rows each (fewer
// when rows are fewer than 8 * 32), one per kBlockRows rows beyond 8 * kBlockRows. It depends
// on `rows` alone, not on the thread count: the blocks, and so every result, are the same
// however many threads run them. On the 2-core machine a single-threaded product of the
// char-GPT's shapes ran as fast on 512 rows as on 2048, within the noise (docs/performance.md).
int64_t block_count(int64_t rows) {
  const int64_t wanted = std::max(kBlocksAtLeast, at::divup(rows, kBlockRows));
  return std::max<int64_t>(1, std::min(wanted, rows / kMinRows));
}

// f(block, first row, end row) for each of `n` blocks of `rows` rows (block i: rows
// i*rows/n .. (i+1)*rows/n - 1), the blocks shared out over LibTorch's intra-op threads as they
// ask for them (gpt::parallel_blocks; n == 1 runs on the calling thread, where BLAS uses its own
// threads). Below autograd, as ATen's kernels run: the pool's threads have grad mode on, and
// the out= products would refuse inputs that require grad.
template <typename F>
void for_each_block(int64_t rows, int64_t n, const F& f) {
  gpt::parallel_blocks(n, [&](gpt::Blocks& blocks) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (int64_t i = 0; blocks.next(i);) f(i, i * rows / n, (i + 1) * rows / n);
  });
}

// The forward and backward of both autograd functions below (bias: whether there is one).
at::Tensor forward_rows(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight,
                        const at::Tensor& bias) {
  const at::Tensor x = x_in.contiguous();
  const int64_t in = weight.size(1), out = weight.size(0), rows = x.numel() / in;
  const at::Tensor x2 = x.view({rows, in});
  at::Tensor y = at::empty({rows, out}, x.options());
  for_each_block(rows, block_count(rows), [&](int64_t, int64_t r0, int64_t r1) {
    at::Tensor y_rows = y.slice(0, r0, r1);
    if (bias.defined())
      at::addmm_out(y_rows, bias, x2.slice(0, r0, r1), weight.t());
    else
      at::mm_out(y_rows, x2.slice(0, r0, r1), weight.t());
  });
  ctx->save_for_backward({x, weight});
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = out;
  return y.view(sizes);
}

// {dx, dW, db}; db undefined without a bias, each one undefined when its input needs none.
tensor_list backward_rows(AutogradContext* ctx, const tensor_list& grads, bool bias) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& x = saved[0];
  const at::Tensor& weight = saved[1];
  const int64_t in = weight.size(1), out = weight.size(0), rows = x.numel() / in;
  const at::Tensor x2 = x.view({rows, in});
  const at::Tensor dy = grads[0].contiguous().view({rows, out});
  const bool want_dx = ctx->needs_input_grad(0), want_dw = ctx->needs_input_grad(1);
  const int64_t n = block_count(rows);
  at::Tensor dx, dw, partial;  // partial: each block's share of dW (with one block: dw itself)
  if (want_dx) dx = at::empty({rows, in}, x.options());
  if (want_dw) dw = at::empty({out, in}, weight.options());
  if (want_dw && n > 1) partial = at::empty({n, out, in}, weight.options());
  for_each_block(rows, n, [&](int64_t i, int64_t r0, int64_t r1) {
    const at::Tensor dy_rows = dy.slice(0, r0, r1);
    if (want_dx) {
      at::Tensor dx_rows = dx.slice(0, r0, r1);
      at::mm_out(dx_rows, dy_rows, weight);
    }
    if (want_dw) {
      at::Tensor share = n == 1 ? dw : partial.select(0, i);
      at::mm_out(share, dy_rows.t(), x2.slice(0, r0, r1));
    }
  });
  if (partial.defined()) at::sum_out(dw, partial, 0);  // in block order, whoever computed them
  const bool want_db = bias && ctx->needs_input_grad(2);
  return {want_dx ? dx.view(x.sizes()) : at::Tensor(), dw, want_db ? dy.sum(0) : at::Tensor()};
}

// Two functions because an autograd function's tensor inputs must be defined.
struct SplitLinear : torch::autograd::Function<SplitLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    return forward_rows(ctx, x, weight, bias);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return backward_rows(ctx, grads, /*bias=*/true);
  }
};

struct SplitLinearNoBias : torch::autograd::Function<SplitLinearNoBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    return forward_rows(ctx, x, weight, at::Tensor());
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    tensor_list g = backward_rows(ctx, grads, /*bias=*/false);
    g.pop_back();
    return g;
  }
};

}  // namespace

at::Tensor split_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const auto is_float_cpu = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kFloat;
  };
  // What the split path handles; anything else (and every shape error) is ATen's linear's.
  const bool splits = is_float_cpu(x) && is_float_cpu(weight) && weight.dim() == 2 &&
                      x.dim() >= 1 && x.size(-1) == weight.size(1) && weight.size(1) > 0 &&
                      x.numel() > 0 &&
                      (!bias.defined() || (is_float_cpu(bias) && bias.dim() == 1 &&
                                           bias.size(0) == weight.size(0)));
  if (!splits) return at::linear(x, weight, bias);
  return bias.defined() ? SplitLinear::apply(x, weight, bias) : SplitLinearNoBias::apply(x, weight);
}

}  // namespace gpt
