/*
 * fuselet CUDA kernels: RMSNorm, LayerNorm and gated RMSNorm, forward and backward (math in norm.h).
 *
 * Storage dtypes float32 / float16 / bfloat16; all arithmetic in float32. Parameters (weight,
 * bias and their gradients) are in x's dtype or float32, chosen at runtime (ParamRef); a missing
 * weight reads as 1, a missing bias as 0, and zero-centered gamma adds 1 to the weight.
 *
 * Work split. A row is handled by a "team": one warp (H <= kMaxWarpHidden = 512; kWarpRows rows
 * per block) or one block of 128..1024 threads (larger H; 512 at most for the backward and the
 * scalar forward, which keep more values live per thread). The row is read as vectors of kVec
 * elements: 16 bytes when every row pointer, row stride, weight/bias and H allow it (checked at
 * runtime), else 1 element. Each thread holds up to 16 elements of a row in registers (8 on the
 * scalar block paths); a longer row is processed in chunks and re-read (from L2) in pass 2.
 *
 * Forward. RMSNorm reduces sum(x^2). LayerNorm reduces sum(x), then sum((x - mean)^2) in a
 * second pass over the registers (a chunked row is re-read), so there is no E[x^2]-E[x]^2
 * cancellation. The last pass writes y; thread 0 of the team writes rstd (and mean).
 *
 * Backward. The rows are split into G contiguous row groups (G <= 512, see bwd_groups), one
 * block per group. Each block computes dx for its rows and accumulates dweight (and dbias)
 * partial sums for its rows in registers (rows longer than one chunk: in dynamic shared memory,
 * or in its own slice of the workspace when 2 * H floats exceed the opt-in shared memory size),
 * then writes them to the workspace:
 *     workspace = float32 [2][G][H]   (dweight partials, then dbias partials; RMSNorm uses the first)
 * A second kernel sums the G partials per column in a fixed order (deterministic) and writes
 * dweight / dbias in the storage dtype.
 *
 * Residual add + RMSNorm (kRes): the first pass reads x and residual, forms h = x + residual
 * rounded to the storage dtype, writes it to residual_out and normalizes h (a chunked row
 * re-reads h from residual_out, written by the same thread). Its backward is RMSNorm's, plus
 * d(residual_out) added to dx as it is stored.
 *
 * Gated RMSNorm (gated_norm_*_kernel): simple rather than tuned. One block of 128..512 threads
 * per row (forward, grid-strided) or per row group of bwd_groups (backward), scalar accesses,
 * every value re-read from memory by each pass. A row's groups of S elements are processed one
 * after the other, thread t taking the group's elements t, t + blockDim.x, ... (the same columns
 * in every row), each group reduced with one block allreduce: sum(h^2) in the forward (rescaled
 * on overflow as above), sum(gy * w * xhat) in the backward. The backward's block accumulates its
 * dweight partials in its own row of the workspace (each thread only its own columns, so no
 * synchronization), and norm_bwd_finalize_kernel sums them as for RMSNorm.
 *
 * All launches go on the caller's stream; every launch is followed by a cudaGetLastError() check.
 */
#include <cinttypes>

#include "common.cuh"
#include "fuselet/norm.h"
#include "norm_check.h"

namespace fuselet {
namespace {

using namespace gpu;  // NOLINT: the shared building blocks (common.cuh)

constexpr int kWarpRows = 8;               // warps (= rows in flight) per block on the warp path
constexpr int kElems = 16;                 // elements a thread holds per chunk (vectorized / warp)
constexpr int kMaxWarpHidden = 32 * kElems;  // largest H served by one warp per row
// Block-per-row teams have 128..max_threads() threads. The backward (and the scalar forward)
// keep more live values per thread, so they stop at 512 threads (128 registers each).
__host__ __device__ constexpr int max_threads(bool backward, int vec) { return backward || vec == 1 ? 512 : 1024; }
constexpr int kFinalizeSlices = 8;         // threadIdx.y extent of the partial-sum kernel

// Kernel variants: one warp per row; one block per row held in registers; one block per row
// processed in chunks of nthreads * kElems elements (rows too long for the registers).
enum Team { kWarpTeam, kBlockTeam, kChunkedTeam };

// Vectors of kVec elements a thread holds per chunk: kElems elements, but only 8 on the scalar
// block paths (each scalar access keeps its own 64-bit address live).
__host__ __device__ constexpr int vecs_per_thread(Team team, int vec) {
  return team != kWarpTeam && vec == 1 ? 8 : kElems / vec;
}

// ---------------------------------------------------------------------------------------------
// Parameters.

// A parameter vector (weight or bias) as the kernels read it: float32 or the storage dtype T,
// or absent (NULL: every element reads as `fill`); `offset` is added to present elements.
struct ParamRef {
  const void* p;
  bool f32;
  float offset, fill;
};

template <typename T, int N>
__device__ __forceinline__ void load_param(const ParamRef& r, int64_t e, float (&out)[N]) {
  if (r.p == nullptr) {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = r.fill;
    return;
  }
  if (r.f32)
    load(static_cast<const float*>(r.p) + e, out);
  else
    load(static_cast<const T*>(r.p) + e, out);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] += r.offset;
}

// ---------------------------------------------------------------------------------------------
// Forward.

struct FwdArgs {
  const void* x;
  ParamRef w;
  ParamRef b;  // absent for RMSNorm
  void* y;
  float* mean;  // null for RMSNorm
  float* rstd;
  int64_t rows, x_stride, y_stride, hidden;
  float eps, inv_h;  // inv_h = 1 / hidden
  const void* res;  // residual add (kRes): the norm's input is x + res rounded to T, written to hout
  void* hout;
  int64_t res_stride, hout_stride;
};

// v = x + res rounded to T (and written to h), for the `count` valid vectors of a chunk.
template <typename T, int kVecs, int kVec>
__device__ __forceinline__ void add_residual(const T* res, T* h, int step, int count, float (&v)[kVecs][kVec]) {
  float r[kVecs][kVec];
  load_chunk(res, step, count, r);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[k][j] = to_float(from_float<T>(v[k][j] + r[k][j]));
    if (k < count) store(h + k * step, v[k]);
  }
}

