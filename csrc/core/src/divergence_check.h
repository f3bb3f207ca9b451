// Argument checking and the per-element math shared by the CPU and CUDA divergence entry points.
#pragma once

#include "fuselet/divergence.h"
#include "internal.h"

// Inlined everywhere: into each ISA copy of the CPU row kernels (cpu_isa.h: a call out of one
// would run the baseline code, unvectorized), and into the CUDA kernels.
#ifdef __CUDACC__
#define FUSELET_DIVERGENCE_INLINE __host__ __device__ __forceinline__
#else
#define FUSELET_DIVERGENCE_INLINE __attribute__((always_inline)) inline
#endif

namespace fuselet {

// A checked divergence problem: N rows of V elements of input and target.
struct DivergenceProblem {
  fuselet_dtype dtype = FUSELET_FLOAT32;
  int64_t rows = 0, vocab = 0;
  int kind = FUSELET_DIVERGENCE_KL;
  bool log_target = true;
  float beta = 0.f;
  // clang-format off: each data pointer beside its strides
  const void* input = nullptr;   int64_t input_stride = 0;
  const void* target = nullptr;  int64_t target_stride = 0;
  float* loss = nullptr;         // fwd
  const float* dloss = nullptr;  // bwd
  void* dinput = nullptr;        int64_t dinput_stride = 0;   // bwd (NULL: not computed)
  void* dtarget = nullptr;       int64_t dtarget_stride = 0;  // bwd (NULL: not computed)
  // clang-format on
  float scale = 1.f;  // logits: input and target are logits, times scale; dinput is input (in place)
};

fuselet_status check_divergence_fwd(const fuselet_tensor* input, const fuselet_tensor* target,
                                    const fuselet_divergence_options* opts, fuselet_tensor* loss,
                                    DivergenceProblem* p);
fuselet_status check_divergence_bwd(const fuselet_tensor* dloss, const fuselet_tensor* input,
                                    const fuselet_tensor* target, const fuselet_divergence_options* opts,
                                    fuselet_tensor* dinput, fuselet_tensor* dtarget, DivergenceProblem* p);
fuselet_status check_divergence_logits(fuselet_tensor* input, const fuselet_tensor* target,
                                       const fuselet_tensor* dloss, const fuselet_divergence_options* opts,
                                       float scale, fuselet_tensor* loss, DivergenceProblem* p);

// The math of fuselet/divergence.h for one element (x = input, t = target), templated on its
// form and on whether t holds log-probabilities, and on the exp / log functions (the CPU kernels'
// vectorizable approximations, the CUDA kernels' expf / logf). JSD at beta 0 is the forward KL, at
// beta 1 the reverse KL: forms of their own, so that no branch is left inside the row loops. Every
// weight-0 term is selected to 0 rather than multiplied (0 * -inf would be NaN); the mixture's
// weights are tested after the multiplication by beta, which under flush-to-zero (denormals as 0)
// can make a positive p or q's weight 0 and the mixture's log -inf.
enum class DivergenceForm { kForwardKl, kReverseKl, kMixture, kTvd };

struct DivergenceGrad {
  float dx, dt;
};

struct DivergenceTermDx {
  float term, dx;
};

template <DivergenceForm Form, bool LogTarget, typename Exp, typename Log>
struct DivergenceMath {
  Exp exp;
  Log log;
  float beta;

  // The row sum's term of element j.
  FUSELET_DIVERGENCE_INLINE float term(float x, float t) const {
    const float q = exp(x);
    const float p = LogTarget ? exp(t) : t;
    const float lp = LogTarget ? t : log(t);
    if (Form == DivergenceForm::kTvd) {
      const float d = p - q;
      return 0.5f * (d < 0.f ? -d : d);
    }
    if (Form == DivergenceForm::kForwardKl) return p > 0.f ? p * (lp - x) : 0.f;
    if (Form == DivergenceForm::kReverseKl) return q > 0.f ? q * (x - lp) : 0.f;
    const float wp = beta * p, wq = (1.f - beta) * q;
    const float lm = log(wp + wq);
    const float a = wp > 0.f ? wp * (lp - lm) : 0.f;
    const float b = wq > 0.f ? wq * (x - lm) : 0.f;
    return a + b;
  }

