// The one place where the two builds of the torch layer differ. The exact build (the default)
// uses ATen / c10 and torch/library.h: compiled against one torch minor, it runs on that minor
// only. The stable build (FUSELET_TORCH_STABLE, CMake FUSELET_TORCH_ABI=stable) uses only
// LibTorch's stable ABI (torch/csrc/stable: the C shim behind torch::stable::Tensor and
// STABLE_TORCH_LIBRARY), compiled with TORCH_TARGET_VERSION = the oldest torch it must run
// on, and runs on that torch and every later one. Everything else of the layer (checks,
// views, the op implementations) is written once against what this header declares.
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef FUSELET_TORCH_STABLE
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#ifdef FUSELET_TORCH_CUDA
// The shim's current CUDA stream (libtorch_cuda; declared in shim.h under USE_CUDA only).
extern "C" AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);
#endif
#else
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#ifdef FUSELET_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#endif

namespace fuselet_torch {

#ifdef FUSELET_TORCH_STABLE
using Tensor = torch::stable::Tensor;
using Library = torch::stable::detail::StableLibrary;
#else
using Tensor = at::Tensor;
using Library = torch::Library;
#endif
using ScalarType = c10::ScalarType;  // the same enum in both builds (torch/headeronly)
using OptTensor = std::optional<Tensor>;

// --- errors ------------------------------------------------------------------------------
// The kinds of a refused call and the Python exception each becomes. The exact build raises
// c10's typed errors (ValueError, TypeError, NotImplementedError, RuntimeError). A stable
// kernel can only throw standard C++ exceptions, and what a torch makes of those is its own
// choice (torch 2.15 turns every one but std::out_of_range into a RuntimeError). So each
// refusal of the stable build names its Python exception at the head of its message:
// "[fuselet ValueError] weight: expected ...". The torch layer's Python kernels, registered
// over the stable kernels (python/fuselet/torch/_errors.py), raise that exception with the rest
// of the message, under any torch. Where a stable kernel is called some other way, the head
// stays readable, and the C++ type is the next best: std::invalid_argument (pybind11's
// ValueError) for a bad value or dtype, std::runtime_error (RuntimeError) otherwise.
enum class Error { Value, Type, NotImplemented, Runtime };

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

[[noreturn]] inline void fail(Error kind, const std::string& message) {
#ifdef FUSELET_TORCH_STABLE
  // the heads python/fuselet/torch/_errors.py reads (TAG)
  switch (kind) {
    case Error::Value: throw std::invalid_argument("[fuselet ValueError] " + message);
    case Error::Type: throw std::invalid_argument("[fuselet TypeError] " + message);
    case Error::NotImplemented: throw std::runtime_error("[fuselet NotImplementedError] " + message);
    case Error::Runtime: break;
  }
  throw std::runtime_error(message);
#else
  switch (kind) {
    case Error::Value: TORCH_CHECK_VALUE(false, message);
    case Error::Type: TORCH_CHECK_TYPE(false, message);
    case Error::NotImplemented: TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    case Error::Runtime: break;
  }
  TORCH_CHECK(false, message);
#endif
}

#define FUSELET_CHECK_KIND(kind, cond, ...)                                                                 \
  do {                                                                                                      \
    if (!(cond)) ::fuselet_torch::fail(::fuselet_torch::Error::kind, ::fuselet_torch::concat(__VA_ARGS__)); \
  } while (0)
#define FUSELET_CHECK_VALUE(cond, ...) FUSELET_CHECK_KIND(Value, cond, __VA_ARGS__)
#define FUSELET_CHECK_TYPE(cond, ...) FUSELET_CHECK_KIND(Type, cond, __VA_ARGS__)
#define FUSELET_CHECK_NOT_IMPLEMENTED(cond, ...) FUSELET_CHECK_KIND(NotImplemented, cond, __VA_ARGS__)

// --- tensors -----------------------------------------------------------------------------

inline std::vector<int64_t> shape_of(const Tensor& t) {
  std::vector<int64_t> shape(static_cast<size_t>(t.dim()));
  for (int64_t d = 0; d < t.dim(); ++d) shape[static_cast<size_t>(d)] = t.size(d);
  return shape;
}

inline Tensor make_contiguous(const Tensor& t) {
#ifdef FUSELET_TORCH_STABLE
  return t.is_contiguous() ? t : torch::stable::contiguous(t);
#else
  return t.contiguous();
#endif
}

// Uninitialised, contiguous, t's shape, dtype and device.
inline Tensor alloc_like(const Tensor& t) {
#ifdef FUSELET_TORCH_STABLE
  return torch::stable::empty_like(t);
#else
  return at::empty_like(t);
#endif
}

// Uninitialised, contiguous, of `shape` and `dtype` on the device of `like`.
inline Tensor alloc(const Tensor& like, const std::vector<int64_t>& shape, ScalarType dtype) {
#ifdef FUSELET_TORCH_STABLE
  return torch::stable::new_empty(like, shape, dtype);
#else
  return at::empty(shape, like.options().dtype(dtype));
#endif
}

inline void copy_into(const Tensor& dst, const Tensor& src) {
#ifdef FUSELET_TORCH_STABLE
  Tensor handle = dst;  // another handle of the same tensor
  torch::stable::copy_(handle, src);
#else
  dst.copy_(src);
#endif
}

inline bool same_device(const Tensor& a, const Tensor& b) { return a.device() == b.device(); }

// A device as torch prints it (cpu, cuda:0, meta).
inline std::string device_name(const Tensor& t) {
#ifdef FUSELET_TORCH_STABLE
  const auto device = t.device();
  std::string name;
  switch (device.type()) {
    case torch::headeronly::DeviceType::CPU: name = "cpu"; break;
    case torch::headeronly::DeviceType::CUDA: name = "cuda"; break;
    case torch::headeronly::DeviceType::Meta: name = "meta"; break;
    default: name = concat("device type ", static_cast<int>(device.type()));
  }
  return device.has_index() ? concat(name, ":", static_cast<int>(device.index())) : name;
#else
  return concat(t.device());
#endif
}

// --- CUDA --------------------------------------------------------------------------------
#ifdef FUSELET_TORCH_CUDA
// x's device made current for the scope, and its current stream.
class CudaScope {
 public:
  explicit CudaScope(const Tensor& x)
#ifdef FUSELET_TORCH_STABLE
      : guard_(x.get_device_index()) {
    if (aoti_torch_get_current_cuda_stream(x.get_device_index(), &stream_) != AOTI_TORCH_SUCCESS)
      fail(Error::Runtime, "fuselet: the current CUDA stream of the tensors' device is unavailable");
  }
#else
      : guard_(x.device()), stream_(at::cuda::getCurrentCUDAStream(x.device().index()).stream()) {
  }
#endif
  void* stream() const { return stream_; }

