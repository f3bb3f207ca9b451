// CPU and CUDA implementations of fuselet::cross_entropy_{fwd,bwd,bwd_,fwd_bwd,fwd_bwd_} and
// fuselet::logprobs_{fwd,bwd_}: the
// core's checks of the inputs as given (before any copy), then allocate outputs and hand core
// views of contiguous inputs to libfuselet (on the current CUDA stream for CUDA tensors). The
// trailing-underscore ops write dlogits into the logits' own memory.
#include "fuselet/cross_entropy.h"
#include "op.h"

namespace fuselet_torch {
namespace {

fuselet_cross_entropy_options options(int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  return {ignore_index, static_cast<float>(label_smoothing), static_cast<float>(z_loss), static_cast<float>(softcap)};
}

std::tuple<Tensor, Tensor, Tensor> cross_entropy_fwd(const Tensor& logits_in, const Tensor& target_in,
                                                     int64_t ignore_index, double label_smoothing, double z_loss,
                                                     double softcap) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  check_devices(logits_in, "logits", {{"target", &target_in}});
  Arg logits(logits_in, "logits"), target(target_in, "target", index_view);
  check_args(fuselet_cross_entropy_fwd_check(&logits.v, &target.v, &o));
  logits.contiguous();
  target.contiguous();
  Tensor loss = row_stats(logits.t), z = row_stats(logits.t), lse = row_stats(logits.t);
  fuselet_tensor vl = view(loss, "loss"), vz = view(z, "z"), vlse = view(lse, "lse");
  run_on(
      logits.t, [&] { return fuselet_cross_entropy_fwd(&logits.v, &target.v, &o, &vl, &vz, &vlse); },
      [&](void* stream) { return fuselet_cross_entropy_fwd_cuda(&logits.v, &target.v, &o, &vl, &vz, &vlse, stream); });
  return {loss, z, lse};
}

// The arguments of a backward (their devices checked), checked by the core before any copy; then
// made contiguous but for logits, which the caller makes contiguous or not (in place).
struct Backward {
  Arg dloss, logits, target, lse;
  Backward(const Tensor& dloss_in, const Tensor& logits_in, const Tensor& target_in, const Tensor& lse_in,
           const fuselet_cross_entropy_options& o)
      : dloss(dloss_in, "dloss"),
        logits(logits_in, "logits"),
        target(target_in, "target", index_view),
        lse(lse_in, "lse") {
    check_args(fuselet_cross_entropy_bwd_check(&dloss.v, &logits.v, &target.v, &lse.v, &o));
    dloss.contiguous();
    target.contiguous();
    lse.contiguous();
  }
  // The backward into `dlogits` (contiguous, logits' shape and dtype; may be logits itself), of a
  // contiguous logits.
  void into(const fuselet_cross_entropy_options& o, const Tensor& dlogits) {
    fuselet_tensor vdx = view(dlogits, "dlogits");
    run_on(
        logits.t, [&] { return fuselet_cross_entropy_bwd(&dloss.v, &logits.v, &target.v, &lse.v, &o, &vdx); },
        [&](void* stream) {
          return fuselet_cross_entropy_bwd_cuda(&dloss.v, &logits.v, &target.v, &lse.v, &o, &vdx, stream);
        });
  }
};

Tensor cross_entropy_bwd(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                         int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  check_devices(logits, "logits", {{"dloss", &dloss}, {"target", &target}, {"lse", &lse}});
  Backward b(dloss, logits, target, lse, o);
  b.logits.contiguous();
  Tensor dlogits = alloc_like(b.logits.t);
  b.into(o, dlogits);
  return dlogits;
}

void cross_entropy_bwd_(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                        int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  check_devices(logits, "logits", {{"dloss", &dloss}, {"target", &target}, {"lse", &lse}});
  Backward b(dloss, logits, target, lse, o);
  if (logits.is_contiguous()) {
    b.logits.contiguous();  // the same tensor: its view for the kernel
    b.into(o, logits);
    return;
  }
  // Rows the core cannot view in place: through a contiguous copy.
  b.logits.contiguous();
  Tensor out = alloc_like(b.logits.t);
  b.into(o, out);
  copy_into(logits, out);
}

// Forward and backward in one pass into `dlogits` (may be logits itself) of a contiguous logits.
std::tuple<Tensor, Tensor> fwd_bwd_into(Arg& logits, Arg& target, const fuselet_cross_entropy_options& o,
                                        float grad_scale, const Tensor& dlogits) {
  fuselet_tensor vdx = view(dlogits, "dlogits");
  Tensor loss = row_stats(logits.t), z = row_stats(logits.t);
  fuselet_tensor vl = view(loss, "loss"), vz = view(z, "z");
  run_on(
      logits.t, [&] { return fuselet_cross_entropy_fwd_bwd(&logits.v, &target.v, &o, grad_scale, &vl, &vz, &vdx); },
      [&](void* stream) {
        return fuselet_cross_entropy_fwd_bwd_cuda(&logits.v, &target.v, &o, grad_scale, &vl, &vz, &vdx, stream);
      });
  return {loss, z};
}

std::tuple<Tensor, Tensor, Tensor> cross_entropy_fwd_bwd(const Tensor& logits_in, const Tensor& target_in,
                                                         int64_t ignore_index, double label_smoothing, double z_loss,
                                                         double softcap, double grad_scale) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  const float g = static_cast<float>(grad_scale);
  check_devices(logits_in, "logits", {{"target", &target_in}});
  Arg logits(logits_in, "logits"), target(target_in, "target", index_view);
  check_args(fuselet_cross_entropy_fwd_bwd_check(&logits.v, &target.v, &o, g));
  logits.contiguous();
  target.contiguous();
  Tensor dlogits = alloc_like(logits.t);
  auto [loss, z] = fwd_bwd_into(logits, target, o, g, dlogits);
  return {loss, z, dlogits};
}

