/*
 * fuselet gated linear units: SwiGLU, GeGLU and GPT-OSS's clamped SwiGLU over the last dimension.
 *
 * Shapes. x is [..., 2F], read as R rows of 2F elements (R = product of the leading dims,
 * R may be 0): the first F are the gate g, the last F the up projection u, or, interleaved
 * (fuselet_glu_options.interleaved = 1), g_i at 2i and u_i at 2i + 1. y and dy are
 * [..., F] with R rows, dx is like x. Every tensor has x's dtype, its last dim stride 1 and its
 * leading dims collapsible into one row stride (any contiguous tensor, or a slice of rows of
 * one). 2F must be even and > 0. Supported dtypes: FUSELET_FLOAT32, FUSELET_FLOAT16,
 * FUSELET_BFLOAT16; the math runs in float32.
 *
 * Math (per element, act chosen by `activation`, a fuselet_glu_activation):
 *   y = act(g) * u
 *   FUSELET_GLU_SILU:      act(g) = g * sigmoid(g)                                   (SwiGLU)
 *   FUSELET_GLU_GELU:      act(g) = g * Phi(g) = 0.5 g (1 + erf(g / sqrt(2)))        (GeGLU)
 *   FUSELET_GLU_GELU_TANH: act(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))  (GeGLU, tanh)
 * Backward: dg = dy * u * act'(g), du = dy * act(g); dx = [dg, du] (or interleaved like x).
 *
 *   FUSELET_GLU_SILU_CLAMPED (GPT-OSS; alpha a, limit L of fuselet_glu_options, _ex entry points only):
 *     g' = min(g, L), u' = clamp(u, -L, L), y = g' * sigmoid(a g') * (u' + 1)
 *     dg = dy * (u' + 1) * (s + a g' s (1 - s)) where g <= L, else 0  (s = sigmoid(a g'))
 *     du = dy * g' * s where -L <= u <= L, else 0  (torch.clamp's gradient: the bounds pass it)
 *
 * Host entry points take host pointers and run on the calling thread plus fuselet's own
 * worker threads; `_cuda` entry points take device pointers and enqueue on `stream`. No
 * workspace. Builds without CUDA return FUSELET_ERR_UNSUPPORTED from the `_cuda` ones.
 */
#ifndef FUSELET_GLU_H_
#define FUSELET_GLU_H_

#include "fuselet/fuselet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The activation applied to the gate half. */
typedef enum fuselet_glu_activation {
  FUSELET_GLU_SILU = 0,
  FUSELET_GLU_GELU = 1,
  FUSELET_GLU_GELU_TANH = 2,
  FUSELET_GLU_SILU_CLAMPED = 3 /* alpha and limit: the _ex entry points only */
} fuselet_glu_activation;

/* The _ex entry points' options (pass the same to the forward and the backward). */
typedef struct fuselet_glu_options {
  int32_t activation;  /* a fuselet_glu_activation */
  int32_t interleaved; /* 0: x = [g (F), u (F)]; 1: x = [g_0, u_0, g_1, u_1, ...] */
  float alpha;         /* FUSELET_GLU_SILU_CLAMPED: the sigmoid's slope, finite; the others: ignored */
  float limit;         /* FUSELET_GLU_SILU_CLAMPED: the clamp, finite and > 0; the others: ignored */
} fuselet_glu_options;

/* Forward. In: x [..., 2F], activation. Out: y [..., F]. */
FUSELET_API fuselet_status fuselet_glu_fwd(const fuselet_tensor* x, int32_t activation, fuselet_tensor* y);

/* Backward. In: dy [..., F], x [..., 2F], activation. Out: dx [..., 2F]. */
FUSELET_API fuselet_status fuselet_glu_bwd(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation,
                                           fuselet_tensor* dx);

/* The same with options: every activation, either layout of x. */
FUSELET_API fuselet_status fuselet_glu_fwd_ex(const fuselet_tensor* x, const fuselet_glu_options* opts,
                                              fuselet_tensor* y);
FUSELET_API fuselet_status fuselet_glu_bwd_ex(const fuselet_tensor* dy, const fuselet_tensor* x,
                                              const fuselet_glu_options* opts, fuselet_tensor* dx);

/* The checks of the inputs and options of the entry points above, host and `_cuda` alike, on
 * views of any strides >= 0 with no data read (fuselet.h: the `_check` functions). */
FUSELET_API fuselet_status fuselet_glu_fwd_check(const fuselet_tensor* x, int32_t activation);
FUSELET_API fuselet_status fuselet_glu_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                 int32_t activation);
FUSELET_API fuselet_status fuselet_glu_fwd_ex_check(const fuselet_tensor* x, const fuselet_glu_options* opts);
FUSELET_API fuselet_status fuselet_glu_bwd_ex_check(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                    const fuselet_glu_options* opts);

FUSELET_API fuselet_status fuselet_glu_fwd_cuda(const fuselet_tensor* x, int32_t activation, fuselet_tensor* y,
                                                void* stream);
FUSELET_API fuselet_status fuselet_glu_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x, int32_t activation,
                                                fuselet_tensor* dx, void* stream);
FUSELET_API fuselet_status fuselet_glu_fwd_ex_cuda(const fuselet_tensor* x, const fuselet_glu_options* opts,
                                                   fuselet_tensor* y, void* stream);
FUSELET_API fuselet_status fuselet_glu_bwd_ex_cuda(const fuselet_tensor* dy, const fuselet_tensor* x,
                                                   const fuselet_glu_options* opts, fuselet_tensor* dx, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSELET_GLU_H_ */