template <typename T, int kVec, Team kTeam, bool kLN, bool kRes = false>
__global__ void __launch_bounds__(kTeam == kWarpTeam ? 32 * kWarpRows : max_threads(false, kVec), 1)
    norm_fwd_kernel(const FwdArgs a) {
  constexpr int kVecs = vecs_per_thread(kTeam, kVec);
  constexpr bool kWarp = kTeam == kWarpTeam, kChunked = kTeam == kChunkedTeam;
  FUSELET_SHARED(float[33], scratch);
  const int tid = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int nthr = kWarp ? 32 : blockDim.x;
  const int teams = kWarp ? blockDim.x / 32 : 1;  // rows per block
  const int64_t nvec = a.hidden / kVec;
  const int64_t chunk = int64_t(nthr) * kVecs;  // vectors per chunk
  const int64_t nchunks = kChunked ? (nvec - 1) / chunk + 1 : 1;
  const int step = nthr * kVec;  // elements between a thread's vectors

  for (int64_t row = int64_t(blockIdx.x) * teams + (kWarp ? threadIdx.x / 32 : 0); row < a.rows;
       row += int64_t(gridDim.x) * teams) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    T* y = static_cast<T*>(a.y) + row * a.y_stride;
    T* h = kRes ? static_cast<T*>(a.hout) + row * a.hout_stride : nullptr;
    float v[kVecs][kVec];
    float sum = 0.f;  // LayerNorm: sum(x); RMSNorm: sum(x^2)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t e0 = (c * chunk + tid) * kVec;
      const int count = valid_count<kVecs>(c * chunk + tid, nthr, nvec);
      load_chunk(x + e0, step, count, v);
      if constexpr (kRes) add_residual(static_cast<const T*>(a.res) + row * a.res_stride + e0, h + e0, step, count, v);
#pragma unroll
      for (int k = 0; k < kVecs; ++k)
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum += kLN ? v[k][j] : v[k][j] * v[k][j];  // zero padded
    }
    if constexpr (kRes) x = h;  // later passes re-read the norm's input: this thread's own writes
    sum = team_allreduce<kWarp>(sum, Add(), scratch) * a.inv_h;
    float mu = 0.f, var = sum;
    // op over f(x) of the row's elements: a pass over the registers (or the re-read chunks)
    const auto reduce = [&](auto f, auto op) {
      float acc = 0.f;  // the identity of a sum, and of a max of non-negative values
      for (int64_t c = 0; c < nchunks; ++c) {
        const int count = valid_count<kVecs>(c * chunk + tid, nthr, nvec);
        if constexpr (kChunked) load_chunk(x + (c * chunk + tid) * kVec, step, count, v);
#pragma unroll
        for (int k = 0; k < kVecs; ++k)
#pragma unroll
          for (int j = 0; j < kVec; ++j) acc = op(acc, k < count ? f(v[k][j]) : 0.f);
      }
      return team_allreduce<kWarp>(acc, op, scratch);
    };
    if constexpr (kLN) {  // second pass: mean((x - mu)^2)
      mu = sum;
      var = reduce([mu](float t) { return (t - mu) * (t - mu); }, Add()) * a.inv_h;
    }
    float rs = rsqrtf(var + a.eps);
    if (isinf(var)) {
      // A row of finite values whose float32 sum of squares overflowed (|x| beyond ~1e19): sum
      // over (x - mu) / m, m = max |x - mu|, as the CPU kernels do (norm.cc, rescaled_rstd). var
      // is the same on every thread of the team: the whole team takes this branch, or none.
      const float mx = reduce([mu](float t) { return fabsf(t - mu); }, Max());
      if (isfinite(mx) && mx > 0.f) {  // else the row holds an inf: inf and NaN propagate
        const float inv = 1.f / mx;
        const float s2 = reduce([mu, inv](float t) { return ((t - mu) * inv) * ((t - mu) * inv); }, Add()) * a.inv_h;
        rs = inv * rsqrtf(s2 + a.eps * inv * inv);
      }
    }
    if (tid == 0) {
      a.rstd[row] = rs;
      if constexpr (kLN) a.mean[row] = mu;
    }
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t e0 = (c * chunk + tid) * kVec;
      const int count = valid_count<kVecs>(c * chunk + tid, nthr, nvec);
      if constexpr (kChunked) load_chunk(x + e0, step, count, v);  // else v still holds the row
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (k >= count) continue;
        const int64_t e = e0 + k * step;
        float wv[kVec], bv[kVec] = {}, out[kVec];
        load_param<T>(a.w, e, wv);
        if constexpr (kLN) load_param<T>(a.b, e, bv);
#pragma unroll
        for (int j = 0; j < kVec; ++j) out[j] = (v[k][j] - mu) * rs * wv[j] + bv[j];
        store(y + e, out);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward.

struct BwdArgs {
  const void* dy;
  const void* x;
  ParamRef w;
  const float* mean;  // null for RMSNorm
  const float* rstd;
  void* dx;
  float* part_w;  // [groups][hidden]
  float* part_b;  // [groups][hidden], null for RMSNorm
  bool smem_acc;  // chunked rows: accumulate in dynamic shared memory (else in part_w / part_b)
  int64_t rows, rows_per_group, dy_stride, x_stride, dx_stride, hidden;
  float inv_h;  // 1 / hidden
  const void* dres;  // residual add + RMSNorm: added to dx (null otherwise)
  int64_t dres_stride;
};

