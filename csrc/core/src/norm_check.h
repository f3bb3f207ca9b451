// Argument checking shared by the CPU and CUDA normalization entry points.
#pragma once

#include "fuselet/norm.h"
#include "internal.h"

namespace fuselet {

// A checked normalization problem: R rows of H elements plus raw pointers.
struct NormProblem {
  fuselet_dtype dtype = FUSELET_FLOAT32;        // x, y, dy, dx
  fuselet_dtype param_dtype = FUSELET_FLOAT32;  // weight, bias, dweight, dbias: dtype or float32
  float w_offset = 0.f;                         // 1 with FUSELET_NORM_ZERO_CENTERED_GAMMA
  int64_t rows = 0, hidden = 0;
  float eps = 0.f;
  // clang-format off: each data pointer beside its strides
  const void* x = nullptr;  int64_t x_stride = 0;
  const void* dy = nullptr; int64_t dy_stride = 0;
  void* y = nullptr;        int64_t y_stride = 0;
  void* dx = nullptr;       int64_t dx_stride = 0;
  // clang-format on
  const void* weight = nullptr;  // null: scale by 1
  const void* bias = nullptr;    // null: add 0
  float* mean = nullptr;  // null for RMSNorm
  float* rstd = nullptr;
  void* dweight = nullptr;  // null when there is no weight
  void* dbias = nullptr;    // null for RMSNorm or when not requested
  // Residual add + RMSNorm: the norm's input is x + res, rounded to dtype and written to hout;
  // the backward adds dres to dx. All null otherwise.
  // clang-format off: each data pointer beside its strides
  const void* res = nullptr;  int64_t res_stride = 0;
  void* hout = nullptr;       int64_t hout_stride = 0;
  const void* dres = nullptr; int64_t dres_stride = 0;
  // clang-format on
  // Gated RMSNorm: the gate z (and its gradient dz in the backward), rows normalized in groups
  // of `group` elements (rstd: one per group), the gate applied first (FUSELET_NORM_GATE_FIRST).
  // z and dz are null otherwise, and `group` is the hidden size.
  // clang-format off: each data pointer beside its strides
  const void* z = nullptr;  int64_t z_stride = 0;
  void* dz = nullptr;       int64_t dz_stride = 0;
  // clang-format on
  int64_t group = 0;
  bool gate_first = false;
};

// Checks a forward call. bias and mean are null for RMSNorm.
fuselet_status check_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight, const fuselet_tensor* bias,
                              float eps, uint32_t flags, fuselet_tensor* y, fuselet_tensor* mean, fuselet_tensor* rstd,
                              bool layer_norm, NormProblem* p);

// Checks a backward call. mean and dbias are null for RMSNorm.
fuselet_status check_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* weight,
                              const fuselet_tensor* mean, const fuselet_tensor* rstd, uint32_t flags,
                              fuselet_tensor* dx, fuselet_tensor* dweight, fuselet_tensor* dbias, bool layer_norm,
                              NormProblem* p);

// Checks a residual add + RMSNorm forward (x, residual, residual_out: rows like x).
fuselet_status check_add_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* residual,
                                  const fuselet_tensor* weight, float eps, uint32_t flags, fuselet_tensor* y,
                                  fuselet_tensor* residual_out, fuselet_tensor* rstd, NormProblem* p);

// Checks a residual add + RMSNorm backward (residual_out is the norm's input x).
fuselet_status check_add_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                                  const fuselet_tensor* residual_out, const fuselet_tensor* weight,
                                  const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                  fuselet_tensor* dweight, NormProblem* p);

// Checks a gated RMSNorm forward (z: rows like x; rstd: rows * hidden / group elements).
fuselet_status check_gated_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* z, const fuselet_tensor* weight,
                                    float eps, int64_t group_size, uint32_t flags, fuselet_tensor* y,
                                    fuselet_tensor* rstd, NormProblem* p);

// Checks a gated RMSNorm backward.
fuselet_status check_gated_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, const fuselet_tensor* z,
                                    const fuselet_tensor* weight, const fuselet_tensor* rstd, int64_t group_size,
                                    uint32_t flags, fuselet_tensor* dx, fuselet_tensor* dz, fuselet_tensor* dweight,
                                    NormProblem* p);

}  // namespace fuselet
