// XLA FFI buffers -> fuselet_tensor views, fuselet_status -> ffi::Error.
#pragma once

#include <string>

#include "fuselet/fuselet.h"
#include "xla/ffi/api/ffi.h"

namespace fuselet_jax {

namespace ffi = xla::ffi;

// Data, shape and row-major strides of `buf` into `out` (XLA buffers given to custom calls are
// dense, row-major); false with `error` set for more dimensions than a view holds.
inline bool row_major(const ffi::AnyBuffer& buf, const char* name, fuselet_tensor* out, ffi::Error* error) {
  const auto dims = buf.dimensions();
  if (dims.size() > FUSELET_MAX_DIMS) {
    *error = ffi::Error::InvalidArgument(std::string(name) + ": expected at most 8 dimensions");
    return false;
  }
  out->data = buf.untyped_data();
  out->ndim = static_cast<int32_t>(dims.size());
  int64_t stride = 1;
  for (int32_t d = out->ndim - 1; d >= 0; --d) {
    out->shape[d] = dims[d];
    out->strides[d] = stride;
    stride *= dims[d];
  }
  return true;
}

// A core view of `buf`. Sets `error` and returns false for dtypes fuselet does not support.
inline bool view(const ffi::AnyBuffer& buf, const char* name, fuselet_tensor* out, ffi::Error* error) {
  *out = fuselet_tensor{};
  switch (buf.element_type()) {
    case ffi::DataType::F32: out->dtype = FUSELET_FLOAT32; break;
    case ffi::DataType::F16: out->dtype = FUSELET_FLOAT16; break;
    case ffi::DataType::BF16: out->dtype = FUSELET_BFLOAT16; break;
    default:
      *error = ffi::Error::InvalidArgument(std::string(name) + ": expected dtype float32, float16 or bfloat16");
      return false;
  }
  return row_major(buf, name, out, error);
}

// A core view of a class-id buffer (S32 or S64: cross-entropy's target).
inline bool index_view(const ffi::AnyBuffer& buf, const char* name, fuselet_tensor* out, ffi::Error* error) {
  *out = fuselet_tensor{};
  switch (buf.element_type()) {
    case ffi::DataType::S32: out->dtype = FUSELET_INT32; break;
    case ffi::DataType::S64: out->dtype = FUSELET_INT64; break;
    default:
      *error = ffi::Error::InvalidArgument(std::string(name) + ": expected dtype int32 or int64 (class ids)");
      return false;
  }
  return row_major(buf, name, out, error);
}

inline ffi::Error to_error(fuselet_status status) {
  if (status == FUSELET_OK) return ffi::Error::Success();
  std::string msg = std::string("fuselet: ") + fuselet_last_error();
  switch (status) {
    case FUSELET_ERR_INVALID_ARGUMENT: return ffi::Error::InvalidArgument(msg);
    case FUSELET_ERR_UNSUPPORTED: return ffi::Error(ffi::ErrorCode::kUnimplemented, msg);
    default: return ffi::Error::Internal(msg);
  }
}

}  // namespace fuselet_jax

// Declares core views v<name> of the listed buffers, returning the view error if any.
#define FUSELET_JAX_VIEW(var, buf, name)                           \
  fuselet_tensor var;                                              \
  {                                                                \
    ::xla::ffi::Error _err = ::xla::ffi::Error::Success();         \
    if (!::fuselet_jax::view(buf, name, &var, &_err)) return _err; \
  }

// Declares a core view var of a class-id buffer, returning the view error if any.
#define FUSELET_JAX_INDEX_VIEW(var, buf, name)                           \
  fuselet_tensor var;                                                    \
  {                                                                      \
    ::xla::ffi::Error _err = ::xla::ffi::Error::Success();               \
    if (!::fuselet_jax::index_view(buf, name, &var, &_err)) return _err; \
  }