// Loads one vector of dy, x, w and forms xhat and g = dy * w.
template <typename T, int kVec>
__device__ __forceinline__ void load_grad(const T* dy, const T* x, const ParamRef& w, int64_t e, float mu, float rs,
                                          float (&dyv)[kVec], float (&xh)[kVec], float (&g)[kVec]) {
  float xv[kVec], wv[kVec];
  load(dy, dyv);
  load(x, xv);
  load_param<T>(w, e, wv);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    xh[j] = (xv[j] - mu) * rs;
    g[j] = dyv[j] * wv[j];
  }
}

// acc_w[e..e+kVec) += dy * xhat, acc_b[...] += dy; all loads issued before the stores.
template <int kVec, bool kLN>
__device__ __forceinline__ void accumulate(float* acc_w, float* acc_b, const float (&dyv)[kVec],
                                           const float (&xh)[kVec]) {
  float tw[kVec], tb[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    tw[j] = acc_w[j];
    if constexpr (kLN) tb[j] = acc_b[j];
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    acc_w[j] = tw[j] + dyv[j] * xh[j];
    if constexpr (kLN) acc_b[j] = tb[j] + dyv[j];
  }
}

// Block b handles rows [b * rows_per_group, (b + 1) * rows_per_group) and writes row b of the
// partial sums. Warp path: warps take the block's rows round robin and combine their register
// partials through dynamic shared memory (kWarpRows * H floats) in warp order. Block path with
// chunked rows: each thread accumulates its own columns in memory (dynamic shared memory of
// 2 * H floats when it fits, else the block's workspace row), so no synchronization is needed.
template <typename T, int kVec, Team kTeam, bool kLN>
__global__ void __launch_bounds__(kTeam == kWarpTeam ? 32 * kWarpRows : max_threads(true, kVec), 1)
    norm_bwd_kernel(const BwdArgs a) {
  constexpr int kVecs = vecs_per_thread(kTeam, kVec);
  constexpr bool kWarp = kTeam == kWarpTeam, kChunked = kTeam == kChunkedTeam;
  FUSELET_DYNAMIC_SHARED(float, dyn_smem);
  FUSELET_SHARED(float2[33], scratch);
  const int tid = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int nthr = kWarp ? 32 : blockDim.x;
  const int warp = threadIdx.x / 32, teams = kWarp ? blockDim.x / 32 : 1;
  const int64_t nvec = a.hidden / kVec;
  const int64_t chunk = int64_t(nthr) * kVecs;
  const int64_t nchunks = kChunked ? (nvec - 1) / chunk + 1 : 1;
  const int step = nthr * kVec;
  float* pw = a.part_w + int64_t(blockIdx.x) * a.hidden;
  float* pb = kLN ? a.part_b + int64_t(blockIdx.x) * a.hidden : nullptr;

  float acc_w[kVecs][kVec] = {}, acc_b[kVecs][kVec] = {};
  float* mw = a.smem_acc ? dyn_smem : pw;  // chunked rows: this block's accumulators
  float* mb = a.smem_acc ? dyn_smem + a.hidden : pb;
  const auto for_owned = [&](auto f) {  // chunked rows: f(e) for each element this thread owns
    for (int64_t c = 0; c < nchunks; ++c)
      for (int k = 0; k < valid_count<kVecs>(c * chunk + tid, nthr, nvec); ++k)
        for (int j = 0; j < kVec; ++j) f((c * chunk + tid) * kVec + k * step + j);
  };
  if constexpr (kChunked) {  // each thread zeroes, then owns, the columns it visits
    for_owned([&](int64_t e) {
      mw[e] = 0.f;
      if constexpr (kLN) mb[e] = 0.f;
    });
  }

  const int64_t r0 = int64_t(blockIdx.x) * a.rows_per_group;
  const int64_t r1 = min(a.rows, r0 + a.rows_per_group);
  for (int64_t row = r0 + (kWarp ? warp : 0); row < r1; row += teams) {
    const T* dy = static_cast<const T*>(a.dy) + row * a.dy_stride;
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    T* dx = static_cast<T*>(a.dx) + row * a.dx_stride;
    const float mu = kLN ? a.mean[row] : 0.f, rs = a.rstd[row];
    float xh[kVecs][kVec], g[kVecs][kVec];
    float2 s = make_float2(0.f, 0.f);  // sum(g), sum(g * xhat)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t e0 = (c * chunk + tid) * kVec;
      const int count = valid_count<kVecs>(c * chunk + tid, nthr, nvec);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (k >= count) continue;
        const int64_t e = e0 + k * step;
        float dyv[kVec];
        load_grad(dy + e, x + e, a.w, e, mu, rs, dyv, xh[k], g[k]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          s.x += g[k][j];
          s.y += g[k][j] * xh[k][j];
          if constexpr (!kChunked) {
            acc_w[k][j] += dyv[j] * xh[k][j];
            if constexpr (kLN) acc_b[k][j] += dyv[j];
          }
        }
        if constexpr (kChunked) accumulate<kVec, kLN>(mw + e, kLN ? mb + e : nullptr, dyv, xh[k]);
      }
    }
    s = team_allreduce<kWarp>(s, Add(), scratch);
    const float mg = kLN ? s.x * a.inv_h : 0.f, mgx = s.y * a.inv_h;
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t e0 = (c * chunk + tid) * kVec;
      const int count = valid_count<kVecs>(c * chunk + tid, nthr, nvec);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (k >= count) continue;
        const int64_t e = e0 + k * step;
        if constexpr (kChunked) {  // xh / g hold the last chunk only: recompute
          float dyv[kVec];
          load_grad(dy + e, x + e, a.w, e, mu, rs, dyv, xh[k], g[k]);
        }
        float out[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) out[j] = rs * (g[k][j] - mg - xh[k][j] * mgx);
        if (a.dres != nullptr) {
          float d[kVec];
          load(static_cast<const T*>(a.dres) + row * a.dres_stride + e, d);
#pragma unroll
          for (int j = 0; j < kVec; ++j) out[j] += d[j];
        }
        store(dx + e, out);
      }
    }
  }

  if constexpr (kChunked) {
    if (a.smem_acc) {  // copy this thread's columns out of shared memory
      for_owned([&](int64_t e) {
        pw[e] = mw[e];
        if constexpr (kLN) pb[e] = mb[e];
      });
    }
  } else if constexpr (kWarp) {
    // Single chunk: lane owns vectors lane + 32 k. Sum the warps' partials in warp order.
    for (int which = 0; which < (kLN ? 2 : 1); ++which) {
      float* dst = which == 0 ? pw : pb;
      const int count = valid_count<kVecs>(tid, 32, nvec);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (k >= count) continue;
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          dyn_smem[warp * a.hidden + tid * kVec + k * step + j] = which ? acc_b[k][j] : acc_w[k][j];
      }
      __syncthreads();
      for (int64_t col = threadIdx.x; col < a.hidden; col += blockDim.x) {
        float t = 0.f;
        for (int q = 0; q < teams; ++q) t += dyn_smem[q * a.hidden + col];
        dst[col] = t;
      }
      __syncthreads();
    }
  } else {
    const int count = valid_count<kVecs>(tid, nthr, nvec);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (k >= count) continue;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        pw[tid * kVec + k * step + j] = acc_w[k][j];
        if constexpr (kLN) pb[tid * kVec + k * step + j] = acc_b[k][j];
      }
    }
  }
}

