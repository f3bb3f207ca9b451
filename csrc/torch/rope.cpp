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
  return t.dim() >= 1 && t.size(-1) > 1 && t.stride(-1) != 1 ? t.contiguous() : t;
}

// The core view of cos / sin (on x's device, made contiguous: they are small).
struct Table {
  Tensor t;
  fuselet_tensor v{};
  Table(const Tensor& x, const Tensor& in, const char* name) {
    check_same_device(x, in, name);
    t = in.contiguous();
    v = view(t, name);
  }
};

Tensor rope_fwd(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in, bool bhsd, bool interleaved) {
  const Tensor x = unit_last_stride(x_in);
  Table cos(x, cos_in, "cos"), sin(x, sin_in, "sin");
  fuselet_tensor vx = view(x, "x");
  Tensor y = at::empty(x.sizes(), x.options());
  fuselet_tensor vy = view(y, "y");
  const uint32_t f = rope_flags(bhsd, interleaved);
  run_on(
      x, [&] { return fuselet_rope_fwd(&vx, &cos.v, &sin.v, f, &vy); },
      [&](void* stream) { return fuselet_rope_fwd_cuda(&vx, &cos.v, &sin.v, f, &vy, stream); });
  return y;
}

Tensor rope_bwd(const Tensor& dy_in, const Tensor& cos_in, const Tensor& sin_in, bool bhsd, bool interleaved) {
  const Tensor dy = unit_last_stride(dy_in);
  Table cos(dy, cos_in, "cos"), sin(dy, sin_in, "sin");
  fuselet_tensor vdy = view(dy, "dy");
  Tensor dx = at::empty(dy.sizes(), dy.options());
  fuselet_tensor vdx = view(dx, "dx");
  const uint32_t f = rope_flags(bhsd, interleaved);
  run_on(
      dy, [&] { return fuselet_rope_bwd(&vdy, &cos.v, &sin.v, f, &vdx); },
      [&](void* stream) { return fuselet_rope_bwd_cuda(&vdy, &cos.v, &sin.v, f, &vdx, stream); });
  return dx;
}

void impls(torch::Library& m) {
  m.impl("rope_fwd", &rope_fwd);
  m.impl("rope_bwd", &rope_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
