// A Linear layer's products split by rows over LibTorch's intra-op threads, one single-threaded
// BLAS call per thread: gpt's `linear = "split"` (the default).
//
//   y = x W^T + b        x: [..., in] (rows: every leading index), W: [out, in], b: [out] or none
//   forward:  y[r] = x[r] W^T + b                      each of n row blocks r on its own thread
//   backward: dx[r] = dy[r] W;  dW = sum_r dy[r]^T x[r] (one partial per block, added in block
//             order);  db = sum over rows of dy (ATen's sum)
//
// Why: OpenBLAS 0.3.21 splits one product over its own two threads at 0.57 to 0.81 of the
// machine's measured float32 matmul peak for the char-GPT's shapes (4096 rows, 113 to 512
// columns) on the 2-core machine; two single-threaded calls on half the rows each, run at once,
// reach 0.87 to 0.93 (docs/performance.md, "The language model"). Inside a parallel
// region OpenBLAS's OpenMP build runs single-threaded, as in the fused attention.
//
// The same function as ATen's linear within float32 rounding: each row block's product and the
// bias are ATen's addmm/mm on that block; dW's sum over rows is split into n partial products,
// so its rounding depends on n = min(intra-op threads, rows / 32), the same from run to run on
// the same thread count. Float32 on the CPU only; `split_linear` runs ATen's linear otherwise.
// No double backward (its backward is not differentiable).
#pragma once

#include <ATen/core/Tensor.h>

namespace gpt {

// y = x W^T + b as above; `bias` undefined: none.
at::Tensor split_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace gpt
