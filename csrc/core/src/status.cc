// Error reporting, version and tensor-view validation of the fuselet core.
#include <cinttypes>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "internal.h"

#ifndef FUSELET_VERSION_STRING
#define FUSELET_VERSION_STRING "0.0.0"
#endif
#ifndef FUSELET_CUDA_ARCHS
#define FUSELET_CUDA_ARCHS ""
#endif

namespace fuselet {
namespace {
thread_local char g_last_error[1024] = "";
}

fuselet_status fail(fuselet_status status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(g_last_error, sizeof(g_last_error), fmt, args);
  va_end(args);
  return status;
}

fuselet_status ok() {
  g_last_error[0] = '\0';
  return FUSELET_OK;
}

fuselet_status no_cuda() {
  return fail(FUSELET_ERR_UNSUPPORTED, "this libfuselet was built without CUDA (FUSELET_CUDA=OFF)");
}

const char* dtype_name(fuselet_dtype dtype) {
  switch (dtype) {
    case FUSELET_FLOAT32: return "float32";
    case FUSELET_FLOAT16: return "float16";
    case FUSELET_BFLOAT16: return "bfloat16";
    case FUSELET_INT32: return "int32";
    case FUSELET_INT64: return "int64";
  }
  return "unknown";
}

bool is_float_dtype(int dtype) {
  return dtype == FUSELET_FLOAT32 || dtype == FUSELET_FLOAT16 || dtype == FUSELET_BFLOAT16;
}

const char* dtype_string(int code, char* buf, size_t len) {
  if (code >= FUSELET_FLOAT32 && code <= FUSELET_INT64) return dtype_name(static_cast<fuselet_dtype>(code));
  std::snprintf(buf, len, "code %d", code);
  return buf;
}

const char* float_string(double v, char* buf, size_t len) {
  const int n = std::snprintf(buf, len, "%g", v);
  // %g drops the point of a whole number (0, -1, 30): Python's float has it (0.0, -1.0, 30.0).
  if (n > 0 && static_cast<size_t>(n) + 2 < len && std::strspn(buf, "-0123456789") == static_cast<size_t>(n))
    std::memcpy(buf + n, ".0", 3);
  return buf;
}

const char* shape_string(const fuselet_tensor* t, char* buf, size_t len) {
  size_t n = static_cast<size_t>(std::snprintf(buf, len, "["));
  for (int32_t d = 0; d < t->ndim && d < FUSELET_MAX_DIMS && n < len; ++d) {
    n += static_cast<size_t>(std::snprintf(buf + n, len - n, d ? ", %" PRId64 : "%" PRId64, t->shape[d]));
  }
  if (n < len) std::snprintf(buf + n, len - n, "]");
  return buf;
}

static int64_t dtype_bytes(int dtype) {
  switch (dtype) {
    case FUSELET_FLOAT32: return 4;
    case FUSELET_FLOAT16: return 2;
    case FUSELET_BFLOAT16: return 2;
    case FUSELET_INT32: return 4;
    case FUSELET_INT64: return 8;
  }
  return 0;
}

fuselet_status check_extent(const fuselet_tensor* t, const char* name, int64_t* numel) {
  const int64_t elem = dtype_bytes(dtype_code(t));
  char buf[200];
  bool empty = false;
  for (int32_t d = 0; d < t->ndim; ++d) {
    if (t->shape[d] < 0)
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: dimension %d has negative size %" PRId64, name,
                  static_cast<int>(d), t->shape[d]);
    empty = empty || t->shape[d] == 0;
  }
  *numel = empty ? 0 : 1;
  for (int32_t d = 0; d < t->ndim && !empty; ++d)
    if (__builtin_mul_overflow(*numel, t->shape[d], numel))
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: the number of elements of shape %s overflows int64", name,
                  shape_string(t, buf, sizeof(buf)));
  if (empty) return FUSELET_OK;  // nothing is read or written: any strides will do
  int64_t last = 0;               // offset of the last element, in elements
  for (int32_t d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 1) continue;
    if (t->strides[d] < 0)
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "%s: negative strides are not supported (dimension %d has stride %" PRId64
                  "); make it contiguous first",
                  name, static_cast<int>(d), t->strides[d]);
    int64_t span;
    if (__builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &span) || __builtin_add_overflow(last, span, &last))
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "%s: element offsets overflow int64 (shape %s, dimension %d has stride %" PRId64 ")", name,
                  shape_string(t, buf, sizeof(buf)), static_cast<int>(d), t->strides[d]);
  }
  int64_t bytes;
  if (__builtin_add_overflow(last, 1, &bytes) || __builtin_mul_overflow(bytes, elem, &bytes) || bytes > PTRDIFF_MAX)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "%s: byte offsets overflow int64 (shape %s spans %" PRId64 " elements of %" PRId64 " bytes)", name,
                shape_string(t, buf, sizeof(buf)), last, elem);
  return FUSELET_OK;
}

fuselet_status check_ndim(const fuselet_tensor* t, const char* name) {
  if (t->ndim > FUSELET_MAX_DIMS)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected at most %d dimensions, got %d", name, FUSELET_MAX_DIMS,
                static_cast<int>(t->ndim));
  if (t->ndim < 0)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected 0..%d dimensions, got %d", name, FUSELET_MAX_DIMS,
                static_cast<int>(t->ndim));
  return FUSELET_OK;
}

