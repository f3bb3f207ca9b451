// Generic CUDA building blocks of the fuselet kernels: element conversion, vector loads and
// stores, warp / block all-reductions, chunked row loads, shared memory declarations (device
// side), and kernel launches, launch checks, alignment checks and dtype dispatch (host side).
// Every kernel family includes this header.
//
// Compiled by nvcc, or as host C++ under fuselet's CUDA emulator (FUSELET_CUDA_EMU,
// csrc/emu): the emulator gives the CUDA names below their meaning on a CPU. So that both
// compile the same source, every kernel is launched with launch_kernel and declares its shared
// memory with FUSELET_SHARED / FUSELET_DYNAMIC_SHARED (scripts/lint.sh's `emu` check refuses a
// CUDA construct the emulator does not implement).
#pragma once

#if defined(FUSELET_CUDA_EMU)
#include "fuselet_emu/simt.h"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "internal.h"

namespace fuselet {
namespace gpu {

#if defined(FUSELET_CUDA_EMU)
// Rows beyond this are grid-strided. Under the emulator FUSELET_EMU_MAX_GRID lowers it (the
// second thread order of make emu-test does), so that the tests' rows reach the grid-stride loops.
inline const int64_t kMaxGrid = ::fuselet_emu::grid_cap(int64_t(1) << 20);
#else
constexpr int64_t kMaxGrid = int64_t(1) << 20;  // rows beyond this are grid-strided
#endif

// ---------------------------------------------------------------------------------------------
// Shared memory and launches.

template <typename T>
using Id = T;

#if defined(FUSELET_CUDA_EMU)
#define FUSELET_SHARED(type, name) auto& name = ::fuselet_emu::shared<type>([] {})
#define FUSELET_DYNAMIC_SHARED(type, name) type* const name = ::fuselet_emu::dynamic_shared<type>()
#else
// `__shared__ float x[33]` is FUSELET_SHARED(float[33], x); `extern __shared__ float x[]` is
// FUSELET_DYNAMIC_SHARED(float, x).
#define FUSELET_SHARED(type, name) __shared__::fuselet::gpu::Id<type> name
#define FUSELET_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

// K<<<grid, block, dynamic_smem, stream>>>(args...): every launch of the kernels goes through it.
template <auto K, typename... Args>
inline void launch_kernel(dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream, const Args&... args) {
#if defined(FUSELET_CUDA_EMU)
  ::fuselet_emu::launch<K>(grid, block, dynamic_smem, stream, args...);
#else
  K<<<grid, block, dynamic_smem, stream>>>(args...);
#endif
}

// ---------------------------------------------------------------------------------------------
// Element access.

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// N consecutive elements moved as one (16-byte when N * sizeof(T) == 16) access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void load(const T* p, float (&out)[N]) {
  const Vec<T, N> v = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = to_float(v.v[j]);
}

template <typename T, int N>
__device__ __forceinline__ void store(T* p, const float (&in)[N]) {
  Vec<T, N> v;
#pragma unroll
  for (int j = 0; j < N; ++j) v.v[j] = from_float<T>(in[j]);
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// ---------------------------------------------------------------------------------------------
// Reductions. Every lane/thread of a team gets the same, deterministic result.

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
  __device__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__device__ __forceinline__ float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ float2 shfl_xor(float2 v, int m) { return make_float2(shfl_xor(v.x, m), shfl_xor(v.y, m)); }

// Butterfly all-reduce; the lower lane's value is always the left operand, so every lane ends
// with the bit-identical result.
template <typename V, typename Op>
__device__ __forceinline__ V warp_allreduce(V v, Op op) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const V o = shfl_xor(v, m);
    v = (lane & m) ? op(o, v) : op(v, o);
  }
  return v;
}

// Block all-reduce through `scratch` (>= 33 entries of V); `identity` pads the missing warps
// (0 for sums, -inf for a max). blockDim.x must be a multiple of 32.
// Safe to call back to back: the result slot (32) and the per-warp slots do not alias.
template <typename V, typename Op>
__device__ V block_allreduce(V v, Op op, V* scratch, V identity = V{}) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_allreduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V t = lane < nwarps ? scratch[lane] : identity;
    t = warp_allreduce(t, op);
    if (lane == 0) scratch[32] = t;
  }
  __syncthreads();
  return scratch[32];
}

template <bool kWarp, typename V, typename Op>
__device__ __forceinline__ V team_allreduce(V v, Op op, void* scratch) {
  if constexpr (kWarp) {
    return warp_allreduce(v, op);
  } else {
    return block_allreduce(v, op, static_cast<V*>(scratch));
  }
}

// Thread `tid` of a team of `nthr` owns vectors base + k * nthr, k < kVecs, of each chunk
// (base = chunk start + tid): the elements at base * kVec + k * step, step = nthr * kVec.
// Only the first `count` of them lie inside the row.
template <int kVecs>
__device__ __forceinline__ int valid_count(int64_t base, int nthr, int64_t nvec) {
  if (base >= nvec) return 0;
  const int64_t n = (nvec - base - 1) / nthr + 1;
  return n < kVecs ? static_cast<int>(n) : kVecs;
}

template <typename T, int kVecs, int kVec>
__device__ __forceinline__ void load_chunk(const T* p, int step, int count, float (&v)[kVecs][kVec]) {
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    if (k < count) {
      load(p + k * step, v[k]);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[k][j] = 0.f;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

inline bool aligned(const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// FUSELET_OK, or FUSELET_ERR_CUDA naming `kernel` when the last launch failed.
inline fuselet_status launch_status(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(FUSELET_ERR_CUDA, "%s launch failed: %s", kernel, cudaGetErrorString(err));
  return FUSELET_OK;
}

// Threads of a block-per-row team: enough for `vecs_per_thread` vectors each, min_threads..max_threads
// (a multiple of 32).
inline int team_threads(int64_t nvec, int vecs_per_thread, int max_threads, int min_threads = 128) {
  const int64_t t = ((nvec - 1) / vecs_per_thread + 1 + 31) / 32 * 32;
  return static_cast<int>(std::min<int64_t>(max_threads, std::max<int64_t>(min_threads, t)));
}

// Data pointers must be aligned to their element size (a misaligned access would poison the
// CUDA context). Null pointers (absent or empty tensors) pass.
inline fuselet_status check_alignment(std::initializer_list<std::pair<const char*, const void*>> tensors,
                                      size_t elem) {
  for (const auto& t : tensors)
    if (!aligned(t.second, elem))
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: data pointer %p is not aligned to its element size (%zu bytes)",
                  t.first, t.second, elem);
  return FUSELET_OK;
}

inline size_t dtype_size(fuselet_dtype dtype) { return dtype == FUSELET_FLOAT32 ? 4 : 2; }

// Calls f(T{}) with T the storage type of `dtype`.
template <typename F>
fuselet_status dispatch(fuselet_dtype dtype, F&& f) {
  switch (dtype) {
    case FUSELET_FLOAT32: return f(float{});
    case FUSELET_FLOAT16: return f(__half{});
    case FUSELET_BFLOAT16: return f(__nv_bfloat16{});
    case FUSELET_INT32:
    case FUSELET_INT64: break;  // never: as_rows admits float dtypes only
  }
  return fail(FUSELET_ERR_INVALID_ARGUMENT, "x: unsupported dtype code %d", static_cast<int>(dtype));
}

}  // namespace gpu
}  // namespace fuselet
