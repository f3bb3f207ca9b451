// C++ test of the framework-free core: CPU softmax (plain and causal, Q != K) against a
// float64 reference, and the error values of the C ABI. Prints "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "fuselet/softmax.h"

namespace {

using fuselet_test::expect;
using fuselet_test::expect_error;

fuselet_tensor view(float* data, int64_t b, int64_t q, int64_t k) {
  fuselet_tensor t{};
  t.data = data;
  t.dtype = FUSELET_FLOAT32;
  t.ndim = 3;
  t.shape[0] = b, t.shape[1] = q, t.shape[2] = k;
  t.strides[0] = q * k, t.strides[1] = k, t.strides[2] = 1;
  return t;
}

void check(int64_t B, int64_t Q, int64_t K, float scale, bool causal) {
  std::mt19937 rng(static_cast<unsigned>(B * 7 + Q * 5 + K));
  std::normal_distribution<float> dist(0.5f, 2.0f);
  const int64_t n = B * Q * K;
  std::vector<float> x(n), dy(n), y(n), dx(n);
  for (auto& v : x) v = dist(rng);
  for (auto& v : dy) v = dist(rng);
  fuselet_tensor tx = view(x.data(), B, Q, K), tdy = view(dy.data(), B, Q, K), ty = view(y.data(), B, Q, K),
                 tdx = view(dx.data(), B, Q, K);
  const std::string name = "softmax B=" + std::to_string(B) + " Q=" + std::to_string(Q) + " K=" + std::to_string(K) +
                           (causal ? " causal" : "");
  expect(fuselet_softmax_fwd(&tx, scale, causal ? FUSELET_SOFTMAX_CAUSAL : 0, &ty) == FUSELET_OK, name + " fwd");
  expect(fuselet_softmax_bwd(&tdy, &ty, scale, &tdx) == FUSELET_OK, name + " bwd");
  double err = 0;
  for (int64_t r = 0; r < B * Q; ++r) {
    const int64_t i = r % Q, visible = causal ? std::min<int64_t>(K, std::max<int64_t>(0, i + K - Q + 1)) : K;
    double m = -INFINITY, sum = 0, dot = 0;
    for (int64_t j = 0; j < visible; ++j) m = std::fmax(m, double(scale) * x[r * K + j]);
    for (int64_t j = 0; j < visible; ++j) sum += std::exp(double(scale) * x[r * K + j] - m);
    std::vector<double> yr(K, 0.0);
    for (int64_t j = 0; j < visible; ++j) yr[j] = std::exp(double(scale) * x[r * K + j] - m) / sum;
    for (int64_t j = 0; j < K; ++j) dot += double(dy[r * K + j]) * y[r * K + j];
    for (int64_t j = 0; j < K; ++j) {
      err = std::fmax(err, std::fabs(y[r * K + j] - yr[j]));
      err = std::fmax(err, std::fabs(dx[r * K + j] - scale * y[r * K + j] * (dy[r * K + j] - dot)));
    }
  }
  expect(err < 1e-5, name + " values, max error " + std::to_string(err));
}

}  // namespace

int main() {
  for (bool causal : {false, true})
    for (int64_t K : {1, 3, 127, 4096, 4097}) {
      check(2, 3, K, 1.f, causal);
      check(1, 9, K, 0.125f, causal);
    }
  check(3, 7, 3, 0.5f, true);  // Q > K: fully masked rows are zeros
  float x[8] = {}, y[8];
  fuselet_tensor tx = view(x, 1, 2, 4), ty = view(y, 1, 2, 4), t1 = view(x, 1, 1, 8), ty2 = view(y, 1, 4, 2);
  t1.ndim = 1;
  t1.shape[0] = 8;
  t1.strides[0] = 1;
  expect_error(fuselet_softmax_fwd(&tx, NAN, 0, &ty), "scale: expected a finite number", "NaN scale");
  expect_error(fuselet_softmax_fwd(&tx, 1.f, 2, &ty), "flags: unknown bits", "unknown flag");
  expect_error(fuselet_softmax_fwd(&t1, 1.f, FUSELET_SOFTMAX_CAUSAL, &t1), "needs x of shape [..., Q, K]",
               "1-D causal");
  expect_error(fuselet_softmax_fwd(&tx, 1.f, 0, &ty2), "y: expected 2 rows of 4 elements", "y shape");
  expect_error(fuselet_softmax_bwd(&tx, &tx, 1.f, nullptr), "dx: expected a tensor", "NULL dx");
  if (!fuselet_has_cuda())
    expect(fuselet_softmax_fwd_cuda(&tx, 1.f, 0, &ty, nullptr) == FUSELET_ERR_UNSUPPORTED, "CPU-only build");
  {  // the `_check` functions: stride-0 and transposed views with no data, the entry points' messages
    const fuselet_tensor big = fuselet_test::view(nullptr, {int64_t{1} << 40, 8}, {0, 1}),
                         cols = fuselet_test::view(nullptr, {8, 3}, {1, 8});
    expect(fuselet_softmax_fwd_check(&big, 0.5f, FUSELET_SOFTMAX_CAUSAL) == FUSELET_OK, "fwd_check: stride-0 x");
    expect(fuselet_softmax_bwd_check(&cols, &cols, 1.f) == FUSELET_OK, "bwd_check: transposed views");
    expect_error(fuselet_softmax_fwd_check(&big, INFINITY, 0), "scale: expected a finite number, got inf",
                 "fwd_check: scale");
    expect_error(fuselet_softmax_fwd_check(&t1, 1.f, FUSELET_SOFTMAX_CAUSAL), "needs x of shape [..., Q, K]",
                 "fwd_check: 1-D causal");
    expect_error(fuselet_softmax_bwd_check(&cols, &big, 1.f), "dy: expected 1099511627776 rows of 8 elements",
                 "bwd_check: dy shape");
  }
  return fuselet_test::report();
}