  // The term and d term / dx of element j from the log-probabilities x, t (log_target) and their
  // exponentials q, p, computed once by the caller (the kernels over logits).
  FUSELET_DIVERGENCE_INLINE DivergenceTermDx term_dx(float x, float q, float t, float p) const {
    if (Form == DivergenceForm::kTvd) {
      const float d = p - q;
      const float s = p > q ? 0.5f : (p < q ? -0.5f : 0.f);
      return {0.5f * (d < 0.f ? -d : d), -s * q};
    }
    if (Form == DivergenceForm::kForwardKl) return {p > 0.f ? p * (t - x) : 0.f, -p};
    if (Form == DivergenceForm::kReverseKl) return {q > 0.f ? q * (x - t) : 0.f, q > 0.f ? q * (x - t + 1.f) : 0.f};
    const float wp = beta * p, wq = (1.f - beta) * q;
    const float lm = log(wp + wq);
    const float b = wq > 0.f ? wq * (x - lm) : 0.f;
    return {(wp > 0.f ? wp * (t - lm) : 0.f) + b, b};
  }

  // d term / dx and d term / dt of element j.
  FUSELET_DIVERGENCE_INLINE DivergenceGrad grad(float x, float t) const {
    const float q = exp(x);
    const float p = LogTarget ? exp(t) : t;
    const float lp = LogTarget ? t : log(t);
    if (Form == DivergenceForm::kTvd) {
      const float s = p > q ? 0.5f : (p < q ? -0.5f : 0.f);
      return {-s * q, s * p};
    }
    if (Form == DivergenceForm::kForwardKl)
      return {-p, p > 0.f ? (LogTarget ? p * (t - x + 1.f) : lp + 1.f - x) : 0.f};
    if (Form == DivergenceForm::kReverseKl) return {q > 0.f ? q * (x - t + 1.f) : 0.f, -q};
    const float wp = beta * p, wq = (1.f - beta) * q;
    const float lm = log(wp + wq);
    return {wq > 0.f ? wq * (x - lm) : 0.f, wp > 0.f ? wp * (t - lm) : 0.f};
  }
};

// Calls f(DivergenceMath<form, log_target, Exp, Log>{...}) for the problem's kind, beta and
// log_target (JSD and TVD take log-probability targets only: checked), on the host.
// LogTargetOnly: the caller's problems have log_target (checked: the mode over logits), so no
// math of probability targets is instantiated for it.
template <typename Exp, typename Log, bool LogTargetOnly = false, typename F>
__attribute__((always_inline)) inline void with_divergence_math(const DivergenceProblem& p, F&& f) {
  using Form = DivergenceForm;
  if constexpr (!LogTargetOnly) {
    if (p.kind == FUSELET_DIVERGENCE_KL && !p.log_target) {
      f(DivergenceMath<Form::kForwardKl, false, Exp, Log>{Exp{}, Log{}, 0.f});
      return;
    }
  }
  if (p.kind == FUSELET_DIVERGENCE_TVD) {
    f(DivergenceMath<Form::kTvd, true, Exp, Log>{Exp{}, Log{}, 0.f});
  } else if (p.kind == FUSELET_DIVERGENCE_KL || p.beta == 0.f) {
    f(DivergenceMath<Form::kForwardKl, true, Exp, Log>{Exp{}, Log{}, 0.f});
  } else if (p.beta == 1.f) {
    f(DivergenceMath<Form::kReverseKl, true, Exp, Log>{Exp{}, Log{}, 1.f});
  } else {
    f(DivergenceMath<Form::kMixture, true, Exp, Log>{Exp{}, Log{}, p.beta});
  }
}

}  // namespace fuselet
