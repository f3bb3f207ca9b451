// C++ test of the framework-free core: CPU cross-entropy (forward, backward, fused forward +
// backward, in place) and log-probabilities (every output, the entropy's gradient) against a
// float64 reference, and the error values of the C ABI.
// Prints "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "fuselet/cross_entropy.h"

namespace {

using fuselet_test::expect;
using fuselet_test::expect_error;
using fuselet_test::view;

struct Ref {
  std::vector<double> loss, z, dx;
};

// float64 reference of the header's math; g: the upstream gradient of each row.
Ref reference(const std::vector<float>& x, const std::vector<int64_t>& t, int64_t V,
              const fuselet_cross_entropy_options& o, const std::vector<float>& g) {
  const int64_t N = static_cast<int64_t>(t.size());
  Ref out{std::vector<double>(N), std::vector<double>(N), std::vector<double>(N * V)};
  for (int64_t r = 0; r < N; ++r) {
    if (t[r] == o.ignore_index) continue;
    std::vector<double> s(V);
    double m = -INFINITY, sum = 0, mean = 0;
    for (int64_t j = 0; j < V; ++j) {
      s[j] = o.softcap > 0 ? o.softcap * std::tanh(double(x[r * V + j]) / o.softcap) : double(x[r * V + j]);
      m = std::fmax(m, s[j]);
      mean += s[j] / V;
    }
    for (int64_t j = 0; j < V; ++j) sum += std::exp(s[j] - m);
    const double lse = m + std::log(sum), ls = o.label_smoothing, zl = o.z_loss;
    out.z[r] = zl * lse * lse;
    out.loss[r] = (1 - ls) * (lse - s[t[r]]) + ls * (lse - mean) + out.z[r];
    for (int64_t j = 0; j < V; ++j) {
      double d = g[r] * (std::exp(s[j] - lse) * (1 + 2 * zl * lse) - (1 - ls) * (j == t[r]) - ls / V);
      if (o.softcap > 0) d *= 1 - (s[j] / o.softcap) * (s[j] / o.softcap);
      out.dx[r * V + j] = d;
    }
  }
  return out;
}

double max_err(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i)
    err = std::fmax(err, std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i])));
  return std::isnan(err) ? INFINITY : err;
}

void check(int64_t N, int64_t V, fuselet_cross_entropy_options o, bool target64, const std::string& what) {
  std::mt19937 rng(static_cast<unsigned>(N * 31 + V));
  std::normal_distribution<float> dist(0.5f, 3.0f);
  std::uniform_int_distribution<int64_t> cls(0, V - 1);
  std::vector<float> x(N * V), g(N), loss(N), z(N), lse(N), dx(N * V), dx2(N * V), loss2(N), z2(N);
  std::vector<int64_t> t(N);
  std::vector<int32_t> t32(N);
  for (auto& v : x) v = dist(rng);
  for (int64_t r = 0; r < N; ++r) {
    t[r] = r % 3 == 1 ? o.ignore_index : cls(rng);
    t32[r] = static_cast<int32_t>(t[r]);
    g[r] = dist(rng);
  }
  const std::string name =
      what + " N=" + std::to_string(N) + " V=" + std::to_string(V) + (target64 ? " int64" : " int32");
  fuselet_tensor tx = view(x.data(), {N, V}, {}, FUSELET_FLOAT32), tdx = view(dx.data(), {N, V}, {}, FUSELET_FLOAT32);
  fuselet_tensor tt = target64 ? view(t.data(), {N}, {}, FUSELET_INT64) : view(t32.data(), {N}, {}, FUSELET_INT32);
  fuselet_tensor tg = view(g.data(), {N}, {}, FUSELET_FLOAT32), tl = view(loss.data(), {N}, {}, FUSELET_FLOAT32),
                 tz = view(z.data(), {N}, {}, FUSELET_FLOAT32), tlse = view(lse.data(), {N}, {}, FUSELET_FLOAT32);
  expect(fuselet_cross_entropy_fwd(&tx, &tt, &o, &tl, &tz, &tlse) == FUSELET_OK, name + " fwd");
  expect(fuselet_cross_entropy_bwd(&tg, &tx, &tt, &tlse, &o, &tdx) == FUSELET_OK, name + " bwd");
  const Ref want = reference(x, t, V, o, g);
  expect(max_err(loss, want.loss) < 2e-5, name + " loss, max error " + std::to_string(max_err(loss, want.loss)));
  expect(max_err(z, want.z) < 2e-5, name + " z, max error " + std::to_string(max_err(z, want.z)));
  expect(max_err(dx, want.dx) < 2e-6, name + " dlogits, max error " + std::to_string(max_err(dx, want.dx)));
  for (int64_t r = 1; r < N; r += 3) expect(lse[r] == 0.f && loss[r] == 0.f, name + " ignored row zeros");
  // fwd_bwd with grad_scale 0.5, in place (dlogits = the logits), z not asked for.
  std::vector<float> xi = x;
  fuselet_tensor txi = view(xi.data(), {N, V}, {}, FUSELET_FLOAT32),
                 tl2 = view(loss2.data(), {N}, {}, FUSELET_FLOAT32);
  expect(fuselet_cross_entropy_fwd_bwd(&txi, &tt, &o, 0.5f, &tl2, nullptr, &txi) == FUSELET_OK, name + " fwd_bwd");
  const Ref half = reference(x, t, V, o, std::vector<float>(N, 0.5f));
  expect(max_err(loss2, want.loss) < 2e-5, name + " fwd_bwd loss");
  expect(max_err(xi, half.dx) < 2e-6,
         name + " fwd_bwd in-place dlogits, max error " + std::to_string(max_err(xi, half.dx)));
  // bwd in place.
  xi = x;
  expect(fuselet_cross_entropy_bwd(&tg, &txi, &tt, &tlse, &o, &txi) == FUSELET_OK, name + " bwd in place");
  expect(max_err(xi, want.dx) < 2e-6, name + " bwd in-place dlogits");
}

