// Choice of the instruction set of the CPU row kernels (cpu_isa.h): the best one the CPU
// has, or a lower one named by FUSELET_CPU_ISA (FUSELET_CPU_BASELINE=1: the baseline).
#include "cpu_isa.h"

#include <atomic>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace fuselet {
namespace cpu {
namespace {

constexpr const char* kVar = "FUSELET_CPU_ISA";
constexpr const char* kAllowed = "baseline, avx2, avx512";
constexpr int kUnset = -1;
constexpr int kInvalid = -2;

// The best ISA this CPU (and its OS, which __builtin_cpu_supports checks too) runs.
Isa best_isa() {
#ifdef FUSELET_X86_DISPATCH
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for __builtin_cpu_supports.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kBaseline;
#else
  return Isa::kBaseline;
#endif
}

bool parse(const char* s, Isa* out) {
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512})
    if (std::strcmp(s, isa_name(isa)) == 0) {
      *out = isa;
      return true;
    }
  return false;
}

// The ISA from the environment and CPUID (kInvalid for an unknown FUSELET_CPU_ISA).
int from_environment() {
  const Isa best = best_isa();
  Isa want = best;
  const char* env = std::getenv(kVar);
  const char* alias = std::getenv("FUSELET_CPU_BASELINE");
  if (env != nullptr && *env != '\0') {
    if (!parse(env, &want)) return kInvalid;
  } else if (alias != nullptr && *alias != '\0' && std::strcmp(alias, "0") != 0) {
    want = Isa::kBaseline;
  }
  if (static_cast<int>(want) > static_cast<int>(best)) {
    std::fprintf(stderr, "fuselet: %s=%s: this CPU lacks %s; the CPU kernels use %s\n", kVar, env, env,
                 isa_name(best));
    want = best;
  }
  return static_cast<int>(want);
}

std::atomic<int> g_isa{kUnset};  // an Isa, kUnset or kInvalid

int load_isa() {
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa == kUnset) {
    int expected = kUnset;
    g_isa.compare_exchange_strong(expected, from_environment());
    isa = g_isa.load();
  }
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return "baseline";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

fuselet_status current_isa(Isa* isa) {
  const int v = load_isa();
  if (v == kInvalid)
    return fail(FUSELET_ERR_INVALID_ARGUMENT, "%s: expected one of %s, got '%s'", kVar, kAllowed, std::getenv(kVar));
  *isa = static_cast<Isa>(v);
  return FUSELET_OK;
}

Isa active_isa() {
  const int v = load_isa();
  return v < 0 ? Isa::kBaseline : static_cast<Isa>(v);
}

}  // namespace cpu
}  // namespace fuselet

extern "C" {

const char* fuselet_cpu_isa(void) {
  fuselet::cpu::Isa isa = fuselet::cpu::Isa::kBaseline;
  if (fuselet::cpu::current_isa(&isa) != FUSELET_OK) return nullptr;
  return fuselet::cpu::isa_name(isa);
}

fuselet_status fuselet_set_cpu_isa(const char* name) {
  using fuselet::cpu::Isa;
  if (name == nullptr) {  // back to the choice of the environment and CPUID
    fuselet::cpu::g_isa.store(fuselet::cpu::kUnset);
    return fuselet::ok();
  }
  Isa isa = Isa::kBaseline;
  if (!fuselet::cpu::parse(name, &isa))
    return fuselet::fail(FUSELET_ERR_INVALID_ARGUMENT, "isa: expected one of %s, got '%s'", fuselet::cpu::kAllowed,
                         name);
  const Isa best = fuselet::cpu::best_isa();
  if (static_cast<int>(isa) > static_cast<int>(best))
    return fuselet::fail(FUSELET_ERR_UNSUPPORTED, "isa: this CPU lacks %s (the best it runs is %s)", name,
                         fuselet::cpu::isa_name(best));
  fuselet::cpu::g_isa.store(static_cast<int>(isa));
  return fuselet::ok();
}

}  // extern "C"
