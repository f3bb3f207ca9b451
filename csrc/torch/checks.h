// Checks of the ops' arguments that need no data, run before any argument is made contiguous:
// a call that the core would refuse is refused before a copy of its tensors (a stride-0 or
// strided view of billions of elements would otherwise be copied first). The rules and words
// are the core's (csrc/core/src/*check*), with a dtype mismatch a TypeError; the fake impls of
// python/fuselet/torch/*.py check the same for meta tensors and torch.compile.
#pragma once

#include <cmath>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "view.h"

namespace fuselet_torch {

inline std::string shape_str(const Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  s << "]";
  return s.str();
}

inline bool is_float(const Tensor& t) {
  const auto d = t.scalar_type();
  return d == ScalarType::Float || d == ScalarType::Half || d == ScalarType::BFloat16;
}

// A tensor read as rows [..., last]: defined, float32 / float16 / bfloat16, 1..MAX_DIMS dims.
struct Rows {
  int64_t rows = 0, cols = 0;
  bool operator==(const Rows& o) const { return rows == o.rows && cols == o.cols; }
};

inline Rows rows_of(const Tensor& t, const char* name, const char* last = "H") {
  check_defined(t, name);
  FUSELET_CHECK_TYPE(is_float(t), name, ": expected dtype float32, float16 or bfloat16, got ",
                     dtype_name(t.scalar_type()));
  FUSELET_CHECK_VALUE(t.dim() <= FUSELET_MAX_DIMS, name, ": expected at most ", FUSELET_MAX_DIMS, " dimensions, got ",
                      t.dim());
  FUSELET_CHECK_VALUE(t.dim() >= 1, name, ": expected a tensor of shape [..., ", last, "], got a 0-d tensor");
  Rows r{1, t.size(-1)};
  for (int64_t d = 0; d + 1 < t.dim(); ++d) r.rows *= t.size(d);
  return r;
}

// `t` in the dtype of `ref` (named `ref_name`), read as `want` rows (any leading shape).
inline void rows_like(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name, Rows want,
                      const char* suffix = "") {
  check_defined(t, name);
  FUSELET_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), name, ": expected dtype ", dtype_name(ref.scalar_type()),
                     " (the dtype of ", ref_name, "), got ", dtype_name(t.scalar_type()));
  const Rows got = rows_of(t, name);
  FUSELET_CHECK_VALUE(got == want, name, ": expected ", want.rows, " rows of ", want.cols, " elements", suffix,
                      ", got ", got.rows, " rows of ", got.cols);
}

// `n` elements of `dtype` (per-row statistics, per-token losses), any shape.
inline void vector_of(const Tensor& t, const char* name, int64_t n, ScalarType dtype = ScalarType::Float) {
  check_defined(t, name);
  FUSELET_CHECK_TYPE(t.scalar_type() == dtype, name, ": expected dtype ", dtype_name(dtype), ", got ",
                     dtype_name(t.scalar_type()));
  FUSELET_CHECK_VALUE(t.numel() == n, name, ": expected ", n, " elements, got shape ", shape_str(t));
}

// `ref` (named `ref_name`) given, and every tensor of `others` (name, tensor) on its device.
inline void check_devices(const Tensor& ref, const char* ref_name,
                          std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  check_defined(ref, ref_name);
  for (const auto& [name, t] : others) check_same_device(ref, *t, name, ref_name);
}

// Raises the refusal of a core `_check` function with the core's message: a TypeError for a
// dtype ("<argument>: expected dtype ...", fuselet.h), a ValueError for any other argument.
inline void check_args(fuselet_status status) {
  if (status != FUSELET_ERR_INVALID_ARGUMENT) return check(status);
  const std::string msg = fuselet_last_error();
  FUSELET_CHECK_TYPE(msg.find(": expected dtype ") == std::string::npos, msg);
  fail(Error::Value, msg);
}

}  // namespace fuselet_torch
