// at::Tensor -> fuselet_tensor views and fuselet_status -> Python exceptions.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "fuselet/fuselet.h"

namespace fuselet_torch {

// A non-owning core view of `t`; `name` is the argument name used in error messages.
inline fuselet_tensor view(const at::Tensor& t, const char* name) {
  fuselet_tensor v{};
  switch (t.scalar_type()) {
    case at::kFloat: v.dtype = FUSELET_FLOAT32; break;
    case at::kHalf: v.dtype = FUSELET_FLOAT16; break;
    case at::kBFloat16: v.dtype = FUSELET_BFLOAT16; break;
    default: TORCH_CHECK_TYPE(false, name, ": expected dtype float32, float16 or bfloat16, got ", t.scalar_type());
  }
  TORCH_CHECK_VALUE(t.dim() <= FUSELET_MAX_DIMS, name, ": expected at most ", FUSELET_MAX_DIMS, " dimensions, got ",
                    t.dim());
  v.data = t.data_ptr();
  v.ndim = static_cast<int32_t>(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

// A core view of a class-id tensor (int32 or int64: cross-entropy's target).
inline fuselet_tensor index_view(const at::Tensor& t, const char* name) {
  fuselet_tensor v{};
  switch (t.scalar_type()) {
    case at::kInt: v.dtype = FUSELET_INT32; break;
    case at::kLong: v.dtype = FUSELET_INT64; break;
    default: TORCH_CHECK_TYPE(false, name, ": expected dtype int32 or int64 (class ids), got ", t.scalar_type());
  }
  TORCH_CHECK_VALUE(t.dim() <= FUSELET_MAX_DIMS, name, ": expected at most ", FUSELET_MAX_DIMS, " dimensions, got ",
                    t.dim());
  v.data = t.data_ptr();
  v.ndim = static_cast<int32_t>(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

// Turns a failed core call into the matching Python exception with the core's message.
inline void check(fuselet_status status) {
  if (status == FUSELET_OK) return;
  const char* msg = fuselet_last_error();
  TORCH_CHECK_VALUE(status != FUSELET_ERR_INVALID_ARGUMENT, "fuselet: ", msg);
  TORCH_CHECK_NOT_IMPLEMENTED(status != FUSELET_ERR_UNSUPPORTED, "fuselet: ", msg);
  TORCH_CHECK(false, "fuselet (", fuselet_status_string(status), "): ", msg);
}

// A required tensor argument: None reaches the op as an undefined tensor.
inline void check_defined(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.defined(), name, ": expected a tensor, got None");
}

// Every tensor on the device of the reference argument `ref` (named `ref_name`).
inline void check_same_device(const at::Tensor& ref, const at::Tensor& t, const char* name,
                              const char* ref_name = "x") {
  check_defined(t, name);
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, ": expected a tensor on ", ref.device(), " (the device of ",
                    ref_name, "), got ", t.device());
}

}  // namespace fuselet_torch