// bfloat16 logits: the core's results against float32 logits holding the same values.
void check_bf16(int64_t N, int64_t V) {
  std::vector<uint16_t> xb(N * V), dxb(N * V);
  std::vector<float> x(N * V), loss(N), lse(N), loss32(N), lse32(N), dx32(N * V), g(N, 1.f);
  std::vector<int64_t> t(N);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 4.f);
  for (int64_t i = 0; i < N * V; ++i) {
    uint32_t u;
    const float f = dist(rng);
    std::memcpy(&u, &f, 4);
    xb[i] = static_cast<uint16_t>(u >> 16);
    u = static_cast<uint32_t>(xb[i]) << 16;
    std::memcpy(&x[i], &u, 4);
  }
  for (int64_t r = 0; r < N; ++r) t[r] = (r * 7919) % V;
  fuselet_cross_entropy_options o{-100, 0.1f, 1e-4f, 30.f};
  fuselet_tensor tx = view(xb.data(), {N, V}, {}, FUSELET_BFLOAT16),
                 tdx = view(dxb.data(), {N, V}, {}, FUSELET_BFLOAT16), tt = view(t.data(), {N}, {}, FUSELET_INT64),
                 tl = view(loss.data(), {N}, {}, FUSELET_FLOAT32), tlse = view(lse.data(), {N}, {}, FUSELET_FLOAT32),
                 tg = view(g.data(), {N}, {}, FUSELET_FLOAT32);
  expect(fuselet_cross_entropy_fwd(&tx, &tt, &o, &tl, nullptr, &tlse) == FUSELET_OK &&
             fuselet_cross_entropy_bwd(&tg, &tx, &tt, &tlse, &o, &tdx) == FUSELET_OK,
         "bf16 fwd + bwd");
  const Ref want = reference(x, t, V, o, g);
  std::vector<float> dx(N * V);
  for (int64_t i = 0; i < N * V; ++i) {
    const uint32_t u = static_cast<uint32_t>(dxb[i]) << 16;
    std::memcpy(&dx[i], &u, 4);
  }
  expect(max_err(loss, want.loss) < 2e-5, "bf16 loss");
  expect(max_err(dx, want.dx) < 8e-3, "bf16 dlogits, max error " + std::to_string(max_err(dx, want.dx)));
}

