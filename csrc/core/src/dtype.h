// Host-side float16 / bfloat16 <-> float32 conversions (round to nearest even), written
// branch-light so the row loops that use them vectorize.
#pragma once

#include <cstdint>
#include <cstring>

namespace fuselet {

struct half_t { uint16_t bits; };
struct bfloat16_t { uint16_t bits; };

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float to_float(float v) { return v; }
inline float to_float(bfloat16_t v) { return bits_to_float(static_cast<uint32_t>(v.bits) << 16); }
inline float to_float(half_t v) {
  // F. Giesen's half_to_float_fast4, exact for all inputs.
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = (v.bits & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += (127 - 15) << 23;
  if (exp == shifted_exp) {
    o += (128 - 16) << 23;  // Inf / NaN
  } else if (exp == 0) {
    o += 1 << 23;  // zero / subnormal: renormalize
    o = float_to_bits(bits_to_float(o) - bits_to_float(113u << 23));
  }
  return bits_to_float(o | (static_cast<uint32_t>(v.bits & 0x8000u) << 16));
}

template <typename T> inline T from_float(float f);
template <> inline float from_float<float>(float f) { return f; }
template <> inline bfloat16_t from_float<bfloat16_t>(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}
template <> inline half_t from_float<half_t>(float fv) {
  // F. Giesen's float_to_half_fast3_rtne.
  const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
  const uint32_t denorm_magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t f = float_to_bits(fv);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t o;
  if (f >= f16max) {
    o = (f > f32infty) ? 0x7e00 : 0x7c00;
  } else if (f < (113u << 23)) {
    o = static_cast<uint16_t>(float_to_bits(bits_to_float(f) + bits_to_float(denorm_magic_bits)) - denorm_magic_bits);
  } else {
    const uint32_t mant_odd = (f >> 13) & 1u;
    f += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    f += mant_odd;
    o = static_cast<uint16_t>(f >> 13);
  }
  return {static_cast<uint16_t>(o | (sign >> 16))};
}

}  // namespace fuselet
