// Generic pieces of the CPU kernels: row tasks, float conversion of rows, the lane
// reduction, per-task scratch and dtype dispatch. Every kernel family includes this header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <vector>

#include "cpu_isa.h"
#include "dtype.h"
#include "internal.h"

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
  Isa isa;
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