// dweight[col] = sum_g part_w[g][col] (and dbias from part_b), g in a fixed order; T is the
// parameter dtype; a NULL dw / db is not written.
// Block (32, kFinalizeSlices): x picks the column, y strides over the groups.
template <typename T>
__global__ void __launch_bounds__(32 * kFinalizeSlices)
    norm_bwd_finalize_kernel(const float* part_w, const float* part_b, T* dw, T* db, int64_t groups, int64_t hidden) {
  FUSELET_SHARED(float[2][kFinalizeSlices][33], red);
  const int64_t col = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float sw = 0.f, sb = 0.f;
  if (col < hidden) {
    for (int64_t g = threadIdx.y; g < groups; g += kFinalizeSlices) {
      sw += part_w[g * hidden + col];
      if (part_b != nullptr) sb += part_b[g * hidden + col];
    }
  }
  red[0][threadIdx.y][threadIdx.x] = sw;
  red[1][threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || col >= hidden) return;
  for (int q = 1; q < kFinalizeSlices; ++q) {
    sw += red[0][q][threadIdx.x];
    sb += red[1][q][threadIdx.x];
  }
  if (dw != nullptr) dw[col] = from_float<T>(sw);
  if (db != nullptr) db[col] = from_float<T>(sb);
}

// ---------------------------------------------------------------------------------------------
// Gated RMSNorm: one block per row (forward) or per row group (backward), scalar accesses.

constexpr int kGatedThreads = 512;  // the most threads of a gated block (128 at least)

// The arguments of both gated kernels; the forward leaves dy, dz and part_w null, and writes y
// and rstd; the backward writes dx into y.
struct GatedArgs {
  const void* x;
  const void* z;
  const void* dy;
  ParamRef w;
  void* y;  // the forward's y, the backward's dx
  void* dz;
  float* rstd;    // [rows][hidden / group]
  float* part_w;  // backward: [row groups][hidden] dweight partials; null when dweight is not asked for
  int64_t rows, rows_per_group, hidden, group;
  int64_t x_stride, z_stride, dy_stride, y_stride, dz_stride;
  float eps, inv_s;  // inv_s = 1 / group
  bool gate_first;
};

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

// One element of a gated row: its x, z, silu(z) and the norm's input h (x, or x * silu(z) with
// the gate first).
struct GatedElem {
  float x, z, sig, s, h;
};

template <typename T>
__device__ __forceinline__ GatedElem gated_elem(const T* x, const T* z, int64_t e, bool gate_first) {
  GatedElem v;
  v.x = to_float(x[e]);
  v.z = to_float(z[e]);
  v.sig = sigmoid(v.z);
  v.s = v.z * v.sig;
  v.h = gate_first ? v.x * v.s : v.x;
  return v;
}

// Row r's group g: elements [g * S, (g + 1) * S); thread t handles g * S + t + k * blockDim.x,
// the same columns in every row. Each group is reduced with a block allreduce: every thread of
// the block takes every branch below together.
template <typename T>
__global__ void __launch_bounds__(kGatedThreads) gated_norm_fwd_kernel(const GatedArgs a) {
  FUSELET_SHARED(float[33], scratch);
  const int64_t S = a.group, G = a.hidden / a.group;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    const T* z = static_cast<const T*>(a.z) + row * a.z_stride;
    T* y = static_cast<T*>(a.y) + row * a.y_stride;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t e0 = g * S, e1 = e0 + S;
      // op over f(h) of the group's elements, across the block
      const auto reduce = [&](auto f, auto op) {
        float acc = 0.f;  // the identity of a sum, and of a max of non-negative values
        for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x)
          acc = op(acc, f(gated_elem(x, z, e, a.gate_first).h));
        return team_allreduce<false>(acc, op, scratch);
      };
      const float var = reduce([](float h) { return h * h; }, Add()) * a.inv_s;
      float rs = rsqrtf(var + a.eps);
      if (isinf(var)) {  // finite values whose float32 sum of squares overflowed: as norm_fwd_kernel
        const float mx = reduce([](float h) { return fabsf(h); }, Max());
        if (isfinite(mx) && mx > 0.f) {  // else the group holds an inf: inf and NaN propagate
          const float inv = 1.f / mx;
          const float s2 = reduce([inv](float h) { return (h * inv) * (h * inv); }, Add()) * a.inv_s;
          rs = inv * rsqrtf(s2 + a.eps * inv * inv);
        }
      }
      if (threadIdx.x == 0) a.rstd[row * G + g] = rs;
      for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const GatedElem v = gated_elem(x, z, e, a.gate_first);
        float w[1];
        load_param<T>(a.w, e, w);
        y[e] = from_float<T>(v.h * rs * w[0] * (a.gate_first ? 1.f : v.s));
      }
    }
  }
}