void errors() {
  float x[6] = {0, 1, 2, 3, 4, 5}, loss[2], lse[2], dx[6], g[2] = {1, 1};
  int64_t t[2] = {1, 2}, bad[2] = {0, 3};
  int32_t t32[2] = {2, -100};
  fuselet_cross_entropy_options o{-100, 0.f, 0.f, 0.f};
  fuselet_tensor tx = view(x, {2, 3}, {}, FUSELET_FLOAT32), tt = view(t, {2}, {}, FUSELET_INT64),
                 tl = view(loss, {2}, {}, FUSELET_FLOAT32), tlse = view(lse, {2}, {}, FUSELET_FLOAT32),
                 tdx = view(dx, {2, 3}, {}, FUSELET_FLOAT32), tg = view(g, {2}, {}, FUSELET_FLOAT32);
  expect(fuselet_cross_entropy_fwd(&tx, &tt, &o, &tl, nullptr, &tlse) == FUSELET_OK, "plain call");
  fuselet_tensor tb = view(bad, {2}, {}, FUSELET_INT64);
  expect_error(fuselet_cross_entropy_fwd(&tx, &tb, &o, &tl, nullptr, &tlse), "target: element 1 is 3, outside [0, 3)",
               "target out of range");
  expect_error(fuselet_cross_entropy_bwd(&tg, &tx, &tb, &tlse, &o, &tdx), "target: element 1 is 3",
               "bwd target range");
  fuselet_tensor t32v = view(t32, {2}, {}, FUSELET_INT32);
  expect(fuselet_cross_entropy_fwd(&tx, &t32v, &o, &tl, nullptr, &tlse) == FUSELET_OK && loss[1] == 0.f,
         "int32 target with an ignored row");
  fuselet_tensor tf = view(x, {2}, {}, FUSELET_FLOAT32);
  expect_error(fuselet_cross_entropy_fwd(&tx, &tf, &o, &tl, nullptr, &tlse), "target: expected dtype int32 or int64",
               "float target");
  fuselet_tensor t3 = view(t, {1}, {}, FUSELET_INT64);
  expect_error(fuselet_cross_entropy_fwd(&tx, &t3, &o, &tl, nullptr, &tlse), "target: expected 2 elements",
               "target size");
  fuselet_tensor xi = view(t, {2, 1}, {}, FUSELET_INT64);
  expect_error(fuselet_cross_entropy_fwd(&xi, &tt, &o, &tl, nullptr, &tlse),
               "logits: expected dtype float32, float16 or bfloat16, got int64", "integer logits");
  fuselet_tensor x0 = view(x, {2, 0}, {}, FUSELET_FLOAT32);
  expect_error(fuselet_cross_entropy_fwd(&x0, &tt, &o, &tl, nullptr, &tlse),
               "logits: the number of classes (last dimension) must be > 0, got shape [2, 0]", "V = 0");
  fuselet_tensor huge = view(x, {int64_t{1} << 40, int64_t{1} << 30}, {}, FUSELET_FLOAT32);
  expect_error(fuselet_cross_entropy_fwd(&huge, &tt, &o, &tl, nullptr, &tlse),
               "logits: the number of elements of shape [1099511627776, 1073741824] overflows int64",
               "element count overflow");
  fuselet_cross_entropy_options b = o;
  b.label_smoothing = 1.5f;
  expect_error(fuselet_cross_entropy_fwd(&tx, &tt, &b, &tl, nullptr, &tlse),
               "label_smoothing: expected a number in [0, 1]", "label_smoothing");
  b = o;
  b.z_loss = NAN;
  expect_error(fuselet_cross_entropy_fwd(&tx, &tt, &b, &tl, nullptr, &tlse), "z_loss: expected a finite number >= 0",
               "z_loss");
  b = o;
  b.softcap = -1.f;
  expect_error(fuselet_cross_entropy_fwd(&tx, &tt, &b, &tl, nullptr, &tlse),
               "softcap: expected 0 (none) or a finite number > 0, got -1.0", "softcap");
  expect_error(fuselet_cross_entropy_fwd(&tx, &tt, nullptr, &tl, nullptr, &tlse), "opts: expected the options",
               "NULL opts");
  fuselet_tensor tl3 = view(loss, {3}, {}, FUSELET_FLOAT32);
  expect_error(fuselet_cross_entropy_fwd(&tx, &tt, &o, &tl3, nullptr, &tlse), "loss: expected 2 elements",
               "loss size");
  expect_error(fuselet_cross_entropy_fwd(&tx, &tt, &o, &tl, nullptr, nullptr), "lse: expected a tensor", "NULL lse");
  fuselet_tensor th = view(dx, {2, 3}, {}, FUSELET_FLOAT16);
  expect_error(fuselet_cross_entropy_bwd(&tg, &tx, &tt, &tlse, &o, &th),
               "dlogits: expected dtype float32 (the dtype of logits)", "dlogits dtype");
  expect_error(fuselet_cross_entropy_fwd_bwd(&tx, &tt, &o, INFINITY, &tl, nullptr, &tdx),
               "grad_scale: expected a finite", "grad_scale");
  {  // the `_check` functions: stride-0 and strided views with no data, the entry points' messages
    const int64_t N = int64_t{1} << 40;
    const fuselet_tensor big = view(nullptr, {N, 8}, {0, 1}), t = view(nullptr, {N}, {0}, FUSELET_INT64),
                         g = view(nullptr, {N}, {0});
    const fuselet_tensor cols = view(nullptr, {8, 3}, {1, 8}), t8 = view(nullptr, {8}, {2}, FUSELET_INT32),
                         g8 = view(nullptr, {8}, {3});
    expect(fuselet_cross_entropy_fwd_check(&big, &t, &o) == FUSELET_OK, "fwd_check: stride-0 views");
    expect(fuselet_cross_entropy_bwd_check(&g, &big, &t, &g, &o) == FUSELET_OK, "bwd_check: stride-0 views");
    expect(fuselet_cross_entropy_bwd_check(&g8, &cols, &t8, &g8, &o) == FUSELET_OK, "bwd_check: strided views");
    expect(fuselet_cross_entropy_fwd_bwd_check(&cols, &t8, &o, 0.5f) == FUSELET_OK, "fwd_bwd_check: strided views");
    expect_error(fuselet_cross_entropy_fwd_bwd_check(&big, &t, &o, NAN), "grad_scale: expected a finite",
                 "fwd_bwd_check: grad_scale");
    expect_error(fuselet_cross_entropy_fwd_check(&big, &t8, &o), "target: expected 1099511627776 elements",
                 "fwd_check: target size");
    expect_error(fuselet_cross_entropy_fwd_check(&big, &g, &o), "target: expected dtype int32 or int64",
                 "fwd_check: target dtype");
    fuselet_cross_entropy_options bad = o;
    bad.softcap = -1.f;
    expect_error(fuselet_cross_entropy_bwd_check(&g, &big, &t, &g, &bad),
                 "softcap: expected 0 (none) or a finite number > 0, got -1.0", "bwd_check: softcap");
    expect_error(fuselet_cross_entropy_bwd_check(&g, &big, &t, &g8, &o), "lse: expected 1099511627776 elements",
                 "bwd_check: lse size");
  }
  if (!fuselet_has_cuda())
    expect(fuselet_cross_entropy_fwd_cuda(&tx, &tt, &o, &tl, nullptr, &tlse, nullptr) == FUSELET_ERR_UNSUPPORTED,
           "CPU-only build");
}

