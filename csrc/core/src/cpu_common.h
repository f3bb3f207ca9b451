// Generic pieces of the CPU kernels: row tasks, float conversion of rows, the lane
// reduction, per-task scratch and dtype dispatch. Every kernel family includes this header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

// Streams read ahead: the row kernels read rows from memory in blocks of kAheadBlock elements,
// and each block first requests the cache lines kAheadBytes ahead of it in every stream it reads
// (ahead). The hardware prefetchers alone left a compute-heavy row loop short of the memory's
// bandwidth on the 2-vCPU EPYC build machine: measured on one thread over 2048 x 4096 float32
// rows, the KL forward (one exp per element) took 3.0-3.6 ms, with these requests 2.0 ms (the
// FMA polynomials of cpu_math.h alone were worth little there), as torch.compile's kernel did;
// in a C++ loop of the same kind, lines 2-32 KiB ahead did equally well, 1 KiB ahead less well.
// A request past the end of a buffer is harmless: a prefetch never faults.
constexpr int64_t kAheadBytes = 8192;
constexpr int64_t kAheadBlock = 64;

template <typename S>
FUSELET_INLINE void request_ahead(const S* p) {
  const char* line = reinterpret_cast<const char*>(p) + kAheadBytes;
  for (int64_t b = 0; b < kAheadBlock * static_cast<int64_t>(sizeof(S)); b += 64) __builtin_prefetch(line + b);
}

// f(j0, j1) over the blocks [j0, j1) of [0, n), the lines ahead of each of `streams` requested
// before each block. f's own loop over [j0, j1) vectorizes as a loop over [0, n) would.
template <typename F, typename... S>
FUSELET_INLINE void ahead(int64_t n, F f, const S*... streams) {
  for (int64_t j0 = 0; j0 < n; j0 += kAheadBlock) {
    (request_ahead(streams + j0), ...);
    f(j0, std::min(n, j0 + kAheadBlock));
  }
}

// The n elements at src as float32: src itself for float, else converted into buf.
template <typename T>
const float* row_as_float(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    (void)buf;
    (void)n;
    return src;
  } else {
    ahead(
        n,
        [=](int64_t j0, int64_t j1) __attribute__((always_inline)) {
          for (int64_t i = j0; i < j1; ++i) buf[i] = to_float(src[i]);
        },
        src);
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
    case FUSELET_INT32:
    case FUSELET_INT64: break;  // never: the checks admit float parameters only
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
    case FUSELET_INT32:
    case FUSELET_INT64: break;  // never: the checks admit float parameters only
  }
}

// Large outputs: the framework hands fuselet freshly mapped memory for each, and faulting
// in its 4 KiB pages one by one on first touch, not the arithmetic, is most of the time of a
// memory-bound row kernel there (measured on 64 MiB: writing fresh memory 34 ms, memory
// advised MADV_HUGEPAGE 8.9 ms and also populated with MADV_POPULATE_WRITE 6.3 ms, mapped
// memory 3.6 ms). With FUSELET_CPU_HUGE_PAGES=1, for an output of kLargeOutput bytes or
// more, parallel_rows asks Linux for transparent huge pages over its 2 MiB-aligned interior
// before the tasks start (the kernels write every row in full, so no memory is wasted), then
// each task populates its own rows with one call. Off by default: where the kernel reports
// free memory to a hypervisor (virtio-balloon free page reporting, which reports free blocks
// of order >= 9, exactly what a huge page takes), a huge page is often one the host has
// discarded, and its first touch costs host faults: measured on such a VM, first-touching
// 64 MiB advised MADV_HUGEPAGE took 3.3 ms when it reused recently freed blocks but 184-208 ms
// after memory had been freed and reported, against 25-34 ms in 4 KiB pages either way; the
// 4096x4096 float32 RMSNorm forward took 90-120 ms instead of 7 ms in its first calls. The
// 4 KiB path has no such mode. Smaller outputs are left alone in any case: glibc serves those
// from memory it has mapped already (its mmap threshold grows up to 32 MiB), where the two
// system calls per call only cost time (measured: 4096x512 float32 RMSNorm 1.0 ms with them,
// 0.7 ms without).
constexpr int64_t kLargeOutput = int64_t{32} << 20;

// FUSELET_CPU_HUGE_PAGES set and not "0": the huge-page path above (read once per process).
inline bool huge_page_outputs() {
  static const bool on = [] {
    const char* e = std::getenv("FUSELET_CPU_HUGE_PAGES");
    return e != nullptr && *e != '\0' && std::strcmp(e, "0") != 0;
  }();
  return on;
}

