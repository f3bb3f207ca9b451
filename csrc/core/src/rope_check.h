// Argument checking shared by the CPU and CUDA rotary-embedding entry points.
#pragma once

#include "fuselet/rope.h"
#include "internal.h"

namespace fuselet {

// A checked rope problem: rows = B * S * N heads of D features, the first R rotated. Strides
// are in elements and indexed by the logical dims (b, s, n) whatever the memory layout; a
// shared [S, R] table has cos_b = sin_b = 0. `in` is x (forward) or dy (backward), `out` is
// y or dx. Every offset of every row fits in int64 (checked).
struct RopeProblem {
  fuselet_dtype dtype = FUSELET_FLOAT32;     // x, y, dy, dx
  fuselet_dtype cs_dtype = FUSELET_FLOAT32;  // cos, sin
  bool interleaved = false, bhsd = false, backward = false;
  int64_t B = 0, S = 0, N = 0, D = 0, R = 0, rows = 0;
  // clang-format off: each data pointer beside its strides
  const void* in = nullptr; int64_t in_b = 0, in_s = 0, in_n = 0;
  void* out = nullptr;      int64_t out_b = 0, out_s = 0, out_n = 0;
  const void* cos = nullptr; int64_t cos_b = 0, cos_s = 0;
  const void* sin = nullptr; int64_t sin_b = 0, sin_s = 0;
  // clang-format on

  // Row r -> (b, s, n): rows are numbered in x's memory order (n fastest for BSHD, s for BHSD).
  FUSELET_HOST_DEVICE void locate(int64_t r, int64_t* b, int64_t* s, int64_t* n) const {
    if (bhsd) {
      *s = r % S;
      const int64_t t = r / S;
      *n = t % N;
      *b = t / N;
    } else {
      *n = r % N;
      const int64_t t = r / N;
      *s = t % S;
      *b = t / S;
    }
  }
};

// in: x (backward: dy, named `in_name`); out: y (backward: dx, `out_name`).
fuselet_status check_rope(const fuselet_tensor* in, const char* in_name, const fuselet_tensor* cos,
                          const fuselet_tensor* sin, uint32_t flags, fuselet_tensor* out, const char* out_name,
                          bool backward, RopeProblem* p);

}  // namespace fuselet
