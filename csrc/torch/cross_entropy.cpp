// CPU and CUDA implementations of fuselet::cross_entropy_{fwd,bwd,bwd_,fwd_bwd,fwd_bwd_}:
// allocate outputs, hand core views to libfuselet (on the current CUDA stream for CUDA
// tensors). The trailing-underscore ops write dlogits into the logits' own memory.
#include <cmath>

#include "fuselet/cross_entropy.h"
#include "op.h"

namespace fuselet_torch {
namespace {

fuselet_cross_entropy_options options(int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  return {ignore_index, static_cast<float>(label_smoothing), static_cast<float>(z_loss), static_cast<float>(softcap)};
}

// The core's checks of logits [..., V], target, the options, grad_scale (NaN: none) and the
// per-token float32 `tokens` (dloss, lse): before any copy.
void check_args(const Tensor& logits, const Tensor& target, const fuselet_cross_entropy_options& o,
                std::initializer_list<std::pair<const char*, const Tensor*>> tokens, double grad_scale = NAN) {
  check_defined(logits, "logits");
  check_same_device(logits, target, "target", "logits");
  for (const auto& [name, t] : tokens) check_same_device(logits, *t, name, "logits");
  const Rows r = rows_of(logits, "logits", "V");
  FUSELET_CHECK_VALUE(r.cols > 0, "logits: the last dimension (classes) must be > 0, got 0");
  FUSELET_CHECK_TYPE(target.scalar_type() == ScalarType::Int || target.scalar_type() == ScalarType::Long,
                     "target: expected dtype int32 or int64 (class ids), got ", dtype_name(target.scalar_type()));
  FUSELET_CHECK_VALUE(target.dim() <= FUSELET_MAX_DIMS, "target: expected at most ", FUSELET_MAX_DIMS,
                      " dimensions, got ", target.dim());
  FUSELET_CHECK_VALUE(target.numel() == r.rows, "target: expected ", r.rows,
                      " elements (the rows of logits), got shape ", shape_str(target));
  FUSELET_CHECK_VALUE(o.label_smoothing >= 0.f && o.label_smoothing <= 1.f,
                      "label_smoothing: expected a number in [0, 1], got ", o.label_smoothing);
  FUSELET_CHECK_VALUE(std::isfinite(o.z_loss) && o.z_loss >= 0.f, "z_loss: expected a finite number >= 0, got ",
                      o.z_loss);
  FUSELET_CHECK_VALUE(o.softcap == 0.f || (std::isfinite(o.softcap) && o.softcap > 0.f),
                      "softcap: expected a finite number > 0, or 0 for none, got ", o.softcap);
  if (!std::isnan(grad_scale))
    FUSELET_CHECK_VALUE(std::isfinite(static_cast<float>(grad_scale)), "grad_scale: expected a finite number, got ",
                        static_cast<float>(grad_scale));
  for (const auto& [name, t] : tokens) vector_of(*t, name, r.rows);
}

std::tuple<Tensor, Tensor, Tensor> cross_entropy_fwd(const Tensor& logits_in, const Tensor& target_in,
                                                     int64_t ignore_index, double label_smoothing, double z_loss,
                                                     double softcap) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  check_args(logits_in, target_in, o, {});
  const Tensor logits = make_contiguous(logits_in), target = make_contiguous(target_in);
  fuselet_tensor vx = view(logits, "logits"), vt = index_view(target, "target");
  Tensor loss = row_stats(logits), z = row_stats(logits), lse = row_stats(logits);
  fuselet_tensor vl = view(loss, "loss"), vz = view(z, "z"), vlse = view(lse, "lse");
  run_on(
      logits, [&] { return fuselet_cross_entropy_fwd(&vx, &vt, &o, &vl, &vz, &vlse); },
      [&](void* stream) { return fuselet_cross_entropy_fwd_cuda(&vx, &vt, &o, &vl, &vz, &vlse, stream); });
  return {loss, z, lse};
}

// The backward into `dlogits` (contiguous, logits' shape and dtype; may be `logits` itself), of
// checked arguments.
void backward_into(const Tensor& dloss_in, const Tensor& logits, const Tensor& target_in, const Tensor& lse_in,
                   const fuselet_cross_entropy_options& o, Tensor& dlogits) {
  const Tensor dloss = make_contiguous(dloss_in), target = make_contiguous(target_in), lse = make_contiguous(lse_in);
  fuselet_tensor vg = view(dloss, "dloss"), vx = view(logits, "logits"), vt = index_view(target, "target"),
                 vlse = view(lse, "lse"), vdx = view(dlogits, "dlogits");
  run_on(
      logits, [&] { return fuselet_cross_entropy_bwd(&vg, &vx, &vt, &vlse, &o, &vdx); },
      [&](void* stream) { return fuselet_cross_entropy_bwd_cuda(&vg, &vx, &vt, &vlse, &o, &vdx, stream); });
}

Tensor cross_entropy_bwd(const Tensor& dloss, const Tensor& logits_in, const Tensor& target, const Tensor& lse,
                         int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  check_args(logits_in, target, o, {{"dloss", &dloss}, {"lse", &lse}});
  const Tensor logits = make_contiguous(logits_in);
  Tensor dlogits = alloc_like(logits);
  backward_into(dloss, logits, target, lse, o, dlogits);
  return dlogits;
}

void cross_entropy_bwd_(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                        int64_t ignore_index, double label_smoothing, double z_loss, double softcap) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  check_args(logits, target, o, {{"dloss", &dloss}, {"lse", &lse}});
  if (logits.is_contiguous()) {
    Tensor inplace = logits;
    backward_into(dloss, logits, target, lse, o, inplace);
    return;
  }
  // Rows the core cannot view in place: through a contiguous copy.
  const Tensor c = make_contiguous(logits);
  Tensor out = alloc_like(c);
  backward_into(dloss, c, target, lse, o, out);
  copy_into(logits, out);
}

