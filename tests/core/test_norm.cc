// C++ test of the framework-free core: CPU norm kernels against a float64 reference, the
// strided-row path, and the error values of the C ABI. Prints "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "fuselet/norm.h"

namespace {

using fuselet_test::expect;
using fuselet_test::expect_error;
using fuselet_test::view;

double max_err(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::fmax(m, std::fabs(a[i] - b[i]) / (1.0 + std::fabs(b[i])));
  return m;
}

// Forward + backward of both norms on R x H float32 rows whose row stride is `stride`;
// without weight / bias when `has_w` / `has_b` are false, scaling by 1 + weight with `zc`.
void check_numerics(int64_t R, int64_t H, int64_t stride, bool layer, bool has_w = true, bool has_b = true,
                    bool zc = false) {
  std::mt19937 rng(static_cast<unsigned>(R * 131 + H));
  std::normal_distribution<float> dist(0.5f, 2.0f);
  std::vector<float> x(R * stride), dy(R * H), w(H), b(H);
  for (auto& v : x) v = dist(rng);
  for (auto& v : dy) v = dist(rng);
  for (auto& v : w) v = dist(rng);
  for (auto& v : b) v = dist(rng);
  const float eps = 1e-5f;
  // The weight and bias the math sees: 1 + w (zero-centered), 1 (no weight), 0 (no bias).
  std::vector<double> we(H), be(H);
  for (int64_t i = 0; i < H; ++i) {
    we[i] = has_w ? w[i] + (zc ? 1.0 : 0.0) : 1.0;
    be[i] = layer && has_b ? b[i] : 0.0;
  }
  std::vector<double> yr(R * H), dxr(R * H), dwr(H, 0.0), dbr(H, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.data() + r * stride;
    double mean = 0, var = 0;
    if (layer) {
      for (int64_t i = 0; i < H; ++i) mean += xr[i];
      mean /= H;
    }
    for (int64_t i = 0; i < H; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const double rstd = 1.0 / std::sqrt(var / H + eps);
    double c1 = 0, c2 = 0;
    for (int64_t i = 0; i < H; ++i) {
      const double xhat = (xr[i] - mean) * rstd, g = double(dy[r * H + i]) * we[i];
      yr[r * H + i] = xhat * we[i] + be[i];
      c1 += g;
      c2 += g * xhat;
      dwr[i] += dy[r * H + i] * xhat;
      dbr[i] += dy[r * H + i];
    }
    c1 = layer ? c1 / H : 0.0;
    c2 /= H;
    for (int64_t i = 0; i < H; ++i) {
      const double xhat = (xr[i] - mean) * rstd;
      dxr[r * H + i] = rstd * (double(dy[r * H + i]) * we[i] - c1 - xhat * c2);
    }
  }
  std::vector<float> y(R * H), mean(R), rstd(R), dx(R * H), dw(H), db(H);
  fuselet_tensor tx = view(x.data(), {R, H}, {stride, 1}), tw = view(w.data(), {H}), tb = view(b.data(), {H}),
                 ty = view(y.data(), {R, H}), tm = view(mean.data(), {R}), tr = view(rstd.data(), {R}),
                 tdy = view(dy.data(), {R, H}), tdx = view(dx.data(), {R, H}), tdw = view(dw.data(), {H}),
                 tdb = view(db.data(), {H});
  fuselet_tensor *pw = has_w ? &tw : nullptr, *pb = has_b ? &tb : nullptr, *pdw = has_w ? &tdw : nullptr,
                 *pdb = has_b ? &tdb : nullptr;
  const uint32_t flags = zc ? FUSELET_NORM_ZERO_CENTERED_GAMMA : 0;
  fuselet_status s1, s2;
  if (layer) {
    s1 = fuselet_layer_norm_fwd(&tx, pw, pb, eps, flags, &ty, &tm, &tr);
    s2 = fuselet_layer_norm_bwd(&tdy, &tx, pw, &tm, &tr, flags, &tdx, pdw, pdb);
  } else {
    s1 = fuselet_rms_norm_fwd(&tx, pw, eps, flags, &ty, &tr);
    s2 = fuselet_rms_norm_bwd(&tdy, &tx, pw, &tr, flags, &tdx, pdw);
  }
  char name[128];
  std::snprintf(name, sizeof(name), "%s R=%lld H=%lld stride=%lld w=%d b=%d zc=%d", layer ? "layer_norm" : "rms_norm",
                static_cast<long long>(R), static_cast<long long>(H), static_cast<long long>(stride), has_w, has_b,
                zc);
  expect(s1 == FUSELET_OK && s2 == FUSELET_OK, std::string(name) + " status: " + fuselet_last_error());
  const double tol_rows = 1e-4, tol_sum = 1e-4 * std::sqrt(double(R) + 1.0);
  expect(max_err(y, yr) < tol_rows, std::string(name) + " y");
  expect(max_err(dx, dxr) < tol_rows, std::string(name) + " dx");
  if (has_w) expect(max_err(dw, dwr) < tol_sum, std::string(name) + " dweight");
  if (layer && has_b) expect(max_err(db, dbr) < tol_sum, std::string(name) + " dbias");
}

// Residual add + RMSNorm on R x H float32 rows: residual_out, y, dx (= dresidual), dweight.
void check_add_rms_norm(int64_t R, int64_t H) {
  std::mt19937 rng(static_cast<unsigned>(R * 7 + H));
  std::normal_distribution<float> dist(0.5f, 2.0f);
  std::vector<float> x(R * H), res(R * H), w(H), dy(R * H), dh(R * H);
  for (auto* v : {&x, &res, &w, &dy, &dh})
    for (auto& e : *v) e = dist(rng);
  const float eps = 1e-5f;
  std::vector<double> hr(R * H), yr(R * H), dxr(R * H), dwr(H, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0, c2 = 0;
    for (int64_t i = 0; i < H; ++i) {
      hr[r * H + i] = float(x[r * H + i] + res[r * H + i]);
      ss += hr[r * H + i] * hr[r * H + i];
    }
    const double rstd = 1.0 / std::sqrt(ss / H + eps);
    for (int64_t i = 0; i < H; ++i) {
      const double xhat = hr[r * H + i] * rstd;
      yr[r * H + i] = xhat * w[i];
      c2 += double(dy[r * H + i]) * w[i] * xhat;
      dwr[i] += dy[r * H + i] * xhat;
    }
    for (int64_t i = 0; i < H; ++i)
      dxr[r * H + i] = rstd * (double(dy[r * H + i]) * w[i] - hr[r * H + i] * rstd * c2 / H) + dh[r * H + i];
  }
  std::vector<float> y(R * H), h(R * H), rstd(R), dx(R * H), dw(H);
  fuselet_tensor tx = view(x.data(), {R, H}), tres = view(res.data(), {R, H}), tw = view(w.data(), {H}),
                 ty = view(y.data(), {R, H}), th = view(h.data(), {R, H}), tr = view(rstd.data(), {R}),
                 tdy = view(dy.data(), {R, H}), tdh = view(dh.data(), {R, H}), tdx = view(dx.data(), {R, H}),
                 tdw = view(dw.data(), {H});
  const std::string name = "add_rms_norm R=" + std::to_string(R) + " H=" + std::to_string(H);
  expect(fuselet_add_rms_norm_fwd(&tx, &tres, &tw, eps, 0, &ty, &th, &tr) == FUSELET_OK, name + " fwd status");
  expect(fuselet_add_rms_norm_bwd(&tdy, &tdh, &th, &tw, &tr, 0, &tdx, &tdw) == FUSELET_OK, name + " bwd status");
  expect(max_err(h, hr) == 0.0, name + " residual_out");
  expect(max_err(y, yr) < 1e-4, name + " y");
  expect(max_err(dx, dxr) < 1e-4, name + " dx");
  expect(max_err(dw, dwr) < 1e-4 * std::sqrt(double(R) + 1.0), name + " dweight");
}

// --- statistics, half-precision storage, extreme inputs ---------------------------------------

float from_bf16(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float from_f16(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, sizeof v);
  return static_cast<float>(v);
}
uint16_t to_f16(float f) {
  _Float16 v = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, sizeof h);
  return h;
}

// LayerNorm and RMSNorm forward on R x H rows of `dtype` drawn around `center` (x = center +
// N(0, spread)), with a non-default eps: y against float64 math on the stored (rounded) input,
// within `ulps` units in the last place of the output dtype (+ a tiny absolute part); mean and
// rstd (float32) against float64 within a few float32 ulps. A one-pass variance
// (E[x^2] - E[x]^2) in float32 fails at center 1e3; squares in half precision overflow at 300.
void check_stats(fuselet_dtype dtype, float center, float spread, float eps) {
  const int64_t R = 16, H = 1024;
  const bool half = dtype != FUSELET_FLOAT32;
  const double ulp = dtype == FUSELET_BFLOAT16 ? 1.0 / 128 : dtype == FUSELET_FLOAT16 ? 1.0 / 1024 : 1.0 / (1 << 23);
  std::mt19937 rng(static_cast<unsigned>(dtype * 100 + static_cast<int>(center)));
  std::normal_distribution<float> dist(center, spread);
  std::vector<float> xs(R * H);  // the input as stored, read back as float
  std::vector<uint16_t> xh(R * H), yh(R * H);
  std::vector<float> xf(R * H), yf(R * H);
  for (int64_t i = 0; i < R * H; ++i) {
    const float v = dist(rng);
    if (dtype == FUSELET_BFLOAT16)
      xh[i] = to_bf16(v), xs[i] = from_bf16(xh[i]);
    else if (dtype == FUSELET_FLOAT16)
      xh[i] = to_f16(v), xs[i] = from_f16(xh[i]);
    else
      xf[i] = xs[i] = v;
  }
  void* xd = half ? static_cast<void*>(xh.data()) : static_cast<void*>(xf.data());
  void* yd = half ? static_cast<void*>(yh.data()) : static_cast<void*>(yf.data());
  for (bool layer : {false, true}) {
    std::vector<float> mean(R), rstd(R);
    fuselet_tensor tx = view(xd, {R, H}, {}, dtype), ty = view(yd, {R, H}, {}, dtype), tm = view(mean.data(), {R}),
                   tr = view(rstd.data(), {R});
    const fuselet_status st = layer ? fuselet_layer_norm_fwd(&tx, nullptr, nullptr, eps, 0, &ty, &tm, &tr)
                                    : fuselet_rms_norm_fwd(&tx, nullptr, eps, 0, &ty, &tr);
    char name[160];
    std::snprintf(name, sizeof(name), "%s %s x = %g + N(0, %g) eps=%g", layer ? "layer_norm" : "rms_norm",
                  dtype == FUSELET_BFLOAT16  ? "bfloat16"
                  : dtype == FUSELET_FLOAT16 ? "float16"
                                             : "float32",
                  double(center), double(spread), double(eps));
    expect(st == FUSELET_OK, std::string(name) + " status: " + fuselet_last_error());
    double worst_y = 0, worst_m = 0, worst_r = 0;
    for (int64_t r = 0; r < R; ++r) {
      double m = 0, var = 0;
      if (layer) {
        for (int64_t i = 0; i < H; ++i) m += xs[r * H + i];
        m /= H;
      }
      for (int64_t i = 0; i < H; ++i) var += (xs[r * H + i] - m) * (xs[r * H + i] - m);
      const double rs = 1.0 / std::sqrt(var / H + eps);
      // the mean's float32 error scales with the values summed: |mean| or their spread
      if (layer)
        worst_m =
            std::fmax(worst_m, std::fabs(mean[r] - m) / std::fmax(std::fmax(std::fabs(m), 1.0), std::sqrt(var / H)));
      worst_r = std::fmax(worst_r, std::fabs(rstd[r] - rs) / rs);
      for (int64_t i = 0; i < H; ++i) {
        const double want = (xs[r * H + i] - m) * rs;
        const double got = dtype == FUSELET_BFLOAT16  ? from_bf16(yh[r * H + i])
                           : dtype == FUSELET_FLOAT16 ? from_f16(yh[r * H + i])
                                                      : yf[r * H + i];
        // the output's rounding (ulps of its dtype) + the float32 math: x - mean loses |mean|
        // float32 ulps whatever the algorithm, and a sum of H terms a few more
        const double f32 = 1.0 / (1 << 23), allowed = std::fabs(want) * ulp + 16 * f32 * (1 + std::fabs(m) * rs);
        worst_y = std::fmax(worst_y, std::fabs(got - want) / allowed);
      }
    }
    expect(worst_y <= 1.0, std::string(name) +
                               " y within 1 ulp of its dtype + 16 float32 ulps of the math; "
                               "worst " +
                               std::to_string(worst_y) + " of that");
    std::printf("%s: worst y error %.3f of the tolerance\n", name, worst_y);
    expect(worst_r < 1e-5, std::string(name) + " rstd; worst relative error " + std::to_string(worst_r));
    if (layer) expect(worst_m < 1e-6, std::string(name) + " mean; worst relative error " + std::to_string(worst_m));
  }
}

// Gated RMSNorm on R x H float32 rows in groups of S (0: the row), gate first or after: y,
// rstd, dx, dz, dweight against float64.
void check_gated(int64_t R, int64_t H, int64_t S, bool gate_first, bool has_w = true) {
  std::mt19937 rng(static_cast<unsigned>(R * 31 + H * 7 + S + gate_first));
  std::normal_distribution<float> dist(0.3f, 1.5f);
  std::vector<float> x(R * H), z(R * H), w(H), dy(R * H);
  for (auto* v : {&x, &z, &w, &dy})
    for (auto& e : *v) e = dist(rng);
  const float eps = 1e-6f;
  const int64_t gs = S > 0 ? S : H, G = H / gs;
  const auto silu = [](double t) { return t / (1.0 + std::exp(-t)); };
  const auto dsilu = [](double t) {
    const double s = 1.0 / (1.0 + std::exp(-t));
    return s * (1.0 + t * (1.0 - s));
  };
  std::vector<double> yr(R * H), dxr(R * H), dzr(R * H), dwr(H, 0.0), rr(R * G), h(H), gy(H);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t o = r * H;
    for (int64_t i = 0; i < H; ++i) {
      const double we = has_w ? w[i] : 1.0, sz = silu(z[o + i]);
      h[i] = gate_first ? x[o + i] * sz : x[o + i];
      gy[i] = gate_first ? dy[o + i] : dy[o + i] * sz;
      (void)we;
    }
    for (int64_t g = 0; g < G; ++g) {
      double ss = 0, c2 = 0;
      for (int64_t i = g * gs; i < (g + 1) * gs; ++i) ss += h[i] * h[i];
      const double rstd = 1.0 / std::sqrt(ss / gs + eps);
      rr[r * G + g] = rstd;
      for (int64_t i = g * gs; i < (g + 1) * gs; ++i) c2 += gy[i] * (has_w ? w[i] : 1.0) * h[i] * rstd;
      c2 /= gs;
      for (int64_t i = g * gs; i < (g + 1) * gs; ++i) {
        const double we = has_w ? w[i] : 1.0, xhat = h[i] * rstd, dh = rstd * (gy[i] * we - xhat * c2);
        yr[o + i] = xhat * we * (gate_first ? 1.0 : silu(z[o + i]));
        dwr[i] += gy[i] * xhat;
        dxr[o + i] = gate_first ? dh * silu(z[o + i]) : dh;
        dzr[o + i] = gate_first ? dh * x[o + i] * dsilu(z[o + i]) : dy[o + i] * xhat * we * dsilu(z[o + i]);
      }
    }
  }
  std::vector<float> y(R * H), rstd(R * G), dx(R * H), dz(R * H), dw(H);
  fuselet_tensor tx = view(x.data(), {R, H}), tz = view(z.data(), {R, H}), tw = view(w.data(), {H}),
                 ty = view(y.data(), {R, H}), tr = view(rstd.data(), {R, G}), tdy = view(dy.data(), {R, H}),
                 tdx = view(dx.data(), {R, H}), tdz = view(dz.data(), {R, H}), tdw = view(dw.data(), {H});
  const uint32_t flags = gate_first ? FUSELET_NORM_GATE_FIRST : 0;
  const fuselet_status s1 = fuselet_gated_rms_norm_fwd(&tx, &tz, has_w ? &tw : nullptr, eps, S, flags, &ty, &tr);
  const fuselet_status s2 = fuselet_gated_rms_norm_bwd(&tdy, &tx, &tz, has_w ? &tw : nullptr, &tr, S, flags, &tdx,
                                                       &tdz, has_w ? &tdw : nullptr);
  char name[128];
  std::snprintf(name, sizeof(name), "gated_rms_norm R=%lld H=%lld S=%lld gate_first=%d w=%d",
                static_cast<long long>(R), static_cast<long long>(H), static_cast<long long>(S), gate_first, has_w);
  expect(s1 == FUSELET_OK && s2 == FUSELET_OK, std::string(name) + " status: " + fuselet_last_error());
  const double tol_rows = 1e-4, tol_sum = 1e-4 * std::sqrt(double(R) + 1.0);
  expect(max_err(y, yr) < tol_rows, std::string(name) + " y");
  expect(max_err(rstd, rr) < tol_rows, std::string(name) + " rstd");
  expect(max_err(dx, dxr) < tol_rows, std::string(name) + " dx");
  expect(max_err(dz, dzr) < tol_rows, std::string(name) + " dz");
  if (has_w) expect(max_err(dw, dwr) < tol_sum, std::string(name) + " dweight");
}

