// The gated linear units' entry points under the fuzzer (fuselet/glu.h: the plain and the _ex
// ones, forward and backward, CPU and `_cuda`); fuzz_c_abi.cc picks them, fuzz.h builds their views.
#include "fuselet/glu.h"
#include "fuzz.h"

namespace fuselet_fuzz {
namespace {

int32_t pick_activation(Ctx& c) {
  const uint8_t b = c.in.u8();
  if (b < 0xF0) return b % 3;
  static const int32_t kTable[] = {3, -1, INT32_MIN, INT32_MAX, 4, 255, 1 << 16, 2};
  return kTable[b % 8];
}

// The _ex entry points' options, read after the tensors (a byte `mode`: 0, and an input that
// ends there, keeps the plain entry points): bit 0 the _ex ones, bit 1 the clamped SwiGLU
// (else `act`), interleaved mostly 0 / 1, alpha and limit anywhere (NaN, inf, 0, negative).
bool pick_glu_options(Ctx& c, int32_t act, fuselet_glu_options* o) {
  const uint8_t mode = c.in.u8();
  if (!(mode & 1)) return false;
  o->activation = mode & 2 ? FUSELET_GLU_SILU_CLAMPED : act;
  const uint8_t b = c.in.u8();
  o->interleaved = b < 0xF0 ? b % 2 : static_cast<int32_t>(b) - 0xF8;
  o->alpha = pick_float(c.in, 1.702f);
  o->limit = pick_float(c.in, 7.f);
  return true;
}

}  // namespace

void op_glu(Ctx& c, bool backward, bool cuda) {
  const int32_t dtype = pick_dtype(c.in);
  const int32_t act = pick_activation(c);
  fuselet_glu_options o{};
  Shape y = c.shape();
  const int64_t f = y.ndim >= 1 && y.ndim <= FUSELET_MAX_DIMS ? y.d[y.ndim - 1] : 1;
  Shape x = with_last(y, static_cast<int64_t>(static_cast<uint64_t>(f) * 2));
  if (!backward) {
    fuselet_tensor* tx = c.tensor(x, dtype);
    fuselet_tensor* ty = c.tensor(y, dtype);
    if (c.too_large) return;
    const bool ex = pick_glu_options(c, act, &o);
    if (ex && cuda) return check_cuda(fuselet_glu_fwd_ex_cuda(tx, &o, ty, c.arena.alloc(0)));
    if (cuda) return check_cuda(fuselet_glu_fwd_cuda(tx, act, ty, c.arena.alloc(0)));
    const fuselet_tensor* vx = c.no_data(tx);
    check_then(ex ? fuselet_glu_fwd_ex_check(vx, &o) : fuselet_glu_fwd_check(vx, act),
               [&] { return ex ? fuselet_glu_fwd_ex(tx, &o, ty) : fuselet_glu_fwd(tx, act, ty); });
    return;
  }
  fuselet_tensor* tdy = c.tensor(y, dtype);
  fuselet_tensor* tx = c.tensor(x, dtype);
  fuselet_tensor* tdx = c.tensor(x, dtype);
  if (c.too_large) return;
  const bool ex = pick_glu_options(c, act, &o);
  if (ex && cuda) return check_cuda(fuselet_glu_bwd_ex_cuda(tdy, tx, &o, tdx, c.arena.alloc(0)));
  if (cuda) return check_cuda(fuselet_glu_bwd_cuda(tdy, tx, act, tdx, c.arena.alloc(0)));
  const fuselet_tensor *vdy = c.no_data(tdy), *vx = c.no_data(tx);
  check_then(ex ? fuselet_glu_bwd_ex_check(vdy, vx, &o) : fuselet_glu_bwd_check(vdy, vx, act),
             [&] { return ex ? fuselet_glu_bwd_ex(tdy, tx, &o, tdx) : fuselet_glu_bwd(tdy, tx, act, tdx); });
}

}  // namespace fuselet_fuzz
