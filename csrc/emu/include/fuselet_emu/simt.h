// fuselet's CUDA emulator, device side: the part of CUDA C++ that fuselet's kernels use, as
// plain host C++, so that csrc/core/src/cuda/*.cu compile with g++ / clang++ and run on a CPU
// (the emulated build, CMake option FUSELET_CUDA_EMU; docs/development.md, "The CUDA emulator").
//
// Each CUDA thread runs as a fiber with a stack of its own; the blocks of a grid run one after
// another on the calling thread, and the threads of a block are interleaved at every
// __syncthreads and warp collective in an order set by FUSELET_EMU_ORDER (forward, reverse or
// random[:SEED]), so that a result that depends on the order (a missing barrier) shows as
// different bits between two runs. Provides threadIdx / blockIdx / blockDim / gridDim,
// __syncthreads (a block barrier: every thread of the block, at the same barrier),
// __shfl_xor_sync (a rendezvous of the lanes its mask names, checked), static and dynamic shared
// memory (FUSELET_SHARED / FUSELET_DYNAMIC_SHARED of common.cuh: per block, filled with 0xFF bytes
// (NaN as float) at the block's start, so a read before any write shows), kernel launches with
// CUDA's limits checked (launch_kernel of common.cuh), and the device math fuselet calls.
// The types (__half, __nv_bfloat16, float2, dim3, cudaError_t ...) are CUDA's own headers'.
//
// What the scheduler found (a barrier not every thread reaches, a shuffle naming lanes outside
// its mask, a launch beyond the limits) fails the launch as a GPU would (cudaGetLastError), and
// is printed to stderr as a line starting with "fuselet-emu: error:".
#pragma once

#if !defined(FUSELET_CUDA_EMU)
#error "fuselet_emu/simt.h is for the emulated build of the CUDA kernels (FUSELET_CUDA_EMU)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <typeinfo>

// CUDA's execution-space keywords mean nothing on the host: every function is a host function.
#undef __device__
#undef __host__
#undef __global__
#undef __forceinline__
#undef __launch_bounds__
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)

#if defined(_WIN32)
#error "the CUDA emulator runs on Linux and macOS"
#endif
#define FUSELET_EMU_API __attribute__((visibility("default")))

namespace fuselet_emu {

// ---- the state of the running CUDA thread (set by the scheduler) ------------------------------
struct Thread {
  uint3 tid;
  int linear;  // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)
  int lane;    // linear % 32
  int warp;    // linear / 32
};
FUSELET_EMU_API extern Thread* g_thread;
FUSELET_EMU_API extern uint3 g_block_idx;
FUSELET_EMU_API extern dim3 g_block_dim, g_grid_dim;

// ---- block-level operations (scheduler.cc) -----------------------------------------------------
// The barrier of the block; `site` names the call (file:line) in diagnostics.
FUSELET_EMU_API void syncthreads(const char* site);
// The lanes of `mask` (this thread's warp) meet at `site`: each deposits `value`; returns the 32
// deposits of the warp (valid for the lanes of the mask), kept until this lane's next collective.
FUSELET_EMU_API const uint64_t* warp_exchange(uint32_t mask, uint64_t value, const char* site);
// Records an error of the running thread (the launch fails with it) and parks the thread.
[[noreturn]] FUSELET_EMU_API void thread_error(const char* site, const char* what);

// One `FUSELET_SHARED` declaration: storage for one block at a time, refilled with 0xFF bytes
// at each block's start.
struct SharedSlot {
  size_t bytes, align;
  unsigned char* data;
  uint64_t block;  // the block (a global count) the contents belong to
};
FUSELET_EMU_API void* shared_storage(SharedSlot* slot);
FUSELET_EMU_API void* dynamic_shared_storage();

// Static shared memory of type T (an array type, as declared), one slot per declaration: `Site`
// is a lambda's type, distinct for every declaration and template instance.
template <typename T, typename Site>
T& shared(Site) {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "__shared__ variables must be of a trivial type");
  static SharedSlot slot{sizeof(T), alignof(T) < 16 ? 16 : alignof(T), nullptr, 0};
  return *static_cast<T*>(shared_storage(&slot));
}

template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_storage());
}