// Block b handles rows [b * rows_per_group, (b + 1) * rows_per_group) and sums its dweight
// partials into row b of part_w: each thread only ever touches its own columns there (zeroed
// first), so no synchronization is needed.
template <typename T>
__global__ void __launch_bounds__(kGatedThreads) gated_norm_bwd_kernel(const GatedArgs a) {
  FUSELET_SHARED(float[33], scratch);
  const int64_t S = a.group, G = a.hidden / a.group;
  float* pw = a.part_w != nullptr ? a.part_w + int64_t(blockIdx.x) * a.hidden : nullptr;
  if (pw != nullptr)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t e = g * S + threadIdx.x; e < (g + 1) * S; e += blockDim.x) pw[e] = 0.f;
  const int64_t r0 = int64_t(blockIdx.x) * a.rows_per_group;
  const int64_t r1 = min(a.rows, r0 + a.rows_per_group);
  for (int64_t row = r0; row < r1; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    const T* z = static_cast<const T*>(a.z) + row * a.z_stride;
    const T* dy = static_cast<const T*>(a.dy) + row * a.dy_stride;
    T* dx = static_cast<T*>(a.y) + row * a.y_stride;
    T* dz = static_cast<T*>(a.dz) + row * a.dz_stride;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t e0 = g * S, e1 = e0 + S;
      const float rs = a.rstd[row * G + g];
      // Element e, its dy, its weight, xhat = h * rstd and the gradient gy reaching the norm's
      // output (dy * silu(z), or dy with the gate first).
      struct Grad {
        GatedElem v;
        float dy, w, xhat, gy;
      };
      const auto grad = [&](int64_t e) {
        Grad q;
        q.v = gated_elem(x, z, e, a.gate_first);
        q.dy = to_float(dy[e]);
        float w[1];
        load_param<T>(a.w, e, w);
        q.w = w[0];
        q.xhat = q.v.h * rs;
        q.gy = a.gate_first ? q.dy : q.dy * q.v.s;
        return q;
      };
      float dot = 0.f;  // sum(gy * w * xhat) over the group
      for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const Grad q = grad(e);
        dot += q.gy * q.w * q.xhat;
        if (pw != nullptr) pw[e] += q.gy * q.xhat;
      }
      const float c = team_allreduce<false>(dot, Add(), scratch) * a.inv_s;
      for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const Grad q = grad(e);
        const GatedElem& v = q.v;
        const float dh = rs * (q.gy * q.w - q.xhat * c);        // d(the norm's input h)
        const float ds = v.sig * (1.f + v.z * (1.f - v.sig));  // silu'(z)
        dx[e] = from_float<T>(a.gate_first ? dh * v.s : dh);
        dz[e] = from_float<T>(a.gate_first ? dh * v.x * ds : q.dy * q.xhat * q.w * ds);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// Backward row groups: G = ceil(rows / rows_per_group) <= cap, where the cap (128..512) keeps
// the workspace (2 * G * H floats) near 32 MiB for large H.
void bwd_groups(int64_t rows, int64_t hidden, int64_t* groups, int64_t* rows_per_group) {
  const int64_t cap =
      std::min<int64_t>(512, std::max<int64_t>(128, (int64_t(1) << 22) / std::max<int64_t>(hidden, 1)));
  *rows_per_group = rows > 0 ? (rows - 1) / cap + 1 : 1;
  *groups = rows > 0 ? (rows - 1) / *rows_per_group + 1 : 0;
}

size_t workspace_bytes(int64_t rows, int64_t hidden) {
  int64_t groups, per;
  bwd_groups(rows, hidden, &groups, &per);
  if (groups == 0) return 0;
  const uint64_t h = static_cast<uint64_t>(std::max<int64_t>(hidden, 1));
  const uint64_t per_col = 2 * sizeof(float) * static_cast<uint64_t>(groups);
  if (h > SIZE_MAX / per_col) return SIZE_MAX;  // absurd sizes: no caller can provide it
  return static_cast<size_t>(h * per_col);
}

// ParamRef of a checked parameter of problem `p`.
ParamRef param_ref(const NormProblem& p, const void* param, float offset, float fill) {
  return ParamRef{param, p.param_dtype == FUSELET_FLOAT32, offset, fill};
}

// Parameters read as kV-element vectors need kV * (their element size) alignment.
bool params_vectorizable(const NormProblem& p, int kV, std::initializer_list<const void*> params) {
  for (const void* q : params)
    if (!aligned(q, kV * dtype_size(p.param_dtype))) return false;
  return true;
}

template <typename T, int kVec, bool kLN, bool kRes = false>
fuselet_status launch_fwd(const NormProblem& p, cudaStream_t stream) {
  const FwdArgs a{p.x,
                  param_ref(p, p.weight, p.w_offset, 1.f),
                  param_ref(p, p.bias, 0.f, 0.f),
                  p.y,
                  p.mean,
                  p.rstd,
                  p.rows,
                  p.x_stride,
                  p.y_stride,
                  p.hidden,
                  p.eps,
                  static_cast<float>(1.0 / p.hidden),
                  p.res,
                  p.hout,
                  p.res_stride,
                  p.hout_stride};
  if (p.hidden <= kMaxWarpHidden) {
    const int64_t grid = std::min<int64_t>((p.rows - 1) / kWarpRows + 1, kMaxGrid);
    launch_kernel<norm_fwd_kernel<T, kVec, kWarpTeam, kLN, kRes>>(static_cast<unsigned>(grid), 32 * kWarpRows, 0,
                                                                  stream, a);
  } else {
    constexpr int kVecs = vecs_per_thread(kBlockTeam, kVec);
    const int threads = team_threads(p.hidden / kVec, kVecs, max_threads(false, kVec));
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGrid));
    if (p.hidden / kVec <= int64_t(threads) * kVecs)
      launch_kernel<norm_fwd_kernel<T, kVec, kBlockTeam, kLN, kRes>>(grid, threads, 0, stream, a);
    else
      launch_kernel<norm_fwd_kernel<T, kVec, kChunkedTeam, kLN, kRes>>(grid, threads, 0, stream, a);
  }
  return launch_status(kLN ? "layer_norm_fwd_kernel" : kRes ? "add_rms_norm_fwd_kernel" : "rms_norm_fwd_kernel");
}

