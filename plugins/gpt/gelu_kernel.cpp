#include "gelu_kernel.hpp"

#include <cmath>

namespace gpt {

// y[i] = x Phi(x) and slope[i] = Phi(x) + x phi(x) for x = x[i], i < n.
// - e = exp(-x^2 / 2) by Cephes' expf: w = -x^2 / 2 = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in
//   two parts, so r is exact), exp(r) by its polynomial, 2^k put in the exponent bits. |x| is
//   clamped at 13 so that 2^k stays a normal float (exp(-84.5) is 2e-37: the terms e enters are
//   then below float32's resolution of the sums they enter); the clamp sends NaN to 13 too, so
//   the integer conversion is always defined (y and the slope are NaN through their factor x).
// - With z = |x| / sqrt 2, Abramowitz and Stegun 7.1.26 gives 1 - erf(z) = t (a1 + t (a2 +
//   t (a3 + t (a4 + t a5)))) exp(-z^2) with t = 1 / (1 + p z), and exp(-z^2) is e. The tail
//   q = (1 - erf(z)) / 2 is Phi(-|x|), so Phi(x) = q for x < 0 and 1 - q otherwise.
// One loop body without calls, so that each clone's loop is vectorised with its instruction set
// (a helper function of the default target would not be inlined into the clones). GCC 12
// vectorises it only with -fno-trapping-math (plugins/gpt/meson.build compiles this file alone
// so, without LibTorch's headers): otherwise it keeps a branch for conditionals whose arms
// compute in floating point, and did not vectorise this loop even without them. clang 14
// vectorises it either way, but gets no clones: its resolver chose the AVX-512 clone on a
// 2-core AMD EPYC VM whose kernel does not enable AVX-512 (/proc/cpuinfo lists avx and avx2
// alone), which died of SIGILL (also with target_clones("avx512f", ...)); GCC 12's resolver
// chose right there. keel's clang builds are the sanitizer and fuzzer builds.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void gelu_and_slope(const float* __restrict x, float* __restrict y, float* __restrict slope,
                    int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    // min(|v|, 13), compared as integers (NaN's bits are above 13's). __builtin_bit_cast: GCC
    // 11 and clang 9 have it (C++20's std::bit_cast); GCC did not vectorise memcpy's here.
    uint32_t abs_bits = __builtin_bit_cast(uint32_t, v) & 0x7fffffffu;
    abs_bits = abs_bits < 0x41500000u ? abs_bits : 0x41500000u;  // 13.0f
    const float a = __builtin_bit_cast(float, abs_bits);
    const float w = -0.5f * a * a;  // -x^2 / 2, at least -84.5
    const float k = std::floor(w * 1.44269504088896341f + 0.5f);
    const float r = (w - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const float e = p * __builtin_bit_cast(float, (static_cast<int32_t>(k) + 127) << 23);
    const float t = 1.0f / (1.0f + 0.3275911f * 0.70710678118654752f * std::fabs(v));
    const float poly =
        t * (0.254829592f +
             t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    const float q = 0.5f * poly * e;
    const float cdf = q + static_cast<float>(v >= 0.0f) * (1.0f - 2.0f * q);  // q or 1 - q
    y[i] = v * cdf;
    slope[i] = cdf + v * e * 0.39894228040143268f;  // 1 / sqrt(2 pi)
  }
}

}  // namespace gpt
