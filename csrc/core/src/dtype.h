// Host-side float16 / bfloat16 <-> float32 conversions (round to nearest even), written
// branch-light so the row loops that use them vectorize.
#pragma once

#include <cstdint>
#include <cstring>

namespace fuselet {

struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float to_float(float v) { return v; }
inline float to_float(bfloat16_t v) { return bits_to_float(static_cast<uint32_t>(v.bits) << 16); }
inline float to_float(half_t v) {
  // F. Giesen's half_to_float_fast4, exact for all inputs; every case computed and one
  // selected, so that the loops that call it vectorize.
  const uint32_t shifted_exp = 0x7c00u << 13;
  const uint32_t o = ((v.bits & 0x7fffu) << 13) + ((127u - 15u) << 23);
  const uint32_t exp = shifted_exp & (static_cast<uint32_t>(v.bits) << 13);
  const uint32_t inf_nan = o + ((128u - 16u) << 23);
  const uint32_t subnormal = float_to_bits(bits_to_float(o + (1u << 23)) - bits_to_float(113u << 23));
  const uint32_t r = exp == shifted_exp ? inf_nan : exp == 0 ? subnormal : o;
  return bits_to_float(r | (static_cast<uint32_t>(v.bits & 0x8000u) << 16));
}

// Round to nearest even; branch-free like to_float(half_t), for the same reason.
template <typename T> inline T from_float(float f);
template <> inline float from_float<float>(float f) { return f; }
template <> inline bfloat16_t from_float<bfloat16_t>(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return {static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}
template <> inline half_t from_float<half_t>(float fv) {
  // F. Giesen's float_to_half_fast3_rtne.
  const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
  const uint32_t denorm_magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  const uint32_t sign = float_to_bits(fv) & 0x80000000u;
  const uint32_t f = float_to_bits(fv) ^ sign;
  const uint32_t inf_nan = f > f32infty ? 0x7e00u : 0x7c00u;
  const uint32_t subnormal = float_to_bits(bits_to_float(f) + bits_to_float(denorm_magic_bits)) - denorm_magic_bits;
  const uint32_t normal = (f + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + ((f >> 13) & 1u)) >> 13;
  const uint32_t o = f >= f16max ? inf_nan : f < (113u << 23) ? subnormal : normal;
  return {static_cast<uint16_t>(o | (sign >> 16))};
}

}  // namespace fuselet
