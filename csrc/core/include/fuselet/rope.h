/*
 * fuselet rotary position embedding (RoPE), forward and backward.
 *
 * Shapes. x is [B, S, N, D] (FUSELET_ROPE_BHSD unset: batch, sequence, heads, head dim) or
 * [B, N, S, D] (FUSELET_ROPE_BHSD set); the leading B may be absent ([S, N, D] / [N, S, D],
 * read as B = 1). Any strides >= 0 with the last one 1 (a transposed or sliced view is read in
 * place). cos and sin are [S, R] (shared by every sequence of the batch) or [B, S, R] (one
 * table per sequence: KV-cache offsets, packed positions; not with a B-less x), broadcast over
 * the N heads; both have one dtype, FUSELET_FLOAT32 or x's, and any strides >= 0 with the last
 * one 1. R is even, 2 <= R <= D: the first R features of each head rotate, features R..D-1 pass
 * through unchanged (partial rotary). y, dy and dx have x's shape and dtype (their own strides,
 * last one 1); y must not overlap x, nor dx dy (no in-place call). Supported dtypes: FUSELET_FLOAT32, FUSELET_FLOAT16, FUSELET_BFLOAT16; the math
 * runs in float32. B, S or N may be 0; D may not. flags: a bitwise OR of fuselet_rope_flags.
 *
 * Math, per row (one head of one token) with c = cos[b, s, :], s = sin[b, s, :], and i < R:
 *   y_i = x_i * c_i + rot(x)_i * s_i,      y_i = x_i for R <= i < D
 * Each i < R has a partner p(i) and a sign e_i:
 *   half-split (default, transformers' rotate_half): h = R / 2,
 *     p(i) = i + h, e_i = -1 for i < h;   p(i) = i - h, e_i = +1 for i >= h
 *   FUSELET_ROPE_INTERLEAVED (GPT-J): p(2j) = 2j + 1, e_2j = -1;  p(2j + 1) = 2j, e_2j+1 = +1
 *   rot(x)_i = e_i * x_p(i)
 * cos and sin are read at every one of the R columns (any values, not only tables whose two
 * halves repeat). The rotation is linear in x, y_i = c_i x_i + e_i s_i x_p(i), so the backward
 * is its transpose; since p(p(i)) = i and e_p(i) = -e_i:
 *   dx_i = dy_i * c_i - e_i * dy_p(i) * s_p(i)   for i < R,     dx_i = dy_i for R <= i < D
 * i.e. half-split: dx_i = dy_i c_i + dy_{i+h} s_{i+h},  dx_{i+h} = dy_{i+h} c_{i+h} - dy_i s_i;
 *      interleaved: dx_2j = dy_2j c_2j + dy_2j+1 s_2j+1, dx_2j+1 = dy_2j+1 c_2j+1 - dy_2j s_2j.
 * No gradient for cos and sin.
 *
 * Pair table (FUSELET_ROPE_PAIR_TABLE: Llama4's and DeepSeek-V2's complex freqs_cis, GLM's and
 * GPT-OSS's half tables): cos and sin hold one angle per rotating pair, [S, R/2] or [B, S, R/2]
 * (R = 2 x their last dim). Pair j is (j, j + R/2) half-split, (2j, 2j + 1) interleaved; both of
 * its features read column j: c_i = cos[..., j(i)] with j(i) = i mod R/2 (half-split) or
 * floor(i / 2) (interleaved), and likewise s_i. The math above is then unchanged.
 *
 * Sections (multimodal rope, mrope: Qwen2-VL and Qwen3-VL), the fuselet_rope_sections_* entry
 * points: cos and sin get a leading dim of K tables, [K, S, R'] or [K, B, S, R'] (R' = R, or R/2
 * with FUSELET_ROPE_PAIR_TABLE), one per position axis, and sections s_0..s_{K-1} (each >= 0,
 * summing to R/2, the number of pairs; 1 <= K <= FUSELET_ROPE_MAX_SECTIONS) say which table each
 * pair j reads, k(j):
 *   contiguous (default, Qwen2-VL's recomposition): k(j) is the k with
 *     s_0 + ... + s_{k-1} <= j < s_0 + ... + s_k;
 *   FUSELET_ROPE_SECTIONS_INTERLEAVED (Qwen3-VL's apply_interleaved_mrope): with m = j mod K,
 *     k(j) = m when m != 0 and j < K s_m, else 0. Each section k >= 1 must then fit:
 *     K (s_k - 1) + k < R/2 where s_k > 0, so that table k gives exactly its s_k pairs
 *     k, k + K, ..., k + K (s_k - 1) and table 0 the s_0 others.
 * Feature i then reads cos[k(j(i)), ..., column], column j(i) with the pair table, else i. With
 * n_sections = 0 and sections NULL, the sections entry points are the ones without (no K dim).
 *
 * Host entry points take host pointers and run on the calling thread plus fuselet's own
 * worker threads; `_cuda` entry points take device pointers and enqueue on `stream`. No
 * workspace. Builds without CUDA return FUSELET_ERR_UNSUPPORTED from the `_cuda` ones.
 */
