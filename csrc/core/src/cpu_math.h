// Branch-free float32 exp / erf / sigmoid / tanh for the CPU kernels: plain arithmetic and
// bit moves only, so that GCC vectorizes the loops that call them (the libm functions stop
// vectorization). Relative error of exp_approx about 1e-7 (Cephes expf); erf_approx absolute
// error below 1.5e-7 (Abramowitz and Stegun 7.1.26).
#pragma once

#include <cstdint>

#include "dtype.h"

namespace fuselet {
namespace cpu {

// a * b + c rounded once: the polynomials below are written with it. GCC emits one FMA
// instruction for it in the AVX2 and AVX-512 copies of the row kernels (and vectorizes it) and a
// call to libm's exact fmaf in the x86-64 baseline copy, which has no FMA instruction: every copy
// gives the same bits (-ffp-contract=off keeps the compiler from fusing anything else).
__attribute__((always_inline)) inline float fmadd(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// Out of range the result is selected at the end (0 below -87.3, inf above 88.3) rather than
// clamping x first: a clamp lets GCC fold exp of the bound into the callers' vector code,
// where constants like sigmoid(-88.3) are subnormal and every use costs a microcode assist.
__attribute__((always_inline)) inline float exp_approx(float x) {
  const float shifted = fmadd(x, 1.44269504088896341f, 12582912.f);  // 1.5 * 2^23 + round(x / ln 2)
  const float n = shifted - 12582912.f;
  float r = fmadd(n, -0.693359375f, x);
  r = fmadd(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmadd(p, r, 1.3981999507e-3f);
  p = fmadd(p, r, 8.3334519073e-3f);
  p = fmadd(p, r, 4.1665795894e-2f);
  p = fmadd(p, r, 1.6666665459e-1f);
  p = fmadd(p, r, 5.0000001201e-1f);
  p = fmadd(p * r, r, r) + 1.f;
  // 2^n from the integer in shifted's low mantissa bits (two's complement, in uint32: no
  // float-to-int conversion, which is undefined for the NaN or huge x the selects below replace).
  const uint32_t n_bits = float_to_bits(shifted) - 0x4B400000u;
  const float v = p * bits_to_float((n_bits + 127u) << 23);
  const float big = x > 88.3f ? __builtin_huge_valf() : v;
  return x < -87.3f ? 0.f : big;
}

__attribute__((always_inline)) inline float sigmoid_approx(float x) { return 1.f / (1.f + exp_approx(-x)); }

__attribute__((always_inline)) inline float erf_approx(float x) {
  const float a = x < 0.f ? -x : x;
  const float t = 1.f / (1.f + 0.3275911f * a);
  float p = 1.061405429f;
  p = fmadd(p, t, -1.453152027f);
  p = fmadd(p, t, 1.421413741f);
  p = fmadd(p, t, -0.284496736f);
  p = fmadd(p, t, 0.254829592f);
  const float y = fmadd(-p * t, exp_approx(-a * a), 1.f);
  return x < 0.f ? -y : y;
}

// tanh(x) from exp_approx: (1 - e) / (1 + e) with e = exp(-2|x|), and for |x| < 0.3 (where
// 1 - e cancels) its odd Taylor polynomial to x^9 (truncation below 2e-8 relative). Both are
// computed and one selected, so that the loops that call it vectorize.
__attribute__((always_inline)) inline float tanh_approx(float x) {
  const float a = x < 0.f ? -x : x;
  const float e = exp_approx(-2.f * a);
  const float big = (1.f - e) / (1.f + e);
  const float a2 = a * a;
  float q = 62.f / 2835.f;
  q = fmadd(q, a2, -(17.f / 315.f));
  q = fmadd(q, a2, 2.f / 15.f);
  q = fmadd(q, a2, -(1.f / 3.f));
  const float small = fmadd(a * a2, q, a);
  const float t = a < 0.3f ? small : big;
  return x < 0.f ? -t : t;
}

// log(x) (Cephes logf: the mantissa m in [sqrt(1/2), sqrt(2)) and a polynomial in m - 1;
// relative error about 1e-7), for x > 0 including subnormals (scaled by 2^23 first); 0 gives
// -inf, inf gives inf, x < 0 and NaN give NaN. Selects only, so that the loops that call it
// vectorize.
__attribute__((always_inline)) inline float log_approx(float x) {
  const bool tiny = x < 1.17549435e-38f;  // subnormal (or 0, or negative: selected below)
  const float xs = tiny ? x * 8388608.f : x;
  const uint32_t bits = float_to_bits(xs);
  const float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127);
  const float m1 = bits_to_float((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  const bool big = m1 > 1.41421356f;
  const float f = (big ? 0.5f * m1 : m1) - 1.f;
  const float n = e + (big ? 1.f : 0.f) - (tiny ? 23.f : 0.f);
  const float z = f * f;
  float y = 7.0376836292e-2f;
  y = fmadd(y, f, -1.1514610310e-1f);
  y = fmadd(y, f, 1.1676998740e-1f);
  y = fmadd(y, f, -1.2420140846e-1f);
  y = fmadd(y, f, 1.4249322787e-1f);
  y = fmadd(y, f, -1.6668057665e-1f);
  y = fmadd(y, f, 2.0000714765e-1f);
  y = fmadd(y, f, -2.4999993993e-1f);
  y = fmadd(y, f, 3.3333331174e-1f);
  y = y * f * z;
  y = fmadd(-2.12194440e-4f, n, y);
  y = fmadd(-0.5f, z, y);
  const float r = fmadd(0.693359375f, n, f + y);
  const float inf = __builtin_huge_valf();
  const float special = x == 0.f ? -inf : (x == inf ? inf : __builtin_nanf(""));
  return (x > 0.f && x < inf) ? r : special;
}

}  // namespace cpu
}  // namespace fuselet
