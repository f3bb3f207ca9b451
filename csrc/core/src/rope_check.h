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
  // The table forms (rope.h): pair_table (one column per pair), K tables picked per pair by
  // sections (K = 1: one table, no sections; bound[k]: contiguous, the end of section k;
  // interleaved, K * s_k). `direct` when column i of the one table is feature i's.
  bool pair_table = false, sections_interleaved = false, direct = true;
  int32_t K = 1;
  int64_t bound[FUSELET_ROPE_MAX_SECTIONS] = {};
  // clang-format off: each data pointer beside its strides
  const void* in = nullptr; int64_t in_b = 0, in_s = 0, in_n = 0;
  void* out = nullptr;      int64_t out_b = 0, out_s = 0, out_n = 0;
  const void* cos = nullptr; int64_t cos_k = 0, cos_b = 0, cos_s = 0;
  const void* sin = nullptr; int64_t sin_k = 0, sin_b = 0, sin_s = 0;
  // clang-format on

  // The table of pair j (rope.h: k(j)).
  FUSELET_HOST_DEVICE int32_t table_of(int64_t j) const {
    if (sections_interleaved) {
      const int32_t m = static_cast<int32_t>(j % K);
      return m != 0 && j < bound[m] ? m : 0;
    }
    int32_t k = 0;
    while (k < K - 1 && j >= bound[k]) ++k;
    return k;
  }

  // Feature i < R's element of the (b, s) table row, in elements from that row of table 0
  // (offset by `stride_k`, cos_k or sin_k, per table): its table and column (rope.h).
  FUSELET_HOST_DEVICE int64_t table_offset(int64_t i, int64_t stride_k) const {
    const int64_t h = R / 2, j = interleaved ? i / 2 : (i < h ? i : i - h);
    return table_of(j) * stride_k + (pair_table ? j : i);
  }

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
// sections / n_sections: the K tables' sections (rope.h; NULL / 0: no K dim).
fuselet_status check_rope(const fuselet_tensor* in, const char* in_name, const fuselet_tensor* cos,
                          const fuselet_tensor* sin, const int64_t* sections, int32_t n_sections, uint32_t flags,
                          fuselet_tensor* out, const char* out_name, bool backward, RopeProblem* p);

// The `_check` functions of the C ABI: the inputs and options alone.
fuselet_status check_rope_inputs(const char* entry, const fuselet_tensor* in, const char* in_name,
                                 const fuselet_tensor* cos, const fuselet_tensor* sin, const int64_t* sections,
                                 int32_t n_sections, uint32_t flags, bool backward);

}  // namespace fuselet
