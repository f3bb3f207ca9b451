// C++ test of the framework-free core: CPU SwiGLU / GeGLU against a float64 reference, rows of
// a wider buffer, and the error values of the C ABI. Prints "N passed, N failed".
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

// act(g) and act'(g) in double.
void act(int kind, double g, double* a, double* da) {
  if (kind == FUSELET_GLU_SILU) {
    const double s = 1.0 / (1.0 + std::exp(-g));
    *a = g * s;
    *da = s * (1.0 + g * (1.0 - s));
  } else if (kind == FUSELET_GLU_GELU) {
    const double cdf = 0.5 * (1.0 + std::erf(g / std::sqrt(2.0)));
    *a = g * cdf;
    *da = cdf + g * std::exp(-0.5 * g * g) / std::sqrt(2.0 * M_PI);
  } else {
    const double k = std::sqrt(2.0 / M_PI), c = 0.044715, t = std::tanh(k * (g + c * g * g * g));
    *a = 0.5 * g * (1.0 + t);
    *da = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * c * g * g);
  }
}

void check_numerics(int kind, int64_t R, int64_t F, int64_t pad) {
  std::mt19937 rng(static_cast<unsigned>(R * 31 + F + kind));
  std::normal_distribution<float> dist(0.5f, 2.0f);
  const int64_t xs = 2 * F + pad;
  std::vector<float> x(R * xs), dy(R * F), y(R * F), dx(R * 2 * F);
  for (auto& v : x) v = dist(rng);
  for (auto& v : dy) v = dist(rng);
  fuselet_tensor tx = rows(x.data(), R, 2 * F, xs), tdy = rows(dy.data(), R, F, F), ty = rows(y.data(), R, F, F),
                 tdx = rows(dx.data(), R, 2 * F, 2 * F);
  const std::string name = "glu kind=" + std::to_string(kind) + " R=" + std::to_string(R) + " F=" + std::to_string(F);
  expect(fuselet_glu_fwd(&tx, kind, &ty) == FUSELET_OK, name + " fwd status");
  expect(fuselet_glu_bwd(&tdy, &tx, kind, &tdx) == FUSELET_OK, name + " bwd status");
  double err = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < F; ++i) {
      double a, da;
      const double g = x[r * xs + i], u = x[r * xs + F + i], d = dy[r * F + i];
      act(kind, g, &a, &da);
      const auto rel = [](double got, double want) { return std::fabs(got - want) / (1.0 + std::fabs(want)); };
      err = std::fmax(err, rel(y[r * F + i], a * u));
      err = std::fmax(err, rel(dx[r * 2 * F + i], d * u * da));
      err = std::fmax(err, rel(dx[r * 2 * F + F + i], d * a));
    }
  expect(err < 1e-5, name + " values, max error " + std::to_string(err));
}

}  // namespace

int main() {
  for (int kind : {FUSELET_GLU_SILU, FUSELET_GLU_GELU, FUSELET_GLU_GELU_TANH})
    for (int64_t F : {1, 3, 127, 4096, 4097}) {
      check_numerics(kind, 5, F, 0);
      check_numerics(kind, 3, F, 7);  // rows of a wider buffer
    }
  float x[12] = {}, y[6];
  fuselet_tensor tx = rows(x, 2, 6, 6), ty = rows(y, 2, 3, 3), ty2 = rows(y, 2, 2, 2), todd = rows(x, 2, 5, 5);
  expect_error(fuselet_glu_fwd(&todd, FUSELET_GLU_SILU, &ty), "x: expected an even last dimension", "odd 2F");
  expect_error(fuselet_glu_fwd(&tx, 7, &ty), "activation: expected", "unknown activation");
  expect_error(fuselet_glu_fwd(&tx, FUSELET_GLU_SILU, &ty2), "y: expected 2 rows of 3 elements", "y shape");
  expect_error(fuselet_glu_bwd(&tx, &tx, FUSELET_GLU_SILU, &tx), "dy: expected 2 rows of 3 elements", "dy shape");
  expect_error(fuselet_glu_fwd(nullptr, FUSELET_GLU_SILU, &ty), "x: expected a tensor", "NULL x");
  if (!fuselet_has_cuda())
    expect(fuselet_glu_fwd_cuda(&tx, FUSELET_GLU_SILU, &ty, nullptr) == FUSELET_ERR_UNSUPPORTED, "CPU-only build");
  return fuselet_test::report();
}
