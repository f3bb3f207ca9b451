// The checks of the core's C++ tests: count passes and failures (thread-safe), print each
// failure with fuselet's last error, and end with "N passed, N failed" and the exit code; and
// the tensor views they pass.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fuselet/fuselet.h"

namespace fuselet_test {

inline std::atomic<int> g_passed{0}, g_failed{0};

inline void expect(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL: %s (last error: '%s')\n", what.c_str(), fuselet_last_error());
  }
}

// `s` must be FUSELET_ERR_INVALID_ARGUMENT with a message containing `needle`.
inline void expect_error(fuselet_status s, const char* needle, const std::string& what) {
  expect(s == FUSELET_ERR_INVALID_ARGUMENT && std::strstr(fuselet_last_error(), needle) != nullptr,
         what + " -> '" + fuselet_last_error() + "'");
}

// A view of `data` with `shape`: row-major (contiguous) unless `strides` are given.
inline fuselet_tensor view(void* data, std::vector<int64_t> shape, std::vector<int64_t> strides = {},
                           fuselet_dtype dtype = FUSELET_FLOAT32) {
  fuselet_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t s = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = strides.empty() ? s : strides[d];
    if (d > 0) s *= shape[d];  // not past the outermost dim: huge views must not overflow here
  }
  return t;
}

// Prints the totals; the process exit code (0: every check passed).
inline int report(const char* note = "") {
  std::printf("%d passed, %d failed%s\n", g_passed.load(), g_failed.load(), note);
  return g_failed.load() == 0 ? 0 : 1;
}

}  // namespace fuselet_test