template <typename T, bool kLN>
fuselet_status run_fwd(const NormProblem& p, cudaStream_t stream) {
  if (fuselet_status s =
          check_alignment({{"x", p.x}, {"y", p.y}, {"residual", p.res}, {"residual_out", p.hout}}, sizeof(T)))
    return s;
  if (fuselet_status s = check_alignment({{"weight", p.weight}, {"bias", p.bias}}, dtype_size(p.param_dtype)))
    return s;
  if (fuselet_status s = check_alignment({{"rstd", p.rstd}, {"mean", p.mean}}, sizeof(float))) return s;
  constexpr int kV = 16 / sizeof(T);
  const bool vec = aligned(p.x, 16) && aligned(p.y, 16) && params_vectorizable(p, kV, {p.weight, p.bias}) &&
                   p.hidden % kV == 0 && p.x_stride % kV == 0 && p.y_stride % kV == 0 && aligned(p.res, 16) &&
                   aligned(p.hout, 16) && p.res_stride % kV == 0 && p.hout_stride % kV == 0;
  if constexpr (!kLN) {
    if (p.res != nullptr)
      return vec ? launch_fwd<T, kV, false, true>(p, stream) : launch_fwd<T, 1, false, true>(p, stream);
  }
  return vec ? launch_fwd<T, kV, kLN>(p, stream) : launch_fwd<T, 1, kLN>(p, stream);
}

// dweight and dbias (those asked for) from the groups' partial sums (norm_bwd_finalize_kernel).
fuselet_status finalize(const NormProblem& p, const float* part_w, const float* part_b, int64_t groups,
                        const char* name, cudaStream_t stream) {
  if (p.dweight == nullptr && p.dbias == nullptr) return FUSELET_OK;
  const dim3 block(32, kFinalizeSlices);
  const unsigned grid = static_cast<unsigned>((p.hidden - 1) / 32 + 1);
  return dispatch(p.param_dtype, [&](auto tag) {
    using P = decltype(tag);
    launch_kernel<norm_bwd_finalize_kernel<P>>(grid, block, 0, stream, part_w, part_b, static_cast<P*>(p.dweight),
                                               static_cast<P*>(p.dbias), groups, p.hidden);
    return launch_status(name);
  });
}

template <typename T, int kVec, bool kLN>
fuselet_status launch_bwd(const NormProblem& p, float* ws, int64_t groups, int64_t per, cudaStream_t stream) {
  float* part_b = kLN ? ws + groups * p.hidden : nullptr;
  BwdArgs a{p.dy,
            p.x,
            param_ref(p, p.weight, p.w_offset, 1.f),
            p.mean,
            p.rstd,
            p.dx,
            ws,
            part_b,
            false,
            p.rows,
            per,
            p.dy_stride,
            p.x_stride,
            p.dx_stride,
            p.hidden,
            static_cast<float>(1.0 / p.hidden),
            p.dres,
            p.dres_stride};
  const char* name = kLN ? "layer_norm_bwd_kernel" : "rms_norm_bwd_kernel";
  if (p.hidden <= kMaxWarpHidden) {
    const size_t smem = sizeof(float) * kWarpRows * static_cast<size_t>(p.hidden);
    launch_kernel<norm_bwd_kernel<T, kVec, kWarpTeam, kLN>>(static_cast<unsigned>(groups), 32 * kWarpRows, smem,
                                                            stream, a);
  } else {
    constexpr int kVecs = vecs_per_thread(kBlockTeam, kVec);
    const int threads = team_threads(p.hidden / kVec, kVecs, max_threads(true, kVec));
    if (p.hidden / kVec <= int64_t(threads) * kVecs) {
      launch_kernel<norm_bwd_kernel<T, kVec, kBlockTeam, kLN>>(static_cast<unsigned>(groups), threads, 0, stream, a);
    } else {  // chunked rows: accumulators in shared memory if they fit
      constexpr auto kernel = &norm_bwd_kernel<T, kVec, kChunkedTeam, kLN>;
      const size_t bytes = sizeof(float) * (kLN ? 2 : 1) * static_cast<size_t>(p.hidden);
      int dev = 0, optin = 0;
      cudaFuncAttributes attr;
      cudaError_t err = cudaGetDevice(&dev);
      if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
      if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, kernel);
      size_t smem = 0;
      if (err == cudaSuccess && bytes + attr.sharedSizeBytes <= static_cast<size_t>(optin)) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        smem = bytes;
        a.smem_acc = true;
      }
      if (err != cudaSuccess) return fail(FUSELET_ERR_CUDA, "%s setup failed: %s", name, cudaGetErrorString(err));
      launch_kernel<kernel>(static_cast<unsigned>(groups), threads, smem, stream, a);
    }
  }
  if (fuselet_status s = launch_status(name)) return s;
  return finalize(p, a.part_w, a.part_b, groups,
                  kLN ? "layer_norm_bwd_finalize_kernel" : "rms_norm_bwd_finalize_kernel", stream);
}

