// softmax's entry points under the fuzzer (fuselet/softmax.h: forward and backward, CPU and
// `_cuda`); fuzz_c_abi.cc picks them, fuzz.h builds their views.
#include "fuselet/softmax.h"
#include "fuzz.h"

namespace fuselet_fuzz {

void op_softmax(Ctx& c, bool backward, bool cuda) {
  const int32_t dtype = pick_dtype(c.in);
  const float scale = pick_float(c.in, 1.f);
  const uint32_t flags = pick_flags(c.in) & (c.in.u8() < 0xF0 ? 1u : ~0u);
  Shape x = c.shape();
  if (!backward) {
    fuselet_tensor* tx = c.tensor(x, dtype);
    fuselet_tensor* ty = c.tensor(x, dtype);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_softmax_fwd_cuda(tx, scale, flags, ty, c.arena.alloc(0)));
    check_then(fuselet_softmax_fwd_check(c.no_data(tx), scale, flags),
               [&] { return fuselet_softmax_fwd(tx, scale, flags, ty); });
    return;
  }
  fuselet_tensor* tdy = c.tensor(x, dtype);
  fuselet_tensor* ty = c.tensor(x, dtype);
  fuselet_tensor* tdx = c.tensor(x, dtype);
  if (c.too_large) return;
  if (cuda) return check_cuda(fuselet_softmax_bwd_cuda(tdy, ty, scale, tdx, c.arena.alloc(0)));
  check_then(fuselet_softmax_bwd_check(c.no_data(tdy), c.no_data(ty), scale),
             [&] { return fuselet_softmax_bwd(tdy, ty, scale, tdx); });
}

}  // namespace fuselet_fuzz
