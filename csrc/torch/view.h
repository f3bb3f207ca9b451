// Tensor -> fuselet_tensor views and fuselet_status -> Python exceptions.
#pragma once

#include "api.h"
#include "fuselet/fuselet.h"

namespace fuselet_torch {

// A dtype as Python names it (torch.float32 is float32), as the fake impls say it.
inline std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Double: return "float64";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Bool: return "bool";
    case ScalarType::Float: return "float32";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    default: return c10::toString(t);
  }
}

// `v` (its dtype set) completed with t's data, shape and strides.
inline fuselet_tensor with_layout(const Tensor& t, const char* name, fuselet_tensor v) {
  FUSELET_CHECK_VALUE(t.dim() <= FUSELET_MAX_DIMS, name, ": expected at most ", FUSELET_MAX_DIMS, " dimensions, got ",
                      t.dim());
  v.data = t.data_ptr();
  v.ndim = static_cast<int32_t>(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

// A non-owning core view of `t`; `name` is the argument name used in error messages.
inline fuselet_tensor view(const Tensor& t, const char* name) {
  fuselet_tensor v{};
  switch (t.scalar_type()) {
    case ScalarType::Float: v.dtype = FUSELET_FLOAT32; break;
    case ScalarType::Half: v.dtype = FUSELET_FLOAT16; break;
    case ScalarType::BFloat16: v.dtype = FUSELET_BFLOAT16; break;
    default:
      fail(Error::Type,
           concat(name, ": expected dtype float32, float16 or bfloat16, got ", dtype_name(t.scalar_type())));
  }
  return with_layout(t, name, v);
}

// A core view of a class-id tensor (int32 or int64: cross-entropy's target).
inline fuselet_tensor index_view(const Tensor& t, const char* name) {
  fuselet_tensor v{};
  switch (t.scalar_type()) {
    case ScalarType::Int: v.dtype = FUSELET_INT32; break;
    case ScalarType::Long: v.dtype = FUSELET_INT64; break;
    default:
      fail(Error::Type,
           concat(name, ": expected dtype int32 or int64 (class ids), got ", dtype_name(t.scalar_type())));
  }
  return with_layout(t, name, v);
}

// Turns a failed core call into the matching Python exception with the core's message.
inline void check(fuselet_status status) {
  if (status == FUSELET_OK) return;
  const char* msg = fuselet_last_error();
  FUSELET_CHECK_VALUE(status != FUSELET_ERR_INVALID_ARGUMENT, "fuselet: ", msg);
  FUSELET_CHECK_NOT_IMPLEMENTED(status != FUSELET_ERR_UNSUPPORTED, "fuselet: ", msg);
  fail(Error::Runtime, concat("fuselet (", fuselet_status_string(status), "): ", msg));
}

}  // namespace fuselet_torch
