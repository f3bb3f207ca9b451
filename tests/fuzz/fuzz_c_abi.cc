// libFuzzer target over every entry point of fuselet's C ABI (csrc/core/include/fuselet/*.h).
//
// An input is a sequence of calls, each picked by its first byte (call() below: its case numbers
// are what the inputs of tests/fuzz/corpus and tests/fuzz/regressions start with). fuzz.h reads
// the input and builds the views, and checks every call; fuzz_<stem>.cc calls the entry points
// of fuselet/<stem>.h (fuzz_fuselet.cc: fuselet/fuselet.h's).
#include "fuzz.h"

namespace fuselet_fuzz {
namespace {

constexpr int kThreads = 2;   // reset before every input
constexpr int kMaxCalls = 8;  // calls per input

void call(Ctx& c, uint8_t op) {
  switch (op % 44) {
    case 0: return op_info(c);
    case 1: return op_set_num_threads(c);
    case 2: return op_set_cpu_isa(c);
    case 3: return op_rms_norm(c, false);
    case 4: return op_rms_norm_bwd(c, false);
    case 5: return op_layer_norm(c, false);
    case 6: return op_layer_norm_bwd(c, false);
    case 7: return op_add_rms_norm(c, false);
    case 8: return op_add_rms_norm_bwd(c, false);
    case 9: return op_glu(c, false, false);
    case 10: return op_glu(c, true, false);
    case 11: return op_softmax(c, false, false);
    case 12: return op_softmax(c, true, false);
    case 13: return op_rope(c, false, false);
    case 14: return op_rope(c, true, false);
    case 15: return op_cross_entropy(c, 0, false);
    case 16: return op_cross_entropy(c, 1, false);
    case 17: return op_cross_entropy(c, 2, false);
    case 18: return op_rms_norm(c, true);
    case 19: return op_rms_norm_bwd(c, true);
    case 20: return op_layer_norm(c, true);
    case 21: return op_layer_norm_bwd(c, true);
    case 22: return op_add_rms_norm(c, true);
    case 23: return op_add_rms_norm_bwd(c, true);
    case 24: return op_glu(c, false, true);
    case 25: return op_glu(c, true, true);
    case 26: return op_softmax(c, false, true);
    case 27: return op_softmax(c, true, true);
    case 28: return op_rope(c, false, true);
    case 29: return op_rope(c, true, true);
    case 30: return op_cross_entropy(c, 0, true);
    case 31: return op_cross_entropy(c, 1, true);
    case 32: return op_cross_entropy(c, 2, true);
    case 33: return op_divergence(c, false);
    case 34: return op_divergence(c, true);
    case 35: return op_gated_rms_norm(c, false);
    case 36: return op_gated_rms_norm_bwd(c, false);
    case 37: return op_gated_rms_norm(c, true);
    case 38: return op_gated_rms_norm_bwd(c, true);
    case 39: return op_logprobs(c, false, false);
    case 40: return op_logprobs(c, true, false);
    case 41: return op_logprobs(c, false, true);
    case 42: return op_logprobs(c, true, true);
    default: return op_rope_sections(c);  // 43
  }
}

}  // namespace
}  // namespace fuselet_fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fuselet_fuzz;
  // The same process state before every input: the result of an input is its own.
  if (fuselet_set_num_threads(kThreads) != FUSELET_OK || fuselet_set_cpu_isa(nullptr) != FUSELET_OK) std::abort();
  Ctx c{Reader(data, size)};
  c.seed = static_cast<uint32_t>(size) * 2654435761u + (size ? data[size - 1] : 0);
  for (int k = 0; k < kMaxCalls && !c.in.empty(); ++k) {
    c.too_large = false;
    call(c, c.in.u8());
  }
  return 0;
}
