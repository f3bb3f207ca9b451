// CPU and CUDA implementations of fuselet::divergence_{fwd,bwd}: the core's checks of the inputs
// as given (before any copy), then allocate outputs and hand core views of contiguous inputs to
// libfuselet (on the current CUDA stream for CUDA tensors).
#include "fuselet/divergence.h"
#include "op.h"

namespace fuselet_torch {
namespace {

fuselet_divergence_options options(int64_t kind, bool log_target, double beta) {
  return {static_cast<int32_t>(kind), log_target ? 1 : 0, static_cast<float>(beta)};
}

Tensor divergence_fwd(const Tensor& input_in, const Tensor& target_in, int64_t kind, bool log_target, double beta) {
  const fuselet_divergence_options o = options(kind, log_target, beta);
  check_devices(input_in, "input", {{"target", &target_in}});
  Arg input(input_in, "input"), target(target_in, "target");
  check_args(fuselet_divergence_fwd_check(&input.v, &target.v, &o));
  input.contiguous();
  target.contiguous();
  Tensor loss = row_stats(input.t);
  fuselet_tensor vl = view(loss, "loss");
  run_on(
      input.t, [&] { return fuselet_divergence_fwd(&input.v, &target.v, &o, &vl); },
      [&](void* stream) { return fuselet_divergence_fwd_cuda(&input.v, &target.v, &o, &vl, stream); });
  return loss;
}

// The gradient of input (wrt_target false) or of target (true).
Tensor divergence_bwd(const Tensor& dloss_in, const Tensor& input_in, const Tensor& target_in, int64_t kind,
                      bool log_target, double beta, bool wrt_target) {
  const fuselet_divergence_options o = options(kind, log_target, beta);
  check_devices(input_in, "input", {{"target", &target_in}, {"dloss", &dloss_in}});
  Arg dloss(dloss_in, "dloss"), input(input_in, "input"), target(target_in, "target");
  check_args(fuselet_divergence_bwd_check(&dloss.v, &input.v, &target.v, &o));
  for (Arg* a : {&dloss, &input, &target}) a->contiguous();
  Tensor grad = alloc_like(wrt_target ? target.t : input.t);
  fuselet_tensor vd = view(grad, wrt_target ? "dtarget" : "dinput");
  fuselet_tensor* dx = wrt_target ? nullptr : &vd;
  fuselet_tensor* dt = wrt_target ? &vd : nullptr;
  run_on(
      input.t, [&] { return fuselet_divergence_bwd(&dloss.v, &input.v, &target.v, &o, dx, dt); },
      [&](void* stream) { return fuselet_divergence_bwd_cuda(&dloss.v, &input.v, &target.v, &o, dx, dt, stream); });
  return grad;
}

Tensor logits_into(Arg& input, Arg& target, Arg& dloss, const fuselet_divergence_options& o, float scale) {
  Tensor loss = row_stats(input.t);
  fuselet_tensor vl = view(loss, "loss");
  run_on(
      input.t, [&] { return fuselet_divergence_logits(&input.v, &target.v, &dloss.v, &o, scale, &vl); },
      [&](void* stream) {
        return fuselet_divergence_logits_cuda(&input.v, &target.v, &dloss.v, &o, scale, &vl, stream);
      });
  return loss;
}

// Over logits: the loss per row, input's memory overwritten with its gradient.
Tensor divergence_logits_(const Tensor& input_in, const Tensor& target_in, const Tensor& dloss_in, int64_t kind,
                          bool log_target, double beta, double scale) {
  const fuselet_divergence_options o = options(kind, log_target, beta);
  const float s = static_cast<float>(scale);
  check_devices(input_in, "input", {{"target", &target_in}, {"dloss", &dloss_in}});
  Arg input(input_in, "input"), target(target_in, "target"), dloss(dloss_in, "dloss");
  check_args(fuselet_divergence_logits_check(&input.v, &target.v, &dloss.v, &o, s));
  for (Arg* a : {&input, &target, &dloss}) a->contiguous();
  Tensor loss = logits_into(input, target, dloss, o, s);
  if (!input_in.is_contiguous()) copy_into(input_in, input.t);
  return loss;
}

void impls(Library& m) {
  FUSELET_IMPL(m, "divergence_fwd", divergence_fwd);
  FUSELET_IMPL(m, "divergence_bwd", divergence_bwd);
  FUSELET_IMPL(m, "divergence_logits_", divergence_logits_);
}

}  // namespace

FUSELET_TORCH_IMPLS(impls)

}  // namespace fuselet_torch
