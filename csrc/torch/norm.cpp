// CPU and CUDA implementations of fuselet::{rms,layer,add_rms}_norm_{fwd,bwd}: allocate outputs,
// hand core views to libfuselet (on the current CUDA stream for CUDA tensors).
#include <cmath>
#include <limits>

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

uint32_t norm_flags(bool zero_centered_gamma) { return zero_centered_gamma ? FUSELET_NORM_ZERO_CENTERED_GAMMA : 0; }

// The checks of x (named `x_name`: x, or residual_out in add_rms_norm_bwd), the parameters,
// zero_centered_gamma and eps (NaN: none, the backward), and the devices of `others`: before
// any copy. Returns x's rows.
Rows check_norm(const Tensor& x, const char* x_name, const OptTensor& weight, const OptTensor& bias,
                bool zero_centered_gamma, double eps,
                std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  check_defined(x, x_name);
  for (const auto& [name, t] : others) check_same_device(x, *t, name, x_name);
  if (weight.has_value()) check_same_device(x, *weight, "weight", x_name);
  if (bias.has_value()) check_same_device(x, *bias, "bias", x_name);
  const Rows r = rows_of(x, x_name);
  FUSELET_CHECK_VALUE(r.cols > 0, x_name, ": the hidden size (last dimension) must be > 0, got 0");
  FUSELET_CHECK_VALUE(r.cols <= INT32_MAX, x_name, ": the hidden size must be < 2^31, got ", r.cols);
  Params params(x, r.cols, x_name);
  params.check(weight, "weight");
  params.check(bias, "bias");
  FUSELET_CHECK_VALUE(!zero_centered_gamma || weight.has_value(),
                      "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA needs a weight, got NULL");
  if (!std::isnan(eps)) {
    const float e = static_cast<float>(eps);
    FUSELET_CHECK_VALUE(std::isfinite(e) && e > 0.f, "eps: expected a finite number > 0, got ", e);
  }
  return r;
}

constexpr double kNoEps = std::numeric_limits<double>::quiet_NaN();

