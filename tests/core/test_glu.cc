// C++ test of the framework-free core: CPU SwiGLU / GeGLU / clamped SwiGLU against a float64
// reference, both layouts of x, rows of a wider buffer, and the error values of the C ABI. Prints "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "fuselet/glu.h"

namespace {

using fuselet_test::expect;
using fuselet_test::expect_error;
using fuselet_test::view;

fuselet_tensor rows(float* data, int64_t r, int64_t n, int64_t stride) {
  fuselet_tensor t{};
  t.data = data;
  t.dtype = FUSELET_FLOAT32;
  t.ndim = 2;
  t.shape[0] = r;
  t.shape[1] = n;
  t.strides[0] = stride;
  t.strides[1] = 1;
  return t;
}

// y and its gradients (dg, du) in double, for dy = d.
void reference(const fuselet_glu_options& o, double g, double u, double d, double* y, double* dg, double* du) {
  const int kind = o.activation;
  double a, da;
  if (kind == FUSELET_GLU_SILU_CLAMPED) {
    const double L = o.limit, gc = std::fmin(g, L), uc = std::fmax(-L, std::fmin(u, L));
    const double s = 1.0 / (1.0 + std::exp(-double(o.alpha) * gc));
    *y = gc * s * (uc + 1.0);
    *dg = g <= L ? d * (uc + 1.0) * (s + o.alpha * gc * s * (1.0 - s)) : 0.0;
    *du = (u >= -L && u <= L) ? d * gc * s : 0.0;
    return;
  }
  if (kind == FUSELET_GLU_SILU) {
    const double s = 1.0 / (1.0 + std::exp(-g));
    a = g * s;
    da = s * (1.0 + g * (1.0 - s));
  } else if (kind == FUSELET_GLU_GELU) {
    const double cdf = 0.5 * (1.0 + std::erf(g / std::sqrt(2.0)));
    a = g * cdf;
    da = cdf + g * std::exp(-0.5 * g * g) / std::sqrt(2.0 * M_PI);
  } else {
    const double k = std::sqrt(2.0 / M_PI), c = 0.044715, t = std::tanh(k * (g + c * g * g * g));
    a = 0.5 * g * (1.0 + t);
    da = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * c * g * g);
  }
  *y = a * u;
  *dg = d * u * da;
  *du = d * a;
}

// ex: through fuselet_glu_{fwd,bwd}_ex (else the plain entry points, halves layout only).
void check_numerics(const fuselet_glu_options& o, bool ex, int64_t R, int64_t F, int64_t pad) {
  std::mt19937 rng(static_cast<unsigned>(R * 31 + F + o.activation));
  std::normal_distribution<float> dist(0.5f, 2.0f);
  const int64_t xs = 2 * F + pad;
  std::vector<float> x(R * xs), dy(R * F), y(R * F), dx(R * 2 * F);
  for (auto& v : x) v = dist(rng);
  for (auto& v : dy) v = dist(rng);
  if (o.activation == FUSELET_GLU_SILU_CLAMPED && R * F > 1) x[0] = o.limit, x[1] = -o.limit;  // the bounds
  fuselet_tensor tx = rows(x.data(), R, 2 * F, xs), tdy = rows(dy.data(), R, F, F), ty = rows(y.data(), R, F, F),
                 tdx = rows(dx.data(), R, 2 * F, 2 * F);
  const std::string name = "glu kind=" + std::to_string(o.activation) + (o.interleaved ? " interleaved" : "") +
                           (ex ? " ex" : "") + " R=" + std::to_string(R) + " F=" + std::to_string(F);
  if (ex) {
    expect(fuselet_glu_fwd_ex(&tx, &o, &ty) == FUSELET_OK, name + " fwd status");
    expect(fuselet_glu_bwd_ex(&tdy, &tx, &o, &tdx) == FUSELET_OK, name + " bwd status");
  } else {
    expect(fuselet_glu_fwd(&tx, o.activation, &ty) == FUSELET_OK, name + " fwd status");
    expect(fuselet_glu_bwd(&tdy, &tx, o.activation, &tdx) == FUSELET_OK, name + " bwd status");
  }
  double err = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < F; ++i) {
      const int64_t gi = o.interleaved ? 2 * i : i, ui = o.interleaved ? 2 * i + 1 : F + i;
      double want, dg, du;
      reference(o, x[r * xs + gi], x[r * xs + ui], dy[r * F + i], &want, &dg, &du);
      const auto rel = [](double got, double want) { return std::fabs(got - want) / (1.0 + std::fabs(want)); };
      err = std::fmax(err, rel(y[r * F + i], want));
      err = std::fmax(err, rel(dx[r * 2 * F + gi], dg));
      err = std::fmax(err, rel(dx[r * 2 * F + ui], du));
    }
  expect(err < 1e-5, name + " values, max error " + std::to_string(err));
}

}  // namespace

