// C++ test of the framework-free core: CPU divergences (KL with log and probability targets, JSD
// at beta 0, 1 and between, TVD) against a float64 reference of the loss and of both gradients,
// the 0 log 0 = 0 rule, and the error values of the C ABI. Prints "N passed, N failed".
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "fuselet/divergence.h"

namespace {

using fuselet_test::expect;
using fuselet_test::expect_error;

fuselet_tensor view(void* data, int64_t n, int64_t v, fuselet_dtype dtype = FUSELET_FLOAT32) {
  fuselet_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = 2;
  t.shape[0] = n, t.shape[1] = v;
  t.strides[0] = v, t.strides[1] = 1;
  return t;
}

fuselet_tensor vec(float* data, int64_t n) {
  fuselet_tensor t{};
  t.data = data;
  t.dtype = FUSELET_FLOAT32;
  t.ndim = 1;
  t.shape[0] = n;
  t.strides[0] = 1;
  return t;
}

// log_softmax of a random row, in place.
void log_softmax(float* row, int64_t V) {
  double m = -INFINITY, s = 0;
  for (int64_t j = 0; j < V; ++j) m = std::fmax(m, row[j]);
  for (int64_t j = 0; j < V; ++j) s += std::exp(double(row[j]) - m);
  const double lse = m + std::log(s);
  for (int64_t j = 0; j < V; ++j) row[j] = static_cast<float>(row[j] - lse);
}

// The float64 loss of one row and its gradients (x: log Q; t: log P, or P when !log_target).
double reference(int kind, bool log_target, double beta, const float* x, const float* t, int64_t V, double* dx,
                 double* dt) {
  double loss = 0;
  for (int64_t j = 0; j < V; ++j) {
    const double q = std::exp(double(x[j])), p = log_target ? std::exp(double(t[j])) : t[j];
    const double lp = log_target ? t[j] : std::log(double(t[j]));
    if (kind == FUSELET_DIVERGENCE_TVD) {
      const double s = p > q ? 0.5 : (p < q ? -0.5 : 0.0);
      loss += 0.5 * std::fabs(p - q);
      dx[j] = -s * q, dt[j] = s * p;
    } else if (kind == FUSELET_DIVERGENCE_KL || beta == 0.0) {
      loss += p * (lp - x[j]);
      dx[j] = -p;
      dt[j] = log_target ? p * (lp - x[j] + 1) : lp + 1 - x[j];
    } else if (beta == 1.0) {
      loss += q * (x[j] - lp);
      dx[j] = q * (x[j] - lp + 1), dt[j] = -q;
    } else {
      const double lm = std::log(beta * p + (1 - beta) * q);
      loss += beta * p * (lp - lm) + (1 - beta) * q * (x[j] - lm);
      dx[j] = (1 - beta) * q * (x[j] - lm), dt[j] = beta * p * (lp - lm);
    }
  }
  return loss;
}

void check(int kind, bool log_target, float beta, int64_t N, int64_t V) {
  std::mt19937 rng(static_cast<unsigned>(kind * 131 + N * 7 + V));
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<float> x(N * V), t(N * V), loss(N), g(N), dx(N * V), dt(N * V);
  for (auto& v : x) v = dist(rng);
  for (auto& v : t) v = dist(rng);
  for (auto& v : g) v = dist(rng);
  for (int64_t r = 0; r < N; ++r) {
    log_softmax(&x[r * V], V);
    log_softmax(&t[r * V], V);
    if (!log_target)
      for (int64_t j = 0; j < V; ++j) t[r * V + j] = std::exp(t[r * V + j]);
  }
  const fuselet_divergence_options opts{kind, log_target ? 1 : 0, beta};
  fuselet_tensor tx = view(x.data(), N, V), tt = view(t.data(), N, V), tl = vec(loss.data(), N), tg = vec(g.data(), N),
                 tdx = view(dx.data(), N, V), tdt = view(dt.data(), N, V);
  const std::string name = "divergence kind=" + std::to_string(kind) + (log_target ? " log" : " prob") +
                           " beta=" + std::to_string(beta) + " N=" + std::to_string(N) + " V=" + std::to_string(V);
  expect(fuselet_divergence_fwd(&tx, &tt, &opts, &tl) == FUSELET_OK, name + " fwd");
  expect(fuselet_divergence_bwd(&tg, &tx, &tt, &opts, &tdx, &tdt) == FUSELET_OK, name + " bwd");
  double err_loss = 0, err_grad = 0;
  std::vector<double> rdx(V), rdt(V);
  for (int64_t r = 0; r < N; ++r) {
    const double ref = reference(kind, log_target, beta, &x[r * V], &t[r * V], V, rdx.data(), rdt.data());
    err_loss = std::fmax(err_loss, std::fabs(loss[r] - ref) / (1 + std::fabs(ref)));
    for (int64_t j = 0; j < V; ++j) {
      err_grad = std::fmax(err_grad, std::fabs(dx[r * V + j] - g[r] * rdx[j]));
      err_grad = std::fmax(err_grad, std::fabs(dt[r * V + j] - g[r] * rdt[j]));
    }
  }
  expect(err_loss < 2e-5, name + " loss, max relative error " + std::to_string(err_loss));
  expect(err_grad < 2e-5, name + " gradients, max error " + std::to_string(err_grad));
  // dinput alone and dtarget alone write the same values as both together
  std::vector<float> dx1(N * V), dt1(N * V);
  fuselet_tensor tdx1 = view(dx1.data(), N, V), tdt1 = view(dt1.data(), N, V);
  expect(fuselet_divergence_bwd(&tg, &tx, &tt, &opts, &tdx1, nullptr) == FUSELET_OK &&
             fuselet_divergence_bwd(&tg, &tx, &tt, &opts, nullptr, &tdt1) == FUSELET_OK && dx1 == dx && dt1 == dt,
         name + " one gradient at a time");
}

// fuselet_divergence_logits against float64: log_softmax of the scaled logits in float64, the
// reference's loss and dx, then dz_j = g scale (dx_j - Q_j sum dx); float32 and bfloat16 logits.
void check_logits(int kind, float beta, float scale, int64_t N, int64_t V, fuselet_dtype dtype) {
  std::mt19937 rng(static_cast<unsigned>(kind * 131 + N * 7 + V + 3));
  std::normal_distribution<float> dist(0.f, 3.f);
  const bool bf16 = dtype == FUSELET_BFLOAT16;
  auto round = [&](float v) {  // the value the dtype holds (bfloat16: round to nearest even)
    if (!bf16) return v;
    uint32_t b;
    std::memcpy(&b, &v, 4);
    b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&v, &b, 4);
    return v;
  };
  std::vector<float> z(N * V), t(N * V), loss(N), g(N);
  for (auto& v : z) v = round(dist(rng));
  for (auto& v : t) v = round(dist(rng));
  for (auto& v : g) v = dist(rng);
  g[0] = 0.f;  // a row no gradient reaches (an ignored label): zeros, its loss still written
  std::vector<uint16_t> zb(N * V), tb(N * V);
  auto to_bits = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return static_cast<uint16_t>(b >> 16);
  };
  auto from_bits = [](uint16_t h) {
    const uint32_t b = uint32_t{h} << 16;
    float v;
    std::memcpy(&v, &b, 4);
    return v;
  };
  for (int64_t i = 0; i < N * V; ++i) zb[i] = to_bits(z[i]), tb[i] = to_bits(t[i]);
  std::vector<float> dz = z;
  const fuselet_divergence_options opts{kind, 1, beta};
  fuselet_tensor tz = bf16 ? view(zb.data(), N, V, dtype) : view(dz.data(), N, V),
                 tt = bf16 ? view(tb.data(), N, V, dtype) : view(t.data(), N, V), tl = vec(loss.data(), N),
                 tg = vec(g.data(), N);
  const std::string name = "divergence logits kind=" + std::to_string(kind) + " beta=" + std::to_string(beta) +
                           " scale=" + std::to_string(scale) + " N=" + std::to_string(N) + " V=" + std::to_string(V) +
                           (bf16 ? " bfloat16" : " float32");
  expect(fuselet_divergence_logits_check(&tz, &tt, &tg, &opts, scale) == FUSELET_OK, name + " check");
  expect(fuselet_divergence_logits(&tz, &tt, &tg, &opts, scale, &tl) == FUSELET_OK, name + " run");
  if (bf16)
    for (int64_t i = 0; i < N * V; ++i) dz[i] = from_bits(zb[i]);
  double err_loss = 0, err_grad = 0;
  std::vector<double> rdx(V), rdt(V), xs(V), ts(V);
  std::vector<float> xf(V), tf(V);
  for (int64_t r = 0; r < N; ++r) {
    for (int i = 0; i < 2; ++i) {  // float64 log_softmax of the scaled row
      const float* src = (i ? t.data() : z.data()) + r * V;
      std::vector<double>& out = i ? ts : xs;
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < V; ++j) m = std::fmax(m, double(scale) * src[j]);
      for (int64_t j = 0; j < V; ++j) s += std::exp(double(scale) * src[j] - m);
      for (int64_t j = 0; j < V; ++j) out[j] = double(scale) * src[j] - m - std::log(s);
    }
    for (int64_t j = 0; j < V; ++j) xf[j] = static_cast<float>(xs[j]), tf[j] = static_cast<float>(ts[j]);
    const double ref = reference(kind, true, beta, xf.data(), tf.data(), V, rdx.data(), rdt.data());
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += rdx[j];
    err_loss = std::fmax(err_loss, std::fabs(loss[r] - ref) / (1 + std::fabs(ref)));
    for (int64_t j = 0; j < V; ++j) {
      const double want = double(g[r]) * scale * (rdx[j] - std::exp(xs[j]) * sum);
      // bfloat16 output: its rounding (8 bits) relative to the value
      const double tol = bf16 ? 8e-3 * std::fabs(want) : 0.0;
      err_grad = std::fmax(err_grad, std::fabs(dz[r * V + j] - want) - tol);
    }
    if (r == 0) {
      bool zeros = true;
      for (int64_t j = 0; j < V; ++j) zeros = zeros && dz[j] == 0.f;
      expect(zeros, name + " a row with dloss 0 gets zeros");
    }
  }
  expect(err_loss < 2e-5, name + " loss, max relative error " + std::to_string(err_loss));
  expect(err_grad < 2e-5, name + " dlogits, max error " + std::to_string(err_grad));
}

}  // namespace

