// Which x86-64 instruction set the CPU row kernels run with, and the run-time dispatch to
// the copy of a row kernel built for it. Every row kernel K is compiled once per ISA below:
// K::run must be `static FUSELET_INLINE void run(...)`, so that it is inlined into each
// target-attributed copy and its loops vectorize for that target (code it does not inline
// stays baseline code). The ISA is chosen once, at the first kernel call, from CPUID and the
// FUSELET_CPU_ISA environment variable (cpu_isa.cc).
#pragma once

#include "internal.h"

namespace fuselet {
namespace cpu {

// Ordered: each one needs everything the ones below it need.
enum class Isa : int {
  kBaseline = 0,  // x86-64 baseline (SSE2), or any non-x86 CPU
  kAvx2 = 1,      // AVX2 + FMA + F16C
  kAvx512 = 2,    // AVX-512 F/BW/VL/DQ (+ the AVX2 set)
};

const char* isa_name(Isa isa);

// The ISA the kernels use. FUSELET_OK with *isa set, or FUSELET_ERR_INVALID_ARGUMENT when
// FUSELET_CPU_ISA holds an unknown value (the message names the variable and the values).
fuselet_status current_isa(Isa* isa);

// current_isa's ISA, for code that ran current_isa first (the baseline if that failed).
Isa active_isa();

#define FUSELET_INLINE __attribute__((always_inline)) inline

// No FMA contraction anywhere in the core (-ffp-contract=off), explicit fused multiply-adds
// only where cpu_math.h writes them (fmadd: exactly rounded in every copy), and the fixed lane
// order of lane_reduce: the copies give bit-identical results.
template <typename K, typename... A>
void run_baseline(A... a) {
  K::run(a...);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define FUSELET_X86_DISPATCH 1
template <typename K, typename... A>
__attribute__((target("avx2,fma,f16c"))) void run_avx2(A... a) {
  K::run(a...);
}

// clang has no prefer-vector-width in target attributes (it ignores the whole attribute).
#if defined(__clang__)
#define FUSELET_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#else
#define FUSELET_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512"
#endif
template <typename K, typename... A>
__attribute__((target(FUSELET_AVX512_TARGET))) void run_avx512(A... a) {
  K::run(a...);
}
#endif

// Runs K::run(a...) in the copy for active_isa().
template <typename K, typename... A>
void run_best(A... a) {
#ifdef FUSELET_X86_DISPATCH
  const Isa isa = active_isa();
  if (isa == Isa::kAvx512) return run_avx512<K>(a...);
  if (isa == Isa::kAvx2) return run_avx2<K>(a...);
#endif
  run_baseline<K>(a...);
}

}  // namespace cpu
}  // namespace fuselet