 private:
#ifdef FUSELET_TORCH_STABLE
  torch::stable::accelerator::DeviceGuard guard_;
  void* stream_ = nullptr;
#else
  c10::cuda::CUDAGuard guard_;
  void* stream_;
#endif
};
#endif

}  // namespace fuselet_torch

// --- registration ------------------------------------------------------------------------
// FUSELET_TORCH_LIBRARY(m) defines the schemas; FUSELET_IMPL(m, "name", fn) registers a kernel;
// FUSELET_TORCH_IMPLS(fn) runs fn(Library&) for CPU tensors and, in builds with CUDA kernels,
// CUDA tensors: the same functions serve both.
#ifdef FUSELET_TORCH_STABLE
#define FUSELET_TORCH_LIBRARY(m) STABLE_TORCH_LIBRARY(fuselet, m)
#define FUSELET_IMPL(m, name, fn) (m).impl(name, TORCH_BOX(&fn))
#define FUSELET_LIBRARY_IMPL(key, m) STABLE_TORCH_LIBRARY_IMPL(fuselet, key, m)
#else
#define FUSELET_TORCH_LIBRARY(m) TORCH_LIBRARY(fuselet, m)
#define FUSELET_IMPL(m, name, fn) (m).impl(name, &fn)
#define FUSELET_LIBRARY_IMPL(key, m) TORCH_LIBRARY_IMPL(fuselet, key, m)
#endif
#ifdef FUSELET_TORCH_CUDA
#define FUSELET_TORCH_IMPLS(fn)           \
  FUSELET_LIBRARY_IMPL(CPU, m) { fn(m); } \
  FUSELET_LIBRARY_IMPL(CUDA, m) { fn(m); }
#else
#define FUSELET_TORCH_IMPLS(fn) \
  FUSELET_LIBRARY_IMPL(CPU, m) { fn(m); }
#endif
