// Tests of fuselet's CUDA emulator itself (csrc/emu): the barrier, the warp shuffle, shared
// memory, launches and their limits, the diagnostics of code a GPU would hang or misbehave on,
// the thread orders, and the runtime's memory calls. The kernels here use common.cuh's building
// blocks (launch_kernel, FUSELET_SHARED, warp / block all-reduce), as the core's kernels do.
// Prints one line per failure and "N passed, N failed" last.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../core/expect.h"
#include "cuda/common.cuh"

namespace {

using fuselet::gpu::launch_kernel;
using fuselet_test::expect;

// ---- kernels ----------------------------------------------------------------------------------

// out[i] = the value thread i + 1 wrote before the barrier (with or without the barrier).
template <bool kBarrier>
__global__ void neighbour_kernel(float* out) {
  FUSELET_SHARED(float[1024], s);
  const int i = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  s[i] = static_cast<float>(i);
  if constexpr (kBarrier) __syncthreads();
  out[blockIdx.x * n + i] = s[(i + 1) % n];
}

// out[0] = a shared word read before any write: the poison's bits.
__global__ void poison_kernel(uint32_t* out) {
  FUSELET_SHARED(uint32_t[4], s);
  if (threadIdx.x == 0) out[0] = s[2];
}

// out[i] = the sum of 1..n over the block, each thread's value i + 1 (block_allreduce), and
// out[n + i] = the max over the warp of lane * 3 (warp_allreduce).
__global__ void reduce_kernel(float* out) {
  FUSELET_SHARED(float[33], scratch);
  const int i = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  out[i] = fuselet::gpu::block_allreduce(static_cast<float>(i + 1), fuselet::gpu::Add(), scratch);
  out[n + i] = fuselet::gpu::warp_allreduce(static_cast<float>((i & 31) * 3), fuselet::gpu::Max());
}

// out[i] = the value lane (i ^ m) holds, width w.
__global__ void shuffle_kernel(int* out, int m, int w) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x) * 10, m, w);
}

// A barrier that only the first warp reaches.
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 32) __syncthreads();
  out[threadIdx.x] = 1;
}

// Odd and even threads wait at different barriers.
__global__ void two_barriers_kernel(int* out) {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// A full-warp shuffle in a block of 16 threads: the mask names lanes the warp does not have.
__global__ void absent_lanes_kernel(int* out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1); }

// Every lane calls a shuffle of lanes 0..15: lanes 16..31 are outside the mask they give.
__global__ void outside_mask_kernel(int* out) { out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1, 1); }

// The two halves of a warp shuffle at different call sites.
__global__ void divergent_shuffle_kernel(int* out) {
  if (threadIdx.x < 16)
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  else
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 2, 1);
}

// Each block writes its index into its slot; grid-stride over `n` slots.
__global__ void blocks_kernel(int* out, int n) {
  for (int b = static_cast<int>(blockIdx.x); b < n; b += static_cast<int>(gridDim.x))
    if (threadIdx.x == 0) out[b] += b + 1;
}

// Dynamic shared memory: thread i writes i, then reads thread (n - 1 - i)'s value.
__global__ void dynamic_kernel(float* out) {
  FUSELET_DYNAMIC_SHARED(float, d);
  const int i = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  d[i] = static_cast<float>(i);
  __syncthreads();
  out[i] = d[n - 1 - i];
}

// 64 KiB of static shared memory: more than a block may have.
__global__ void big_static_kernel(float* out) {
  FUSELET_SHARED(float[16384], s);
  s[threadIdx.x] = 1.f;
  out[threadIdx.x] = s[threadIdx.x];
}

// 2-D blocks: threadIdx.y / blockDim.y, and a barrier across them.
__global__ void two_d_kernel(int* out) {
  FUSELET_SHARED(int[8][32], s);
  s[threadIdx.y][threadIdx.x] = static_cast<int>(threadIdx.y * 100 + threadIdx.x);
  __syncthreads();
  out[threadIdx.y * blockDim.x + threadIdx.x] = s[blockDim.y - 1 - threadIdx.y][threadIdx.x];
}

// ---- helpers ------------------------------------------------------------------------------------

