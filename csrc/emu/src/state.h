// What the scheduler (scheduler.cc) and the CUDA runtime stand-in (runtime.cc) of fuselet's CUDA
// emulator share. Not installed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace fuselet_emu {

// CUDA's limits for the emulated device (those of compute capability 9.0, an H100 / H200).
constexpr int kMaxThreadsPerBlock = 1024;
constexpr int kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimX = 2147483647u, kMaxGridDimYZ = 65535u;
constexpr size_t kStaticSharedLimit = 48 * 1024;     // static __shared__ per block
constexpr size_t kDefaultDynamicShared = 48 * 1024;  // dynamic, without the opt-in attribute
constexpr size_t kOptinShared = 227 * 1024;          // cudaDevAttrMaxSharedMemoryPerBlockOptin
constexpr int kMultiprocessors = 132;

// Records `error` as the last error of the runtime (cudaGetLastError) with `message`; `print`
// also writes "fuselet-emu: error: MESSAGE" to stderr (what a launch found).
void set_error(cudaError_t error, const std::string& message, bool print);
// Counts an error found in a launch, kept for last_diagnostic() (scheduler.cc).
void note_diagnostic(const std::string& message);
// The dynamic shared memory a kernel may use (cudaFuncSetAttribute), and setting it.
size_t dynamic_shared_limit(const void* kernel);
void set_dynamic_shared_limit(const void* kernel, size_t bytes);

}  // namespace fuselet_emu
