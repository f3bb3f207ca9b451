// Argument checking shared by the CPU and CUDA gated-linear-unit entry points.
#pragma once

#include "fuselet/glu.h"
#include "internal.h"

namespace fuselet {

// A checked GLU problem: R rows, x rows of 2F elements, y / dy rows of F.
struct GluProblem {
  fuselet_dtype dtype = FUSELET_FLOAT32;
  int32_t activation = FUSELET_GLU_SILU;
  bool interleaved = false;        // x = [g_0, u_0, g_1, u_1, ...]
  float alpha = 1.f, limit = 0.f;  // FUSELET_GLU_SILU_CLAMPED
  int64_t rows = 0, half = 0;  // half = F
  // clang-format off: each data pointer beside its strides
  const void* x = nullptr;  int64_t x_stride = 0;
  const void* dy = nullptr; int64_t dy_stride = 0;
  void* y = nullptr;        int64_t y_stride = 0;   // forward
  void* dx = nullptr;       int64_t dx_stride = 0;  // backward
  // clang-format on
};

// `opts` of the _ex entry points; `ex` false: the plain ones, whose options hold only the activation.
fuselet_status check_glu_fwd(const fuselet_tensor* x, const fuselet_glu_options* opts, bool ex, fuselet_tensor* y,
                             GluProblem* p);
fuselet_status check_glu_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_glu_options* opts,
                             bool ex, fuselet_tensor* dx, GluProblem* p);

// The plain entry points' options: the activation, halves layout.
inline fuselet_glu_options glu_options(int32_t activation) { return {activation, 0, 0.f, 0.f}; }

}  // namespace fuselet
