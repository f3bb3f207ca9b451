// CPU and CUDA implementations of fuselet::divergence_{fwd,bwd}: allocate outputs, hand core
// views to libfuselet (on the current CUDA stream for CUDA tensors).
#include "fuselet/divergence.h"
#include "op.h"

namespace fuselet_torch {
namespace {

fuselet_divergence_options options(int64_t kind, bool log_target, double beta) {
  return {static_cast<int32_t>(kind), log_target ? 1 : 0, static_cast<float>(beta)};
}

// input and target [..., V] of one shape and dtype, and dloss (the backward): before any copy.
// The core checks the options (kind, log_target, beta) and names them.
Rows check_args(const Tensor& input, const Tensor& target, const Tensor* dloss = nullptr) {
  check_defined(input, "input");
  check_same_device(input, target, "target", "input");
  const Rows r = rows_of(input, "input", "V");
  FUSELET_CHECK_VALUE(r.cols > 0, "input: the last dimension (classes) must be > 0, got 0");
  rows_like(target, "target", input, "input", r);
  if (dloss) {
    check_same_device(input, *dloss, "dloss", "input");
    vector_of(*dloss, "dloss", r.rows);
  }
  return r;
}

Tensor divergence_fwd(const Tensor& input_in, const Tensor& target_in, int64_t kind, bool log_target, double beta) {
  check_args(input_in, target_in);
  const fuselet_divergence_options o = options(kind, log_target, beta);
  const Tensor input = make_contiguous(input_in), target = make_contiguous(target_in);
  fuselet_tensor vx = view(input, "input"), vt = view(target, "target");
  Tensor loss = row_stats(input);
  fuselet_tensor vl = view(loss, "loss");
  run_on(
      input, [&] { return fuselet_divergence_fwd(&vx, &vt, &o, &vl); },
      [&](void* stream) { return fuselet_divergence_fwd_cuda(&vx, &vt, &o, &vl, stream); });
  return loss;
}

// The gradient of input (wrt_target false) or of target (true).
Tensor divergence_bwd(const Tensor& dloss_in, const Tensor& input_in, const Tensor& target_in, int64_t kind,
                      bool log_target, double beta, bool wrt_target) {
  check_args(input_in, target_in, &dloss_in);
  const fuselet_divergence_options o = options(kind, log_target, beta);
  const Tensor dloss = make_contiguous(dloss_in), input = make_contiguous(input_in),
               target = make_contiguous(target_in);
  fuselet_tensor vg = view(dloss, "dloss"), vx = view(input, "input"), vt = view(target, "target");
  Tensor grad = alloc_like(wrt_target ? target : input);
  fuselet_tensor vd = view(grad, wrt_target ? "dtarget" : "dinput");
  fuselet_tensor* dx = wrt_target ? nullptr : &vd;
  fuselet_tensor* dt = wrt_target ? &vd : nullptr;
  run_on(
      input, [&] { return fuselet_divergence_bwd(&vg, &vx, &vt, &o, dx, dt); },
      [&](void* stream) { return fuselet_divergence_bwd_cuda(&vg, &vx, &vt, &o, dx, dt, stream); });
  return grad;
}

void impls(Library& m) {
  FUSELET_IMPL(m, "divergence_fwd", divergence_fwd);
  FUSELET_IMPL(m, "divergence_bwd", divergence_bwd);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