// --- the log-probabilities (fuselet_logprobs_*) ---------------------------------------------

struct LogprobsRef {
  std::vector<double> logp, lse, entropy, lssp, mean, top1, dx;
};

// float64 reference of the header's math; g, h: dlogp and dentropy of each row.
LogprobsRef logprobs_reference(const std::vector<float>& x, const std::vector<int64_t>& t, int64_t V, int64_t ignore,
                               float c, const std::vector<float>& g, const std::vector<float>& h) {
  const int64_t N = static_cast<int64_t>(t.size());
  LogprobsRef o{std::vector<double>(N), std::vector<double>(N), std::vector<double>(N),    std::vector<double>(N),
                std::vector<double>(N), std::vector<double>(N), std::vector<double>(N * V)};
  for (int64_t r = 0; r < N; ++r) {
    if (t[r] == ignore) continue;
    std::vector<double> s(V), p(V);
    double m = -INFINITY, sum = 0, sq = 0, mean = 0;
    int64_t arg = 0;
    for (int64_t j = 0; j < V; ++j) {
      s[j] = c > 0 ? c * std::tanh(double(x[r * V + j]) / c) : double(x[r * V + j]);
      if (s[j] > m) m = s[j], arg = j;
      mean += s[j] / V;
    }
    for (int64_t j = 0; j < V; ++j) sum += std::exp(s[j] - m), sq += std::exp(2 * (s[j] - m));
    const double lse = m + std::log(sum);
    double ent = lse;
    for (int64_t j = 0; j < V; ++j) p[j] = std::exp(s[j] - lse), ent -= p[j] * s[j];
    o.logp[r] = s[t[r]] - lse;
    o.lse[r] = lse;
    o.entropy[r] = ent;
    o.lssp[r] = std::log(sq) - 2 * std::log(sum);
    o.mean[r] = mean;
    o.top1[r] = arg == t[r];
    for (int64_t j = 0; j < V; ++j) {
      double d = g[r] * ((j == t[r]) - p[j]) - h[r] * p[j] * ((s[j] - lse) + ent);
      if (c > 0) d *= 1 - (s[j] / c) * (s[j] / c);
      o.dx[r * V + j] = d;
    }
  }
  return o;
}

