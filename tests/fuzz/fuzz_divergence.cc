// The divergences' entry points under the fuzzer (fuselet/divergence.h: kl_div, jsd, tvd, forward
// and backward, the one pass over logits, CPU and `_cuda`); fuzz_c_abi.cc picks them, fuzz.h builds their views.
#include "fuselet/divergence.h"
#include "fuzz.h"

namespace fuselet_fuzz {

// Divergences: kind (mostly a known one), log_target, beta from the bytes; input and target
// of the same shape (or target of its own, sometimes), dinput / dtarget each optional.
void op_divergence(Ctx& c, bool cuda) {
  const uint8_t mode = c.in.u8();
  const bool backward = mode & 1, logits = (mode & 6) == 6;  // logits: a quarter of the inputs
  const int32_t dtype = pick_dtype(c.in);
  fuselet_divergence_options opts;
  const uint8_t kb = c.in.u8();
  opts.kind = kb < 0xF0 ? kb % 3 : static_cast<int32_t>(c.in.u32());
  const uint8_t lb = c.in.u8();
  opts.log_target = lb < 0xF0 ? (lb & 1 ? 1 : (opts.kind == FUSELET_DIVERGENCE_KL ? 0 : 1)) : static_cast<int32_t>(lb);
  opts.beta =
      opts.kind == FUSELET_DIVERGENCE_JSD ? pick_float(c.in, 0.5f) : (c.in.u8() < 0xF0 ? 0.f : pick_float(c.in, 0.f));
  const fuselet_divergence_options* popts = c.in.u8() == 0xFF ? nullptr : &opts;
  const Shape x = c.shape();
  const Shape t = c.in.u8() < 0xF0 ? x : c.shape();
  const Shape n = shape_of({leading(x)});
  fuselet_tensor* tx = c.tensor(x, dtype);
  fuselet_tensor* tt = c.tensor(t, c.in.u8() < 0xF0 ? dtype : pick_dtype(c.in));
  void* stream = c.arena.alloc(0);
  if (logits) {  // scale from the bytes; input is written in place
    const float scale = pick_float(c.in, 1.f);
    fuselet_tensor* dloss = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* loss = c.tensor(n, FUSELET_FLOAT32);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_divergence_logits_cuda(tx, tt, dloss, popts, scale, loss, stream));
    check_then(fuselet_divergence_logits_check(c.no_data(tx), c.no_data(tt), c.no_data(dloss), popts, scale),
               [&] { return fuselet_divergence_logits(tx, tt, dloss, popts, scale, loss); });
    return;
  }
  if (!backward) {
    fuselet_tensor* loss = c.tensor(n, FUSELET_FLOAT32);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_divergence_fwd_cuda(tx, tt, popts, loss, stream));
    check_then(fuselet_divergence_fwd_check(c.no_data(tx), c.no_data(tt), popts),
               [&] { return fuselet_divergence_fwd(tx, tt, popts, loss); });
    return;
  }
  fuselet_tensor* dloss = c.tensor(n, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.optional(false, x, dtype);
  fuselet_tensor* dt = c.optional(false, t, dtype);
  if (c.too_large) return;
  if (cuda) return check_cuda(fuselet_divergence_bwd_cuda(dloss, tx, tt, popts, dx, dt, stream));
  check_then(fuselet_divergence_bwd_check(c.no_data(dloss), c.no_data(tx), c.no_data(tt), popts),
             [&] { return fuselet_divergence_bwd(dloss, tx, tt, popts, dx, dt); });
}

}  // namespace fuselet_fuzz