std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x_in, const OptTensor& weight_in, double eps,
                                        bool zero_centered_gamma) {
  check_norm(x_in, "x", weight_in, std::nullopt, zero_centered_gamma, eps, {});
  const Tensor x = make_contiguous(x_in);
  fuselet_tensor vx = view(x, "x");
  Param w(weight_in, "weight");
  Tensor y = alloc_like(x), rstd = row_stats(x);
  fuselet_tensor vy = view(y, "y"), vr = view(rstd, "rstd");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  run_on(
      x, [&] { return fuselet_rms_norm_fwd(&vx, w.ptr(), e, flags, &vy, &vr); },
      [&](void* stream) { return fuselet_rms_norm_fwd_cuda(&vx, w.ptr(), e, flags, &vy, &vr, stream); });
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight_in,
                                        const Tensor& rstd_in, bool zero_centered_gamma) {
  const Rows r = check_norm(x_in, "x", weight_in, std::nullopt, zero_centered_gamma, kNoEps,
                            {{"dy", &dy_in}, {"rstd", &rstd_in}});
  rows_like(dy_in, "dy", x_in, "x", r, " like x");
  vector_of(rstd_in, "rstd", r.rows);
  const Tensor dy = make_contiguous(dy_in), x = make_contiguous(x_in), rstd = make_contiguous(rstd_in);
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x"), vr = view(rstd, "rstd");
  Param w(weight_in, "weight");
  Tensor dx = alloc_like(x), dweight = w.grad_like(x);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  run_on(
      x, [&] { return fuselet_rms_norm_bwd(&vdy, &vx, w.ptr(), &vr, flags, &vdx, vdw.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(x);
        return fuselet_rms_norm_bwd_cuda(&vdy, &vx, w.ptr(), &vr, flags, &vdx, vdw.ptr, ws.data_ptr(), ws.numel(),
                                         stream);
      });
  return {dx, dweight};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& x_in, const OptTensor& weight_in,
                                                  const OptTensor& bias_in, double eps, bool zero_centered_gamma) {
  check_norm(x_in, "x", weight_in, bias_in, zero_centered_gamma, eps, {});
  const Tensor x = make_contiguous(x_in);
  fuselet_tensor vx = view(x, "x");
  Param w(weight_in, "weight"), b(bias_in, "bias");
  Tensor y = alloc_like(x), mean = row_stats(x), rstd = row_stats(x);
  fuselet_tensor vy = view(y, "y"), vm = view(mean, "mean"), vr = view(rstd, "rstd");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  run_on(
      x, [&] { return fuselet_layer_norm_fwd(&vx, w.ptr(), b.ptr(), e, flags, &vy, &vm, &vr); },
      [&](void* stream) {
        return fuselet_layer_norm_fwd_cuda(&vx, w.ptr(), b.ptr(), e, flags, &vy, &vm, &vr, stream);
      });
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight_in,
                                                  const OptTensor& bias_in, const Tensor& mean_in,
                                                  const Tensor& rstd_in, bool zero_centered_gamma) {
  const Rows r = check_norm(x_in, "x", weight_in, bias_in, zero_centered_gamma, kNoEps,
                            {{"dy", &dy_in}, {"mean", &mean_in}, {"rstd", &rstd_in}});
  rows_like(dy_in, "dy", x_in, "x", r, " like x");
  vector_of(mean_in, "mean", r.rows);
  vector_of(rstd_in, "rstd", r.rows);
  const Tensor dy = make_contiguous(dy_in), x = make_contiguous(x_in), mean = make_contiguous(mean_in),
               rstd = make_contiguous(rstd_in);
  fuselet_tensor vdy = view(dy, "dy"), vx = view(x, "x"), vm = view(mean, "mean"), vr = view(rstd, "rstd");
  Param w(weight_in, "weight"), b(bias_in, "bias");
  Tensor dx = alloc_like(x), dweight = w.grad_like(x), dbias = b.grad_like(x);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight"), vdb(b, dbias, "dbias");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  run_on(
      x, [&] { return fuselet_layer_norm_bwd(&vdy, &vx, w.ptr(), &vm, &vr, flags, &vdx, vdw.ptr, vdb.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(x);
        return fuselet_layer_norm_bwd_cuda(&vdy, &vx, w.ptr(), &vm, &vr, flags, &vdx, vdw.ptr, vdb.ptr, ws.data_ptr(),
                                           ws.numel(), stream);
      });
  return {dx, dweight, dbias};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd(const Tensor& x_in, const Tensor& residual_in,
                                                    const OptTensor& weight_in, double eps, bool zero_centered_gamma) {
  const Rows r =
      check_norm(x_in, "x", weight_in, std::nullopt, zero_centered_gamma, eps, {{"residual", &residual_in}});
  rows_like(residual_in, "residual", x_in, "x", r, " like x");
  const Tensor x = make_contiguous(x_in), residual = make_contiguous(residual_in);
  fuselet_tensor vx = view(x, "x"), vres = view(residual, "residual");
  Param w(weight_in, "weight");
  Tensor y = alloc_like(x), h = alloc_like(x), rstd = row_stats(x);
  fuselet_tensor vy = view(y, "y"), vh = view(h, "residual_out"), vr = view(rstd, "rstd");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  const float e = static_cast<float>(eps);
  run_on(
      x, [&] { return fuselet_add_rms_norm_fwd(&vx, &vres, w.ptr(), e, flags, &vy, &vh, &vr); },
      [&](void* stream) {
        return fuselet_add_rms_norm_fwd_cuda(&vx, &vres, w.ptr(), e, flags, &vy, &vh, &vr, stream);
      });
  return {y, h, rstd};
}

std::tuple<Tensor, Tensor> add_rms_norm_bwd(const Tensor& dy_in, const Tensor& dh_in, const Tensor& h_in,
                                            const OptTensor& weight_in, const Tensor& rstd_in,
                                            bool zero_centered_gamma) {
  const Rows r = check_norm(h_in, "residual_out", weight_in, std::nullopt, zero_centered_gamma, kNoEps,
                            {{"dy", &dy_in}, {"dresidual_out", &dh_in}, {"rstd", &rstd_in}});
  rows_like(dy_in, "dy", h_in, "residual_out", r, " like residual_out");
  rows_like(dh_in, "dresidual_out", h_in, "residual_out", r, " like residual_out");
  vector_of(rstd_in, "rstd", r.rows);
  const Tensor dy = make_contiguous(dy_in), dh = make_contiguous(dh_in), h = make_contiguous(h_in),
               rstd = make_contiguous(rstd_in);
  fuselet_tensor vdy = view(dy, "dy"), vdh = view(dh, "dresidual_out"), vh = view(h, "residual_out"),
                 vr = view(rstd, "rstd");
  Param w(weight_in, "weight");
  Tensor dx = alloc_like(h), dweight = w.grad_like(h);
  fuselet_tensor vdx = view(dx, "dx");
  GradView vdw(w, dweight, "dweight");
  const uint32_t flags = norm_flags(zero_centered_gamma);
  run_on(
      h, [&] { return fuselet_add_rms_norm_bwd(&vdy, &vdh, &vh, w.ptr(), &vr, flags, &vdx, vdw.ptr); },
      [&](void* stream) {
        Tensor ws = workspace(h);
        return fuselet_add_rms_norm_bwd_cuda(&vdy, &vdh, &vh, w.ptr(), &vr, flags, &vdx, vdw.ptr, ws.data_ptr(),
                                             ws.numel(), stream);
      });
  return {dx, dweight};
}

void impls(Library& m) {
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
