// Every schema of the fuselet torch library, in one place. Implementations live in the
// per-family files (norm.cpp, ...); fake impls and autograd are registered from Python
// (python/fuselet/torch/<family>.py). FFI targets of the JAX layer use the same names.
#include "api.h"

FUSELET_TORCH_LIBRARY(m) {
  // Normalization (norm.cpp): math and shapes in csrc/core/include/fuselet/norm.h.
  // weight / bias: None for none; the backward returns an empty dweight / dbias for those.
  m.def(
      "rms_norm_fwd(Tensor x, Tensor? weight, float eps, bool zero_centered_gamma=False)"
      " -> (Tensor y, Tensor rstd)");
  m.def(
      "rms_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor rstd, bool zero_centered_gamma=False)"
      " -> (Tensor dx, Tensor dweight)");
  m.def(
      "layer_norm_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps, bool zero_centered_gamma=False)"
      " -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "layer_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd,"
      " bool zero_centered_gamma=False) -> (Tensor dx, Tensor dweight, Tensor dbias)");
  // Residual add + RMSNorm: residual_out = x + residual (x's dtype), y = rms_norm(residual_out).
  // The backward's dx is the gradient of x and of residual alike.
  m.def(
      "add_rms_norm_fwd(Tensor x, Tensor residual, Tensor? weight, float eps, bool zero_centered_gamma=False)"
      " -> (Tensor y, Tensor residual_out, Tensor rstd)");
  m.def(
      "add_rms_norm_bwd(Tensor dy, Tensor dresidual_out, Tensor residual_out, Tensor? weight, Tensor rstd,"
      " bool zero_centered_gamma=False) -> (Tensor dx, Tensor dweight)");
  // Gated RMSNorm: y = rms_norm(x) * silu(z) per group of group_size elements (0: the row), or
  // rms_norm(x * silu(z)) when not norm_before_gate (Mamba2's); rstd [..., H / group_size].
  m.def(
      "gated_rms_norm_fwd(Tensor x, Tensor z, Tensor? weight, float eps, int group_size=0, bool norm_before_gate=True,"
      " bool zero_centered_gamma=False) -> (Tensor y, Tensor rstd)");
  m.def(
      "gated_rms_norm_bwd(Tensor dy, Tensor x, Tensor z, Tensor? weight, Tensor rstd, int group_size=0,"
      " bool norm_before_gate=True, bool zero_centered_gamma=False) -> (Tensor dx, Tensor dz, Tensor dweight)");
  // Gated linear units (glu.cpp): math in csrc/core/include/fuselet/glu.h. x [..., 2F] = [gate, up],
  // y [..., F]; approximate: "none" (erf) or "tanh"; clamped_swiglu: GPT-OSS's (alpha, limit; x
  // interleaved [g0, u0, g1, u1, ...] when asked).
  m.def("swiglu_fwd(Tensor x) -> Tensor y");
  m.def("swiglu_bwd(Tensor dy, Tensor x) -> Tensor dx");
  m.def("geglu_fwd(Tensor x, str approximate=\"none\") -> Tensor y");
  m.def("geglu_bwd(Tensor dy, Tensor x, str approximate=\"none\") -> Tensor dx");
  m.def("clamped_swiglu_fwd(Tensor x, float alpha=1.702, float limit=7.0, bool interleaved=False) -> Tensor y");
  m.def(
      "clamped_swiglu_bwd(Tensor dy, Tensor x, float alpha=1.702, float limit=7.0, bool interleaved=False) -> Tensor "
      "dx");
  // Softmax (softmax.cpp): math in csrc/core/include/fuselet/softmax.h. y = softmax(scale * x)
  // over the last dim; causal: x [..., Q, K], key j masked for query i when j > i + (K - Q).
  m.def("softmax_fwd(Tensor x, float scale=1.0, bool causal=False) -> Tensor y");
  m.def("softmax_bwd(Tensor dy, Tensor y, float scale=1.0) -> Tensor dx");
  // Rotary position embedding (rope.cpp): math in csrc/core/include/fuselet/rope.h. x [B, S, N, D]
  // ([B, N, S, D] with bhsd; B may be absent), cos / sin [S, R] or [B, S, R] (float32 or x's
  // dtype), R even in [2, D]; the first R features rotate (interleaved: pairs 2j, 2j+1, else
  // i, i + R/2). The backward is the transposed rotation of dy; cos and sin get no gradient.
  // pair_table: cos / sin hold one column per pair (width R/2); sections (not None): cos / sin
  // are K = len(sections) tables [K, ...], pair j reading the table its section names
  // (contiguous, or interleaved_sections: Qwen3-VL's).
  m.def(
      "rope_fwd(Tensor x, Tensor cos, Tensor sin, bool bhsd=False, bool interleaved=False, bool pair_table=False, "
      "int[]? sections=None, bool interleaved_sections=False) -> Tensor y");
  m.def(
      "rope_bwd(Tensor dy, Tensor cos, Tensor sin, bool bhsd=False, bool interleaved=False, bool pair_table=False, "
      "int[]? sections=None, bool interleaved_sections=False) -> Tensor dx");
  // Cross-entropy (cross_entropy.cpp): math in csrc/core/include/fuselet/cross_entropy.h.
  // logits [..., V], target logits.shape[:-1] (int32 or int64); per-token float32 outputs of
  // target's shape, 0 where target == ignore_index; softcap 0.0: none. The backward takes the
  // upstream gradient of each token's loss (dloss); the trailing-underscore variants write
  // dlogits into the logits' memory.
  m.def(
      "cross_entropy_fwd(Tensor logits, Tensor target, int ignore_index, float label_smoothing, float z_loss,"
      " float softcap) -> (Tensor loss, Tensor z, Tensor lse)");
  m.def(
      "cross_entropy_bwd(Tensor dloss, Tensor logits, Tensor target, Tensor lse, int ignore_index,"
      " float label_smoothing, float z_loss, float softcap) -> Tensor dlogits");
  m.def(
      "cross_entropy_bwd_(Tensor dloss, Tensor(a!) logits, Tensor target, Tensor lse, int ignore_index,"
      " float label_smoothing, float z_loss, float softcap) -> ()");
  m.def(
      "cross_entropy_fwd_bwd(Tensor logits, Tensor target, int ignore_index, float label_smoothing, float z_loss,"
      " float softcap, float grad_scale) -> (Tensor loss, Tensor z, Tensor dlogits)");
  m.def(
      "cross_entropy_fwd_bwd_(Tensor(a!) logits, Tensor target, int ignore_index, float label_smoothing,"
      " float z_loss, float softcap, float grad_scale) -> (Tensor loss, Tensor z)");
  // Log-probabilities (cross_entropy.cpp): math in csrc/core/include/fuselet/cross_entropy.h
  // (fuselet_logprobs_*). logits [..., V], target its rows' class ids; float32 per-token outputs
  // of logits.shape[:-1], 0 where target == ignore_index; softcap 0.0: none. log_probs and lse
  // always; entropy with with_entropy; log_sum_sq_probs, mean_logits and is_top1 (1.0 / 0.0)
  // with with_stats; an output not asked for is an empty float32 tensor. The backward writes
  // dlogits (of dlogp and dentropy, each None for 0; entropy needed with dentropy) into logits.
  m.def(
      "logprobs_fwd(Tensor logits, Tensor target, int ignore_index, float softcap, bool with_entropy,"
      " bool with_stats) -> (Tensor log_probs, Tensor lse, Tensor entropy, Tensor log_sum_sq_probs,"
      " Tensor mean_logits, Tensor is_top1)");
  m.def(
      "logprobs_bwd_(Tensor(a!) logits, Tensor target, Tensor lse, Tensor? entropy, Tensor? dlogp,"
      " Tensor? dentropy, int ignore_index, float softcap) -> ()");
  // Divergences (divergence.cpp): math in csrc/core/include/fuselet/divergence.h. input, target
  // [..., V] of one shape and dtype; kind a fuselet_divergence_kind (0 KL, 1 JSD, 2 TVD); a float32
  // loss per row (input.shape[:-1]). The backward returns the gradient of input, or with
  // wrt_target that of target.
  m.def("divergence_fwd(Tensor input, Tensor target, int kind, bool log_target, float beta) -> Tensor loss");
  m.def(
      "divergence_bwd(Tensor dloss, Tensor input, Tensor target, int kind, bool log_target, float beta,"
      " bool wrt_target) -> Tensor grad");
  // Over logits in one pass (fuselet_divergence_logits): input and target the logits, times scale;
  // the float32 loss per row returned, input overwritten with the gradient of sum(dloss * loss).
  m.def(
      "divergence_logits_(Tensor(a!) input, Tensor target, Tensor dloss, int kind, bool log_target, float beta,"
      " float scale) -> Tensor loss");
}
