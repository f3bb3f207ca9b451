// Argument checking shared by the CPU and CUDA softmax entry points.
#pragma once

#include "fuselet/softmax.h"
#include "internal.h"

namespace fuselet {

// A checked softmax problem: R rows of K elements; with causal, query i = r mod Q of row r
// sees keys j <= i + shift, shift = K - Q.
struct SoftmaxProblem {
  fuselet_dtype dtype = FUSELET_FLOAT32;
  int64_t rows = 0, keys = 0;
  float scale = 1.f;
  bool causal = false;
  int64_t queries = 1, shift = 0;
  // clang-format off: each data pointer beside its strides
  const void* x = nullptr;  int64_t x_stride = 0;   // forward: x; backward: y
  const void* dy = nullptr; int64_t dy_stride = 0;  // backward
  void* out = nullptr;      int64_t out_stride = 0; // forward: y; backward: dx
  // clang-format on

  // Unmasked keys of row r: [0, visible(r)).
  FUSELET_HOST_DEVICE int64_t visible(int64_t r) const {
    if (!causal) return keys;
    const int64_t v = r % queries + shift + 1;
    return v < 0 ? 0 : (v > keys ? keys : v);
  }
};

fuselet_status check_softmax_fwd(const fuselet_tensor* x, float scale, uint32_t flags, fuselet_tensor* y,
                                 SoftmaxProblem* p);
fuselet_status check_softmax_bwd(const fuselet_tensor* dy, const fuselet_tensor* y, float scale, fuselet_tensor* dx,
                                 SoftmaxProblem* p);

}  // namespace fuselet
