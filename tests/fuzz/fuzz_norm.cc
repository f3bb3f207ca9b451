// The norms' entry points under the fuzzer (fuselet/norm.h: rms_norm, layer_norm, add_rms_norm,
// gated_rms_norm, forward and backward, CPU and `_cuda`); fuzz_c_abi.cc picks them, fuzz.h builds
// their views.
#include "fuselet/norm.h"
#include "fuzz.h"

namespace fuselet_fuzz {
namespace {

// Norms: x [..., H], weight/bias [H], rstd/mean [R].
struct NormArgs {
  int32_t dtype, pdtype;
  Shape x, h, r;
  float eps;
  uint32_t flags;
};

// `known`: the flags an entry point takes (the others only now and then).
NormArgs norm_args(Ctx& c, uint32_t known = FUSELET_NORM_ZERO_CENTERED_GAMMA) {
  NormArgs a;
  a.dtype = pick_dtype(c.in);
  a.pdtype = pick_param_dtype(c, a.dtype);
  a.x = c.shape();
  a.h = shape_of({a.x.ndim >= 1 && a.x.ndim <= FUSELET_MAX_DIMS ? a.x.d[a.x.ndim - 1] : 1});
  a.r = shape_of({leading(a.x)});
  a.eps = pick_float(c.in, 1e-5f);
  a.flags = pick_flags(c.in) & (c.in.u8() < 0xF0 ? known : ~0u);
  return a;
}

// Gated RMSNorm: NormArgs with both flags, and group_size: 0 (byte 0: the whole row), a divisor
// of H (bytes below 0x80), a small size that may not divide it or be negative, or an interesting
// value. rstd gets R * H / group_size elements where group_size divides H.
struct GatedArgs : NormArgs {
  int64_t group;
};

GatedArgs gated_args(Ctx& c) {
  GatedArgs a;
  static_cast<NormArgs&>(a) = norm_args(c, FUSELET_NORM_ZERO_CENTERED_GAMMA | FUSELET_NORM_GATE_FIRST);
  const int64_t h = a.h.d[0];
  const uint8_t b = c.in.u8();
  if (b == 0) {
    a.group = 0;
  } else if (b < 0x80 && h >= 1 && h <= 4096) {
    int64_t divisors[64], n = 0;  // any H <= 4096 has at most 48 divisors
    for (int64_t d = 1; d <= h && n < 64; ++d)
      if (h % d == 0) divisors[n++] = d;
    a.group = divisors[(b - 1) % n];
  } else if (b < 0xE0) {
    a.group = static_cast<int64_t>(b % 19) - 2;
  } else {
    a.group = interesting_i64(c.in, static_cast<uint8_t>(b - 0xE0));
  }
  if (a.group > 0 && h > 0 && h % a.group == 0)
    a.r = shape_of({static_cast<int64_t>(static_cast<uint64_t>(leading(a.x)) * static_cast<uint64_t>(h / a.group))});
  return a;
}

}  // namespace

void op_rms_norm(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* y = c.tensor(a.x, a.dtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  if (c.too_large) return;
  if (cuda) return check_cuda(fuselet_rms_norm_fwd_cuda(x, weight, a.eps, a.flags, y, rstd, c.arena.alloc(0)));
  check_then(fuselet_rms_norm_fwd_check(c.no_data(x), c.no_data(weight), a.eps, a.flags),
             [&] { return fuselet_rms_norm_fwd(x, weight, a.eps, a.flags, y, rstd); });
}

void op_rms_norm_bwd(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* dy = c.tensor(a.x, a.dtype);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.tensor(a.x, a.dtype);
  fuselet_tensor* dweight = c.optional(weight != nullptr, a.h, a.pdtype);
  if (c.too_large) return;
  if (cuda) {
    const size_t ws = c.in.u8() % 64;
    return check_cuda(
        fuselet_rms_norm_bwd_cuda(dy, x, weight, rstd, a.flags, dx, dweight, c.arena.alloc(ws), ws, c.arena.alloc(0)));
  }
  check_then(fuselet_rms_norm_bwd_check(c.no_data(dy), c.no_data(x), c.no_data(weight), c.no_data(rstd), a.flags),
             [&] { return fuselet_rms_norm_bwd(dy, x, weight, rstd, a.flags, dx, dweight); });
}

void op_layer_norm(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* bias = c.tensor(a.h, a.pdtype);
  fuselet_tensor* y = c.tensor(a.x, a.dtype);
  fuselet_tensor* mean = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  if (c.too_large) return;
  if (cuda)
    return check_cuda(fuselet_layer_norm_fwd_cuda(x, weight, bias, a.eps, a.flags, y, mean, rstd, c.arena.alloc(0)));
  check_then(fuselet_layer_norm_fwd_check(c.no_data(x), c.no_data(weight), c.no_data(bias), a.eps, a.flags),
             [&] { return fuselet_layer_norm_fwd(x, weight, bias, a.eps, a.flags, y, mean, rstd); });
}

void op_layer_norm_bwd(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* dy = c.tensor(a.x, a.dtype);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* mean = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.tensor(a.x, a.dtype);
  fuselet_tensor* dweight = c.optional(weight != nullptr, a.h, a.pdtype);
  fuselet_tensor* dbias = c.optional(false, a.h, a.pdtype);
  if (c.too_large) return;
  if (cuda) {
    const size_t ws = c.in.u8() % 64;
    return check_cuda(fuselet_layer_norm_bwd_cuda(dy, x, weight, mean, rstd, a.flags, dx, dweight, dbias,
                                                  c.arena.alloc(ws), ws, c.arena.alloc(0)));
  }
  check_then(fuselet_layer_norm_bwd_check(c.no_data(dy), c.no_data(x), c.no_data(weight), c.no_data(dbias),
                                          c.no_data(mean), c.no_data(rstd), a.flags),
             [&] { return fuselet_layer_norm_bwd(dy, x, weight, mean, rstd, a.flags, dx, dweight, dbias); });
}

void op_add_rms_norm(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* residual = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* y = c.tensor(a.x, a.dtype);
  fuselet_tensor* residual_out = c.tensor(a.x, a.dtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  if (c.too_large) return;
  if (cuda)
    return check_cuda(
        fuselet_add_rms_norm_fwd_cuda(x, residual, weight, a.eps, a.flags, y, residual_out, rstd, c.arena.alloc(0)));
  check_then(fuselet_add_rms_norm_fwd_check(c.no_data(x), c.no_data(residual), c.no_data(weight), a.eps, a.flags),
             [&] { return fuselet_add_rms_norm_fwd(x, residual, weight, a.eps, a.flags, y, residual_out, rstd); });
}

void op_add_rms_norm_bwd(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* dy = c.tensor(a.x, a.dtype);
  fuselet_tensor* dresidual_out = c.tensor(a.x, a.dtype);
  fuselet_tensor* residual_out = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.tensor(a.x, a.dtype);
  fuselet_tensor* dweight = c.optional(weight != nullptr, a.h, a.pdtype);
  if (c.too_large) return;
  if (cuda) {
    const size_t ws = c.in.u8() % 64;
    return check_cuda(fuselet_add_rms_norm_bwd_cuda(dy, dresidual_out, residual_out, weight, rstd, a.flags, dx,
                                                    dweight, c.arena.alloc(ws), ws, c.arena.alloc(0)));
  }
  check_then(
      fuselet_add_rms_norm_bwd_check(c.no_data(dy), c.no_data(dresidual_out), c.no_data(residual_out),
                                     c.no_data(weight), c.no_data(rstd), a.flags),
      [&] { return fuselet_add_rms_norm_bwd(dy, dresidual_out, residual_out, weight, rstd, a.flags, dx, dweight); });
}

void op_gated_rms_norm(Ctx& c, bool cuda) {
  GatedArgs a = gated_args(c);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* z = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* y = c.tensor(a.x, a.dtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  if (c.too_large) return;
  if (cuda)
    return check_cuda(
        fuselet_gated_rms_norm_fwd_cuda(x, z, weight, a.eps, a.group, a.flags, y, rstd, c.arena.alloc(0)));
  check_then(fuselet_gated_rms_norm_fwd_check(c.no_data(x), c.no_data(z), c.no_data(weight), a.eps, a.group, a.flags),
             [&] { return fuselet_gated_rms_norm_fwd(x, z, weight, a.eps, a.group, a.flags, y, rstd); });
}

void op_gated_rms_norm_bwd(Ctx& c, bool cuda) {
  GatedArgs a = gated_args(c);
  fuselet_tensor* dy = c.tensor(a.x, a.dtype);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* z = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.tensor(a.x, a.dtype);
  fuselet_tensor* dz = c.tensor(a.x, a.dtype);
  fuselet_tensor* dweight = c.optional(weight != nullptr, a.h, a.pdtype);
  if (c.too_large) return;
  if (cuda) {
    const size_t ws = c.in.u8() % 64;
    return check_cuda(fuselet_gated_rms_norm_bwd_cuda(dy, x, z, weight, rstd, a.group, a.flags, dx, dz, dweight,
                                                      c.arena.alloc(ws), ws, c.arena.alloc(0)));
  }
  check_then(fuselet_gated_rms_norm_bwd_check(c.no_data(dy), c.no_data(x), c.no_data(z), c.no_data(weight),
                                              c.no_data(rstd), a.group, a.flags),
             [&] { return fuselet_gated_rms_norm_bwd(dy, x, z, weight, rstd, a.group, a.flags, dx, dz, dweight); });
}

}  // namespace fuselet_fuzz