// Forward (every output, then none of the optional ones) and backward (dlogp and dentropy, each
// alone, in place) against the reference. Rows 2 mod 4 tie the target's logit with another
// class's, before it (is_top1 0) or after it (1), at the row's max.
void check_logprobs(int64_t N, int64_t V, int64_t ignore, float c, bool target64, const std::string& what) {
  std::mt19937 rng(static_cast<unsigned>(N * 17 + V));
  std::normal_distribution<float> dist(0.5f, 3.0f);
  std::uniform_int_distribution<int64_t> cls(0, V - 1);
  std::vector<float> x(N * V), g(N), h(N), zeros(N, 0.f), out[6], dx(N * V), lp2(N), lse2(N);
  for (auto& v : out) v.resize(N);
  std::vector<int64_t> t(N);
  std::vector<int32_t> t32(N);
  for (auto& v : x) v = dist(rng);
  for (int64_t r = 0; r < N; ++r) {
    t[r] = r % 4 == 1 ? ignore : cls(rng);
    t32[r] = static_cast<int32_t>(t[r]);
    g[r] = dist(rng);
    h[r] = dist(rng);
    if (r % 4 == 2 && V > 1 && t[r] != ignore) {
      const int64_t other = r % 8 == 2 ? (t[r] + V - 1) % V : (t[r] + 1) % V;
      x[r * V + t[r]] = x[r * V + other] = 40.f;
    }
  }
  const std::string name = what + " N=" + std::to_string(N) + " V=" + std::to_string(V);
  const fuselet_cross_entropy_options o{ignore, 0.f, 0.f, c};
  fuselet_tensor tx = view(x.data(), {N, V}, {}, FUSELET_FLOAT32), tdx = view(dx.data(), {N, V}, {}, FUSELET_FLOAT32);
  fuselet_tensor tt = target64 ? view(t.data(), {N}, {}, FUSELET_INT64) : view(t32.data(), {N}, {}, FUSELET_INT32);
  fuselet_tensor to[6], tg = view(g.data(), {N}, {}, FUSELET_FLOAT32), th = view(h.data(), {N}, {}, FUSELET_FLOAT32);
  for (int k = 0; k < 6; ++k) to[k] = view(out[k].data(), {N}, {}, FUSELET_FLOAT32);
  expect(fuselet_logprobs_fwd(&tx, &tt, &o, &to[0], &to[1], &to[2], &to[3], &to[4], &to[5]) == FUSELET_OK,
         name + " fwd");
  const LogprobsRef want = logprobs_reference(x, t, V, ignore, c, g, h);
  const std::vector<double>* wants[6] = {&want.logp, &want.lse, &want.entropy, &want.lssp, &want.mean, &want.top1};
  const char* names[6] = {" logp", " lse", " entropy", " log_sum_sq_probs", " mean_logits", " is_top1"};
  for (int k = 0; k < 6; ++k)
    expect(max_err(out[k], *wants[k]) < (k == 5 ? 1e-12 : 2e-5),
           name + names[k] + ", max error " + std::to_string(max_err(out[k], *wants[k])));
  bool ignored = true;
  for (int64_t r = 1; r < N; r += 4)
    for (int k = 0; k < 6; ++k) ignored = ignored && out[k][r] == 0.f;
  expect(ignored, name + " ignored rows: zeros");
  // The optional outputs not asked for: logp and lse alike.
  fuselet_tensor tl2 = view(lp2.data(), {N}, {}, FUSELET_FLOAT32), tlse2 = view(lse2.data(), {N}, {}, FUSELET_FLOAT32);
  expect(fuselet_logprobs_fwd(&tx, &tt, &o, &tl2, &tlse2, nullptr, nullptr, nullptr, nullptr) == FUSELET_OK &&
             lp2 == out[0] && lse2 == out[1],
         name + " fwd without the optional outputs");
  // Backward with both gradients, then each alone (the reference with the other 0).
  expect(fuselet_logprobs_bwd(&tg, &th, &tx, &tt, &to[1], &to[2], &o, &tdx) == FUSELET_OK, name + " bwd");
  expect(max_err(dx, want.dx) < 2e-5, name + " dlogits, max error " + std::to_string(max_err(dx, want.dx)));
  const LogprobsRef only_g = logprobs_reference(x, t, V, ignore, c, g, zeros);
  expect(fuselet_logprobs_bwd(&tg, nullptr, &tx, &tt, &to[1], nullptr, &o, &tdx) == FUSELET_OK &&
             max_err(dx, only_g.dx) < 2e-5,
         name + " bwd of dlogp alone, max error " + std::to_string(max_err(dx, only_g.dx)));
  const LogprobsRef only_h = logprobs_reference(x, t, V, ignore, c, zeros, h);
  expect(fuselet_logprobs_bwd(nullptr, &th, &tx, &tt, &to[1], &to[2], &o, &tdx) == FUSELET_OK &&
             max_err(dx, only_h.dx) < 2e-5,
         name + " bwd of dentropy alone, max error " + std::to_string(max_err(dx, only_h.dx)));
  std::vector<float> xi = x;
  fuselet_tensor txi = view(xi.data(), {N, V}, {}, FUSELET_FLOAT32);
  expect(
      fuselet_logprobs_bwd(&tg, &th, &txi, &tt, &to[1], &to[2], &o, &txi) == FUSELET_OK && max_err(xi, want.dx) < 2e-5,
      name + " bwd in place");
}