std::tuple<Tensor, Tensor> cross_entropy_fwd_bwd_(const Tensor& logits_in, const Tensor& target_in,
                                                  int64_t ignore_index, double label_smoothing, double z_loss,
                                                  double softcap, double grad_scale) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  const float g = static_cast<float>(grad_scale);
  check_devices(logits_in, "logits", {{"target", &target_in}});
  Arg logits(logits_in, "logits"), target(target_in, "target", index_view);
  check_args(fuselet_cross_entropy_fwd_bwd_check(&logits.v, &target.v, &o, g));
  target.contiguous();
  logits.contiguous();
  if (logits_in.is_contiguous()) return fwd_bwd_into(logits, target, o, g, logits_in);
  Tensor out = alloc_like(logits.t);
  auto result = fwd_bwd_into(logits, target, o, g, out);
  copy_into(logits_in, out);
  return result;
}

// --- the log-probabilities (fuselet_logprobs_*) --------------------------------------------

// Every given tensor of `others` on the device of logits.
void check_logprobs_devices(const Tensor& logits,
                            std::initializer_list<std::pair<const char*, const OptTensor*>> others) {
  check_defined(logits, "logits");
  for (const auto& [name, t] : others)
    if (t->has_value()) check_same_device(logits, **t, name, "logits");
}