void check_gated_errors() {
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, w[4] = {1, 1, 1, 1}, y[8], r[4];
  fuselet_tensor tx = view(x, {2, 4}), tw = view(w, {4}), ty = view(y, {2, 4}), tr = view(r, {2});
  expect_error(fuselet_gated_rms_norm_fwd(&tx, &tx, &tw, 1e-6f, 3, 0, &ty, &tr),
               "group_size: expected 0 (the whole row) or a divisor of 4 (the hidden size of x), got 3",
               "gated: group_size 3 of 4");
  expect_error(fuselet_gated_rms_norm_fwd(&tx, &tx, &tw, 1e-6f, -1, 0, &ty, &tr), "group_size: expected 0",
               "gated: group_size -1");
  fuselet_tensor tr4 = view(r, {4});
  expect_error(fuselet_gated_rms_norm_fwd(&tx, &tx, &tw, 1e-6f, 0, 0, &ty, &tr4), "rstd: expected 2 elements",
               "gated: rstd of one group per row");
  expect(fuselet_gated_rms_norm_fwd(&tx, &tx, &tw, 1e-6f, 2, 0, &ty, &tr4) == FUSELET_OK,
         "gated: rstd of two groups per row");
  fuselet_tensor tz = view(x, {2, 2});
  expect_error(fuselet_gated_rms_norm_fwd(&tx, &tz, &tw, 1e-6f, 0, 0, &ty, &tr), "z: expected 2 rows of 4 elements",
               "gated: z shape");
  expect_error(fuselet_gated_rms_norm_fwd(&tx, nullptr, &tw, 1e-6f, 0, 0, &ty, &tr), "z: expected a tensor",
               "gated: NULL z");
  expect_error(fuselet_rms_norm_fwd(&tx, &tw, 1e-5f, FUSELET_NORM_GATE_FIRST, &ty, &tr), "flags: unknown bits 0x2",
               "rms_norm: FUSELET_NORM_GATE_FIRST is the gated norm's");
  expect_error(fuselet_gated_rms_norm_fwd(&tx, &tx, &tw, 1e-6f, 0, 4, &ty, &tr),
               "flags: unknown bits 0x4 (known: FUSELET_NORM_ZERO_CENTERED_GAMMA, FUSELET_NORM_GATE_FIRST)",
               "gated: unknown flag");
  float dx[8], dw[4];
  fuselet_tensor tdx = view(dx, {2, 4}), tdw = view(dw, {4});
  expect_error(fuselet_gated_rms_norm_bwd(&tx, &tx, &tx, &tw, &tr, 0, 0, &tdx, nullptr, &tdw), "dz: expected a tensor",
               "gated bwd: NULL dz");
  expect_error(fuselet_gated_rms_norm_bwd_check(&tx, &tx, &tx, &tw, &tr, 3, 0), "group_size: expected 0",
               "gated bwd check: group_size");
  fuselet_tensor nul = view(nullptr, {int64_t{1} << 40, 4}, {0, 1}), rn = view(nullptr, {int64_t{1} << 41}, {0});
  expect(fuselet_gated_rms_norm_fwd_check(&nul, &nul, nullptr, 1e-6f, 2, FUSELET_NORM_GATE_FIRST) == FUSELET_OK,
         "gated fwd check: stride-0 views");
  expect(fuselet_gated_rms_norm_bwd_check(&nul, &nul, &nul, nullptr, &rn, 2, 0) == FUSELET_OK,
         "gated bwd check: stride-0 views, two groups per row");
  {  // 0 rows: the backward zeroes dweight
    float dw0[4] = {9, 9, 9, 9};
    fuselet_tensor e = view(nullptr, {0, 4}), er = view(nullptr, {0}), tdw0 = view(dw0, {4});
    expect(fuselet_gated_rms_norm_bwd(&e, &e, &e, &tw, &er, 0, 0, &e, &e, &tdw0) == FUSELET_OK && dw0[3] == 0.f,
           "gated: 0-row backward zeroes dweight");
  }
  if (!fuselet_has_cuda())
    expect(fuselet_gated_rms_norm_fwd_cuda(&tx, &tx, &tw, 1e-6f, 0, 0, &ty, &tr, nullptr) == FUSELET_ERR_UNSUPPORTED,
           "gated: CUDA entry point of a CPU-only build");
}

