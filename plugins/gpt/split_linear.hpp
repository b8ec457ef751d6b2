// A Linear layer's products split into blocks of rows over LibTorch's intra-op threads, one
// single-threaded BLAS call per block: gpt's `linear = "split"` (the default).
//
//   y = x W^T + b        x: [..., in] (rows: every leading index), W: [out, in], b: [out] or none
//   forward:  y[r] = x[r] W^T + b                      for each of n row blocks r
//   backward: dx[r] = dy[r] W;  dW = sum_r dy[r]^T x[r] (one partial per block, added in block
//             order by ATen's sum);  db = sum over rows of dy (ATen's sum)
//
// The blocks (8 for 256 to 4096 rows, one per 512 rows beyond, fewer of at least 32 rows below
// 256; split_linear.cpp) go to the intra-op threads as they ask for them (gpt::parallel_blocks,
// parallel.hpp), one single-threaded BLAS call per block. A single block (under 64 rows) is one
// BLAS call on the calling thread, with BLAS's own threads.
//
// Why: OpenBLAS 0.3.21 splits one product over its own two threads at 0.57 to 0.81 of the
// machine's measured float32 matmul peak for the char-GPT's shapes (4096 rows, 113 to 512
// columns) on the 2-core machine; two single-threaded calls on half the rows each, run at once,
// reach 0.87 to 0.93 (docs/performance.md, "The language model"). Inside a parallel
// region OpenBLAS's OpenMP build runs single-threaded, as in the fused attention. More blocks
// than threads, taken as the threads ask: when one core runs slower, the other takes more.
//
// The same function as ATen's linear within float32 rounding: each row block's product and the
// bias are ATen's addmm/mm on that block; dW's sum over rows is split into n partial products,
// so its rounding depends on n, which depends on the number of rows alone: the results are the
// same from run to run and whichever thread takes which block (tests/plugins/test_gpt.py
// compares 320 rows on 1, 2 and 3 threads). Float32 on the CPU only; `split_linear` runs ATen's
// linear otherwise. No double backward (its backward is not differentiable).
#pragma once

#include <ATen/core/Tensor.h>

namespace gpt {

// y = x W^T + b as above; `bias` undefined: none.
at::Tensor split_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace gpt
