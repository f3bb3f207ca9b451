// The start of the core's CUDA tests (tests/core/test_*_cuda.cc): CUDA_OK, and the one optional
// argument, the dtype a run is limited to (the emulated runs split the work so), with the skip
// (exit 77, ctest's SKIP_RETURN_CODE) where there is no CUDA device or libfuselet has no CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuselet/fuselet.h"

#define CUDA_OK(expr)                                                                             \
  do {                                                                                            \
    const cudaError_t err_ = (expr);                                                              \
    if (err_ != cudaSuccess) {                                                                    \
      std::printf("FAIL: %s: %s (%s:%d)\n", #expr, cudaGetErrorString(err_), __FILE__, __LINE__); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace fuselet_test {

// The dtype named on the command line ("" for every dtype); exits 2 with the usage on any other
// argument, 77 without a CUDA device or a CUDA build of libfuselet.
inline std::string start_cuda_test(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (argc > 2 || (!only.empty() && only != "float32" && only != "float16" && only != "bfloat16")) {
    std::printf("usage: %s [float32|float16|bfloat16]\n", argv[0]);
    std::exit(2);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    std::exit(77);
  }
  if (!fuselet_has_cuda()) {
    std::printf("libfuselet was built without CUDA: skipped\n");
    std::exit(77);
  }
  return only;
}

// Whether a run limited to `only` ("" for none) runs the dtype named `name`.
inline bool runs_dtype(const std::string& only, const char* name) { return only.empty() || only == name; }

}  // namespace fuselet_test