void check_errors() {
  float x[6] = {1, 2, 3, 4, 5, 6}, w[3] = {1, 1, 1}, y[6], r[2];
  fuselet_tensor tx = view(x, {2, 3}), tw = view(w, {3}), ty = view(y, {2, 3}), tr = view(r, {2});
  expect_error(fuselet_rms_norm_fwd(&tx, &tw, 0.f, 0, &ty, &tr), "eps", "eps = 0");
  expect_error(fuselet_rms_norm_fwd(&tx, &tw, NAN, 0, &ty, &tr), "eps", "eps = NaN");
  fuselet_tensor tw2 = view(w, {2});
  expect_error(fuselet_rms_norm_fwd(&tx, &tw2, 1e-5f, 0, &ty, &tr), "weight", "weight of 2 for H = 3");
  fuselet_tensor th = view(w, {3}, {}, FUSELET_FLOAT16);
  expect_error(fuselet_rms_norm_fwd(&tx, &th, 1e-5f, 0, &ty, &tr),
               "weight: expected dtype float32 (the dtype of x), got float16", "weight dtype");
  {  // float32 parameters go with any x; other dtypes must be x's, and bias must match weight
    uint16_t xb[6] = {}, yb[6];
    fuselet_tensor txb = view(xb, {2, 3}, {}, FUSELET_BFLOAT16), tyb = view(yb, {2, 3}, {}, FUSELET_BFLOAT16);
    expect(fuselet_rms_norm_fwd(&txb, &tw, 1e-5f, 0, &tyb, &tr) == FUSELET_OK, "float32 weight with bfloat16 x");
    expect_error(fuselet_rms_norm_fwd(&txb, &th, 1e-5f, 0, &tyb, &tr),
                 "weight: expected dtype bfloat16 (the dtype of x) or float32, got float16", "float16 weight, bf16 x");
    float m[2];
    fuselet_tensor tbh = view(w, {3}, {}, FUSELET_BFLOAT16), tm = view(m, {2});
    expect_error(fuselet_layer_norm_fwd(&txb, &tw, &tbh, 1e-5f, 0, &tyb, &tm, &tr),
                 "bias: expected dtype float32 (the dtype of weight), got bfloat16", "bias dtype != weight dtype");
  }
  expect_error(fuselet_rms_norm_fwd(&tx, &tw, 1e-5f, 4, &ty, &tr), "flags: unknown bits 0x4", "unknown flag");
  expect_error(fuselet_rms_norm_fwd(&tx, nullptr, 1e-5f, FUSELET_NORM_ZERO_CENTERED_GAMMA, &ty, &tr),
               "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA scales by (1 + weight) and needs a weight, got weight=NULL",
               "zero-centered without weight");
  {
    float dw[3];
    fuselet_tensor tdw = view(dw, {3});
    expect_error(fuselet_rms_norm_bwd(&tx, &tx, &tw, &tr, 0, &ty, nullptr), "dweight: expected a tensor",
                 "weight without dweight");
    expect_error(fuselet_rms_norm_bwd(&tx, &tx, nullptr, &tr, 0, &ty, &tdw), "dweight: expected NULL",
                 "dweight without weight");
    fuselet_tensor tdwh = view(dw, {3}, {}, FUSELET_BFLOAT16);
    expect_error(fuselet_rms_norm_bwd(&tx, &tx, &tw, &tr, 0, &ty, &tdwh),
                 "dweight: expected dtype float32 (the dtype of weight), got bfloat16", "dweight dtype");
  }
  fuselet_tensor t0 = view(x, {2, 0});
  expect_error(fuselet_rms_norm_fwd(&t0, &tw, 1e-5f, 0, &ty, &tr), "hidden size", "H = 0");
  // A C caller (ctypes, C) may store any integer in the dtype field: stored as bytes, as it would.
  const int32_t code = 7;
  fuselet_tensor bad = tx;
  std::memcpy(&bad.dtype, &code, sizeof code);
  expect_error(fuselet_rms_norm_fwd(&bad, &tw, 1e-5f, 0, &ty, &tr), "x: expected dtype", "integer dtype code");
  fuselet_tensor badw = tw;
  std::memcpy(&badw.dtype, &code, sizeof code);
  expect_error(fuselet_rms_norm_fwd(&tx, &badw, 1e-5f, 0, &ty, &tr),
               "weight: expected dtype float32, float16 or bfloat16, got code 7", "integer dtype code of weight");
  expect_error(fuselet_rms_norm_fwd(nullptr, &tw, 1e-5f, 0, &ty, &tr), "x: expected a tensor", "NULL x");
  {  // the strided-view checks of the C API itself (the framework layers copy before calling)
    float big[64] = {};
    fuselet_tensor over = view(big, {4, 3}, {2, 1});     // row stride 2 < H = 3
    expect_error(fuselet_rms_norm_fwd(&over, &tw, 1e-5f, 0, &ty, &tr),
                 "x: rows overlap (row stride 2 < hidden size 3)", "overlapping rows");
    fuselet_tensor y4 = view(big, {4, 3}), r4 = view(big + 32, {4});
    fuselet_tensor gap = view(big, {2, 2, 3}, {16, 3, 1});  // dims 0 and 1 do not collapse into one stride
    expect_error(fuselet_rms_norm_fwd(&gap, &tw, 1e-5f, 0, &y4, &r4), "x: the leading dimensions must collapse",
                 "non-collapsible leading dims");
    fuselet_tensor null_x = tx;
    null_x.data = nullptr;
    expect_error(fuselet_rms_norm_fwd(&null_x, &tw, 1e-5f, 0, &ty, &tr), "x: data pointer is NULL", "NULL data");
    fuselet_tensor deep = tx;
    deep.ndim = FUSELET_MAX_DIMS + 1;
    expect_error(fuselet_rms_norm_fwd(&deep, &tw, 1e-5f, 0, &ty, &tr), "x: expected at most 8 dimensions, got 9",
                 "ndim > 8");
    fuselet_tensor r3 = view(big + 32, {3});
    expect_error(fuselet_rms_norm_fwd(&tx, &tw, 1e-5f, 0, &ty, &r3), "rstd", "rstd of 3 for 2 rows");
    float m3[3];
    fuselet_tensor tm3 = view(m3, {3});
    expect_error(fuselet_layer_norm_fwd(&tx, &tw, nullptr, 1e-5f, 0, &ty, &tm3, &tr), "mean", "mean of 3 for 2 rows");
    // a strided view that is valid: every other row of a buffer, through the C API directly
    float xs[4 * 6], ys[2 * 3], rs[2];
    for (int i = 0; i < 24; ++i) xs[i] = static_cast<float>(i % 7) - 3.f;
    fuselet_tensor every_other = view(xs, {2, 3}, {12, 1}), tys = view(ys, {2, 3}), trs = view(rs, {2});
    expect(fuselet_rms_norm_fwd(&every_other, &tw, 1e-5f, 0, &tys, &trs) == FUSELET_OK, "rows 12 elements apart");
    for (int r = 0; r < 2; ++r) {
      double ss = 0;
      for (int i = 0; i < 3; ++i) ss += double(xs[12 * r + i]) * xs[12 * r + i];
      const double rstd = 1.0 / std::sqrt(ss / 3 + 1e-5);
      for (int i = 0; i < 3; ++i)
        expect(std::fabs(ys[3 * r + i] - xs[12 * r + i] * rstd) < 1e-6, "strided row " + std::to_string(r) + " y");
    }
  }
  fuselet_tensor cols = view(x, {3, 2}, {1, 3});  // a transposed view: last dim not contiguous
  expect_error(fuselet_rms_norm_fwd(&cols, &tw2, 1e-5f, 0, &ty, &tr), "stride 1", "transposed x");
  expect(fuselet_set_num_threads(0) == FUSELET_ERR_INVALID_ARGUMENT, "set_num_threads(0) rejected");
  // The CUDA entry points of a CPU-only build say so; with CUDA they reject host garbage args.
  if (!fuselet_has_cuda())
    expect(fuselet_rms_norm_fwd_cuda(&tx, &tw, 1e-5f, 0, &ty, &tr, nullptr) == FUSELET_ERR_UNSUPPORTED,
           "CUDA entry point of a CPU-only build");
}