struct OutRows {
  void* data;      // NULL: no such output
  int64_t stride;  // elements between rows
  int64_t width;   // elements a row writes
};

// Rows [r0, r1) of `out` (elements of `elem` bytes) as a byte range.
inline int64_t rows_bytes(const OutRows& out, int64_t elem, int64_t r0, int64_t r1) {
  return out.data == nullptr || r1 <= r0 ? 0 : ((r1 - r0 - 1) * out.stride + out.width) * elem;
}

// madvise(advice) over the `align`-aligned interior of rows [r0, r1) of `out`.
inline void advise_rows(const OutRows& out, int64_t elem, int64_t r0, int64_t r1, uintptr_t align, int advice) {
#if defined(__linux__)
  const uintptr_t p = reinterpret_cast<uintptr_t>(out.data) + static_cast<uintptr_t>(r0 * out.stride * elem);
  const uintptr_t b = (p + align - 1) & ~(align - 1);
  const uintptr_t e = (p + static_cast<uintptr_t>(rows_bytes(out, elem, r0, r1))) & ~(align - 1);
  if (e > b) (void)madvise(reinterpret_cast<void*>(b), e - b, advice);
#else
  (void)out, (void)elem, (void)r0, (void)r1, (void)align, (void)advice;
#endif
}

// parallel_for(rows, grain, f) in at most `max_chunks` tasks (the slices of their Scratch) that
// write rows [r0, r1) of each of `outs` (T elements): large outputs are faulted in as above.
template <typename T, typename F>
void parallel_rows(int64_t rows, int64_t grain, int64_t max_chunks, std::initializer_list<OutRows> outs, F&& f) {
  constexpr int64_t elem = sizeof(T);
  bool large = false;
  for (const OutRows& out : outs) large = large || rows_bytes(out, elem, 0, rows) >= kLargeOutput;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (large && huge_page_outputs()) {
    constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, Linux 5.14 (older ones: EINVAL)
    for (const OutRows& out : outs)
      if (out.data) advise_rows(out, elem, 0, rows, uintptr_t{2} << 20, MADV_HUGEPAGE);
    return parallel_for(
        rows, grain,
        [&](int64_t c, int64_t r0, int64_t r1) {
          for (const OutRows& out : outs)
            if (out.data) advise_rows(out, elem, r0, r1, 4096, kPopulateWrite);
          f(c, r0, r1);
        },
        max_chunks);
  }
#endif
  (void)large;
  parallel_for(rows, grain, f, max_chunks);
}

// Per-task scratch: floats for converted rows and partial sums, allocated by the caller
// before any worker starts (no allocation, hence no exception, inside a task).
struct Scratch {
  std::vector<float> buf;
  int64_t tasks = 0;  // slices: no parallel_rows over this scratch may run more chunks
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
    case FUSELET_INT32:
    case FUSELET_INT64: break;  // never: as_rows admits float dtypes only
  }
}

// Allocates `tasks` scratch slices of `per_elem` x `elems` floats, then runs f(scratch).
// Scratch the address space cannot hold is FUSELET_ERR_INVALID_ARGUMENT naming `name`, the
// argument whose last dimension (`elems`) sizes it; out of memory is FUSELET_ERR_INTERNAL (no
// exception leaves). Every CPU op starts here, so this is also where a bad FUSELET_CPU_ISA is
// reported (before any kernel runs).
template <typename F>
fuselet_status with_scratch(const char* name, int64_t tasks, int64_t per_elem, int64_t elems, F&& f) {
  Isa isa = Isa::kBaseline;
  if (fuselet_status s = current_isa(&isa)) return s;
  int64_t per_task = 0, floats = 0, bytes = 0;
  if (__builtin_mul_overflow(per_elem, elems, &per_task) || __builtin_mul_overflow(per_task, tasks, &floats) ||
      __builtin_mul_overflow(floats, static_cast<int64_t>(sizeof(float)), &bytes) || bytes > PTRDIFF_MAX)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "%s: too large: its rows need %lld tasks x %lld x %lld floats of scratch, more than the address "
                "space holds",
                name, static_cast<long long>(tasks), static_cast<long long>(per_elem), static_cast<long long>(elems));
  try {
    Scratch s;
    s.tasks = tasks;
    s.per_task = per_task;
    s.buf.resize(static_cast<size_t>(floats));
    f(s);
  } catch (const std::bad_alloc&) {
    return fail(FUSELET_ERR_INTERNAL, "out of memory allocating %lld floats of scratch (%s)",
                static_cast<long long>(floats), name);
  }
  return ok();
}

}  // namespace cpu
}  // namespace fuselet