// A class masked to -inf (p = 0): every output as without it, finite, and no gradient there.
void check_logprobs_masked() {
  const int64_t V = 37;
  std::vector<float> x(2 * V), out[4], dx(2 * V);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 2.f);
  for (auto& v : x) v = dist(rng);
  x[V + 5] = -INFINITY;  // row 1 masks class 5; row 0 is the same row with class 5 at a value whose p is 0 in float64
  for (int64_t j = 0; j < V; ++j) x[j] = x[V + j];
  x[5] = -1e30f;
  for (auto& v : out) v.resize(2);
  std::vector<int64_t> t = {3, 3};
  std::vector<float> g = {0.7f, 0.7f}, h = {-1.3f, -1.3f};
  const fuselet_cross_entropy_options o{-100, 0.f, 0.f, 0.f};
  fuselet_tensor tx = view(x.data(), {2, V}, {}, FUSELET_FLOAT32), tt = view(t.data(), {2}, {}, FUSELET_INT64),
                 tdx = view(dx.data(), {2, V}, {}, FUSELET_FLOAT32), tg = view(g.data(), {2}, {}, FUSELET_FLOAT32),
                 th = view(h.data(), {2}, {}, FUSELET_FLOAT32), to[4];
  for (int k = 0; k < 4; ++k) to[k] = view(out[k].data(), {2}, {}, FUSELET_FLOAT32);
  expect(fuselet_logprobs_fwd(&tx, &tt, &o, &to[0], &to[1], &to[2], &to[3], nullptr, nullptr) == FUSELET_OK &&
             fuselet_logprobs_bwd(&tg, &th, &tx, &tt, &to[1], &to[2], &o, &tdx) == FUSELET_OK,
         "logprobs masked class: fwd + bwd");
  bool same = true;
  for (int k = 0; k < 4; ++k) same = same && std::isfinite(out[k][1]) && std::fabs(out[k][1] - out[k][0]) < 1e-6f;
  for (int64_t j = 0; j < V; ++j) same = same && std::isfinite(dx[V + j]) && std::fabs(dx[V + j] - dx[j]) < 1e-6f;
  expect(same && dx[V + 5] == 0.f, "logprobs masked class (-inf): finite, as a class of p = 0, no gradient");
}

