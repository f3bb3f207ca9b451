// The library-wide entry points of the C ABI under the fuzzer (fuselet/fuselet.h: the thread count,
// the CPU ISA, the getters); fuzz_c_abi.cc picks them, fuzz.h reads their arguments.
#include "fuselet/fuselet.h"
#include "fuselet/norm.h"
#include "fuzz.h"

namespace fuselet_fuzz {

// A thread count: 1..4 mostly (the fuzzer stays fast), else one a caller must not get a pool
// of: 0, negative, INT32_MAX...
void op_set_num_threads(Ctx& c) {
  const uint8_t b = c.in.u8();
  static const int kHuge[] = {0, -1, INT32_MIN, INT32_MAX, INT32_MAX - 1, 1 << 30, -(1 << 30), 0};
  const int n = b < 0xF0 ? 1 + b % 4 : kHuge[b % 8];
  if (check(fuselet_set_num_threads(n)) == FUSELET_OK && fuselet_get_num_threads() != n)
    finding("fuselet_get_num_threads() after fuselet_set_num_threads(n) returned OK", "not n");
}

void op_set_cpu_isa(Ctx& c) {
  const uint8_t b = c.in.u8();
  static const char* const kNames[] = {"baseline", "avx2", "avx512", nullptr, "", "AVX2", "avx512 ", "avx"};
  const char* name;
  char* raw = nullptr;
  if (b < 0xF0) {
    name = kNames[b % 8];
  } else {  // bytes of the input, NUL-terminated, in a buffer of exactly that size
    const size_t len = c.in.u8() % 24;
    raw = static_cast<char*>(c.arena.alloc(len + 1));
    for (size_t i = 0; i < len; ++i) raw[i] = static_cast<char>(c.in.u8());
    raw[len] = '\0';
    name = raw;
  }
  const fuselet_status s = check(fuselet_set_cpu_isa(name));
  const char* now = fuselet_cpu_isa();
  if (s == FUSELET_OK && name != nullptr && (now == nullptr || std::strcmp(now, name) != 0))
    finding("fuselet_cpu_isa() after fuselet_set_cpu_isa(name) returned OK", "not name");
}

// The getters: none may crash or return a bad string, whatever was set before.
void op_info(Ctx& c) {
  check_string(fuselet_last_error(), "fuselet_last_error()", false);
  check_string(fuselet_version(), "fuselet_version()", true);
  check_string(fuselet_cuda_archs(), "fuselet_cuda_archs()", false);
  const int cuda = fuselet_has_cuda();
  if (cuda != 0 && cuda != 1) finding("fuselet_has_cuda()", "neither 0 nor 1");
  const char* isa = fuselet_cpu_isa();
  if (isa != nullptr) check_string(isa, "fuselet_cpu_isa()", true);
  if (fuselet_get_num_threads() < 1) finding("fuselet_get_num_threads()", "< 1");
  const int32_t code = static_cast<int32_t>(c.in.u32());  // any int, as a C caller may pass
  fuselet_status status;
  std::memcpy(&status, &code, sizeof status);
  check_string(fuselet_status_string(status), "fuselet_status_string()", true);
  const int64_t rows = pick_dim(c.in), hidden = pick_dim(c.in);
  (void)fuselet_norm_bwd_workspace_bytes_cuda(rows, hidden);
}

}  // namespace fuselet_fuzz
