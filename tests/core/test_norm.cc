// C++ test of the framework-free core: CPU norm kernels against a float64 reference, the
// strided-row path, and the error values of the C ABI. Prints "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fuselet/norm.h"

namespace {

int g_passed = 0, g_failed = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

fuselet_tensor view(void* data, std::vector<int64_t> shape, std::vector<int64_t> strides = {},
                    fuselet_dtype dtype = FUSELET_FLOAT32) {
  fuselet_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t s = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = strides.empty() ? s : strides[d];
    s *= shape[d];
  }
  return t;
}

double max_err(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::fmax(m, std::fabs(a[i] - b[i]) / (1.0 + std::fabs(b[i])));
  return m;
}

// Forward + backward of both norms on R x H float32 rows whose row stride is `stride`.
void check_numerics(int64_t R, int64_t H, int64_t stride, bool layer) {
  std::mt19937 rng(static_cast<unsigned>(R * 131 + H));
  std::normal_distribution<float> dist(0.5f, 2.0f);
  std::vector<float> x(R * stride), dy(R * H), w(H), b(H);
  for (auto& v : x) v = dist(rng);
  for (auto& v : dy) v = dist(rng);
  for (auto& v : w) v = dist(rng);
  for (auto& v : b) v = dist(rng);
  const float eps = 1e-5f;
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
      const double xhat = (xr[i] - mean) * rstd, g = double(dy[r * H + i]) * w[i];
      yr[r * H + i] = xhat * w[i] + (layer ? b[i] : 0.0);
      c1 += g;
      c2 += g * xhat;
      dwr[i] += dy[r * H + i] * xhat;
      dbr[i] += dy[r * H + i];
    }
    c1 = layer ? c1 / H : 0.0;
    c2 /= H;
    for (int64_t i = 0; i < H; ++i) {
      const double xhat = (xr[i] - mean) * rstd;
      dxr[r * H + i] = rstd * (double(dy[r * H + i]) * w[i] - c1 - xhat * c2);
    }
  }
  std::vector<float> y(R * H), mean(R), rstd(R), dx(R * H), dw(H), db(H);
  fuselet_tensor tx = view(x.data(), {R, H}, {stride, 1}), tw = view(w.data(), {H}), tb = view(b.data(), {H}),
                 ty = view(y.data(), {R, H}), tm = view(mean.data(), {R}), tr = view(rstd.data(), {R}),
                 tdy = view(dy.data(), {R, H}), tdx = view(dx.data(), {R, H}), tdw = view(dw.data(), {H}),
                 tdb = view(db.data(), {H});
  fuselet_status s1, s2;
  if (layer) {
    s1 = fuselet_layer_norm_fwd(&tx, &tw, &tb, eps, &ty, &tm, &tr);
    s2 = fuselet_layer_norm_bwd(&tdy, &tx, &tw, &tm, &tr, &tdx, &tdw, &tdb);
  } else {
    s1 = fuselet_rms_norm_fwd(&tx, &tw, eps, &ty, &tr);
    s2 = fuselet_rms_norm_bwd(&tdy, &tx, &tw, &tr, &tdx, &tdw);
  }
  char name[96];
  std::snprintf(name, sizeof(name), "%s R=%lld H=%lld stride=%lld", layer ? "layer_norm" : "rms_norm",
                static_cast<long long>(R), static_cast<long long>(H), static_cast<long long>(stride));
  expect(s1 == FUSELET_OK && s2 == FUSELET_OK, std::string(name) + " status: " + fuselet_last_error());
  const double tol_rows = 1e-4, tol_sum = 1e-4 * std::sqrt(double(R) + 1.0);
  expect(max_err(y, yr) < tol_rows, std::string(name) + " y");
  expect(max_err(dx, dxr) < tol_rows, std::string(name) + " dx");
  expect(max_err(dw, dwr) < tol_sum, std::string(name) + " dweight");
  if (layer) expect(max_err(db, dbr) < tol_sum, std::string(name) + " dbias");
}

void expect_error(fuselet_status s, const char* needle, const std::string& what) {
  expect(s == FUSELET_ERR_INVALID_ARGUMENT && std::strstr(fuselet_last_error(), needle) != nullptr,
         what + " -> '" + fuselet_last_error() + "'");
}

void check_errors() {
  float x[6] = {1, 2, 3, 4, 5, 6}, w[3] = {1, 1, 1}, y[6], r[2];
  fuselet_tensor tx = view(x, {2, 3}), tw = view(w, {3}), ty = view(y, {2, 3}), tr = view(r, {2});
  expect_error(fuselet_rms_norm_fwd(&tx, &tw, 0.f, &ty, &tr), "eps", "eps = 0");
  expect_error(fuselet_rms_norm_fwd(&tx, &tw, NAN, &ty, &tr), "eps", "eps = NaN");
  fuselet_tensor tw2 = view(w, {2});
  expect_error(fuselet_rms_norm_fwd(&tx, &tw2, 1e-5f, &ty, &tr), "weight", "weight of 2 for H = 3");
  fuselet_tensor th = view(w, {3}, {}, FUSELET_FLOAT16);
  expect_error(fuselet_rms_norm_fwd(&tx, &th, 1e-5f, &ty, &tr), "weight: expected dtype float32", "weight dtype");
  fuselet_tensor t0 = view(x, {2, 0});
  expect_error(fuselet_rms_norm_fwd(&t0, &tw, 1e-5f, &ty, &tr), "hidden size", "H = 0");
  fuselet_tensor bad = tx;
  bad.dtype = static_cast<fuselet_dtype>(7);
  expect_error(fuselet_rms_norm_fwd(&bad, &tw, 1e-5f, &ty, &tr), "x: expected dtype", "integer dtype code");
  expect_error(fuselet_rms_norm_fwd(nullptr, &tw, 1e-5f, &ty, &tr), "x: expected a tensor", "NULL x");
  fuselet_tensor cols = view(x, {3, 2}, {1, 3});  // a transposed view: last dim not contiguous
  expect_error(fuselet_rms_norm_fwd(&cols, &tw2, 1e-5f, &ty, &tr), "stride 1", "transposed x");
  expect(fuselet_set_num_threads(0) == FUSELET_ERR_INVALID_ARGUMENT, "set_num_threads(0) rejected");
  // The CUDA entry points of a CPU-only build say so; with CUDA they reject host garbage args.
  if (!fuselet_has_cuda())
    expect(fuselet_rms_norm_fwd_cuda(&tx, &tw, 1e-5f, &ty, &tr, nullptr) == FUSELET_ERR_UNSUPPORTED,
           "CUDA entry point of a CPU-only build");
}

void check_empty_batch() {
  float w[4] = {1, 2, 3, 4}, dw[4] = {9, 9, 9, 9};
  fuselet_tensor tx = view(nullptr, {0, 4}), tw = view(w, {4}), tr = view(nullptr, {0}), tdw = view(dw, {4});
  expect(fuselet_rms_norm_bwd(&tx, &tx, &tw, &tr, &tx, &tdw) == FUSELET_OK, "0-row backward succeeds");
  expect(dw[0] == 0 && dw[3] == 0, "0-row backward zeroes dweight");
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
  fuselet_set_num_threads(1);
  check_numerics(33, 256, 256, true);
  fuselet_set_num_threads(3);
  check_numerics(333, 64, 64, false);
  check_errors();
  check_empty_batch();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