void logprobs_errors() {
  float x[6] = {0, 1, 2, 3, 4, 5}, lp[2], lse[2], ent[2], dx[6], g[2] = {1, 1};
  int64_t t[2] = {1, 2}, bad[2] = {0, 3};
  fuselet_cross_entropy_options o{-100, 0.f, 0.f, 0.f};
  fuselet_tensor tx = view(x, {2, 3}, {}, FUSELET_FLOAT32), tt = view(t, {2}, {}, FUSELET_INT64),
                 tl = view(lp, {2}, {}, FUSELET_FLOAT32), tlse = view(lse, {2}, {}, FUSELET_FLOAT32),
                 te = view(ent, {2}, {}, FUSELET_FLOAT32), tdx = view(dx, {2, 3}, {}, FUSELET_FLOAT32),
                 tg = view(g, {2}, {}, FUSELET_FLOAT32), tb = view(bad, {2}, {}, FUSELET_INT64);
  expect(fuselet_logprobs_fwd(&tx, &tt, &o, &tl, &tlse, &te, nullptr, nullptr, nullptr) == FUSELET_OK,
         "logprobs plain call");
  expect_error(fuselet_logprobs_fwd(&tx, &tb, &o, &tl, &tlse, nullptr, nullptr, nullptr, nullptr),
               "target: element 1 is 3, outside [0, 3)", "logprobs target out of range");
  expect_error(fuselet_logprobs_bwd(&tg, nullptr, &tx, &tb, &tlse, nullptr, &o, &tdx), "target: element 1 is 3",
               "logprobs bwd target range");
  fuselet_cross_entropy_options b = o;
  b.label_smoothing = 0.1f;
  expect_error(fuselet_logprobs_fwd(&tx, &tt, &b, &tl, &tlse, nullptr, nullptr, nullptr, nullptr),
               "label_smoothing: expected 0 (the log-probabilities take no label smoothing), got 0.1",
               "logprobs label_smoothing");
  expect_error(fuselet_logprobs_bwd_check(&tg, nullptr, &tx, &tt, &tlse, nullptr, &b), "label_smoothing: expected 0",
               "logprobs bwd_check label_smoothing");
  b = o;
  b.z_loss = 1e-4f;
  expect_error(fuselet_logprobs_fwd_check(&tx, &tt, &b), "z_loss: expected 0 (the log-probabilities take no z-loss)",
               "logprobs z_loss");
  b = o;
  b.softcap = -1.f;
  expect_error(fuselet_logprobs_fwd_check(&tx, &tt, &b), "softcap: expected 0 (none) or a finite number > 0",
               "logprobs softcap");
  expect_error(fuselet_logprobs_fwd_check(&tx, &tt, nullptr), "opts: expected the options", "logprobs NULL opts");
  expect_error(fuselet_logprobs_fwd(&tx, &tt, &o, nullptr, &tlse, nullptr, nullptr, nullptr, nullptr),
               "logp: expected a tensor", "logprobs NULL logp");
  fuselet_tensor t3 = view(ent, {3}, {}, FUSELET_FLOAT32);
  expect_error(fuselet_logprobs_fwd(&tx, &tt, &o, &tl, &tlse, nullptr, nullptr, &t3, nullptr),
               "mean_logits: expected 2 elements", "logprobs mean_logits size");
  expect_error(fuselet_logprobs_bwd(&tg, &tg, &tx, &tt, &tlse, nullptr, &o, &tdx),
               "entropy: expected a tensor (the forward's entropy, needed with dentropy), got NULL",
               "logprobs dentropy without entropy");
  expect_error(fuselet_logprobs_bwd_check(&t3, nullptr, &tx, &tt, &tlse, nullptr, &o), "dlogp: expected 2 elements",
               "logprobs dlogp size");
  expect_error(fuselet_logprobs_bwd_check(nullptr, &t3, &tx, &tt, &tlse, &te, &o), "dentropy: expected 2 elements",
               "logprobs dentropy size");
  expect_error(fuselet_logprobs_bwd_check(&tg, nullptr, &tx, &tt, nullptr, nullptr, &o), "lse: expected a tensor",
               "logprobs NULL lse");
  expect(fuselet_logprobs_bwd(nullptr, nullptr, &tx, &tt, &tlse, nullptr, &o, &tdx) == FUSELET_OK && dx[0] == 0.f &&
             dx[5] == 0.f,
         "logprobs bwd of no gradient: zeros");
  {  // stride-0 views with no data
    const int64_t N = int64_t{1} << 40;
    const fuselet_tensor big = view(nullptr, {N, 8}, {0, 1}), tn = view(nullptr, {N}, {0}, FUSELET_INT64),
                         gn = view(nullptr, {N}, {0});
    expect(fuselet_logprobs_fwd_check(&big, &tn, &o) == FUSELET_OK, "logprobs fwd_check: stride-0 views");
    expect(fuselet_logprobs_bwd_check(&gn, &gn, &big, &tn, &gn, &gn, &o) == FUSELET_OK,
           "logprobs bwd_check: stride-0 views");
  }
  if (!fuselet_has_cuda())
    expect(fuselet_logprobs_fwd_cuda(&tx, &tt, &o, &tl, &tlse, nullptr, nullptr, nullptr, nullptr, nullptr) ==
               FUSELET_ERR_UNSUPPORTED,
           "logprobs CPU-only build");
}

