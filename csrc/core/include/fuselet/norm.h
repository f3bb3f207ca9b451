/*
 * fuselet normalization kernels: RMSNorm and LayerNorm over the last dimension.
 *
 * Shapes. x is [..., H]; it is read as R rows of H elements, R = product of the leading
 * dims (R may be 0). The last dim must have stride 1 and the leading dims must collapse
 * into a single row stride (any contiguous tensor, or a slice of rows of one).
 * y, dy and dx follow the same rule and must have x's shape and dtype.
 * weight, bias, dweight, dbias are 1-D [H] with stride 1. They share one "parameter dtype":
 * x's dtype, or FUSELET_FLOAT32 with any x (float32 master weights with float16 / bfloat16
 * activations). dweight has weight's dtype, dbias bias's.
 * weight and bias are optional (NULL): no weight scales by 1, no bias adds 0. The backward
 * takes dweight exactly when it takes weight; dbias is optional (NULL: not computed).
 * mean and rstd are float32 with R elements, contiguous (any shape with R elements).
 * Supported dtypes: FUSELET_FLOAT32, FUSELET_FLOAT16, FUSELET_BFLOAT16; the math runs in
 * float32. eps must be finite and > 0. flags: a bitwise OR of fuselet_norm_flags (0: none).
 *
 * Math (per row r, over its H elements, w = weight, or 1 + weight with
 * FUSELET_NORM_ZERO_CENTERED_GAMMA, b = bias):
 *   RMSNorm:   rstd_r = 1 / sqrt(mean(x_r^2) + eps)
 *              y_r    = x_r * rstd_r * w
 *   LayerNorm: mean_r = mean(x_r),  rstd_r = 1 / sqrt(mean((x_r - mean_r)^2) + eps)
 *              xhat_r = (x_r - mean_r) * rstd_r,   y_r = xhat_r * w + b
 * Backward (g_r = dy_r * w):
 *   RMSNorm:   dx_r = rstd_r * (g_r - xhat_r * mean(g_r * xhat_r)),  xhat_r = x_r * rstd_r
 *              dweight = sum_r dy_r * xhat_r
 *   LayerNorm: dx_r = rstd_r * (g_r - mean(g_r) - xhat_r * mean(g_r * xhat_r))
 *              dweight = sum_r dy_r * xhat_r,   dbias = sum_r dy_r
 * dweight is the same with and without FUSELET_NORM_ZERO_CENTERED_GAMMA (d(1 + w)/dw = 1).
 *
 * Residual add + RMSNorm (the pre-norm transformer step in one pass). residual and
 * residual_out have x's shape and dtype (and follow x's layout rule):
 *   h_r = round_to_dtype(x_r + residual_r)          (residual_out, the next residual stream)
 *   y_r = RMSNorm(h_r)                             (as above, with h_r as its input)
 * Backward, with dh_out = d(residual_out) from whatever consumes the residual stream:
 *   dx_r = RMSNorm backward of dy_r at h_r  +  dh_out_r   (= d(residual)_r: both inputs get it)
 *   dweight = sum_r dy_r * h_r * rstd_r
 * Gated RMSNorm (Qwen3-Next's and Qwen3.5's RMSNormGated, Mamba2's, FLA's FusedRMSNormGated),
 * with a gate z of x's shape and dtype, each row normalized in groups of S = group_size
 * elements (0: one group of H; S must divide H; G = H / S groups per row), s = silu(z):
 *   y_r = RMSNorm_groups(x_r) * s_r                    (default: normalize, then gate)
 *   y_r = RMSNorm_groups(x_r * s_r)                    (FUSELET_NORM_GATE_FIRST: Mamba2's
 *                                                      norm_before_gate=False)
 * where RMSNorm_groups scales each group of a row by its own rstd (over its S elements) and then
 * by w, as RMSNorm above. rstd is float32 with R * G elements: row r's groups at r * G.
 * Backward: the RMSNorm backward per group (mean over the group's S elements) of
 * dn = dy * s (normalize then gate; dz = dy * n * silu'(z), n the normalized, weighted x)
 * or of dy at h = x * s (gate first; dx = dh * s, dz = dh * x * silu'(z)); dweight sums
 * dn * xhat (or dy * xhat) over the rows.
 *
 * With R == 0 the forward writes nothing and the backward writes zeros to dweight/dbias.
 *
 * Host entry points take host pointers and run on the calling thread plus fuselet's own
 * worker threads (see fuselet_set_num_threads); they return when the result is written.
 * `_cuda` entry points take device pointers and enqueue on `stream` (cudaStream_t).
 */
#ifndef FUSELET_NORM_H_
#define FUSELET_NORM_H_