// ---- launches -----------------------------------------------------------------------------------
// Runs body(ctx) for every thread of every block of the grid; checks the configuration as
// cudaLaunchKernel does. `kernel` is the kernel's address (its cudaFuncSetAttribute key),
// `name` its name in diagnostics.
FUSELET_EMU_API void run_grid(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem,
                              cudaStream_t stream, void (*body)(void*), void* ctx);

// The demangled name of the symbol `mangled_type` (a std::integral_constant's type name) holds
// as its value, "" if none: "fuselet::(anonymous namespace)::norm_fwd_kernel<float, 4, ...>", as
// c++filt spells the symbol nvcc compiles (scripts/cuda_resources.py joins the two).
FUSELET_EMU_API const char* kernel_name_of(const char* mangled_type);

template <auto K>
const char* kernel_name() {
  static const char* const name = kernel_name_of(typeid(std::integral_constant<decltype(K), K>).name());
  return name;
}

template <auto K, typename... Args>
void launch(dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream, const Args&... args) {
  auto body = [&] { K(args...); };
  using Body = decltype(body);
  run_grid(
      kernel_name<K>(), reinterpret_cast<const void*>(K), grid, block, dynamic_smem, stream,
      [](void* ctx) { (*static_cast<Body*>(ctx))(); }, &body);
}

// The grid cap a kernel family uses, `dflt` unless FUSELET_EMU_MAX_GRID (a positive count of
// blocks) lowers it for the process: the grid-stride loops of the kernels, reached with few rows.
FUSELET_EMU_API int64_t grid_cap(int64_t dflt);

// ---- what the scheduler saw (for tests of the emulator and of kernels) -------------------------
// The first error of the last launch that failed ("" if none), and the number of errors found
// since the process started.
FUSELET_EMU_API const char* last_diagnostic();
FUSELET_EMU_API uint64_t error_count();

template <typename T>
T shfl_xor(uint32_t mask, T v, int lane_mask, int width, const char* site) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "a shuffle moves at most 8 bytes");
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    thread_error(site, "__shfl_xor_sync: width must be a power of 2 in [1, 32]");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  const uint64_t* slots = warp_exchange(mask, bits, site);
  const int lane = g_thread->lane;
  // CUDA: the source lane is lane ^ lane_mask within the lane's group of `width` lanes; a
  // source outside the group reads the lane's own value.
  int src = lane ^ (lane_mask & 31);
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  if (!(mask >> src & 1u)) thread_error(site, "__shfl_xor_sync reads a lane outside its mask");
  T r;
  std::memcpy(&r, &slots[src], sizeof(T));
  return r;
}

}  // namespace fuselet_emu

// ---- the CUDA names ------------------------------------------------------------------------------
#define FUSELET_EMU_STR2(x) #x
#define FUSELET_EMU_STR(x) FUSELET_EMU_STR2(x)
#define FUSELET_EMU_SITE __FILE__ ":" FUSELET_EMU_STR(__LINE__)

#define threadIdx (::fuselet_emu::g_thread->tid)
#define blockIdx (::fuselet_emu::g_block_idx)
#define blockDim (::fuselet_emu::g_block_dim)
#define gridDim (::fuselet_emu::g_grid_dim)
#define warpSize 32

#define __syncthreads() ::fuselet_emu::syncthreads(FUSELET_EMU_SITE)
#define __shfl_xor_sync(mask, v, ...) ::fuselet_emu::shfl_xor_at(FUSELET_EMU_SITE, mask, v, __VA_ARGS__)

namespace fuselet_emu {
template <typename T>
T shfl_xor_at(const char* site, unsigned mask, T v, int lane_mask, int width = 32) {
  return shfl_xor(mask, v, lane_mask, width, site);
}
}  // namespace fuselet_emu

// cuda_runtime.h's overloads for kernel pointers, which it declares for nvcc only.
template <typename R, typename... A>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, R (*kernel)(A...)) {
  return cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(kernel));
}
template <typename R, typename... A>
inline cudaError_t cudaFuncSetAttribute(R (*kernel)(A...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// The device math fuselet calls that the host's <cmath> lacks or names differently. The host's
// libm may differ from CUDA's in the last ulp or two (the tests' tolerances say how much).
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
using std::isfinite;
using std::isinf;
using std::isnan;
template <typename T>
inline T min(T a, T b) {
  return a < b ? a : b;
}
template <typename T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
