// GELU (erf form) whose forward also computes its slope, so that its backward is one
// multiplication: gpt's `gelu = "fused"` (the default).
//
//   forward:  y = x Phi(x),  slope = Phi(x) + x phi(x)   (saved for the backward)
//   backward: dx = dy * slope
//   Phi: the standard normal distribution function, 0.5 (1 + erf(x / sqrt 2));
//   phi: its density, exp(-x^2 / 2) / sqrt(2 pi)
//
// One pass over x writes y and the slope. erf is Abramowitz and Stegun's 7.1.26 (absolute error
// at most 1.5e-7, the approximation ATen's vectorised erf uses), whose exp(-x^2 / 2) phi shares;
// exp is Cephes' expf polynomial. So y and dx agree with LibTorch's gelu and gelu_backward
// within float32 rounding plus that error (tests/plugins/test_gpt.py checks the model's logits
// and gradients within 1e-5). LibTorch's gelu backward computes erf and exp again from the saved
// input; on the 2-core machine it took about twice its forward (docs/performance.md).
//
// On x86-64 with GCC the loop is compiled for the x86-64-v4 (AVX-512) and x86-64-v3 (AVX2,
// FMA) levels as well as the baseline, one of them chosen when the plugin loads by what the CPU
// supports (target_clones); with clang, for the baseline alone (gelu_kernel.cpp says why). Float32 on the CPU only; `fused_gelu` runs ATen's gelu otherwise. Memory:
// the slope is saved instead of x (the same size). No double backward.
#pragma once

#include <ATen/core/Tensor.h>

namespace gpt {

at::Tensor fused_gelu(const at::Tensor& x);

}  // namespace gpt