#include "fuselet/fuselet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of the normalization entry points, combined with bitwise OR. */
typedef enum fuselet_norm_flags {
  FUSELET_NORM_ZERO_CENTERED_GAMMA = 1, /* scale by (1 + weight) (needs a weight) */
  FUSELET_NORM_GATE_FIRST = 2           /* gated RMSNorm only: normalize x * silu(z) */
} fuselet_norm_flags;

/* RMSNorm forward. In: x [..., H], weight [H] or NULL, eps, flags.
 * Out: y [..., H], rstd [R] (float32). */
FUSELET_API fuselet_status fuselet_rms_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight, float eps,
                                                uint32_t flags, fuselet_tensor* y, fuselet_tensor* rstd);

/* RMSNorm backward. In: dy, x [..., H], weight [H] or NULL, rstd [R] from the forward, flags.
 * Out: dx [..., H], dweight [H] (NULL exactly when weight is). */
FUSELET_API fuselet_status fuselet_rms_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                const fuselet_tensor* weight, const fuselet_tensor* rstd,
                                                uint32_t flags, fuselet_tensor* dx, fuselet_tensor* dweight);

/* LayerNorm forward. In: x [..., H], weight [H] or NULL, bias [H] or NULL, eps, flags.
 * Out: y [..., H], mean [R], rstd [R] (float32). */
FUSELET_API fuselet_status fuselet_layer_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* weight,
                                                  const fuselet_tensor* bias, float eps, uint32_t flags,
                                                  fuselet_tensor* y, fuselet_tensor* mean, fuselet_tensor* rstd);

/* LayerNorm backward. In: dy, x [..., H], weight [H] or NULL, mean [R], rstd [R], flags.
 * Out: dx [..., H], dweight [H] (NULL exactly when weight is), dbias [H] or NULL. */
FUSELET_API fuselet_status fuselet_layer_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                  const fuselet_tensor* weight, const fuselet_tensor* mean,
                                                  const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                                  fuselet_tensor* dweight, fuselet_tensor* dbias);

/* Residual add + RMSNorm forward. In: x [..., H], residual [..., H], weight [H] or NULL, eps, flags.
 * Out: y [..., H], residual_out [..., H] (x + residual in x's dtype), rstd [R] (float32). */
FUSELET_API fuselet_status fuselet_add_rms_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* residual,
                                                    const fuselet_tensor* weight, float eps, uint32_t flags,
                                                    fuselet_tensor* y, fuselet_tensor* residual_out,
                                                    fuselet_tensor* rstd);

/* Residual add + RMSNorm backward. In: dy, dresidual_out, residual_out (from the forward, the
 * input of the norm: x of the rules above) [..., H], weight [H] or NULL, rstd [R], flags.
 * Out: dx [..., H] (the gradient of x and of residual alike), dweight [H] (NULL exactly when
 * weight is). */
FUSELET_API fuselet_status fuselet_add_rms_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                                                    const fuselet_tensor* residual_out, const fuselet_tensor* weight,
                                                    const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                                    fuselet_tensor* dweight);

/* Gated RMSNorm forward. In: x [..., H], z [..., H] (the gate), weight [H] or NULL, eps,
 * group_size (0 or a divisor of H), flags. Out: y [..., H], rstd [R * G] (float32). */
FUSELET_API fuselet_status fuselet_gated_rms_norm_fwd(const fuselet_tensor* x, const fuselet_tensor* z,
                                                      const fuselet_tensor* weight, float eps, int64_t group_size,
                                                      uint32_t flags, fuselet_tensor* y, fuselet_tensor* rstd);

/* Gated RMSNorm backward. In: dy, x, z [..., H], weight [H] or NULL, rstd [R * G] from the
 * forward, group_size, flags. Out: dx, dz [..., H], dweight [H] (NULL exactly when weight is). */
FUSELET_API fuselet_status fuselet_gated_rms_norm_bwd(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                      const fuselet_tensor* z, const fuselet_tensor* weight,
                                                      const fuselet_tensor* rstd, int64_t group_size, uint32_t flags,
                                                      fuselet_tensor* dx, fuselet_tensor* dz, fuselet_tensor* dweight);

/*
 * The checks of the inputs and options of each entry point above, host and `_cuda` alike, on
 * views of any strides >= 0 with no data read (fuselet.h: the `_check` functions). The
 * layer_norm backward's check takes `bias` [H] or NULL, the parameter whose gradient the call's
 * dbias is (dbias: like it), NULL when no dbias is asked for.
 */
FUSELET_API fuselet_status fuselet_rms_norm_fwd_check(const fuselet_tensor* x, const fuselet_tensor* weight, float eps,
                                                      uint32_t flags);