#ifndef FUSELET_ROPE_H_
#define FUSELET_ROPE_H_

#include "fuselet/fuselet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of the rope entry points, combined with bitwise OR. */
typedef enum fuselet_rope_flags {
  FUSELET_ROPE_INTERLEAVED = 1, /* pair features 2j and 2j+1 (GPT-J), not i and i + R/2 */
  FUSELET_ROPE_BHSD = 2,        /* x is [B, N, S, D] ([N, S, D]), not [B, S, N, D] ([S, N, D]) */
  FUSELET_ROPE_PAIR_TABLE = 4,  /* cos and sin hold one column per rotating pair: width R/2 */
  FUSELET_ROPE_SECTIONS_INTERLEAVED = 8 /* sections interleaved (Qwen3-VL), not contiguous; with sections only */
} fuselet_rope_flags;

/* The most tables (sections) the fuselet_rope_sections_* entry points take. */
#define FUSELET_ROPE_MAX_SECTIONS 4

/* Forward. In: x [B, S, N, D] (or as flags say), cos and sin [S, R] or [B, S, R], flags.
 * Out: y like x: y_i = x_i c_i + rot(x)_i s_i for i < R, x_i beyond. */
FUSELET_API fuselet_status fuselet_rope_fwd(const fuselet_tensor* x, const fuselet_tensor* cos,
                                            const fuselet_tensor* sin, uint32_t flags, fuselet_tensor* y);

/* Backward. In: dy like x, cos, sin, flags (as the forward's). Out: dx like dy:
 * dx_i = dy_i c_i - e_i dy_p(i) s_p(i) for i < R, dy_i beyond. */
FUSELET_API fuselet_status fuselet_rope_bwd(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                            const fuselet_tensor* sin, uint32_t flags, fuselet_tensor* dx);

/* The checks of the inputs and options of the entry points above, host and `_cuda` alike, on
 * views of any strides >= 0 with no data read (fuselet.h: the `_check` functions; the entry
 * points read x, dy, cos and sin in place: they need a last stride of 1 and nothing more). */
FUSELET_API fuselet_status fuselet_rope_fwd_check(const fuselet_tensor* x, const fuselet_tensor* cos,
                                                  const fuselet_tensor* sin, uint32_t flags);
FUSELET_API fuselet_status fuselet_rope_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                                  const fuselet_tensor* sin, uint32_t flags);

/* The same with K tables and their sections (above): cos and sin [K, S, R'] or [K, B, S, R'],
 * sections[0..n_sections-1] (n_sections = K, 1..FUSELET_ROPE_MAX_SECTIONS; 0 with sections NULL:
 * no K dim, the entry points above; 0 sections given, not NULL, are refused). */
FUSELET_API fuselet_status fuselet_rope_sections_fwd(const fuselet_tensor* x, const fuselet_tensor* cos,
                                                     const fuselet_tensor* sin, const int64_t* sections,
                                                     int32_t n_sections, uint32_t flags, fuselet_tensor* y);
FUSELET_API fuselet_status fuselet_rope_sections_bwd(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                                     const fuselet_tensor* sin, const int64_t* sections,
                                                     int32_t n_sections, uint32_t flags, fuselet_tensor* dx);
FUSELET_API fuselet_status fuselet_rope_sections_fwd_check(const fuselet_tensor* x, const fuselet_tensor* cos,
                                                           const fuselet_tensor* sin, const int64_t* sections,
                                                           int32_t n_sections, uint32_t flags);
FUSELET_API fuselet_status fuselet_rope_sections_bwd_check(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                                           const fuselet_tensor* sin, const int64_t* sections,
                                                           int32_t n_sections, uint32_t flags);

/* The same on device pointers, enqueued on `stream` (a cudaStream_t). */
FUSELET_API fuselet_status fuselet_rope_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* cos,
                                                 const fuselet_tensor* sin, uint32_t flags, fuselet_tensor* y,
                                                 void* stream);
FUSELET_API fuselet_status fuselet_rope_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                                 const fuselet_tensor* sin, uint32_t flags, fuselet_tensor* dx,
                                                 void* stream);
FUSELET_API fuselet_status fuselet_rope_sections_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* cos,
                                                          const fuselet_tensor* sin, const int64_t* sections,
                                                          int32_t n_sections, uint32_t flags, fuselet_tensor* y,
                                                          void* stream);
FUSELET_API fuselet_status fuselet_rope_sections_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* cos,
                                                          const fuselet_tensor* sin, const int64_t* sections,
                                                          int32_t n_sections, uint32_t flags, fuselet_tensor* dx,
                                                          void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSELET_ROPE_H_ */