template <typename T>
struct Dev {
  T* d = nullptr;
  size_t n;
  explicit Dev(size_t count) : n(count) {
    cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(T));
    cudaMemset(d, 0, n * sizeof(T));
  }
  ~Dev() { cudaFree(d); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

void set_order(const char* order) { setenv("FUSELET_EMU_ORDER", order, 1); }

// The launch just made must have failed with `error`, its diagnostic containing `needle`.
void expect_failed(cudaError_t error, const char* needle, const std::string& what) {
  const cudaError_t e = cudaGetLastError();
  const std::string diag = fuselet_emu::last_diagnostic();
  expect(e == error && diag.find(needle) != std::string::npos, what + ": expected " + cudaGetErrorName(error) +
                                                                   " naming '" + needle + "', got " +
                                                                   cudaGetErrorName(e) + " '" + diag + "'");
}

void expect_ok(const std::string& what) {
  const cudaError_t e = cudaGetLastError();
  expect(e == cudaSuccess, what + ": " + cudaGetErrorString(e));
}

// ---- tests ---------------------------------------------------------------------------------------

void test_barrier_and_orders() {
  const int n = 256, blocks = 3;
  for (const char* order : {"forward", "reverse", "random:1", "random:2"}) {
    set_order(order);
    Dev<float> out(n * blocks);
    launch_kernel<neighbour_kernel<true>>(blocks, n, 0, nullptr, out.d);
    expect_ok(std::string("barrier, ") + order);
    bool ok = true;
    for (int b = 0; b < blocks; ++b)
      for (int i = 0; i < n; ++i) ok = ok && out.get()[b * n + i] == static_cast<float>((i + 1) % n);
    expect(ok, std::string("every thread sees its neighbour's write after __syncthreads, order ") + order);
  }
  // Without the barrier the result depends on the order: forward reads the poison (thread i
  // runs to its end before thread i + 1 writes), reverse the values; random orders differ too.
  std::vector<std::vector<float>> seen;
  for (const char* order : {"forward", "reverse", "random:1"}) {
    set_order(order);
    Dev<float> out(n);
    launch_kernel<neighbour_kernel<false>>(1, n, 0, nullptr, out.d);
    expect_ok(std::string("no barrier, ") + order);
    seen.push_back(out.get());
  }
  expect(std::isnan(seen[0][0]), "forward order, no barrier: thread 0 reads thread 1's slot before it is written");
  expect(seen[1][0] == 1.f, "reverse order, no barrier: thread 0 reads thread 1's write");
  expect(std::memcmp(seen[0].data(), seen[1].data(), n * sizeof(float)) != 0 &&
             std::memcmp(seen[0].data(), seen[2].data(), n * sizeof(float)) != 0,
         "a missing barrier changes the bits between thread orders");
  set_order("forward");
}

void test_poison() {
  Dev<uint32_t> out(1);
  launch_kernel<poison_kernel>(1, 32, 0, nullptr, out.d);
  expect_ok("poison");
  expect(out.get()[0] == 0xffffffffu, "shared memory reads 0xFF bytes (NaN as float) before any write");
}

void test_reductions() {
  for (int n : {32, 96, 1024}) {
    for (const char* order : {"forward", "random:3"}) {
      set_order(order);
      Dev<float> out(2 * n);
      launch_kernel<reduce_kernel>(1, n, 0, nullptr, out.d);
      expect_ok("reduce");
      const std::vector<float> h = out.get();
      bool sum_ok = true, max_ok = true;
      for (int i = 0; i < n; ++i) {
        sum_ok = sum_ok && h[i] == static_cast<float>(n) * (n + 1) / 2;
        max_ok = max_ok && h[n + i] == 93.f;
      }
      expect(sum_ok, "block_allreduce sums 1..n on every thread, n = " + std::to_string(n) + ", order " + order);
      expect(max_ok, "warp_allreduce's max on every lane, n = " + std::to_string(n) + ", order " + order);
    }
  }
  set_order("forward");
}

void test_shuffle() {
  for (int w : {32, 16, 8}) {
    for (int m : {1, 5, 16}) {
      Dev<int> out(64);
      launch_kernel<shuffle_kernel>(1, 64, 0, nullptr, out.d, m, w);
      expect_ok("shuffle");
      const std::vector<int> h = out.get();
      bool ok = true;
      for (int i = 0; i < 64; ++i) {
        int src = i ^ m;
        if ((src & ~(w - 1) & 31) != (i & ~(w - 1) & 31) || (src >> 5) != (i >> 5)) src = i;  // outside its group
        ok = ok && h[i] == src * 10;
      }
      expect(ok, "__shfl_xor_sync(m=" + std::to_string(m) + ", width=" + std::to_string(w) + ")");
    }
  }
}

void test_diagnostics() {
  Dev<int> out(256);
  const uint64_t errors = fuselet_emu::error_count();
  launch_kernel<divergent_barrier_kernel>(1, 64, 0, nullptr, out.d);
  expect_failed(cudaErrorLaunchFailure, "__syncthreads", "a barrier only warp 0 reaches");
  expect(out.get()[0] == 0, "a stuck block's threads stop at the barrier");
  launch_kernel<two_barriers_kernel>(1, 64, 0, nullptr, out.d);
  expect_failed(cudaErrorLaunchFailure, "different __syncthreads", "threads at two different barriers");
  launch_kernel<absent_lanes_kernel>(1, 16, 0, nullptr, out.d);
  expect_failed(cudaErrorLaunchFailure, "names lanes the warp does not have", "a full mask in a 16-thread block");
  launch_kernel<outside_mask_kernel>(1, 32, 0, nullptr, out.d);
  expect_failed(cudaErrorLaunchFailure, "leaves it out", "a lane outside its own mask");
  launch_kernel<divergent_shuffle_kernel>(1, 32, 0, nullptr, out.d);
  expect_failed(cudaErrorLaunchFailure, "different warp collectives", "halves of a warp at different shuffles");
  launch_kernel<big_static_kernel>(1, 32, 0, nullptr, reinterpret_cast<float*>(out.d));
  expect_failed(cudaErrorLaunchFailure, "static shared memory", "64 KiB of static shared memory");
  expect(fuselet_emu::error_count() == errors + 6, "each failed launch is counted");
  // A failed launch leaves no error behind for the next one.
  Dev<float> ok(256);
  launch_kernel<neighbour_kernel<true>>(1, 256, 0, nullptr, ok.d);
  expect_ok("a launch after failed ones");
}

void test_launch_limits() {
  Dev<float> out(2048);
  launch_kernel<neighbour_kernel<true>>(1, 1025, 0, nullptr, out.d);
  expect_failed(cudaErrorInvalidConfiguration, "block (1025,1,1)", "1025 threads");
  launch_kernel<neighbour_kernel<true>>(dim3(1, 65536), 32, 0, nullptr, out.d);
  expect_failed(cudaErrorInvalidConfiguration, "grid (1,65536,1)", "grid.y = 65536");
  launch_kernel<neighbour_kernel<true>>(0, 32, 0, nullptr, out.d);
  expect_failed(cudaErrorInvalidConfiguration, "grid (0,1,1)", "an empty grid");
  launch_kernel<neighbour_kernel<true>>(1, dim3(1, 1, 65), 0, nullptr, out.d);
  expect_failed(cudaErrorInvalidConfiguration, "block (1,1,65)", "blockDim.z = 65");
  // Dynamic shared memory: 48 KiB by default, more once the kernel's attribute allows it.
  const size_t big = 64 * 1024;
  launch_kernel<dynamic_kernel>(1, 128, big, nullptr, out.d);
  expect_failed(cudaErrorInvalidValue, "dynamic shared memory", "64 KiB without the attribute");
  constexpr auto k = &dynamic_kernel;
  expect(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024) == cudaErrorInvalidValue,
         "cudaFuncSetAttribute refuses more than the opt-in limit");
  expect(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(big)) == cudaSuccess,
         "cudaFuncSetAttribute 64 KiB");
  launch_kernel<dynamic_kernel>(1, 128, big, nullptr, out.d);
  expect_ok("64 KiB with the attribute");
  const std::vector<float> h = out.get();
  bool ok = true;
  for (int i = 0; i < 128; ++i) ok = ok && h[i] == static_cast<float>(127 - i);
  expect(ok, "dynamic shared memory across a barrier");
  int optin = 0;
  expect(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess && optin == 227 * 1024,
      "the opt-in shared memory of a compute capability 9.0 device");
}