template <typename T, bool kLN>
fuselet_status run_bwd(const NormProblem& p, float* ws, int64_t groups, int64_t per, cudaStream_t stream) {
  if (fuselet_status s =
          check_alignment({{"dy", p.dy}, {"x", p.x}, {"dx", p.dx}, {"dresidual_out", p.dres}}, sizeof(T)))
    return s;
  if (fuselet_status s = check_alignment({{"weight", p.weight}, {"dweight", p.dweight}, {"dbias", p.dbias}},
                                         dtype_size(p.param_dtype)))
    return s;
  if (fuselet_status s = check_alignment({{"rstd", p.rstd}, {"mean", p.mean}}, sizeof(float))) return s;
  constexpr int kV = 16 / sizeof(T);
  const bool vec = aligned(p.dy, 16) && aligned(p.x, 16) && aligned(p.dx, 16) &&
                   params_vectorizable(p, kV, {p.weight}) && p.hidden % kV == 0 && p.dy_stride % kV == 0 &&
                   p.x_stride % kV == 0 && p.dx_stride % kV == 0 && aligned(p.dres, 16) && p.dres_stride % kV == 0;
  return vec ? launch_bwd<T, kV, kLN>(p, ws, groups, per, stream) : launch_bwd<T, 1, kLN>(p, ws, groups, per, stream);
}

// The arguments of the gated kernels for problem `p` (the backward's: dy, dx and dz; the
// workspace's partial sums set by the caller).
GatedArgs gated_args(const NormProblem& p, bool backward) {
  return GatedArgs{p.x,
                   p.z,
                   p.dy,
                   param_ref(p, p.weight, p.w_offset, 1.f),
                   backward ? p.dx : p.y,
                   p.dz,
                   p.rstd,
                   nullptr,
                   p.rows,
                   1,
                   p.hidden,
                   p.group,
                   p.x_stride,
                   p.z_stride,
                   p.dy_stride,
                   backward ? p.dx_stride : p.y_stride,
                   p.dz_stride,
                   p.eps,
                   static_cast<float>(1.0 / p.group),
                   p.gate_first};
}

template <typename T>
fuselet_status run_gated_fwd(const NormProblem& p, cudaStream_t stream) {
  if (fuselet_status s = check_alignment({{"x", p.x}, {"z", p.z}, {"y", p.y}}, sizeof(T))) return s;
  if (fuselet_status s = check_alignment({{"weight", p.weight}}, dtype_size(p.param_dtype))) return s;
  if (fuselet_status s = check_alignment({{"rstd", p.rstd}}, sizeof(float))) return s;
  const int threads = team_threads(p.group, 1, kGatedThreads);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGrid));
  launch_kernel<gated_norm_fwd_kernel<T>>(grid, threads, 0, stream, gated_args(p, false));
  return launch_status("gated_rms_norm_fwd_kernel");
}

template <typename T>
fuselet_status run_gated_bwd(const NormProblem& p, float* ws, int64_t groups, int64_t per, cudaStream_t stream) {
  if (fuselet_status s =
          check_alignment({{"dy", p.dy}, {"x", p.x}, {"z", p.z}, {"dx", p.dx}, {"dz", p.dz}}, sizeof(T)))
    return s;
  if (fuselet_status s = check_alignment({{"weight", p.weight}, {"dweight", p.dweight}}, dtype_size(p.param_dtype)))
    return s;
  if (fuselet_status s = check_alignment({{"rstd", p.rstd}}, sizeof(float))) return s;
  GatedArgs a = gated_args(p, true);
  a.part_w = p.dweight != nullptr ? ws : nullptr;
  a.rows_per_group = per;
  const int threads = team_threads(p.group, 1, kGatedThreads);
  launch_kernel<gated_norm_bwd_kernel<T>>(static_cast<unsigned>(groups), threads, 0, stream, a);
  if (fuselet_status s = launch_status("gated_rms_norm_bwd_kernel")) return s;
  return finalize(p, a.part_w, nullptr, groups, "gated_rms_norm_bwd_finalize_kernel", stream);
}

template <bool kLN>
fuselet_status norm_fwd(const NormProblem& p, void* stream) {
  if (p.rows == 0) return FUSELET_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.z != nullptr) return dispatch(p.dtype, [&](auto tag) { return run_gated_fwd<decltype(tag)>(p, s); });
  return dispatch(p.dtype, [&](auto tag) { return run_fwd<decltype(tag), kLN>(p, s); });
}

template <bool kLN>
fuselet_status norm_bwd(const NormProblem& p, void* workspace, size_t workspace_bytes_given, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t need = workspace_bytes(p.rows, p.hidden);
  if (need > 0 && (workspace == nullptr || workspace_bytes_given < need))
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "workspace: %" PRId64 " rows of %" PRId64
                " need %zu bytes (fuselet_norm_bwd_workspace_bytes_cuda), "
                "got %zu bytes at %p",
                p.rows, p.hidden, need, workspace == nullptr ? size_t(0) : workspace_bytes_given, workspace);
  if (need > 0 && !aligned(workspace, sizeof(float)))
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "workspace: pointer %p is not 4-byte aligned", workspace);
  if (p.rows == 0) {  // no rows: the reductions are empty sums
    const size_t bytes = dtype_size(p.param_dtype) * static_cast<size_t>(p.hidden);
    cudaError_t err = cudaSuccess;
    if (p.dweight) err = cudaMemsetAsync(p.dweight, 0, bytes, s);
    if (err == cudaSuccess && p.dbias) err = cudaMemsetAsync(p.dbias, 0, bytes, s);
    if (err != cudaSuccess)
      return fail(FUSELET_ERR_CUDA, "cudaMemsetAsync of dweight/dbias failed: %s", cudaGetErrorString(err));
    return FUSELET_OK;
  }
  int64_t groups, per;
  bwd_groups(p.rows, p.hidden, &groups, &per);
  float* ws = static_cast<float*>(workspace);
  if (p.z != nullptr)
    return dispatch(p.dtype, [&](auto tag) { return run_gated_bwd<decltype(tag)>(p, ws, groups, per, s); });
  return dispatch(p.dtype, [&](auto tag) { return run_bwd<decltype(tag), kLN>(p, ws, groups, per, s); });
}

}  // namespace
}  // namespace fuselet