int main() {
  for (int64_t V : {1, 5, 127, 4097}) {
    for (fuselet_dtype dt : {FUSELET_FLOAT32, FUSELET_BFLOAT16}) {
      check_logits(FUSELET_DIVERGENCE_KL, 0.f, 1.f, 3, V, dt);
      for (float beta : {0.f, 0.25f, 0.5f, 1.f}) check_logits(FUSELET_DIVERGENCE_JSD, beta, 0.5f, 3, V, dt);
      check_logits(FUSELET_DIVERGENCE_TVD, 0.f, 2.f, 3, V, dt);
    }
  }
  check_logits(FUSELET_DIVERGENCE_JSD, 0.5f, 1.f, 67, 300, FUSELET_FLOAT32);  // rows over several tasks

  for (int64_t V : {1, 5, 127, 4096, 4097}) {
    check(FUSELET_DIVERGENCE_KL, true, 0.f, 3, V);
    check(FUSELET_DIVERGENCE_KL, false, 0.f, 3, V);
    for (float beta : {0.f, 0.25f, 0.5f, 1.f}) check(FUSELET_DIVERGENCE_JSD, true, beta, 3, V);
    check(FUSELET_DIVERGENCE_TVD, true, 0.f, 3, V);
  }
  check(FUSELET_DIVERGENCE_JSD, true, 0.5f, 67, 300);  // rows over several tasks

  // 0 log 0 = 0: a zero-probability target (or -inf log-probability) adds nothing, no NaN
  float x[4] = {-1.f, -2.f, -0.5f, -3.f}, tp[4] = {0.f, 0.5f, 0.5f, 0.f},
        tl[4] = {-INFINITY, -0.69314718f, -0.69314718f, -INFINITY};
  float loss[1], g[1] = {1.f}, dx[4], dt[4];
  fuselet_tensor vx = view(x, 1, 4), vp = view(tp, 1, 4), vl = view(tl, 1, 4), vloss = vec(loss, 1), vg = vec(g, 1),
                 vdx = view(dx, 1, 4), vdt = view(dt, 1, 4);
  const fuselet_divergence_options kl_prob{FUSELET_DIVERGENCE_KL, 0, 0.f}, kl_log{FUSELET_DIVERGENCE_KL, 1, 0.f},
      jsd{FUSELET_DIVERGENCE_JSD, 1, 0.5f};
  const double want = 0.5 * (std::log(0.5) + 2.0) + 0.5 * (std::log(0.5) + 0.5);
  expect(fuselet_divergence_fwd(&vx, &vp, &kl_prob, &vloss) == FUSELET_OK && std::fabs(loss[0] - want) < 1e-5,
         "KL: zero target probabilities add 0");
  expect(fuselet_divergence_fwd(&vx, &vl, &kl_log, &vloss) == FUSELET_OK && std::fabs(loss[0] - want) < 1e-5,
         "KL: -inf target log-probabilities add 0");
  expect(fuselet_divergence_bwd(&vg, &vx, &vl, &jsd, &vdx, &vdt) == FUSELET_OK && std::isfinite(dx[0]) &&
             std::isfinite(dt[0]) && dt[0] == 0.f,
         "JSD: -inf target log-probabilities give finite gradients");

  // errors name the argument
  fuselet_divergence_options bad = kl_log;
  bad.kind = 7;
  expect_error(fuselet_divergence_fwd(&vx, &vl, &bad, &vloss), "kind: expected FUSELET_DIVERGENCE_KL", "unknown kind");
  bad = kl_log;
  bad.log_target = 2;
  expect_error(fuselet_divergence_fwd(&vx, &vl, &bad, &vloss), "log_target: expected 0 or 1", "log_target 2");
  bad = jsd;
  bad.log_target = 0;
  expect_error(fuselet_divergence_fwd(&vx, &vl, &bad, &vloss), "log_target: expected 1", "JSD with probabilities");
  bad = jsd;
  bad.beta = 1.5f;
  expect_error(fuselet_divergence_fwd(&vx, &vl, &bad, &vloss), "beta: expected a number in [0, 1]", "beta 1.5");
  bad = jsd;
  bad.beta = NAN;
  expect_error(fuselet_divergence_fwd(&vx, &vl, &bad, &vloss), "beta: expected a number in [0, 1]", "beta NaN");
  bad = kl_log;
  bad.beta = 0.5f;
  expect_error(fuselet_divergence_fwd(&vx, &vl, &bad, &vloss), "beta: expected 0", "beta with KL");
  expect_error(fuselet_divergence_fwd(&vx, &vl, nullptr, &vloss), "opts: expected the options", "NULL options");
  fuselet_tensor short_t = view(tl, 2, 2);
  expect_error(fuselet_divergence_fwd(&vx, &short_t, &kl_log, &vloss), "target: expected 1 rows of 4 elements",
               "target shape");
  uint16_t half[4] = {};
  fuselet_tensor th = view(half, 1, 4, FUSELET_FLOAT16);
  expect_error(fuselet_divergence_fwd(&vx, &th, &kl_log, &vloss), "target: expected dtype float32", "target dtype");
  fuselet_tensor short_loss = vec(loss, 1);
  short_loss.shape[0] = 2;
  expect_error(fuselet_divergence_fwd(&vx, &vl, &kl_log, &short_loss), "loss:", "loss size");
  expect_error(fuselet_divergence_bwd(&vg, &vx, &vl, &kl_log, nullptr, nullptr),
               "dinput, dtarget: expected at least one", "no outputs");
  expect_error(fuselet_divergence_bwd(&vg, &vx, &vl, &kl_log, &th, nullptr), "dinput: expected dtype float32",
               "dinput dtype");
  {  // over logits: log_target 1, a finite scale > 0, dloss of N elements
    bad = kl_log;
    bad.log_target = 0;
    expect_error(fuselet_divergence_logits(&vx, &vl, &vg, &bad, 1.f, &vloss), "log_target: expected 1",
                 "logits: log_target 0");
    for (float s : {0.f, -1.f, NAN, INFINITY})
      expect_error(fuselet_divergence_logits(&vx, &vl, &vg, &jsd, s, &vloss), "scale: expected a finite number > 0",
                   "logits: scale " + std::to_string(s));
    fuselet_tensor g2 = vec(g, 1);
    g2.shape[0] = 2;
    expect_error(fuselet_divergence_logits(&vx, &vl, &g2, &jsd, 1.f, &vloss), "dloss: expected 1 elements",
                 "logits: dloss size");
    expect_error(fuselet_divergence_logits(&vx, &th, &vg, &jsd, 1.f, &vloss), "target: expected dtype float32",
                 "logits: target dtype");
    expect_error(fuselet_divergence_logits_check(&vx, &vl, &vg, &jsd, 0.f), "scale: expected a finite number > 0",
                 "logits_check: scale");
  }
  if (!fuselet_has_cuda()) {
    expect(fuselet_divergence_fwd_cuda(&vx, &vl, &kl_log, &vloss, nullptr) == FUSELET_ERR_UNSUPPORTED,
           "CPU-only build");
    expect(fuselet_divergence_logits_cuda(&vx, &vl, &vg, &jsd, 1.f, &vloss, nullptr) == FUSELET_ERR_UNSUPPORTED,
           "CPU-only build: logits");
  }
  {  // the `_check` functions: stride-0 and transposed views with no data, the entry points' messages
    const int64_t N = int64_t{1} << 40;
    const fuselet_tensor big = fuselet_test::view(nullptr, {N, 8}, {0, 1}), g = fuselet_test::view(nullptr, {N}, {0});
    const fuselet_tensor cols = fuselet_test::view(nullptr, {8, 3}, {1, 8}),
                         g8 = fuselet_test::view(nullptr, {8}, {2});
    expect(fuselet_divergence_fwd_check(&big, &big, &jsd) == FUSELET_OK, "fwd_check: stride-0 views");
    expect(fuselet_divergence_bwd_check(&g8, &cols, &cols, &kl_log) == FUSELET_OK, "bwd_check: strided views");
    expect(fuselet_divergence_bwd_check(&g, &big, &big, &kl_log) == FUSELET_OK, "bwd_check: stride-0 views");
    bad = jsd;
    bad.beta = 2.f;
    expect_error(fuselet_divergence_fwd_check(&big, &big, &bad), "beta: expected a number in [0, 1]",
                 "fwd_check: beta");
    const fuselet_tensor bh = fuselet_test::view(nullptr, {N, 8}, {0, 1}, FUSELET_BFLOAT16);
    expect_error(fuselet_divergence_fwd_check(&big, &bh, &kl_log),
                 "target: expected dtype float32 (the dtype of input), got bfloat16", "fwd_check: target dtype");
    expect_error(fuselet_divergence_bwd_check(&g8, &big, &big, &kl_log), "dloss: expected 1099511627776 elements",
                 "bwd_check: dloss size");
  }
  return fuselet_test::report();
}