void check_empty_batch() {
  float w[4] = {1, 2, 3, 4}, dw[4] = {9, 9, 9, 9};
  fuselet_tensor tx = view(nullptr, {0, 4}), tw = view(w, {4}), tr = view(nullptr, {0}), tdw = view(dw, {4});
  expect(fuselet_rms_norm_bwd(&tx, &tx, &tw, &tr, 0, &tx, &tdw) == FUSELET_OK, "0-row backward succeeds");
  expect(dw[0] == 0 && dw[3] == 0, "0-row backward zeroes dweight");
}

// The `_check` functions: the entry points' checks of the inputs and options, on views of any
// strides >= 0 whose data is never read (NULL here), with the entry points' messages.
void check_arg_checks() {
  constexpr int64_t kHuge = int64_t{1} << 40;  // rows of a stride-0 view: nothing behind them
  fuselet_tensor x = view(nullptr, {kHuge, 8}, {0, 1}), w = view(nullptr, {8}, {0});
  fuselet_tensor r = view(nullptr, {kHuge}, {0});
  expect(fuselet_rms_norm_fwd_check(&x, &w, 1e-5f, 0) == FUSELET_OK && fuselet_last_error()[0] == '\0',
         "rms_norm_fwd_check: stride-0 views, NULL data");
  expect(fuselet_layer_norm_fwd_check(&x, &w, &w, 1e-5f, FUSELET_NORM_ZERO_CENTERED_GAMMA) == FUSELET_OK,
         "layer_norm_fwd_check: stride-0 views");
  expect(fuselet_rms_norm_bwd_check(&x, &x, &w, &r, 0) == FUSELET_OK, "rms_norm_bwd_check: stride-0 views");
  expect(fuselet_layer_norm_bwd_check(&x, &x, nullptr, &w, &r, &r, 0) == FUSELET_OK,
         "layer_norm_bwd_check: bias alone");
  expect(fuselet_add_rms_norm_fwd_check(&x, &x, nullptr, 1e-5f, 0) == FUSELET_OK, "add_rms_norm_fwd_check");
  expect(fuselet_add_rms_norm_bwd_check(&x, &x, &x, &w, &r, 0) == FUSELET_OK, "add_rms_norm_bwd_check");
  fuselet_tensor cols = view(nullptr, {8, 3}, {1, 8});  // transposed: the entry point needs a copy
  fuselet_tensor w3 = view(nullptr, {3});
  expect(fuselet_rms_norm_fwd_check(&cols, &w3, 1e-5f, 0) == FUSELET_OK, "rms_norm_fwd_check: a transposed x");

  fuselet_tensor w5 = view(nullptr, {5});
  expect_error(fuselet_rms_norm_fwd_check(&x, &w5, 1e-5f, 0),
               "weight: expected shape [8] to match the last dimension of x [1099511627776, 8], got [5]",
               "rms_norm_fwd_check: weight size");
  expect_error(fuselet_rms_norm_fwd_check(&x, &w, 0.f, 0), "eps: expected a finite number > 0, got 0.0",
               "rms_norm_fwd_check: eps");
  expect_error(fuselet_rms_norm_fwd_check(&x, nullptr, 1e-5f, FUSELET_NORM_ZERO_CENTERED_GAMMA),
               "flags: FUSELET_NORM_ZERO_CENTERED_GAMMA scales by (1 + weight) and needs a weight, got weight=NULL",
               "rms_norm_fwd_check: zero-centered");
  fuselet_tensor rev = view(nullptr, {4, 8}, {-8, 1});
  expect_error(fuselet_rms_norm_fwd_check(&rev, &w, 1e-5f, 0), "x: negative strides are not supported",
               "rms_norm_fwd_check: negative strides");
  fuselet_tensor wb = view(nullptr, {8}, {1}, FUSELET_BFLOAT16);
  expect_error(fuselet_layer_norm_bwd_check(&x, &x, &w, &wb, &r, &r, 0),
               "bias: expected dtype float32 (the dtype of weight), got bfloat16", "layer_norm_bwd_check: bias dtype");
  fuselet_tensor r3 = view(nullptr, {3});
  expect_error(fuselet_layer_norm_bwd_check(&x, &x, &w, nullptr, &r3, &r, 0), "mean: expected 1099511627776 elements",
               "layer_norm_bwd_check: mean size");
  fuselet_tensor xb = view(nullptr, {kHuge, 8}, {0, 1}, FUSELET_BFLOAT16);
  expect_error(fuselet_add_rms_norm_fwd_check(&x, &xb, nullptr, 1e-5f, 0),
               "residual: expected dtype float32 (the dtype of x), got bfloat16", "add_rms_norm_fwd_check: residual");
  fuselet_tensor h0 = view(nullptr, {4, 0});
  expect_error(fuselet_add_rms_norm_bwd_check(&h0, &h0, &h0, nullptr, &r3, 0),
               "residual_out: the hidden size (last dimension) must be > 0",
               "add_rms_norm_bwd_check: names residual_out");
  expect_error(fuselet_add_rms_norm_bwd_check(&x, &xb, &x, nullptr, &r, 0),
               "dresidual_out: expected dtype float32 (the dtype of residual_out), got bfloat16",
               "add_rms_norm_bwd_check: dresidual_out dtype");
  // The entry point runs the same check first: the same message for the same input.
  float buf[64] = {}, rb[8];
  fuselet_tensor tx = view(buf, {8, 8}), ty = view(buf + 64 - 8, {1, 8}), tr = view(rb, {8});
  expect_error(fuselet_rms_norm_fwd(&tx, &w5, 1e-5f, 0, &ty, &tr),
               "weight: expected shape [8] to match the last dimension of x [8, 8], got [5]",
               "rms_norm_fwd: the check's message");
}

}  // namespace