fuselet_cross_entropy_options logprobs_options(int64_t ignore_index, double softcap) {
  return options(ignore_index, 0.0, 0.0, softcap);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> logprobs_fwd(const Tensor& logits_in,
                                                                        const Tensor& target_in, int64_t ignore_index,
                                                                        double softcap, bool with_entropy,
                                                                        bool with_stats) {
  const fuselet_cross_entropy_options o = logprobs_options(ignore_index, softcap);
  check_devices(logits_in, "logits", {{"target", &target_in}});
  Arg logits(logits_in, "logits"), target(target_in, "target", index_view);
  check_args(fuselet_logprobs_fwd_check(&logits.v, &target.v, &o));
  logits.contiguous();
  target.contiguous();
  auto per_token = [&](bool asked) { return asked ? row_stats(logits.t) : alloc(logits.t, {0}, ScalarType::Float); };
  Tensor out[6] = {per_token(true),       per_token(true),       per_token(with_entropy),
                   per_token(with_stats), per_token(with_stats), per_token(with_stats)};
  const char* names[6] = {"log_probs", "lse", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1"};
  fuselet_tensor v[6];
  fuselet_tensor* p[6];
  for (int k = 0; k < 6; ++k) {
    const bool asked = k < 2 || (k == 2 ? with_entropy : with_stats);
    if (asked) v[k] = view(out[k], names[k]);
    p[k] = asked ? &v[k] : nullptr;
  }
  run_on(
      logits.t, [&] { return fuselet_logprobs_fwd(&logits.v, &target.v, &o, p[0], p[1], p[2], p[3], p[4], p[5]); },
      [&](void* stream) {
        return fuselet_logprobs_fwd_cuda(&logits.v, &target.v, &o, p[0], p[1], p[2], p[3], p[4], p[5], stream);
      });
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}

void logprobs_bwd_(const Tensor& logits_in, const Tensor& target_in, const Tensor& lse_in, const OptTensor& entropy_in,
                   const OptTensor& dlogp_in, const OptTensor& dentropy_in, int64_t ignore_index, double softcap) {
  const fuselet_cross_entropy_options o = logprobs_options(ignore_index, softcap);
  const OptTensor target_opt(target_in), lse_opt(lse_in);
  check_logprobs_devices(logits_in, {{"target", &target_opt},
                                     {"lse", &lse_opt},
                                     {"entropy", &entropy_in},
                                     {"dlogp", &dlogp_in},
                                     {"dentropy", &dentropy_in}});
  Arg logits(logits_in, "logits"), target(target_in, "target", index_view), lse(lse_in, "lse");
  Param entropy(entropy_in, "entropy"), dlogp(dlogp_in, "dlogp"), dentropy(dentropy_in, "dentropy");
  check_args(fuselet_logprobs_bwd_check(dlogp.ptr(), dentropy.ptr(), &logits.v, &target.v, &lse.v, entropy.ptr(), &o));
  target.contiguous();
  lse.contiguous();
  entropy.contiguous();
  dlogp.contiguous();
  dentropy.contiguous();
  logits.contiguous();
  // In place where the core can view the rows; else through a contiguous copy.
  const bool in_place = logits_in.is_contiguous();
  Tensor out = in_place ? logits_in : alloc_like(logits.t);
  fuselet_tensor vdx = view(out, "dlogits");
  run_on(
      logits.t,
      [&] {
        return fuselet_logprobs_bwd(dlogp.ptr(), dentropy.ptr(), &logits.v, &target.v, &lse.v, entropy.ptr(), &o,
                                    &vdx);
      },
      [&](void* stream) {
        return fuselet_logprobs_bwd_cuda(dlogp.ptr(), dentropy.ptr(), &logits.v, &target.v, &lse.v, entropy.ptr(), &o,
                                         &vdx, stream);
      });
  if (!in_place) copy_into(logits_in, out);
}

void impls(Library& m) {
  FUSELET_IMPL(m, "logprobs_fwd", logprobs_fwd);
  FUSELET_IMPL(m, "logprobs_bwd_", logprobs_bwd_);
  FUSELET_IMPL(m, "cross_entropy_fwd", cross_entropy_fwd);
  FUSELET_IMPL(m, "cross_entropy_bwd", cross_entropy_bwd);
  FUSELET_IMPL(m, "cross_entropy_bwd_", cross_entropy_bwd_);
  FUSELET_IMPL(m, "cross_entropy_fwd_bwd", cross_entropy_fwd_bwd);
  FUSELET_IMPL(m, "cross_entropy_fwd_bwd_", cross_entropy_fwd_bwd_);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