fuselet_status check_header(const fuselet_tensor* t, const char* name, int64_t* numel) {
  if (t == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected a tensor, got NULL", name);
  if (fuselet_status s = check_ndim(t, name)) return s;
  if (!is_float_dtype(dtype_code(t))) {
    char buf[32];
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype float32, float16 or bfloat16, got %s", name,
                dtype_string(dtype_code(t), buf, sizeof buf));
  }
  return check_extent(t, name, numel);
}

fuselet_status as_rows(const fuselet_tensor* t, const char* name, Rows* out, Layout layout, const char* last_name) {
  int64_t numel = 0;
  if (fuselet_status s = check_header(t, name, &numel)) return s;
  if (t->ndim < 1)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "%s: expected shape [..., %s] with at least 1 dimension, got a 0-d array", name, last_name);
  const int32_t last = t->ndim - 1;
  const int64_t hidden = t->shape[last];
  int64_t rows = 1;
  for (int32_t d = 0; d < last; ++d)
    if (__builtin_mul_overflow(rows, t->shape[d], &rows)) {
      char buf[200];
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "%s: the number of rows (the product of the leading dimensions of shape %s) overflows int64", name,
                  shape_string(t, buf, sizeof(buf)));
    }
  out->data = t->data;
  out->rows = rows;
  out->hidden = hidden;
  out->row_stride = hidden;
  if (numel == 0 || layout == Layout::kAny) return FUSELET_OK;
  if (t->shape[last] > 1 && t->strides[last] != 1)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: the last dimension must have stride 1, got stride %" PRId64, name,
                t->strides[last]);
  // Collapse the leading dims: walking outwards, each stride must be the inner stride times
  // the inner size (size-1 dims are free). check_extent bounds every stride (>= 0) and span.
  bool found = false;
  int64_t row_stride = 0, expect = 0;
  for (int32_t d = last - 1; d >= 0; --d) {
    if (t->shape[d] == 1) continue;
    if (!found) {
      found = true;
      row_stride = t->strides[d];
    } else if (t->strides[d] != expect) {
      return fail(FUSELET_ERR_INVALID_ARGUMENT,
                  "%s: the leading dimensions must collapse into rows of one stride (dimension %d has stride "
                  "%" PRId64 ", expected %" PRId64 "); make it contiguous first",
                  name, static_cast<int>(d), t->strides[d], expect);
    }
    if (__builtin_mul_overflow(t->strides[d], t->shape[d], &expect)) expect = -1;  // matches no stride
  }
  if (found) {
    if (row_stride < hidden)
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: rows overlap (row stride %" PRId64 " < hidden size %" PRId64 ")",
                  name, row_stride, hidden);
    out->row_stride = row_stride;
  }
  if (t->data == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: data pointer is NULL", name);
  return FUSELET_OK;
}

fuselet_status rows_like_x(const fuselet_tensor* t, const char* name, fuselet_dtype dtype, int64_t rows, int64_t cols,
                           Rows* out, Layout layout) {
  if (fuselet_status s = as_rows(t, name, out, layout)) return s;
  if (t->dtype != dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (the dtype of x), got %s", name,
                dtype_name(dtype), dtype_name(t->dtype));
  if (out->rows != rows || out->hidden != cols)
    return fail(FUSELET_ERR_INVALID_ARGUMENT,
                "%s: expected %" PRId64 " rows of %" PRId64 " elements, got %" PRId64 " rows of %" PRId64, name, rows,
                cols, out->rows, out->hidden);
  return FUSELET_OK;
}

fuselet_status as_vector(const fuselet_tensor* t, const char* name, fuselet_dtype dtype, int64_t n, void** data,
                         Layout layout) {
  int64_t numel = 0;
  if (fuselet_status s = check_header(t, name, &numel)) return s;
  char buf[200];
  if (t->dtype != dtype)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected dtype %s, got %s", name, dtype_name(dtype),
                dtype_name(t->dtype));
  if (numel != n)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected %" PRId64 " elements, got shape %s", name, n,
                shape_string(t, buf, sizeof(buf)));
  *data = t->data;
  if (layout == Layout::kAny) return FUSELET_OK;
  int64_t expect = 1;
  for (int32_t d = t->ndim - 1; d >= 0 && n > 0; --d) {  // no elements: any strides will do
    if (t->shape[d] != 1 && t->strides[d] != expect)
      return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected a contiguous tensor", name);
    expect *= t->shape[d];  // a product of the sizes: within numel
  }
  if (n > 0 && t->data == nullptr) return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: data pointer is NULL", name);
  return FUSELET_OK;
}

}  // namespace fuselet

extern "C" {

const char* fuselet_last_error(void) { return fuselet::g_last_error; }

const char* fuselet_status_string(fuselet_status status) {
  // Read as the integer the caller stored: a value of no enumerator is legal C, but loading it
  // as the C++ enum is undefined behaviour (as for the dtype field, dtype_code()).
  std::underlying_type_t<fuselet_status> code;
  std::memcpy(&code, &status, sizeof code);
  switch (code) {
    case FUSELET_OK: return "ok";
    case FUSELET_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FUSELET_ERR_UNSUPPORTED: return "unsupported";
    case FUSELET_ERR_CUDA: return "CUDA error";
    case FUSELET_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* fuselet_version(void) { return FUSELET_VERSION_STRING; }

int fuselet_has_cuda(void) {
#ifdef FUSELET_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

const char* fuselet_cuda_archs(void) { return FUSELET_CUDA_ARCHS; }

}  // extern "C"
