// fuselet's CUDA emulator: the CUDA runtime calls that fuselet's core and its CUDA tests make,
// for one emulated device of compute capability 9.0. Device memory is host memory (each
// allocation recorded, so that a copy whose "device" side is not device memory fails as on a
// GPU); streams are names only: every launch and copy completes before the call returns.
//
// FUSELET_EMU_DIGEST=FILE: at exit, write to FILE a digest of every byte copied from the device
// to the host (cudaMemcpy / cudaMemcpyAsync), so that runs of one test in different thread
// orders can be required to give the same bits.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include "fuselet_emu/simt.h"
#include "state.h"

namespace fuselet_emu {
namespace {

std::mutex g_mutex;  // the runtime's state below
cudaError_t g_last_error = cudaSuccess;
std::string g_last_message;
std::map<const void*, size_t> g_dynamic_limits;  // kernel -> bytes
std::map<uintptr_t, size_t> g_allocations;       // device memory: start -> bytes
int g_streams = 0;

// The digest: FNV-1a over 64-bit words, in the order of the copies.
uint64_t g_digest = 0xcbf29ce484222325ull, g_digest_bytes = 0;

void fold(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t h = g_digest;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  g_digest = h;
  g_digest_bytes += n;
}

void write_digest() {
  const char* path = std::getenv("FUSELET_EMU_DIGEST");
  if (path == nullptr || *path == '\0') return;
  if (FILE* f = std::fopen(path, "w")) {
    std::fprintf(f, "%016llx %llu bytes copied to the host, %llu errors\n", static_cast<unsigned long long>(g_digest),
                 static_cast<unsigned long long>(g_digest_bytes), static_cast<unsigned long long>(error_count()));
    std::fclose(f);
  }
}

struct DigestAtExit {
  DigestAtExit() { std::atexit(write_digest); }
} g_digest_at_exit;

// Whether [p, p + n) lies inside one device allocation.
bool on_device(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return false;
  --it;
  return a >= it->first && a - it->first <= it->second && n <= it->second - (a - it->first);
}

cudaError_t fail(cudaError_t e, const std::string& message) {
  g_last_error = e;
  g_last_message = message;
  return e;
}

// Checks the sides of a copy of `kind` (device memory where the kind says so).
cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue, "cudaMemcpy: a null pointer");
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyDefault && kind != cudaMemcpyHostToHost) {
    if (dst_dev && !on_device(dst, n))
      return fail(cudaErrorInvalidValue, "cudaMemcpy: the destination is not device memory of that size");
    if (src_dev && !on_device(src, n))
      return fail(cudaErrorInvalidValue, "cudaMemcpy: the source is not device memory of that size");
  }
  std::memmove(dst, src, n);
  if (kind == cudaMemcpyDeviceToHost || (kind == cudaMemcpyDefault && on_device(src, n) && !on_device(dst, n)))
    fold(dst, n);
  return cudaSuccess;
}

}  // namespace

void set_error(cudaError_t error, const std::string& message, bool print) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_last_error = error;
    g_last_message = message;
  }
  if (print) {
    note_diagnostic(message);
    std::fprintf(stderr, "fuselet-emu: error: %s\n", message.c_str());
  }
}

size_t dynamic_shared_limit(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_dynamic_limits.find(kernel);
  return it == g_dynamic_limits.end() ? kDefaultDynamicShared : it->second;
}

void set_dynamic_shared_limit(const void* kernel, size_t bytes) { g_dynamic_limits[kernel] = bytes; }

}  // namespace fuselet_emu

using fuselet_emu::g_mutex;
using Lock = std::lock_guard<std::mutex>;

