// XLA FFI handlers of the rope family: fuselet_rope_{fwd,bwd} (flags: fuselet_rope_flags) and
// fuselet_rope_sections_{fwd,bwd} (flags and the K tables' sections).
// Symbols: fuselet_jax_<op>_{cpu,cuda}.
#include <cstdint>

#include "fuselet/rope.h"
#include "op.h"

namespace fuselet_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

Error RopeFwd(Where at, AnyBuffer x, AnyBuffer cos, AnyBuffer sin, int32_t flags, Result<AnyBuffer> y) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vc, cos, "cos");
  FUSELET_JAX_VIEW(vs, sin, "sin");
  FUSELET_JAX_VIEW(vy, *y, "y");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_rope_fwd(&vx, &vc, &vs, f, &vy); },
      [&](void* s) { return fuselet_rope_fwd_cuda(&vx, &vc, &vs, f, &vy, s); });
}

Error RopeBwd(Where at, AnyBuffer dy, AnyBuffer cos, AnyBuffer sin, int32_t flags, Result<AnyBuffer> dx) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vc, cos, "cos");
  FUSELET_JAX_VIEW(vs, sin, "sin");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  const uint32_t f = static_cast<uint32_t>(flags);
  return run_on(
      at, [&] { return fuselet_rope_bwd(&vdy, &vc, &vs, f, &vdx); },
      [&](void* s) { return fuselet_rope_bwd_cuda(&vdy, &vc, &vs, f, &vdx, s); });
}

Error RopeSectionsFwd(Where at, AnyBuffer x, AnyBuffer cos, AnyBuffer sin, int32_t flags,
                      ffi::Span<const int64_t> sections, Result<AnyBuffer> y) {
  FUSELET_JAX_VIEW(vx, x, "x");
  FUSELET_JAX_VIEW(vc, cos, "cos");
  FUSELET_JAX_VIEW(vs, sin, "sin");
  FUSELET_JAX_VIEW(vy, *y, "y");
  const uint32_t f = static_cast<uint32_t>(flags);
  const int32_t k = sections.size() > INT32_MAX ? INT32_MAX : static_cast<int32_t>(sections.size());
  return run_on(
      at, [&] { return fuselet_rope_sections_fwd(&vx, &vc, &vs, sections.begin(), k, f, &vy); },
      [&](void* s) { return fuselet_rope_sections_fwd_cuda(&vx, &vc, &vs, sections.begin(), k, f, &vy, s); });
}

Error RopeSectionsBwd(Where at, AnyBuffer dy, AnyBuffer cos, AnyBuffer sin, int32_t flags,
                      ffi::Span<const int64_t> sections, Result<AnyBuffer> dx) {
  FUSELET_JAX_VIEW(vdy, dy, "dy");
  FUSELET_JAX_VIEW(vc, cos, "cos");
  FUSELET_JAX_VIEW(vs, sin, "sin");
  FUSELET_JAX_VIEW(vdx, *dx, "dx");
  const uint32_t f = static_cast<uint32_t>(flags);
  const int32_t k = sections.size() > INT32_MAX ? INT32_MAX : static_cast<int32_t>(sections.size());
  return run_on(
      at, [&] { return fuselet_rope_sections_bwd(&vdy, &vc, &vs, sections.begin(), k, f, &vdx); },
      [&](void* s) { return fuselet_rope_sections_bwd_cuda(&vdy, &vc, &vs, sections.begin(), k, f, &vdx, s); });
}

}  // namespace
}  // namespace fuselet_jax

FUSELET_JAX_HANDLERS(rope_fwd, fuselet_jax::RopeFwd, "flags")
FUSELET_JAX_HANDLERS(rope_bwd, fuselet_jax::RopeBwd, "flags")
FUSELET_JAX_HANDLERS(rope_sections_fwd, fuselet_jax::RopeSectionsFwd, "flags", "sections")
FUSELET_JAX_HANDLERS(rope_sections_bwd, fuselet_jax::RopeSectionsBwd, "flags", "sections")
