// Argument checking shared by the CPU and CUDA gated-linear-unit entry points.
#pragma once

#include "fuselet/glu.h"
#include "internal.h"

namespace fuselet {

// A checked GLU problem: R rows, x rows of 2F elements, y / dy rows of F.
struct GluProblem {
  fuselet_dtype dtype = FUSELET_FLOAT32;
  int32_t activation = FUSELET_GLU_SILU;
  int64_t rows = 0, half = 0;  // half = F
  // clang-format off: each data pointer beside its strides
  const void* x = nullptr;  int64_t x_stride = 0;
  const void* dy = nullptr; int64_t dy_stride = 0;
  void* y = nullptr;        int64_t y_stride = 0;   // forward
  void* dx = nullptr;       int64_t dx_stride = 0;  // backward
  // clang-format on
};

fuselet_status check_glu_fwd(const fuselet_tensor* x, int32_t activation, fuselet_tensor* y, GluProblem* p);
fuselet_status check_glu_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation, fuselet_tensor* dx,
                             GluProblem* p);

}  // namespace fuselet
