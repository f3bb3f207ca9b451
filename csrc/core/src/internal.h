// Internal helpers of the fuselet core shared by the CPU (.cc) and CUDA (.cu) sources.
// Not installed; nothing here is part of the C ABI.
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <type_traits>

#include "fuselet/fuselet.h"

// Functions of the checked problem structs that the CPU and the CUDA kernels both call.
#ifdef __CUDACC__
#define FUSELET_HOST_DEVICE __host__ __device__
#else
#define FUSELET_HOST_DEVICE
#endif

namespace fuselet {

// Records a printf-style message for fuselet_last_error() and returns `status`.
fuselet_status fail(fuselet_status status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// FUSELET_ERR_UNSUPPORTED: what the `_cuda` entry points of a build without CUDA return.
fuselet_status no_cuda();

// Clears the thread's last error and returns FUSELET_OK.
fuselet_status ok();

const char* dtype_name(fuselet_dtype dtype);
bool is_float_dtype(int dtype);
// A dtype field's code as messages say it: its name (float32, ..., int64), else "code N".
const char* dtype_string(int code, char* buf, size_t len);
// A float option as messages say it, as Python prints a float: 0.0, -1.0, 1.5, 1e-06, nan, inf.
const char* float_string(double v, char* buf, size_t len);

// Runs f() (which returns a fuselet_status) for the C entry point `entry`: a C++ exception
// that escapes it becomes FUSELET_ERR_INTERNAL, as none may cross the C ABI. Zero-cost
// exceptions: nothing runs unless one is thrown.
template <typename F>
fuselet_status guarded(const char* entry, F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(FUSELET_ERR_INTERNAL, "%s: out of memory", entry);
  } catch (const std::exception& e) {
    return fail(FUSELET_ERR_INTERNAL, "%s: unexpected C++ exception: %s", entry, e.what());
  } catch (...) {
    return fail(FUSELET_ERR_INTERNAL, "%s: unknown exception", entry);
  }
}

// The dtype field as the integer a C caller stored (ctypes, C, another compiler): loading an
// out-of-range value as the C++ enum type is undefined behaviour, so it is read as bytes.
inline int dtype_code(const fuselet_tensor* t) {
  std::underlying_type_t<fuselet_dtype> code;
  std::memcpy(&code, &t->dtype, sizeof code);
  return static_cast<int>(code);
}

// A tensor view read as `rows` rows of `hidden` contiguous elements `row_stride` apart.
struct Rows {
  void* data = nullptr;
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t row_stride = 0;
};

// Checks the memory `t` claims (named `name` in messages; its dtype a known code): sizes >= 0;
// the number of elements within int64 (set in *numel); and, when there are elements, strides
// >= 0 on every dimension of more than one element (the stride of a size-1 dimension is never
// used) and the offset of the last byte it spans, ((size - 1) x stride summed) + 1 elements of
// its dtype, within int64 and the address space. Views of no elements take any strides.
fuselet_status check_extent(const fuselet_tensor* t, const char* name, int64_t* numel);

// Checks t->ndim (`t` named `name` in messages): 0..FUSELET_MAX_DIMS.
fuselet_status check_ndim(const fuselet_tensor* t, const char* name);
// Checks `t` (named `name` in messages): non-null, 0..FUSELET_MAX_DIMS dims, a float dtype,
// check_extent (the number of elements in *numel).
fuselet_status check_header(const fuselet_tensor* t, const char* name, int64_t* numel);

// How much of a view's layout a check asks for. kKernel (the entry points): what the kernels
// read, too: as_rows' row layout, as_vector's contiguous elements, non-null data when there are
// elements. kAny (the fuselet_<op>_check functions, which a binding calls on views of its inputs
// before it makes them contiguous): check_extent's bounds only (any strides >= 0), data never
// read (it may be NULL).
enum class Layout { kKernel, kAny };

// Checks `t` (named `name` in messages): non-null, float dtype, check_extent, at least 1 dim
// (the shape's words [..., `last`]: [..., H]); with Layout::kKernel also a last dim of
// stride 1, leading dims collapsible into one row stride and non-null data when non-empty.
fuselet_status as_rows(const fuselet_tensor* t, const char* name, Rows* out, Layout layout = Layout::kKernel,
                       const char* last = "H");

// as_rows, plus: dtype `dtype` (named as x's in messages) and exactly `rows` rows of `cols`.
fuselet_status rows_like_x(const fuselet_tensor* t, const char* name, fuselet_dtype dtype, int64_t rows, int64_t cols,
                           Rows* out, Layout layout = Layout::kKernel);

// Checks that `t` holds exactly `numel` elements of `dtype` (and check_extent); with
// Layout::kKernel contiguous ones and non-null data when numel > 0.
fuselet_status as_vector(const fuselet_tensor* t, const char* name, fuselet_dtype dtype, int64_t numel, void** data,
                         Layout layout = Layout::kKernel);

// Shape of `t` as "[2, 3, 4]" for messages.
const char* shape_string(const fuselet_tensor* t, char* buf, size_t len);

}  // namespace fuselet