// Forward and backward in one pass into `dlogits` (may be `logits` itself), of checked arguments.
std::tuple<Tensor, Tensor> fwd_bwd_into(const Tensor& logits, const Tensor& target_in,
                                        const fuselet_cross_entropy_options& o, double grad_scale, Tensor& dlogits) {
  const Tensor target = make_contiguous(target_in);
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
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  check_args(logits_in, target, o, {}, grad_scale);
  const Tensor logits = make_contiguous(logits_in);
  Tensor dlogits = alloc_like(logits);
  auto [loss, z] = fwd_bwd_into(logits, target, o, grad_scale, dlogits);
  return {loss, z, dlogits};
}

std::tuple<Tensor, Tensor> cross_entropy_fwd_bwd_(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                  double label_smoothing, double z_loss, double softcap,
                                                  double grad_scale) {
  const fuselet_cross_entropy_options o = options(ignore_index, label_smoothing, z_loss, softcap);
  check_args(logits, target, o, {}, grad_scale);
  if (logits.is_contiguous()) {
    Tensor inplace = logits;
    return fwd_bwd_into(logits, target, o, grad_scale, inplace);
  }
  const Tensor c = make_contiguous(logits);
  Tensor out = alloc_like(c);
  auto result = fwd_bwd_into(c, target, o, grad_scale, out);
  copy_into(logits, out);
  return result;
}

void impls(Library& m) {
  FUSELET_IMPL(m, "cross_entropy_fwd", cross_entropy_fwd);
  FUSELET_IMPL(m, "cross_entropy_bwd", cross_entropy_bwd);
  FUSELET_IMPL(m, "cross_entropy_bwd_", cross_entropy_bwd_);
  FUSELET_IMPL(m, "cross_entropy_fwd_bwd", cross_entropy_fwd_bwd);
  FUSELET_IMPL(m, "cross_entropy_fwd_bwd_", cross_entropy_fwd_bwd_);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