FUSELET_API fuselet_status fuselet_rms_norm_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                      const fuselet_tensor* weight, const fuselet_tensor* rstd,
                                                      uint32_t flags);
FUSELET_API fuselet_status fuselet_layer_norm_fwd_check(const fuselet_tensor* x, const fuselet_tensor* weight,
                                                        const fuselet_tensor* bias, float eps, uint32_t flags);
FUSELET_API fuselet_status fuselet_layer_norm_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                        const fuselet_tensor* weight, const fuselet_tensor* bias,
                                                        const fuselet_tensor* mean, const fuselet_tensor* rstd,
                                                        uint32_t flags);
FUSELET_API fuselet_status fuselet_add_rms_norm_fwd_check(const fuselet_tensor* x, const fuselet_tensor* residual,
                                                          const fuselet_tensor* weight, float eps, uint32_t flags);
FUSELET_API fuselet_status fuselet_add_rms_norm_bwd_check(const fuselet_tensor* dy,
                                                          const fuselet_tensor* dresidual_out,
                                                          const fuselet_tensor* residual_out,
                                                          const fuselet_tensor* weight, const fuselet_tensor* rstd,
                                                          uint32_t flags);
FUSELET_API fuselet_status fuselet_gated_rms_norm_fwd_check(const fuselet_tensor* x, const fuselet_tensor* z,
                                                            const fuselet_tensor* weight, float eps,
                                                            int64_t group_size, uint32_t flags);
FUSELET_API fuselet_status fuselet_gated_rms_norm_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                            const fuselet_tensor* z, const fuselet_tensor* weight,
                                                            const fuselet_tensor* rstd, int64_t group_size,
                                                            uint32_t flags);

/*
 * Bytes of device workspace the `_cuda` backward entry points need for R rows of H
 * elements (float32 partial sums of dweight and dbias). 0 when R == 0.
 */
FUSELET_API size_t fuselet_norm_bwd_workspace_bytes_cuda(int64_t rows, int64_t hidden);

/* CUDA versions: same math, shapes and checks as above; every pointer is a device pointer.
 * The backward needs `workspace` of at least fuselet_norm_bwd_workspace_bytes_cuda(R, H)
 * bytes (device memory, contents ignored). Builds without CUDA return FUSELET_ERR_UNSUPPORTED. */
FUSELET_API fuselet_status fuselet_rms_norm_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* weight, float eps,
                                                     uint32_t flags, fuselet_tensor* y, fuselet_tensor* rstd,
                                                     void* stream);
FUSELET_API fuselet_status fuselet_rms_norm_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                     const fuselet_tensor* weight, const fuselet_tensor* rstd,
                                                     uint32_t flags, fuselet_tensor* dx, fuselet_tensor* dweight,
                                                     void* workspace, size_t workspace_bytes, void* stream);
FUSELET_API fuselet_status fuselet_layer_norm_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* weight,
                                                       const fuselet_tensor* bias, float eps, uint32_t flags,
                                                       fuselet_tensor* y, fuselet_tensor* mean, fuselet_tensor* rstd,
                                                       void* stream);
FUSELET_API fuselet_status fuselet_layer_norm_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                       const fuselet_tensor* weight, const fuselet_tensor* mean,
                                                       const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                                       fuselet_tensor* dweight, fuselet_tensor* dbias, void* workspace,
                                                       size_t workspace_bytes, void* stream);

FUSELET_API fuselet_status fuselet_add_rms_norm_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* residual,
                                                         const fuselet_tensor* weight, float eps, uint32_t flags,
                                                         fuselet_tensor* y, fuselet_tensor* residual_out,
                                                         fuselet_tensor* rstd, void* stream);
FUSELET_API fuselet_status fuselet_add_rms_norm_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                                                         const fuselet_tensor* residual_out,
                                                         const fuselet_tensor* weight, const fuselet_tensor* rstd,
                                                         uint32_t flags, fuselet_tensor* dx, fuselet_tensor* dweight,
                                                         void* workspace, size_t workspace_bytes, void* stream);

FUSELET_API fuselet_status fuselet_gated_rms_norm_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* z,
                                                           const fuselet_tensor* weight, float eps, int64_t group_size,
                                                           uint32_t flags, fuselet_tensor* y, fuselet_tensor* rstd,
                                                           void* stream);
FUSELET_API fuselet_status fuselet_gated_rms_norm_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                           const fuselet_tensor* z, const fuselet_tensor* weight,
                                                           const fuselet_tensor* rstd, int64_t group_size,
                                                           uint32_t flags, fuselet_tensor* dx, fuselet_tensor* dz,
                                                           fuselet_tensor* dweight, void* workspace,
                                                           size_t workspace_bytes, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSELET_NORM_H_ */
