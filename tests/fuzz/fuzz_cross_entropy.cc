// cross-entropy's entry points under the fuzzer (fuselet/cross_entropy.h: forward, backward and the
// fused forward + backward, the log-probabilities' forward and backward, CPU and `_cuda`); fuzz_c_abi.cc picks them, fuzz.h builds their views.
#include "fuselet/cross_entropy.h"
#include "fuzz.h"

namespace fuselet_fuzz {

void op_cross_entropy(Ctx& c, int which, bool cuda) {  // 0: fwd, 1: bwd, 2: fwd_bwd
  const int32_t dtype = pick_dtype(c.in);
  const uint8_t tb = c.in.u8();
  const int32_t tdtype = tb < 0xF0 ? (tb & 1 ? FUSELET_INT64 : FUSELET_INT32) : pick_dtype(c.in);
  fuselet_cross_entropy_options opts;
  const uint8_t ib = c.in.u8();
  static const int64_t kIgnore[] = {-100, -1, 0, 1, kI64Min, kI64Max, 2, 3};
  opts.ignore_index = ib < 0xF0 ? kIgnore[ib % 8] : static_cast<int64_t>(c.in.u64());
  opts.label_smoothing = pick_float(c.in, 0.f);
  opts.z_loss = pick_float(c.in, 0.f);
  opts.softcap = pick_float(c.in, 0.f);
  const fuselet_cross_entropy_options* popts = c.in.u8() == 0xFF ? nullptr : &opts;
  const float grad_scale = pick_float(c.in, 1.f);
  Shape logits = c.shape();
  const int64_t V = logits.ndim >= 1 && logits.ndim <= FUSELET_MAX_DIMS ? logits.d[logits.ndim - 1] : 1;
  const Shape n = shape_of({leading(logits)});
  fuselet_tensor* tlogits = c.tensor(logits, dtype);
  fuselet_tensor* target = c.tensor(n, tdtype, V);
  void* stream = c.arena.alloc(0);
  if (which == 0) {
    fuselet_tensor* loss = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* z = c.optional(false, n, FUSELET_FLOAT32);
    fuselet_tensor* lse = c.tensor(n, FUSELET_FLOAT32);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_cross_entropy_fwd_cuda(tlogits, target, popts, loss, z, lse, stream));
    check_then(fuselet_cross_entropy_fwd_check(c.no_data(tlogits), c.no_data(target), popts),
               [&] { return fuselet_cross_entropy_fwd(tlogits, target, popts, loss, z, lse); });
    return;
  }
  const bool in_place = c.in.u8() & 1;
  if (which == 1) {
    fuselet_tensor* dloss = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* lse = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* dlogits = in_place ? tlogits : c.tensor(logits, dtype);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_cross_entropy_bwd_cuda(dloss, tlogits, target, lse, popts, dlogits, stream));
    check_then(fuselet_cross_entropy_bwd_check(c.no_data(dloss), c.no_data(tlogits), c.no_data(target), c.no_data(lse),
                                               popts),
               [&] { return fuselet_cross_entropy_bwd(dloss, tlogits, target, lse, popts, dlogits); });
    return;
  }
  fuselet_tensor* loss = c.tensor(n, FUSELET_FLOAT32);
  fuselet_tensor* z = c.optional(false, n, FUSELET_FLOAT32);
  fuselet_tensor* dlogits = in_place ? tlogits : c.tensor(logits, dtype);
  if (c.too_large) return;
  if (cuda)
    return check_cuda(
        fuselet_cross_entropy_fwd_bwd_cuda(tlogits, target, popts, grad_scale, loss, z, dlogits, stream));
  check_then(fuselet_cross_entropy_fwd_bwd_check(c.no_data(tlogits), c.no_data(target), popts, grad_scale),
             [&] { return fuselet_cross_entropy_fwd_bwd(tlogits, target, popts, grad_scale, loss, z, dlogits); });
}

// The log-probabilities (fuselet_logprobs_*): the options read as op_cross_entropy's (label
// smoothing and z-loss mostly 0, which they need), each optional tensor present or NULL.
void op_logprobs(Ctx& c, bool bwd, bool cuda) {
  const int32_t dtype = pick_dtype(c.in);
  const uint8_t tb = c.in.u8();
  const int32_t tdtype = tb < 0xF0 ? (tb & 1 ? FUSELET_INT64 : FUSELET_INT32) : pick_dtype(c.in);
  fuselet_cross_entropy_options opts;
  const uint8_t ib = c.in.u8();
  static const int64_t kIgnore[] = {-100, -1, 0, 1, kI64Min, kI64Max, 2, 3};
  opts.ignore_index = ib < 0xF0 ? kIgnore[ib % 8] : static_cast<int64_t>(c.in.u64());
  opts.label_smoothing = pick_float(c.in, 0.f);
  opts.z_loss = pick_float(c.in, 0.f);
  opts.softcap = pick_float(c.in, 0.f);
  const fuselet_cross_entropy_options* popts = c.in.u8() == 0xFF ? nullptr : &opts;
  Shape logits = c.shape();
  const int64_t V = logits.ndim >= 1 && logits.ndim <= FUSELET_MAX_DIMS ? logits.d[logits.ndim - 1] : 1;
  const Shape n = shape_of({leading(logits)});
  fuselet_tensor* tlogits = c.tensor(logits, dtype);
  fuselet_tensor* target = c.tensor(n, tdtype, V);
  void* stream = c.arena.alloc(0);
  if (!bwd) {
    fuselet_tensor* logp = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* lse = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* entropy = c.optional(false, n, FUSELET_FLOAT32);
    fuselet_tensor* lssp = c.optional(false, n, FUSELET_FLOAT32);
    fuselet_tensor* mean = c.optional(false, n, FUSELET_FLOAT32);
    fuselet_tensor* top1 = c.optional(false, n, FUSELET_FLOAT32);
    if (c.too_large) return;
    if (cuda)
      return check_cuda(
          fuselet_logprobs_fwd_cuda(tlogits, target, popts, logp, lse, entropy, lssp, mean, top1, stream));
    check_then(fuselet_logprobs_fwd_check(c.no_data(tlogits), c.no_data(target), popts),
               [&] { return fuselet_logprobs_fwd(tlogits, target, popts, logp, lse, entropy, lssp, mean, top1); });
    return;
  }
  const bool in_place = c.in.u8() & 1;
  fuselet_tensor* dlogp = c.optional(false, n, FUSELET_FLOAT32);
  fuselet_tensor* dentropy = c.optional(false, n, FUSELET_FLOAT32);
  fuselet_tensor* lse = c.tensor(n, FUSELET_FLOAT32);
  fuselet_tensor* entropy = c.optional(false, n, FUSELET_FLOAT32);
  fuselet_tensor* dlogits = in_place ? tlogits : c.tensor(logits, dtype);
  if (c.too_large) return;
  if (cuda)
    return check_cuda(
        fuselet_logprobs_bwd_cuda(dlogp, dentropy, tlogits, target, lse, entropy, popts, dlogits, stream));
  check_then(fuselet_logprobs_bwd_check(c.no_data(dlogp), c.no_data(dentropy), c.no_data(tlogits), c.no_data(target),
                                        c.no_data(lse), c.no_data(entropy), popts),
             [&] { return fuselet_logprobs_bwd(dlogp, dentropy, tlogits, target, lse, entropy, popts, dlogits); });
}

}  // namespace fuselet_fuzz
