// Generic pieces of the CPU kernels: row tasks, float conversion of rows, the lane
// reduction, per-task scratch and dtype dispatch. Every kernel family includes this header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <new>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu_isa.h"
#include "dtype.h"
#include "internal.h"
#include "parallel.h"

namespace fuselet {
namespace cpu {

// Lanes of independent float accumulators in every row reduction (see lane_reduce).
constexpr int kLanes = 16;

// Rows per task: enough elements that a task outweighs the cost of waking a worker.
inline int64_t row_grain(int64_t hidden) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1)); }

// The n elements at src as float32: src itself for float, else converted into buf.
template <typename T>
const float* row_as_float(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    (void)buf;
    (void)n;
    return src;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = to_float(src[i]);
    return buf;
  }
}

// sum(term(i)) for i in [0, n), one accumulator per lane so that GCC vectorizes it without
// -ffast-math (the order of additions is fixed, so results are deterministic).
template <typename Term>
inline float lane_reduce(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  for (int l = 0; i < n; ++i, ++l) acc[l] += term(i);
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// max(term(i)) for i in [0, n) (n >= 1), lane-wise like lane_reduce.
template <typename Term>
inline float lane_max(int64_t n, Term term) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = -__builtin_huge_valf();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = std::max(acc[l], term(i + l));
  for (int l = 0; i < n; ++i, ++l) acc[l] = std::max(acc[l], term(i));
  float m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = std::max(m, acc[l]);
  return m;
}

// out[i] = float(param[i]) + offset, or `fill` when there is no parameter (NULL).
inline void load_param(const void* param, fuselet_dtype dtype, int64_t n, float offset, float fill, float* out) {
  if (param == nullptr) {
    std::fill(out, out + n, fill);
    return;
  }
  const auto load = [&](const auto* src) {
    for (int64_t i = 0; i < n; ++i) out[i] = to_float(src[i]) + offset;
  };
  switch (dtype) {
    case FUSELET_FLOAT32: load(static_cast<const float*>(param)); break;
    case FUSELET_FLOAT16: load(static_cast<const half_t*>(param)); break;
    case FUSELET_BFLOAT16: load(static_cast<const bfloat16_t*>(param)); break;
  }
}

// dst[i0..i1) = src[i0..i1) rounded to `dtype`.
inline void store_param(const float* src, fuselet_dtype dtype, int64_t i0, int64_t i1, void* dst) {
  const auto store = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    for (int64_t i = i0; i < i1; ++i) out[i] = from_float<T>(src[i]);
  };
  switch (dtype) {
    case FUSELET_FLOAT32: store(static_cast<float*>(dst)); break;
    case FUSELET_FLOAT16: store(static_cast<half_t*>(dst)); break;
    case FUSELET_BFLOAT16: store(static_cast<bfloat16_t*>(dst)); break;
  }
}

// Large outputs: the framework hands fuselet freshly mapped memory for each, and faulting
// in its 4 KiB pages one by one on first touch, not the arithmetic, is most of the time of a
// memory-bound row kernel there (measured on 64 MiB: writing fresh memory 34 ms, memory
// advised MADV_HUGEPAGE 8.9 ms and also populated with MADV_POPULATE_WRITE 6.3 ms, mapped
// memory 3.6 ms). parallel_rows asks Linux for transparent huge pages over the 2 MiB-aligned
// interior of each output before the tasks start (the kernels write every row in full, so no
// memory is wasted), then each task populates its own rows with one call. Both are hints:
// where the pages are mapped already or the system declines, nothing changes but a cheap
// system call; outputs under 1 MiB are left alone.
struct OutRows {
  void* data;      // NULL: no such output
  int64_t stride;  // elements between rows
  int64_t width;   // elements a row writes
};

inline void advise_range(void* p, int64_t bytes, uintptr_t align, int advice) {
#if defined(__linux__)
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + align - 1) & ~(align - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(align - 1);
  if (e > b) (void)madvise(reinterpret_cast<void*>(b), e - b, advice);
#else
  (void)p, (void)bytes, (void)align, (void)advice;
#endif
}

// Advises rows [r0, r1) of `out` (elements of `elem` bytes) if they span at least min_bytes.
inline void advise_rows(const OutRows& out, int64_t elem, int64_t r0, int64_t r1, int64_t min_bytes, uintptr_t align,
                        int advice) {
  if (out.data == nullptr || r1 <= r0) return;
  const int64_t bytes = ((r1 - r0 - 1) * out.stride + out.width) * elem;
  if (bytes >= min_bytes) advise_range(static_cast<char*>(out.data) + r0 * out.stride * elem, bytes, align, advice);
}

// parallel_for(rows, grain, f) for tasks that write rows [r0, r1) of each of `outs`
// (T elements): the outputs' pages are faulted in as described above.
template <typename T, typename F>
void parallel_rows(int64_t rows, int64_t grain, std::initializer_list<OutRows> outs, F&& f) {
  constexpr int64_t kMinBytes = 1 << 20;
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, Linux 5.14 (older ones: EINVAL)
  constexpr int64_t elem = sizeof(T);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  for (const OutRows& out : outs) advise_rows(out, elem, 0, rows, 4 * kMinBytes, uintptr_t{2} << 20, MADV_HUGEPAGE);
#endif
  parallel_for(rows, grain, [&](int64_t c, int64_t r0, int64_t r1) {
    for (const OutRows& out : outs) advise_rows(out, elem, r0, r1, kMinBytes, 4096, kPopulateWrite);
    f(c, r0, r1);
  });
}

// Per-task scratch: floats for converted rows and partial sums, allocated by the caller
// before any worker starts (no allocation, hence no exception, inside a task).
struct Scratch {
  std::vector<float> buf;
  int64_t per_task = 0;
  float* task(int64_t c) { return buf.data() + c * per_task; }
};

// Calls f(T{}) with T the host storage type of `dtype`.
template <typename F>
void dispatch(fuselet_dtype dtype, F&& f) {
  switch (dtype) {
    case FUSELET_FLOAT32: f(float{}); break;
    case FUSELET_FLOAT16: f(half_t{}); break;
    case FUSELET_BFLOAT16: f(bfloat16_t{}); break;
  }
}

// Allocates `tasks` scratch slices of `per_task` floats, then runs f(scratch); out of memory
// is FUSELET_ERR_INTERNAL (no exception leaves). Every CPU op starts here, so this is also
// where a bad FUSELET_CPU_ISA is reported (before any kernel runs).
template <typename F>
fuselet_status with_scratch(int64_t tasks, int64_t per_task, F&& f) {
  Isa isa = Isa::kBaseline;
  if (fuselet_status s = current_isa(&isa)) return s;
  try {
    Scratch s;
    s.per_task = per_task;
    s.buf.resize(static_cast<size_t>(tasks * per_task));
    f(s);
  } catch (const std::bad_alloc&) {
    return fail(FUSELET_ERR_INTERNAL, "out of memory allocating %lld floats of scratch",
                static_cast<long long>(per_task));
  }
  return ok();
}

}  // namespace cpu
}  // namespace fuselet
