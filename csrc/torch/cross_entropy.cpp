// CPU and CUDA implementations of fuselet::cross_entropy_{fwd,bwd,bwd_,fwd_bwd,fwd_bwd_}:
// allocate outputs, hand core views to libfuselet (on the current CUDA stream for CUDA
// tensors). The trailing-underscore ops write dlogits into the logits' own memory.
#include "fuselet/cross_entropy.h"
#include "op.h"

namespace fuselet_torch {
namespace {

fuselet_cross_entropy_options options(int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  return {ignore_index, static_cast<float>(label_smoothing), static_cast<float>(z_loss), static_cast<float>(softcap)};
}

void check_args(const Tensor& logits, std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  TORCH_CHECK_VALUE(logits.dim() >= 1, "logits: expected a tensor of shape [..., V], got a 0-d tensor");
  for (const auto& [name, t] : others)
    TORCH_CHECK_VALUE(t->device() == logits.device(), name, ": expected a tensor on ", logits.device(),
                      " (the device of logits), got ", t->device());
}

std::tuple<Tensor, Tensor, Tensor> cross_entropy_fwd(const Tensor& logits_in, const Tensor& target_in,
                                                     int64_t ignore_index, double label_smoothing, double z_loss,
                                                     double softcap) {
  check_args(logits_in, {{"target", &target_in}});
  const Tensor logits = logits_in.contiguous(), target = target_in.contiguous();
  fuselet_tensor vx = view(logits, "logits"), vt = index_view(target, "target");
  Tensor loss = row_stats(logits), z = row_stats(logits), lse = row_stats(logits);
  fuselet_tensor vl = view(loss, "loss"), vz = view(z, "z"), vlse = view(lse, "lse");
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  run_on(
      logits, [&] { return fuselet_cross_entropy_fwd(&vx, &vt, &o, &vl, &vz, &vlse); },
      [&](void* stream) { return fuselet_cross_entropy_fwd_cuda(&vx, &vt, &o, &vl, &vz, &vlse, stream); });
  return {loss, z, lse};
}

// The backward into `dlogits` (contiguous, logits' shape and dtype; may be `logits` itself).
void backward_into(const Tensor& dloss_in, const Tensor& logits, const Tensor& target_in, const Tensor& lse_in,
                   const fuselet_cross_entropy_options& o, Tensor& dlogits) {
  check_args(logits, {{"dloss", &dloss_in}, {"target", &target_in}, {"lse", &lse_in}});
  const Tensor dloss = dloss_in.contiguous(), target = target_in.contiguous(), lse = lse_in.contiguous();
  fuselet_tensor vg = view(dloss, "dloss"), vx = view(logits, "logits"), vt = index_view(target, "target"),
                 vlse = view(lse, "lse"), vdx = view(dlogits, "dlogits");
  run_on(
      logits, [&] { return fuselet_cross_entropy_bwd(&vg, &vx, &vt, &vlse, &o, &vdx); },
      [&](void* stream) { return fuselet_cross_entropy_bwd_cuda(&vg, &vx, &vt, &vlse, &o, &vdx, stream); });
}

Tensor cross_entropy_bwd(const Tensor& dloss, const Tensor& logits_in, const Tensor& target, const Tensor& lse,
                         int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  check_args(logits_in, {});
  const Tensor logits = logits_in.contiguous();
  Tensor dlogits = at::empty_like(logits);
  backward_into(dloss, logits, target, lse, options(ignore_index, label_smoothing, z_loss, softcap), dlogits);
  return dlogits;
}

void cross_entropy_bwd_(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                        int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  check_args(logits, {});
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  if (logits.is_contiguous()) {
    Tensor inplace = logits;
    backward_into(dloss, logits, target, lse, o, inplace);
    return;
  }
  // Rows the core cannot view in place: through a contiguous copy.
  const Tensor c = logits.contiguous();
  Tensor out = at::empty_like(c);
  backward_into(dloss, c, target, lse, o, out);
  logits.copy_(out);
}

// Forward and backward in one pass into `dlogits` (may be `logits` itself).
std::tuple<Tensor, Tensor> fwd_bwd_into(const Tensor& logits, const Tensor& target_in,
                                        const fuselet_cross_entropy_options& o, double grad_scale, Tensor& dlogits) {
  check_args(logits, {{"target", &target_in}});
  const Tensor target = target_in.contiguous();
  fuselet_tensor vx = view(logits, "logits"), vt = index_view(target, "target"), vdx = view(dlogits, "dlogits");
  Tensor loss = row_stats(logits), z = row_stats(logits);
  fuselet_tensor vl = view(loss, "loss"), vz = view(z, "z");
  const float g = static_cast<float>(grad_scale);
  run_on(
      logits, [&] { return fuselet_cross_entropy_fwd_bwd(&vx, &vt, &o, g, &vl, &vz, &vdx); },
      [&](void* stream) { return fuselet_cross_entropy_fwd_bwd_cuda(&vx, &vt, &o, g, &vl, &vz, &vdx, stream); });
  return {loss, z};
}

std::tuple<Tensor, Tensor, Tensor> cross_entropy_fwd_bwd(const Tensor& logits_in, const Tensor& target,
                                                         int64_t ignore_index, double label_smoothing, double z_loss,
                                                         double softcap, double grad_scale) {
  check_args(logits_in, {});
  const Tensor logits = logits_in.contiguous();
  Tensor dlogits = at::empty_like(logits);
  auto [loss, z] =
      fwd_bwd_into(logits, target, options(ignore_index, label_smoothing, z_loss, softcap), grad_scale, dlogits);
  return {loss, z, dlogits};
}

std::tuple<Tensor, Tensor> cross_entropy_fwd_bwd_(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                  double label_smoothing, double z_loss, double softcap,
                                                  double grad_scale) {
  check_args(logits, {});
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  if (logits.is_contiguous()) {
    Tensor inplace = logits;
    return fwd_bwd_into(logits, target, o, grad_scale, inplace);
  }
  const Tensor c = logits.contiguous();
  Tensor out = at::empty_like(c);
  auto result = fwd_bwd_into(c, target, o, grad_scale, out);
  logits.copy_(out);
  return result;
}

void impls(torch::Library& m) {
  m.impl("cross_entropy_fwd", &cross_entropy_fwd);
  m.impl("cross_entropy_bwd", &cross_entropy_bwd);
  m.impl("cross_entropy_bwd_", &cross_entropy_bwd_);
  m.impl("cross_entropy_fwd_bwd", &cross_entropy_fwd_bwd);
  m.impl("cross_entropy_fwd_bwd_", &cross_entropy_fwd_bwd_);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