extern "C" {

size_t fuselet_norm_bwd_workspace_bytes_cuda(int64_t rows, int64_t hidden) {
  return fuselet::workspace_bytes(rows, hidden);
}

fuselet_status fuselet_rms_norm_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* weight, float eps,
                                         uint32_t flags, fuselet_tensor* y, fuselet_tensor* rstd, void* stream) {
  return fuselet::guarded("fuselet_rms_norm_fwd_cuda", [&] {
    fuselet::NormProblem p;
    if (fuselet_status s = fuselet::check_norm_fwd(x, weight, nullptr, eps, flags, y, nullptr, rstd, false, &p))
      return s;
    return fuselet::norm_fwd<false>(p, stream);
  });
}

fuselet_status fuselet_rms_norm_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x,
                                         const fuselet_tensor* weight, const fuselet_tensor* rstd, uint32_t flags,
                                         fuselet_tensor* dx, fuselet_tensor* dweight, void* workspace,
                                         size_t workspace_bytes, void* stream) {
  return fuselet::guarded("fuselet_rms_norm_bwd_cuda", [&] {
    fuselet::NormProblem p;
    if (fuselet_status s =
            fuselet::check_norm_bwd(dy, x, weight, nullptr, rstd, flags, dx, dweight, nullptr, false, &p))
      return s;
    return fuselet::norm_bwd<false>(p, workspace, workspace_bytes, stream);
  });
}

fuselet_status fuselet_add_rms_norm_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* residual,
                                             const fuselet_tensor* weight, float eps, uint32_t flags,
                                             fuselet_tensor* y, fuselet_tensor* residual_out, fuselet_tensor* rstd,
                                             void* stream) {
  return fuselet::guarded("fuselet_add_rms_norm_fwd_cuda", [&] {
    fuselet::NormProblem p;
    if (fuselet_status s = fuselet::check_add_norm_fwd(x, residual, weight, eps, flags, y, residual_out, rstd, &p))
      return s;
    return fuselet::norm_fwd<false>(p, stream);
  });
}

fuselet_status fuselet_add_rms_norm_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* dresidual_out,
                                             const fuselet_tensor* residual_out, const fuselet_tensor* weight,
                                             const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                             fuselet_tensor* dweight, void* workspace, size_t workspace_bytes,
                                             void* stream) {
  return fuselet::guarded("fuselet_add_rms_norm_bwd_cuda", [&] {
    fuselet::NormProblem p;
    if (fuselet_status s =
            fuselet::check_add_norm_bwd(dy, dresidual_out, residual_out, weight, rstd, flags, dx, dweight, &p))
      return s;
    return fuselet::norm_bwd<false>(p, workspace, workspace_bytes, stream);
  });
}

fuselet_status fuselet_gated_rms_norm_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* z,
                                               const fuselet_tensor* weight, float eps, int64_t group_size,
                                               uint32_t flags, fuselet_tensor* y, fuselet_tensor* rstd, void* stream) {
  return fuselet::guarded("fuselet_gated_rms_norm_fwd_cuda", [&] {
    fuselet::NormProblem p;
    if (fuselet_status s = fuselet::check_gated_norm_fwd(x, z, weight, eps, group_size, flags, y, rstd, &p)) return s;
    return fuselet::norm_fwd<false>(p, stream);
  });
}

fuselet_status fuselet_gated_rms_norm_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x,
                                               const fuselet_tensor* z, const fuselet_tensor* weight,
                                               const fuselet_tensor* rstd, int64_t group_size, uint32_t flags,
                                               fuselet_tensor* dx, fuselet_tensor* dz, fuselet_tensor* dweight,
                                               void* workspace, size_t workspace_bytes, void* stream) {
  return fuselet::guarded("fuselet_gated_rms_norm_bwd_cuda", [&] {
    fuselet::NormProblem p;
    if (fuselet_status s =
            fuselet::check_gated_norm_bwd(dy, x, z, weight, rstd, group_size, flags, dx, dz, dweight, &p))
      return s;
    return fuselet::norm_bwd<false>(p, workspace, workspace_bytes, stream);
  });
}

fuselet_status fuselet_layer_norm_fwd_cuda(const fuselet_tensor* x, const fuselet_tensor* weight,
                                           const fuselet_tensor* bias, float eps, uint32_t flags, fuselet_tensor* y,
                                           fuselet_tensor* mean, fuselet_tensor* rstd, void* stream) {
  return fuselet::guarded("fuselet_layer_norm_fwd_cuda", [&] {
    fuselet::NormProblem p;
    if (fuselet_status s = fuselet::check_norm_fwd(x, weight, bias, eps, flags, y, mean, rstd, true, &p)) return s;
    return fuselet::norm_fwd<true>(p, stream);
  });
}

fuselet_status fuselet_layer_norm_bwd_cuda(const fuselet_tensor* dy, const fuselet_tensor* x,
                                           const fuselet_tensor* weight, const fuselet_tensor* mean,
                                           const fuselet_tensor* rstd, uint32_t flags, fuselet_tensor* dx,
                                           fuselet_tensor* dweight, fuselet_tensor* dbias, void* workspace,
                                           size_t workspace_bytes, void* stream) {
  return fuselet::guarded("fuselet_layer_norm_bwd_cuda", [&] {
    fuselet::NormProblem p;
    if (fuselet_status s = fuselet::check_norm_bwd(dy, x, weight, mean, rstd, flags, dx, dweight, dbias, true, &p))
      return s;
    return fuselet::norm_bwd<true>(p, workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
