// CPU and CUDA implementations of fuselet::{rms,layer,add_rms,gated_rms}_norm_{fwd,bwd}: the core's checks
// of the inputs as given (before any copy), then allocate outputs and hand core views of
// contiguous inputs to libfuselet (on the current CUDA stream for CUDA tensors).
#include "fuselet/norm.h"
#include "op.h"

namespace fuselet_torch {
namespace {

// Device workspace of the CUDA backward for the rows of x.
Tensor workspace(const Tensor& x) {
  const int64_t hidden = x.size(-1);
  const size_t bytes = fuselet_norm_bwd_workspace_bytes_cuda(hidden ? x.numel() / hidden : 0, hidden);
  return alloc(x, {static_cast<int64_t>(bytes)}, ScalarType::Byte);
}

uint32_t norm_flags(bool zero_centered_gamma, bool gate_first = false) {
  return (zero_centered_gamma ? FUSELET_NORM_ZERO_CENTERED_GAMMA : 0u) | (gate_first ? FUSELET_NORM_GATE_FIRST : 0u);
}

// Every tensor on the device of x (named `x_name`: x, or residual_out in add_rms_norm_bwd).
void check_devices(const Tensor& x, const char* x_name, const OptTensor& weight, const OptTensor& bias,
                   std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  fuselet_torch::check_devices(x, x_name, others);
  if (weight.has_value()) check_same_device(x, *weight, "weight", x_name);
  if (bias.has_value()) check_same_device(x, *bias, "bias", x_name);
}

std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x_in, const OptTensor& weight_in, double eps,
                                        bool zero_centered_gamma) {
  check_devices(x_in, "x", weight_in, std::nullopt, {});
  Arg x(x_in, "x");
  Param w(weight_in, "weight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  check_args(fuselet_rms_norm_fwd_check(&x.v, w.ptr(), e, flags));
  x.contiguous();
  w.contiguous();
  Tensor y = alloc_like(x.t), rstd = row_stats(x.t);
  fuselet_tensor vy = view(y, "y"), vr = view(rstd, "rstd");
  run_on(
      x.t, [&] { return fuselet_rms_norm_fwd(&x.v, w.ptr(), e, flags, &vy, &vr); },
      [&](void* stream) { return fuselet_rms_norm_fwd_cuda(&x.v, w.ptr(), e, flags, &vy, &vr, stream); });
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight_in,
                                        const Tensor& rstd_in, bool zero_centered_gamma) {
  check_devices(x_in, "x", weight_in, std::nullopt, {{"dy", &dy_in}, {"rstd", &rstd_in}});
  Arg dy(dy_in, "dy"), x(x_in, "x"), rstd(rstd_in, "rstd");
  Param w(weight_in, "weight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  check_args(fuselet_rms_norm_bwd_check(&dy.v, &x.v, w.ptr(), &rstd.v, flags));
  for (Arg* a : {&dy, &x, &rstd}) a->contiguous();
  w.contiguous();
  Tensor dx = alloc_like(x.t), dweight = w.grad_like(x.t);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight");
  run_on(
      x.t, [&] { return fuselet_rms_norm_bwd(&dy.v, &x.v, w.ptr(), &rstd.v, flags, &vdx, vdw.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(x.t);
        return fuselet_rms_norm_bwd_cuda(&dy.v, &x.v, w.ptr(), &rstd.v, flags, &vdx, vdw.ptr, ws.data_ptr(),
                                         ws.numel(), stream);
      });
  return {dx, dweight};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& x_in, const OptTensor& weight_in,
                                                  const OptTensor& bias_in, double eps, bool zero_centered_gamma) {
  check_devices(x_in, "x", weight_in, bias_in, {});
  Arg x(x_in, "x");
  Param w(weight_in, "weight"), b(bias_in, "bias");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  check_args(fuselet_layer_norm_fwd_check(&x.v, w.ptr(), b.ptr(), e, flags));
  x.contiguous();
  w.contiguous();
  b.contiguous();
  Tensor y = alloc_like(x.t), mean = row_stats(x.t), rstd = row_stats(x.t);
  fuselet_tensor vy = view(y, "y"), vm = view(mean, "mean"), vr = view(rstd, "rstd");
  run_on(
      x.t, [&] { return fuselet_layer_norm_fwd(&x.v, w.ptr(), b.ptr(), e, flags, &vy, &vm, &vr); },
      [&](void* stream) {
        return fuselet_layer_norm_fwd_cuda(&x.v, w.ptr(), b.ptr(), e, flags, &vy, &vm, &vr, stream);
      });
  return {y, mean, rstd};
}

// bias is read for its presence, shape and dtype only (dbias is computed when it is present).
std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight_in,
                                                  const OptTensor& bias_in, const Tensor& mean_in,
                                                  const Tensor& rstd_in, bool zero_centered_gamma) {
  check_devices(x_in, "x", weight_in, bias_in, {{"dy", &dy_in}, {"mean", &mean_in}, {"rstd", &rstd_in}});
  Arg dy(dy_in, "dy"), x(x_in, "x"), mean(mean_in, "mean"), rstd(rstd_in, "rstd");
  Param w(weight_in, "weight"), b(bias_in, "bias");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  check_args(fuselet_layer_norm_bwd_check(&dy.v, &x.v, w.ptr(), b.ptr(), &mean.v, &rstd.v, flags));
  for (Arg* a : {&dy, &x, &mean, &rstd}) a->contiguous();
  w.contiguous();
  Tensor dx = alloc_like(x.t), dweight = w.grad_like(x.t), dbias = b.grad_like(x.t);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight"), vdb(b, dbias, "dbias");
  run_on(
      x.t,
      [&] { return fuselet_layer_norm_bwd(&dy.v, &x.v, w.ptr(), &mean.v, &rstd.v, flags, &vdx, vdw.ptr, vdb.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(x.t);
        return fuselet_layer_norm_bwd_cuda(&dy.v, &x.v, w.ptr(), &mean.v, &rstd.v, flags, &vdx, vdw.ptr, vdb.ptr,
                                           ws.data_ptr(), ws.numel(), stream);
      });
  return {dx, dweight, dbias};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd(const Tensor& x_in, const Tensor& residual_in,
                                                    const OptTensor& weight_in, double eps, bool zero_centered_gamma) {
  check_devices(x_in, "x", weight_in, std::nullopt, {{"residual", &residual_in}});
  Arg x(x_in, "x"), residual(residual_in, "residual");
  Param w(weight_in, "weight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  check_args(fuselet_add_rms_norm_fwd_check(&x.v, &residual.v, w.ptr(), e, flags));
  x.contiguous();
  residual.contiguous();
  w.contiguous();
  Tensor y = alloc_like(x.t), h = alloc_like(x.t), rstd = row_stats(x.t);
  fuselet_tensor vy = view(y, "y"), vh = view(h, "residual_out"), vr = view(rstd, "rstd");
  run_on(
      x.t, [&] { return fuselet_add_rms_norm_fwd(&x.v, &residual.v, w.ptr(), e, flags, &vy, &vh, &vr); },
      [&](void* stream) {
        return fuselet_add_rms_norm_fwd_cuda(&x.v, &residual.v, w.ptr(), e, flags, &vy, &vh, &vr, stream);
      });
  return {y, h, rstd};
}

std::tuple<Tensor, Tensor> add_rms_norm_bwd(const Tensor& dy_in, const Tensor& dh_in, const Tensor& h_in,
                                            const OptTensor& weight_in, const Tensor& rstd_in,
                                            bool zero_centered_gamma) {
  check_devices(h_in, "residual_out", weight_in, std::nullopt,
                {{"dy", &dy_in}, {"dresidual_out", &dh_in}, {"rstd", &rstd_in}});
  Arg dy(dy_in, "dy"), dh(dh_in, "dresidual_out"), h(h_in, "residual_out"), rstd(rstd_in, "rstd");
  Param w(weight_in, "weight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  check_args(fuselet_add_rms_norm_bwd_check(&dy.v, &dh.v, &h.v, w.ptr(), &rstd.v, flags));
  for (Arg* a : {&dy, &dh, &h, &rstd}) a->contiguous();
  w.contiguous();
  Tensor dx = alloc_like(h.t), dweight = w.grad_like(h.t);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight");
  run_on(
      h.t, [&] { return fuselet_add_rms_norm_bwd(&dy.v, &dh.v, &h.v, w.ptr(), &rstd.v, flags, &vdx, vdw.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(h.t);
        return fuselet_add_rms_norm_bwd_cuda(&dy.v, &dh.v, &h.v, w.ptr(), &rstd.v, flags, &vdx, vdw.ptr, ws.data_ptr(),
                                             ws.numel(), stream);
      });
  return {dx, dweight};
}

// rstd of the gated norm: [..., H / group_size] (one per group; the checks have run).
Tensor group_stats(const Tensor& x, int64_t group_size) {
  std::vector<int64_t> shape = shape_of(x);
  shape.back() = group_size > 0 ? shape.back() / group_size : 1;
  return alloc(x, shape, ScalarType::Float);
}

std::tuple<Tensor, Tensor> gated_rms_norm_fwd(const Tensor& x_in, const Tensor& z_in, const OptTensor& weight_in,
                                              double eps, int64_t group_size, bool norm_before_gate,
                                              bool zero_centered_gamma) {
  check_devices(x_in, "x", weight_in, std::nullopt, {{"z", &z_in}});
  Arg x(x_in, "x"), z(z_in, "z");
  Param w(weight_in, "weight");
  const uint32_t flags = norm_flags(zero_centered_gamma, !norm_before_gate);
  const float e = static_cast<float>(eps);
  check_args(fuselet_gated_rms_norm_fwd_check(&x.v, &z.v, w.ptr(), e, group_size, flags));
  x.contiguous();
  z.contiguous();
  w.contiguous();
  Tensor y = alloc_like(x.t), rstd = group_stats(x.t, group_size);
  fuselet_tensor vy = view(y, "y"), vr = view(rstd, "rstd");
  run_on(
      x.t, [&] { return fuselet_gated_rms_norm_fwd(&x.v, &z.v, w.ptr(), e, group_size, flags, &vy, &vr); },
      [&](void* stream) {
        return fuselet_gated_rms_norm_fwd_cuda(&x.v, &z.v, w.ptr(), e, group_size, flags, &vy, &vr, stream);
      });
  return {y, rstd};
}

std::tuple<Tensor, Tensor, Tensor> gated_rms_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const Tensor& z_in,
                                                      const OptTensor& weight_in, const Tensor& rstd_in,
                                                      int64_t group_size, bool norm_before_gate,
                                                      bool zero_centered_gamma) {
  check_devices(x_in, "x", weight_in, std::nullopt, {{"dy", &dy_in}, {"z", &z_in}, {"rstd", &rstd_in}});
  Arg dy(dy_in, "dy"), x(x_in, "x"), z(z_in, "z"), rstd(rstd_in, "rstd");
  Param w(weight_in, "weight");
  const uint32_t flags = norm_flags(zero_centered_gamma, !norm_before_gate);
  check_args(fuselet_gated_rms_norm_bwd_check(&dy.v, &x.v, &z.v, w.ptr(), &rstd.v, group_size, flags));
  for (Arg* a : {&dy, &x, &z, &rstd}) a->contiguous();
  w.contiguous();
  Tensor dx = alloc_like(x.t), dz = alloc_like(x.t), dweight = w.grad_like(x.t);
  fuselet_tensor vdx = view(dx, "dx"), vdz = view(dz, "dz");
  GradView vdw(w, dweight, "dweight");
  run_on(
      x.t,
      [&] {
        return fuselet_gated_rms_norm_bwd(&dy.v, &x.v, &z.v, w.ptr(), &rstd.v, group_size, flags, &vdx, &vdz, vdw.ptr);
      },
      [&](void* stream) {
        Tensor ws = workspace(x.t);
        return fuselet_gated_rms_norm_bwd_cuda(&dy.v, &x.v, &z.v, w.ptr(), &rstd.v, group_size, flags, &vdx, &vdz,
                                               vdw.ptr, ws.data_ptr(), ws.numel(), stream);
      });
  return {dx, dz, dweight};
}

void impls(Library& m) {
  FUSELET_IMPL(m, "gated_rms_norm_fwd", gated_rms_norm_fwd);
  FUSELET_IMPL(m, "gated_rms_norm_bwd", gated_rms_norm_bwd);
  FUSELET_IMPL(m, "add_rms_norm_fwd", add_rms_norm_fwd);
  FUSELET_IMPL(m, "add_rms_norm_bwd", add_rms_norm_bwd);
  FUSELET_IMPL(m, "rms_norm_fwd", rms_norm_fwd);
  FUSELET_IMPL(m, "rms_norm_bwd", rms_norm_bwd);
  FUSELET_IMPL(m, "layer_norm_fwd", layer_norm_fwd);
  FUSELET_IMPL(m, "layer_norm_bwd", layer_norm_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
