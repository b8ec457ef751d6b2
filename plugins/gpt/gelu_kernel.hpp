// The fused GELU's loop (fused_gelu.hpp): for i < n, y[i] = GELU(x[i]) (erf form) and
// slope[i] = its derivative at x[i]. Plain float arrays, no LibTorch: this file is compiled on its
// own with the flags its vectorisation needs (plugins/gpt/meson.build). Any thread; the three
// arrays must not overlap.
#pragma once

#include <cstdint>

namespace gpt {

void gelu_and_slope(const float* __restrict x, float* __restrict y, float* __restrict slope,
                    int64_t n);

}  // namespace gpt
