// CPU and CUDA implementations of fuselet::rope_{fwd,bwd}: the core's checks of the inputs as
// given (before any copy), then allocate outputs and hand core views to libfuselet (on the current
// CUDA stream for CUDA tensors). x and dy are read in place through their strides (a transposed
// q / k view needs no copy) unless their last dim is strided.
#include <cstdint>
#include <optional>
#include <vector>

#include "fuselet/rope.h"
#include "op.h"

namespace fuselet_torch {
namespace {

uint32_t rope_flags(bool bhsd, bool interleaved, bool pair_table, bool interleaved_sections) {
  return (bhsd ? FUSELET_ROPE_BHSD : 0u) | (interleaved ? FUSELET_ROPE_INTERLEAVED : 0u) |
         (pair_table ? FUSELET_ROPE_PAIR_TABLE : 0u) | (interleaved_sections ? FUSELET_ROPE_SECTIONS_INTERLEAVED : 0u);
}

// sections as the C ABI takes them: NULL and 0 for None or an empty list (torch's tracing may
// give an absent int[]? as []), else its K values (a count beyond INT32_MAX is refused as
// INT32_MAX). An optional list, not a list defaulting to []: AOTInductor's proxy executor
// passes an empty list default as None.
using Sections = std::optional<std::vector<int64_t>>;
const int64_t* sections_data(const Sections& sections) {
  return !sections || sections->empty() ? nullptr : sections->data();
}
int32_t sections_count(const Sections& sections) {
  if (!sections) return 0;
  return sections->size() > INT32_MAX ? INT32_MAX : static_cast<int32_t>(sections->size());
}

// The core reads any strides with a unit last one: only another last stride needs a copy.
bool unit_last_stride(const Tensor& t) { return t.dim() < 1 || t.size(-1) <= 1 || t.stride(-1) == 1; }

Tensor rope_fwd(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in, bool bhsd, bool interleaved,
                bool pair_table, Sections sections, bool interleaved_sections) {
  check_devices(x_in, "x", {{"cos", &cos_in}, {"sin", &sin_in}});
  Arg x(x_in, "x"), cos(cos_in, "cos"), sin(sin_in, "sin");
  const uint32_t f = rope_flags(bhsd, interleaved, pair_table, interleaved_sections);
  const int64_t* sec = sections_data(sections);
  const int32_t k = sections_count(sections);
  check_args(fuselet_rope_sections_fwd_check(&x.v, &cos.v, &sin.v, sec, k, f));
  if (!unit_last_stride(x.t)) x.contiguous();
  cos.contiguous();  // small: [S, R] or [B, S, R], with K tables [K, S, R] or [K, B, S, R]
  sin.contiguous();
  Tensor y = alloc(x.t, shape_of(x.t), x.t.scalar_type());
  fuselet_tensor vy = view(y, "y");
  run_on(
      x.t, [&] { return fuselet_rope_sections_fwd(&x.v, &cos.v, &sin.v, sec, k, f, &vy); },
      [&](void* stream) { return fuselet_rope_sections_fwd_cuda(&x.v, &cos.v, &sin.v, sec, k, f, &vy, stream); });
  return y;
}

Tensor rope_bwd(const Tensor& dy_in, const Tensor& cos_in, const Tensor& sin_in, bool bhsd, bool interleaved,
                bool pair_table, Sections sections, bool interleaved_sections) {
  check_devices(dy_in, "dy", {{"cos", &cos_in}, {"sin", &sin_in}});
  Arg dy(dy_in, "dy"), cos(cos_in, "cos"), sin(sin_in, "sin");
  const uint32_t f = rope_flags(bhsd, interleaved, pair_table, interleaved_sections);
  const int64_t* sec = sections_data(sections);
  const int32_t k = sections_count(sections);
  check_args(fuselet_rope_sections_bwd_check(&dy.v, &cos.v, &sin.v, sec, k, f));
  if (!unit_last_stride(dy.t)) dy.contiguous();
  cos.contiguous();
  sin.contiguous();
  Tensor dx = alloc(dy.t, shape_of(dy.t), dy.t.scalar_type());
  fuselet_tensor vdx = view(dx, "dx");
  run_on(
      dy.t, [&] { return fuselet_rope_sections_bwd(&dy.v, &cos.v, &sin.v, sec, k, f, &vdx); },
      [&](void* stream) { return fuselet_rope_sections_bwd_cuda(&dy.v, &cos.v, &sin.v, sec, k, f, &vdx, stream); });
  return dx;
}

void impls(Library& m) {
  FUSELET_IMPL(m, "rope_fwd", rope_fwd);
  FUSELET_IMPL(m, "rope_bwd", rope_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