int main() {
  for (int kind : {FUSELET_GLU_SILU, FUSELET_GLU_GELU, FUSELET_GLU_GELU_TANH, FUSELET_GLU_SILU_CLAMPED})
    for (int interleaved : {0, 1})
      for (int64_t F : {1, 3, 127, 4096, 4097}) {
        // the clamped SwiGLU with a limit inside the inputs' spread: both sides of each clamp
        const fuselet_glu_options o{kind, interleaved, 1.702f, 1.5f};
        check_numerics(o, true, 5, F, 0);
        check_numerics(o, true, 3, F, 7);  // rows of a wider buffer
        if (kind != FUSELET_GLU_SILU_CLAMPED && !interleaved) check_numerics(o, false, 5, F, 0);
      }
  float x[12] = {}, y[6];
  fuselet_tensor tx = rows(x, 2, 6, 6), ty = rows(y, 2, 3, 3), ty2 = rows(y, 2, 2, 2), todd = rows(x, 2, 5, 5);
  expect_error(fuselet_glu_fwd(&todd, FUSELET_GLU_SILU, &ty), "x: expected an even last dimension", "odd 2F");
  expect_error(fuselet_glu_fwd(&tx, 7, &ty), "activation: expected", "unknown activation");
  expect_error(fuselet_glu_fwd(&tx, FUSELET_GLU_SILU, &ty2), "y: expected 2 rows of 3 elements", "y shape");
  expect_error(fuselet_glu_bwd(&tx, &tx, FUSELET_GLU_SILU, &tx), "dy: expected 2 rows of 3 elements", "dy shape");
  expect_error(fuselet_glu_fwd(nullptr, FUSELET_GLU_SILU, &ty), "x: expected a tensor", "NULL x");
  const fuselet_glu_options clamped{FUSELET_GLU_SILU_CLAMPED, 0, 1.702f, 7.f};
  expect_error(fuselet_glu_fwd(&tx, FUSELET_GLU_SILU_CLAMPED, &ty), "activation: FUSELET_GLU_SILU_CLAMPED takes",
               "clamped through the plain entry point");
  expect_error(fuselet_glu_fwd_ex(&tx, nullptr, &ty), "opts: expected", "NULL opts");
  fuselet_glu_options bad = clamped;
  bad.limit = 0.f;
  expect_error(fuselet_glu_fwd_ex(&tx, &bad, &ty), "limit: expected a finite number > 0", "limit 0");
  bad = clamped;
  bad.alpha = NAN;
  expect_error(fuselet_glu_bwd_ex(&ty, &tx, &bad, &tx), "alpha: expected a finite number", "alpha NaN");
  bad = clamped;
  bad.interleaved = 2;
  expect_error(fuselet_glu_fwd_ex(&tx, &bad, &ty), "interleaved: expected 0 or 1", "interleaved 2");
  bad = {FUSELET_GLU_SILU, 0, NAN, -1.f};  // alpha and limit are the clamped SwiGLU's only
  expect(fuselet_glu_fwd_ex(&tx, &bad, &ty) == FUSELET_OK, "alpha / limit ignored by SiLU");
  if (!fuselet_has_cuda())
    expect(fuselet_glu_fwd_cuda(&tx, FUSELET_GLU_SILU, &ty, nullptr) == FUSELET_ERR_UNSUPPORTED, "CPU-only build");
  {  // the `_check` functions: stride-0 and transposed views with no data, the entry points' messages
    fuselet_tensor big = view(nullptr, {int64_t{1} << 40, 8}, {0, 1}),
                   dy = view(nullptr, {int64_t{1} << 40, 4}, {0, 1});
    fuselet_tensor cols = view(nullptr, {8, 6}, {1, 8}), dcols = view(nullptr, {8, 3}, {1, 8});
    expect(fuselet_glu_fwd_check(&big, FUSELET_GLU_GELU) == FUSELET_OK, "glu_fwd_check: stride-0 x");
    expect(fuselet_glu_bwd_ex_check(&dy, &big, &clamped) == FUSELET_OK, "glu_bwd_ex_check: stride-0 views");
    expect(fuselet_glu_bwd_check(&dcols, &cols, FUSELET_GLU_SILU) == FUSELET_OK, "glu_bwd_check: transposed views");
    expect_error(fuselet_glu_fwd_check(&todd, FUSELET_GLU_SILU), "x: expected an even last dimension",
                 "glu_fwd_check: odd 2F");
    expect_error(fuselet_glu_fwd_check(&big, FUSELET_GLU_SILU_CLAMPED), "activation: FUSELET_GLU_SILU_CLAMPED takes",
                 "glu_fwd_check: clamped through the plain check");
    bad = clamped;
    bad.limit = INFINITY;
    expect_error(fuselet_glu_fwd_ex_check(&big, &bad), "limit: expected a finite number > 0, got inf",
                 "glu_fwd_ex_check: limit");
    expect_error(fuselet_glu_bwd_ex_check(&big, &big, &clamped), "dy: expected 1099511627776 rows of 4 elements",
                 "glu_bwd_ex_check: dy shape");
  }
  return fuselet_test::report();
}