void test_blocks_and_2d() {
  for (const char* order : {"forward", "reverse", "random:5"}) {
    set_order(order);
    Dev<int> out(1000);
    launch_kernel<blocks_kernel>(dim3(7, 1, 1), 32, 0, nullptr, out.d, 1000);
    const std::vector<int> h = out.get();
    bool ok = true;
    for (int b = 0; b < 1000; ++b) ok = ok && h[b] == b + 1;
    expect(ok, std::string("grid-stride loop: every slot written once, order ") + order);
    Dev<int> o2(256);
    launch_kernel<two_d_kernel>(1, dim3(32, 8), 0, nullptr, o2.d);
    const std::vector<int> g = o2.get();
    bool ok2 = true;
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 32; ++x) ok2 = ok2 && g[y * 32 + x] == (7 - y) * 100 + x;
    expect(ok2, std::string("2-D block: threadIdx.y and a barrier across rows, order ") + order);
  }
  set_order("forward");
}

void test_runtime() {
  std::vector<float> host(16, 1.f), other(16);
  float* d = nullptr;
  expect(cudaMalloc(reinterpret_cast<void**>(&d), 16 * sizeof(float)) == cudaSuccess && d != nullptr, "cudaMalloc");
  expect(reinterpret_cast<uintptr_t>(d) % 256 == 0, "cudaMalloc aligns to 256 bytes");
  expect(cudaMemcpy(d, host.data(), 64, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy to the device");
  expect(cudaMemcpy(other.data(), host.data(), 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
         "cudaMemcpy HostToDevice into host memory is refused");
  expect(cudaMemcpy(other.data(), d, 65, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
         "cudaMemcpy past the end of an allocation is refused");
  expect(cudaMemcpy(other.data(), d, 64, cudaMemcpyDeviceToHost) == cudaSuccess && other == host,
         "cudaMemcpy back to the host");
  expect(cudaMemset(other.data(), 0, 64) == cudaErrorInvalidValue, "cudaMemset of host memory is refused");
  expect(cudaFree(other.data()) == cudaErrorInvalidValue, "cudaFree of memory cudaMalloc did not return");
  cudaGetLastError();
  expect(cudaFree(d) == cudaSuccess, "cudaFree");
  int count = 0;
  expect(cudaGetDeviceCount(&count) == cudaSuccess && count == 1, "one emulated device");
  setenv("FUSELET_EMU_MAX_GRID", "7", 1);
  expect(fuselet_emu::grid_cap(int64_t(1) << 20) == 7 && fuselet_emu::grid_cap(3) == 3,
         "FUSELET_EMU_MAX_GRID lowers the grid cap, never raises it");
  unsetenv("FUSELET_EMU_MAX_GRID");
  expect(fuselet_emu::grid_cap(int64_t(1) << 20) == int64_t(1) << 20, "the grid cap without FUSELET_EMU_MAX_GRID");
  cudaStream_t s1, s2;
  expect(cudaStreamCreate(&s1) == cudaSuccess &&
             cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess && s1 != s2,
         "streams are distinct handles");
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

}  // namespace

// test_simt race: a kernel without its barrier, run once in the order FUSELET_EMU_ORDER gives,
// its output copied back; it "passes" in every order, and only the digests of two orders
// (tests/emu/orders.cmake) can tell them apart: the ctest emu.orders_catch_a_race.
int race() {
  Dev<float> out(256);
  launch_kernel<neighbour_kernel<false>>(1, 256, 0, nullptr, out.d);
  expect(cudaGetLastError() == cudaSuccess, "the racy kernel runs");
  out.get();
  return fuselet_test::report();
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "race") == 0) return race();
  unsetenv("FUSELET_EMU_ORDER");
  test_barrier_and_orders();
  test_poison();
  test_reductions();
  test_shuffle();
  test_diagnostics();
  test_launch_limits();
  test_blocks_and_2d();
  test_runtime();
  return fuselet_test::report();
}