extern "C" {

FUSELET_EMU_API cudaError_t cudaGetLastError(void) {
  Lock lock(g_mutex);
  const cudaError_t e = fuselet_emu::g_last_error;
  fuselet_emu::g_last_error = cudaSuccess;
  return e;
}

FUSELET_EMU_API cudaError_t cudaPeekAtLastError(void) {
  Lock lock(g_mutex);
  return fuselet_emu::g_last_error;
}

FUSELET_EMU_API const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

// The message of the last error when it is `error` (what the emulator found), else its name.
FUSELET_EMU_API const char* cudaGetErrorString(cudaError_t error) {
  if (error == cudaSuccess) return "no error";
  thread_local std::string text;
  {
    Lock lock(g_mutex);
    text = fuselet_emu::g_last_message.empty() ? cudaGetErrorName(error) : fuselet_emu::g_last_message;
  }
  return text.c_str();
}

FUSELET_EMU_API cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

FUSELET_EMU_API cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

FUSELET_EMU_API cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

FUSELET_EMU_API cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

FUSELET_EMU_API cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (value == nullptr || device != 0) return cudaErrorInvalidValue;
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(fuselet_emu::kOptinShared); break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(fuselet_emu::kStaticSharedLimit); break;
    case cudaDevAttrMaxThreadsPerBlock: *value = fuselet_emu::kMaxThreadsPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = fuselet_emu::kMultiprocessors; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: return cudaErrorInvalidValue;  // one the emulator does not know: add it here
  }
  return cudaSuccess;
}

// What the compiled kernel needs is unknown before it runs: no static shared memory, no
// registers; the scheduler checks the shared memory a block uses when it uses it.
FUSELET_EMU_API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
  if (attr == nullptr || func == nullptr) return cudaErrorInvalidDeviceFunction;
  std::memset(attr, 0, sizeof *attr);
  attr->maxThreadsPerBlock = fuselet_emu::kMaxThreadsPerBlock;
  attr->maxDynamicSharedSizeBytes = static_cast<int>(fuselet_emu::dynamic_shared_limit(func));
  attr->ptxVersion = attr->binaryVersion = 90;
  return cudaSuccess;
}

FUSELET_EMU_API cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (func == nullptr) return cudaErrorInvalidDeviceFunction;
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > fuselet_emu::kOptinShared) return cudaErrorInvalidValue;
    Lock lock(g_mutex);
    fuselet_emu::set_dynamic_shared_limit(func, static_cast<size_t>(value));
  }
  return cudaSuccess;
}

FUSELET_EMU_API cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = ::operator new(size, std::align_val_t(256), std::nothrow);  // cudaMalloc aligns to 256 bytes
  if (p == nullptr) return cudaErrorMemoryAllocation;
  Lock lock(g_mutex);
  fuselet_emu::g_allocations[reinterpret_cast<uintptr_t>(p)] = size;
  *ptr = p;
  return cudaSuccess;
}

FUSELET_EMU_API cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  Lock lock(g_mutex);
  auto it = fuselet_emu::g_allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == fuselet_emu::g_allocations.end())
    return fuselet_emu::fail(cudaErrorInvalidValue, "cudaFree: not a pointer cudaMalloc returned");
  fuselet_emu::g_allocations.erase(it);
  ::operator delete(ptr, std::align_val_t(256));
  return cudaSuccess;
}

FUSELET_EMU_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  Lock lock(g_mutex);
  return fuselet_emu::copy(dst, src, count, kind);
}

FUSELET_EMU_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                            cudaStream_t) {
  Lock lock(g_mutex);
  return fuselet_emu::copy(dst, src, count, kind);
}

FUSELET_EMU_API cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  Lock lock(g_mutex);
  if (!fuselet_emu::on_device(ptr, count))
    return fuselet_emu::fail(cudaErrorInvalidValue, "cudaMemset: not device memory of that size");
  std::memset(ptr, value, count);
  return cudaSuccess;
}

FUSELET_EMU_API cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t) {
  return cudaMemset(ptr, value, count);
}

FUSELET_EMU_API cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

FUSELET_EMU_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  Lock lock(g_mutex);
  // A distinct, never dereferenced handle per stream.
  *stream = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x57000 + 16 * ++fuselet_emu::g_streams));
  return cudaSuccess;
}

FUSELET_EMU_API cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
FUSELET_EMU_API cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

}  // extern "C"