// bfloat16 logits: the core's results against float32 logits holding the same values.
void check_logprobs_bf16(int64_t N, int64_t V) {
  std::vector<uint16_t> xb(N * V), dxb(N * V);
  std::vector<float> x(N * V), lp(N), lse(N), ent(N), g(N, 1.f), h(N, 0.5f), dx(N * V);
  std::vector<int64_t> t(N);
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.f, 4.f);
  for (int64_t i = 0; i < N * V; ++i) {
    uint32_t u;
    const float f = dist(rng);
    std::memcpy(&u, &f, 4);
    xb[i] = static_cast<uint16_t>(u >> 16);
    u = static_cast<uint32_t>(xb[i]) << 16;
    std::memcpy(&x[i], &u, 4);
  }
  for (int64_t r = 0; r < N; ++r) t[r] = (r * 7919) % V;
  const fuselet_cross_entropy_options o{-100, 0.f, 0.f, 30.f};
  fuselet_tensor tx = view(xb.data(), {N, V}, {}, FUSELET_BFLOAT16),
                 tdx = view(dxb.data(), {N, V}, {}, FUSELET_BFLOAT16), tt = view(t.data(), {N}, {}, FUSELET_INT64),
                 tl = view(lp.data(), {N}, {}, FUSELET_FLOAT32), tlse = view(lse.data(), {N}, {}, FUSELET_FLOAT32),
                 te = view(ent.data(), {N}, {}, FUSELET_FLOAT32), tg = view(g.data(), {N}, {}, FUSELET_FLOAT32),
                 th = view(h.data(), {N}, {}, FUSELET_FLOAT32);
  expect(fuselet_logprobs_fwd(&tx, &tt, &o, &tl, &tlse, &te, nullptr, nullptr, nullptr) == FUSELET_OK &&
             fuselet_logprobs_bwd(&tg, &th, &tx, &tt, &tlse, &te, &o, &tdx) == FUSELET_OK,
         "logprobs bf16 fwd + bwd");
  const LogprobsRef want = logprobs_reference(x, t, V, -100, 30.f, g, h);
  for (int64_t i = 0; i < N * V; ++i) {
    const uint32_t u = static_cast<uint32_t>(dxb[i]) << 16;
    std::memcpy(&dx[i], &u, 4);
  }
  expect(max_err(lp, want.logp) < 2e-5 && max_err(ent, want.entropy) < 2e-5, "logprobs bf16 logp, entropy");
  expect(max_err(dx, want.dx) < 8e-3, "logprobs bf16 dlogits, max error " + std::to_string(max_err(dx, want.dx)));
}

}  // namespace

int main() {
  const fuselet_cross_entropy_options plain{-100, 0.f, 0.f, 0.f};
  for (int64_t V : {1, 3, 127, 32000, 32001})
    for (bool t64 : {false, true}) check(V > 1000 ? 4 : 9, V, plain, t64, "plain");
  for (int64_t V : {3, 4097}) {
    check(7, V, {-100, 0.1f, 0.f, 0.f}, true, "label_smoothing");
    check(7, V, {-100, 0.f, 1e-3f, 0.f}, true, "z_loss");
    check(7, V, {-100, 0.f, 0.f, 5.f}, true, "softcap");
    check(7, V, {2, 0.2f, 1e-2f, 10.f}, false, "all options, ignore_index 2");
  }
  check(0, 5, plain, true, "empty");
  check_bf16(5, 32001);
  errors();
  for (int64_t V : {1, 3, 127, 4097, 32001})
    for (bool t64 : {false, true}) check_logprobs(V > 1000 ? 6 : 11, V, -100, 0.f, t64, "logprobs");
  for (int64_t V : {3, 4097}) {
    check_logprobs(9, V, -100, 5.f, true, "logprobs softcap");
    check_logprobs(9, V, 2, 10.f, false, "logprobs softcap, ignore_index 2");
  }
  check_logprobs(0, 5, -100, 0.f, true, "logprobs empty");
  check_logprobs_bf16(5, 32001);
  check_logprobs_masked();
  logprobs_errors();
  return fuselet_test::report();
}