int main() {
  std::printf("libfuselet %s, cuda=%d, threads=%d\n", fuselet_version(), fuselet_has_cuda(),
              fuselet_get_num_threads());
  for (bool layer : {false, true})
    for (int64_t H : {1, 3, 127, 1024, 4097}) {
      check_numerics(1, H, H, layer);
      check_numerics(67, H, H, layer);
      check_numerics(9, H, H + 5, layer);  // rows of a wider buffer
    }
  for (bool layer : {false, true})
    for (int64_t H : {3, 1024}) {
      check_numerics(67, H, H, layer, /*has_w=*/false, /*has_b=*/false);
      check_numerics(67, H, H, layer, /*has_w=*/true, /*has_b=*/false, /*zc=*/true);
      check_numerics(67, H, H, layer, /*has_w=*/false, /*has_b=*/true);
    }
  fuselet_set_num_threads(1);
  check_numerics(33, 256, 256, true);
  fuselet_set_num_threads(3);
  check_numerics(333, 64, 64, false);
  for (int64_t H : {1, 3, 127, 4097}) check_add_rms_norm(19, H);
  for (fuselet_dtype dt : {FUSELET_FLOAT32, FUSELET_FLOAT16, FUSELET_BFLOAT16}) {
    check_stats(dt, 0.f, 1.f, 1e-6f);
    check_stats(dt, 1e3f, 1.f, 1e-3f);    // large mean, small variance: a one-pass variance fails
    check_stats(dt, 300.f, 10.f, 1e-5f);  // x^2 > 65504: overflows where squares are kept in float16
    // |x| ~ 1e30 (float32, bfloat16): the float32 sum of squares overflows; the row is rescaled
    if (dt != FUSELET_FLOAT16) check_stats(dt, 0.f, 1e30f, 1e-5f);
  }
  {
    float a[6] = {}, b[4] = {}, w[3] = {1, 1, 1}, o[6], h[6], r[2];
    fuselet_tensor ta = view(a, {2, 3}), tb = view(b, {2, 2}), tw = view(w, {3}), to = view(o, {2, 3}),
                   th = view(h, {2, 3}), tr = view(r, {2});
    expect_error(fuselet_add_rms_norm_fwd(&ta, &tb, &tw, 1e-5f, 0, &to, &th, &tr), "residual: expected 2 rows of 3",
                 "add_rms_norm residual shape");
    expect_error(fuselet_add_rms_norm_fwd(&ta, &ta, &tw, 1e-5f, 0, &to, nullptr, &tr),
                 "residual_out: expected a tensor", "add_rms_norm NULL residual_out");
  }
  for (bool gate_first : {false, true})
    for (int64_t H : {1, 7, 128, 4097}) {
      check_gated(1, H, 0, gate_first);
      check_gated(37, H, 0, gate_first);
    }
  for (bool gate_first : {false, true}) {
    check_gated(37, 256, 64, gate_first);  // Qwen3-Next's shape: groups of the head dim
    check_gated(5, 12, 1, gate_first);     // one element per group
    check_gated(19, 96, 32, gate_first, /*has_w=*/false);
  }
  check_errors();
  check_gated_errors();
  check_empty_batch();
  check_arg_checks();
  return fuselet_test::report();
}
