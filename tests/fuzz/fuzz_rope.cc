// rope's entry points under the fuzzer (fuselet/rope.h: forward and backward, CPU and `_cuda`,
// with and without sections);
// fuzz_c_abi.cc picks them, fuzz.h builds their views.
#include "fuselet/rope.h"
#include "fuzz.h"

namespace fuselet_fuzz {

void op_rope(Ctx& c, bool backward, bool cuda) {
  const int32_t dtype = pick_dtype(c.in);
  const int32_t cs_dtype = pick_param_dtype(c, dtype);
  const uint32_t flags = pick_flags(c.in) & (c.in.u8() < 0xF0 ? 3u : ~0u);
  const bool batch = !(c.in.u8() & 1), per_sequence = batch && (c.in.u8() & 1);
  const int64_t B = pick_dim(c.in), S = pick_dim(c.in), N = pick_dim(c.in);
  const int64_t D = static_cast<int64_t>(static_cast<uint64_t>(pick_dim(c.in)) * 2u);  // wraps, as a caller's might
  const int64_t half = D / 2 > 0 ? D / 2 : 1;
  const int64_t R = 2 * (1 + static_cast<int64_t>(static_cast<uint64_t>(c.in.u8()) % static_cast<uint64_t>(half)));
  const bool bhsd = flags & FUSELET_ROPE_BHSD;
  const int64_t d1 = bhsd ? N : S, d2 = bhsd ? S : N;
  const Shape x = batch ? shape_of({B, d1, d2, D}) : shape_of({d1, d2, D});
  const Shape cs = per_sequence ? shape_of({B, S, R}) : shape_of({S, R});
  fuselet_tensor* in = c.tensor(x, dtype);
  fuselet_tensor* cos = c.tensor(cs, cs_dtype);
  fuselet_tensor* sin = c.tensor(cs, cs_dtype);
  fuselet_tensor* out = c.tensor(x, dtype);
  if (c.too_large) return;
  if (cuda) {
    void* stream = c.arena.alloc(0);
    return check_cuda(backward ? fuselet_rope_bwd_cuda(in, cos, sin, flags, out, stream)
                               : fuselet_rope_fwd_cuda(in, cos, sin, flags, out, stream));
  }
  const fuselet_tensor *vin = c.no_data(in), *vcos = c.no_data(cos), *vsin = c.no_data(sin);
  check_then(
      backward ? fuselet_rope_bwd_check(vin, vcos, vsin, flags) : fuselet_rope_fwd_check(vin, vcos, vsin, flags), [&] {
        return backward ? fuselet_rope_bwd(in, cos, sin, flags, out) : fuselet_rope_fwd(in, cos, sin, flags, out);
      });
}

// The sections entry points: K = 0..5 tables (5 is refused) of `pick_dim` sections (sizes that
// sum to R/2 when each is the pairs' share, else anything: 0, huge, negative), a pair table or
// not, contiguous or interleaved sections; backward and `_cuda` picked by a byte.
void op_rope_sections(Ctx& c) {
  const uint8_t kind = c.in.u8();
  const bool backward = kind & 1, cuda = kind & 2;
  const int32_t dtype = pick_dtype(c.in);
  const int32_t cs_dtype = pick_param_dtype(c, dtype);
  uint32_t flags = pick_flags(c.in) & (c.in.u8() < 0xF0 ? 15u : ~0u);
  const bool batch = !(c.in.u8() & 1), per_sequence = batch && (c.in.u8() & 1);
  const int32_t k = static_cast<int32_t>(c.in.u8() % 6);
  const int64_t B = pick_dim(c.in), S = pick_dim(c.in), N = pick_dim(c.in);
  const int64_t D = static_cast<int64_t>(static_cast<uint64_t>(pick_dim(c.in)) * 2u);  // wraps, as a caller's might
  const int64_t half = D / 2 > 0 ? D / 2 : 1;
  const int64_t R = 2 * (1 + static_cast<int64_t>(static_cast<uint64_t>(c.in.u8()) % static_cast<uint64_t>(half)));
  int64_t sections[5] = {};
  const bool fair = c.in.u8() < 0xC0;  // sections that sum to R/2: s_k = R/2 / K, s_0 the rest
  for (int32_t t = 0; t < k; ++t) sections[t] = fair ? R / 2 / k : pick_dim(c.in);
  if (fair && k) sections[0] = R / 2 - (k - 1) * (R / 2 / k);
  const bool bhsd = flags & FUSELET_ROPE_BHSD;
  const int64_t d1 = bhsd ? N : S, d2 = bhsd ? S : N, W = flags & FUSELET_ROPE_PAIR_TABLE ? R / 2 : R;
  const Shape x = batch ? shape_of({B, d1, d2, D}) : shape_of({d1, d2, D});
  Shape cs =
      per_sequence ? (k ? shape_of({k, B, S, W}) : shape_of({B, S, W})) : (k ? shape_of({k, S, W}) : shape_of({S, W}));
  fuselet_tensor* in = c.tensor(x, dtype);
  fuselet_tensor* cos = c.tensor(cs, cs_dtype);
  fuselet_tensor* sin = c.tensor(cs, cs_dtype);
  fuselet_tensor* out = c.tensor(x, dtype);
  if (c.too_large) return;
  const int64_t* sec = k || (c.in.u8() & 1) ? sections : nullptr;
  if (cuda) {
    void* stream = c.arena.alloc(0);
    return check_cuda(backward ? fuselet_rope_sections_bwd_cuda(in, cos, sin, sec, k, flags, out, stream)
                               : fuselet_rope_sections_fwd_cuda(in, cos, sin, sec, k, flags, out, stream));
  }
  const fuselet_tensor *vin = c.no_data(in), *vcos = c.no_data(cos), *vsin = c.no_data(sin);
  check_then(backward ? fuselet_rope_sections_bwd_check(vin, vcos, vsin, sec, k, flags)
                      : fuselet_rope_sections_fwd_check(vin, vcos, vsin, sec, k, flags),
             [&] {
               return backward ? fuselet_rope_sections_bwd(in, cos, sin, sec, k, flags, out)
                               : fuselet_rope_sections_fwd(in, cos, sin, sec, k, flags, out);
             });
}

}  // namespace fuselet_fuzz
