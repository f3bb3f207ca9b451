// CPU and CUDA implementations of fuselet::rope_{fwd,bwd}: allocate outputs, hand core views
// to libfuselet (on the current CUDA stream for CUDA tensors). x and dy are read in place
// through their strides (a transposed q / k view needs no copy) unless their last dim is strided.
#include "fuselet/rope.h"
#include "op.h"

namespace fuselet_torch {
namespace {

uint32_t rope_flags(bool bhsd, bool interleaved) {
  return (bhsd ? FUSELET_ROPE_BHSD : 0u) | (interleaved ? FUSELET_ROPE_INTERLEAVED : 0u);
}

// The core reads any strides with a unit last one.
Tensor unit_last_stride(const Tensor& t) {
  return t.dim() >= 1 && t.size(-1) > 1 && t.stride(-1) != 1 ? make_contiguous(t) : t;
}

// The core's checks of x (dy in the backward: `name`), cos and sin, before any copy.
void check_rope(const Tensor& x, const char* name, const Tensor& cos, const Tensor& sin, bool bhsd) {
  check_defined(x, name);
  check_same_device(x, cos, "cos", name);
  check_same_device(x, sin, "sin", name);
  FUSELET_CHECK_TYPE(is_float(x), name, ": expected dtype float32, float16 or bfloat16, got ",
                     dtype_name(x.scalar_type()));
  FUSELET_CHECK_VALUE(x.dim() == 3 || x.dim() == 4, name, ": expected shape ", bhsd ? "[B, N, S, D]" : "[B, S, N, D]",
                      " or ", bhsd ? "[N, S, D]" : "[S, N, D]", ", got ", shape_str(x));
  const int64_t o = x.dim() - 3, ds = o + (bhsd ? 1 : 0), D = x.size(-1);
  FUSELET_CHECK_VALUE(D > 0, name, ": the head dim D (last dimension) must be > 0, got shape ", shape_str(x));
  for (const auto& [n, t] : {std::pair<const char*, const Tensor*>{"cos", &cos}, {"sin", &sin}})
    FUSELET_CHECK_TYPE(is_float(*t), n, ": expected dtype float32, float16 or bfloat16, got ",
                       dtype_name(t->scalar_type()));
  FUSELET_CHECK_TYPE(cos.scalar_type() == ScalarType::Float || cos.scalar_type() == x.scalar_type(),
                     "cos: expected dtype float32 or ", dtype_name(x.scalar_type()), " (the dtype of ", name,
                     "), got ", dtype_name(cos.scalar_type()));
  FUSELET_CHECK_TYPE(sin.scalar_type() == cos.scalar_type(), "sin: expected dtype ", dtype_name(cos.scalar_type()),
                     " (the dtype of cos), got ", dtype_name(sin.scalar_type()));
  FUSELET_CHECK_VALUE(cos.dim() == 2 || (cos.dim() == 3 && o == 1), "cos: expected shape ",
                      o ? "[S, R] or [B, S, R]" : "[S, R] (x has no batch dim)", ", got ", shape_str(cos));
  const int64_t R = cos.size(-1);
  FUSELET_CHECK_VALUE(R >= 2 && R <= D && R % 2 == 0,
                      "cos: the rotary dim R (last dimension) must be even and in [2, D = ", D, "], got shape ",
                      shape_str(cos));
  FUSELET_CHECK_VALUE(cos.size(-2) == x.size(ds), "cos: expected ", x.size(ds), " positions (S, dimension ", ds,
                      " of ", name, "), got shape ", shape_str(cos));
  FUSELET_CHECK_VALUE(cos.dim() == 2 || cos.size(0) == x.size(0), "cos: expected a batch of ", x.size(0),
                      " (B, dimension 0 of ", name, "), got shape ", shape_str(cos));
  FUSELET_CHECK_VALUE(shape_of(sin) == shape_of(cos), "sin: expected shape ", shape_str(cos),
                      " (the shape of cos), got ", shape_str(sin));
}

// The core view of cos / sin (on x's device, made contiguous: they are small).
struct Table {
  Tensor t;
  fuselet_tensor v{};
  Table(const Tensor& in, const char* name) {
    t = make_contiguous(in);
    v = view(t, name);
  }
};

Tensor rope_fwd(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in, bool bhsd, bool interleaved) {
  check_rope(x_in, "x", cos_in, sin_in, bhsd);
  const Tensor x = unit_last_stride(x_in);
  Table cos(cos_in, "cos"), sin(sin_in, "sin");
  fuselet_tensor vx = view(x, "x");
  Tensor y = alloc(x, shape_of(x), x.scalar_type());
  fuselet_tensor vy = view(y, "y");
  const uint32_t f = rope_flags(bhsd, interleaved);
  run_on(
      x, [&] { return fuselet_rope_fwd(&vx, &cos.v, &sin.v, f, &vy); },
      [&](void* stream) { return fuselet_rope_fwd_cuda(&vx, &cos.v, &sin.v, f, &vy, stream); });
  return y;
}

Tensor rope_bwd(const Tensor& dy_in, const Tensor& cos_in, const Tensor& sin_in, bool bhsd, bool interleaved) {
  check_rope(dy_in, "dy", cos_in, sin_in, bhsd);
  const Tensor dy = unit_last_stride(dy_in);
  Table cos(cos_in, "cos"), sin(sin_in, "sin");
  fuselet_tensor vdy = view(dy, "dy");
  Tensor dx = alloc(dy, shape_of(dy), dy.scalar_type());
  fuselet_tensor vdx = view(dx, "dx");
  const uint32_t f = rope_flags(bhsd, interleaved);
  run_on(
      dy, [&] { return fuselet_rope_bwd(&vdy, &cos.v, &sin.v, f, &vdx); },
      [&](void* stream) { return fuselet_rope_bwd_cuda(&vdy, &cos.v, &sin.v, f, &vdx, stream); });
  return dx;
}

void impls(Library& m) {
  FUSELET_IMPL(m, "rope_fwd", rope_fwd);
  FUSELET_IMPL(m, "rope_bwd", rope_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
