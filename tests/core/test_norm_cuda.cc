// Standalone test of the CUDA normalization entry points (fuselet_*_norm_*_cuda) against the
// CPU entry points of the same library. No framework: prints one line per failure and
// "N passed, N failed" last; exits 0 on success, 1 on failure, 77 (ctest skip) without a GPU.
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test.h"
#include "fuselet/norm.h"
#include "tolerance.h"

namespace {

int g_passed = 0, g_failed = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

// ---- host float16 / bfloat16 conversions (round to nearest even) ----

float half_to_float(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  }
  return (h & 0x8000) ? -f : f;
}

uint16_t float_to_half(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.f) return sign | 0x7c00;  // rounds to infinity
  if (a < 6.103515625e-05f)                // subnormal: multiples of 2^-24 (1024 = smallest normal)
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.f));
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t q = static_cast<uint32_t>(std::nearbyint(m * 2048.f));
  int biased = e - 1 + 15;
  if (q == 2048) {
    q = 1024;
    ++biased;
  }
  if (biased >= 31) return sign | 0x7c00;
  return static_cast<uint16_t>(sign | (biased << 10) | (q - 1024));
}

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- buffers and tensor views ----

size_t dtype_size(fuselet_dtype dt) { return dt == FUSELET_FLOAT32 ? 4 : 2; }

const char* dtype_str(fuselet_dtype dt) {
  return dt == FUSELET_FLOAT32 ? "float32" : dt == FUSELET_FLOAT16 ? "float16" : "bfloat16";
}

// n elements of dtype `dt` in host memory.
struct HostBuf {
  fuselet_dtype dt;
  size_t n;
  std::vector<unsigned char> bytes;
  HostBuf(fuselet_dtype d, size_t count) : dt(d), n(count), bytes(count * dtype_size(d) + 1) {}
  void* data() { return bytes.data(); }
  size_t nbytes() const { return n * dtype_size(dt); }
  float get(size_t i) const {
    if (dt == FUSELET_FLOAT32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &bytes[i * 2], 2);
    return dt == FUSELET_FLOAT16 ? half_to_float(h) : bf16_to_float(h);
  }
  void set(size_t i, float v) {
    if (dt == FUSELET_FLOAT32) {
      std::memcpy(&bytes[i * 4], &v, 4);
      return;
    }
    const uint16_t h = dt == FUSELET_FLOAT16 ? float_to_half(v) : float_to_bf16(v);
    std::memcpy(&bytes[i * 2], &h, 2);
  }
};

// Device copy of a HostBuf (or an uninitialized / byte-filled buffer of the same size).
struct DevBuf {
  void* p = nullptr;
  size_t nbytes = 0;
  explicit DevBuf(size_t bytes, int fill = -1) : nbytes(bytes) {
    if (bytes == 0) return;
    CUDA_OK(cudaMalloc(&p, bytes));
    if (fill >= 0) CUDA_OK(cudaMemset(p, fill, bytes));
  }
  explicit DevBuf(const HostBuf& h) : DevBuf(h.nbytes()) {
    if (nbytes) CUDA_OK(cudaMemcpy(p, h.bytes.data(), nbytes, cudaMemcpyHostToDevice));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  HostBuf download(fuselet_dtype dt) const {
    HostBuf h(dt, nbytes / dtype_size(dt));
    if (nbytes) CUDA_OK(cudaMemcpy(h.data(), p, nbytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

fuselet_tensor rows_view(void* data, fuselet_dtype dt, int64_t rows, int64_t hidden, int64_t stride) {
  fuselet_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dt;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = hidden;
  t.strides[0] = stride;
  t.strides[1] = 1;
  return t;
}

fuselet_tensor vec_view(void* data, fuselet_dtype dt, int64_t n) {
  fuselet_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dt;
  t.ndim = 1;
  t.shape[0] = n;
  t.strides[0] = 1;
  return t;
}

// The largest |value| among the first `hidden` elements of each of `rows` rows.
double max_abs(const HostBuf& b, int64_t rows, int64_t hidden, int64_t stride) {
  double m = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < hidden; ++c) m = std::fmax(m, std::fabs(b.get(static_cast<size_t>(r * stride + c))));
  return m;
}

// Compares the first `hidden` elements of each of `rows` rows (`stride` apart) within `tol` of
// the CPU's (tolerance.h: 2 ulps of the dtype + float32 reduction error over `tol.reduced`
// terms); padding between rows must still hold `ref`'s bytes.
void compare(const std::string& what, const HostBuf& got, const HostBuf& ref, int64_t rows, int64_t hidden,
             int64_t stride, const fuselet_test::Tolerance& tol) {
  int64_t bad = 0;
  std::string first;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < stride; ++c) {
      const size_t i = static_cast<size_t>(r * stride + c);
      if (i >= got.n) break;
      const double g = got.get(i), e = ref.get(i);
      const bool ok = c < hidden ? tol.accepts(got.dt, g, e)
                                 : std::memcmp(&got.bytes[i * dtype_size(got.dt)], &ref.bytes[i * dtype_size(ref.dt)],
                                               dtype_size(got.dt)) == 0;
      if (!ok && bad++ == 0) {
        char buf[200];
        std::snprintf(buf, sizeof(buf),
                      " (first at row %" PRId64 " col %" PRId64 ": got %.7g, expected %.7g +- %.3g%s)", r, c, g, e,
                      tol.allowed(got.dt, e), c < hidden ? "" : ", padding overwritten");
        first = buf;
      }
    }
  }
  check(bad == 0, what + ": " + std::to_string(bad) + " mismatches" + first);
}

// Compares a whole output with the CPU's: the size of its sums is its largest value, or `terms`
// where the value is a difference of larger terms (dx).
void compare_sums(const std::string& what, const HostBuf& got, const HostBuf& ref, int64_t rows, int64_t hidden,
                  int64_t stride, int64_t reduced, double terms = 0) {
  const double scale = std::fmax(max_abs(ref, rows, hidden, stride), terms);
  compare(what, got, ref, rows, hidden, stride, fuselet_test::Tolerance{reduced, scale});
}

struct Case {
  fuselet_dtype dt;
  int64_t rows, hidden, stride;
  bool layer_norm;
  // Parameters: dtype (-1: x's), present or NULL, flags (fuselet_norm_flags).
  int pdt = -1;
  bool has_w = true, has_b = true;
  uint32_t flags = 0;
  float scale = 1.f;  // x = scale * (3 + N(0, 1)): 1e30 overflows the float32 sum of squares
  fuselet_dtype param_dtype() const { return pdt < 0 ? dt : static_cast<fuselet_dtype>(pdt); }
  std::string name() const {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "%s %s rows=%" PRId64 " H=%" PRId64 " stride=%" PRId64 " params=%s w=%d b=%d flags=%u scale=%g",
                  layer_norm ? "layer_norm" : "rms_norm", dtype_str(dt), rows, hidden, stride,
                  dtype_str(param_dtype()), has_w, has_b, flags, double(scale));
    return buf;
  }
};

// &t, or NULL for an absent parameter.
fuselet_tensor* maybe(bool present, fuselet_tensor* t) { return present ? t : nullptr; }

void expect_ok(fuselet_status s, const std::string& what) {
  check(s == FUSELET_OK, what + " returned " + fuselet_status_string(s) + ": " + fuselet_last_error());
}

void run_case(const Case& k, cudaStream_t stream) {
  const fuselet_dtype dt = k.dt, pd = k.param_dtype();
  const int64_t R = k.rows, H = k.hidden, S = k.stride;
  const size_t n = static_cast<size_t>(R > 0 ? (R - 1) * S + H : 0);
  const float eps = 1e-5f;
  std::mt19937 gen(static_cast<uint32_t>(R * 7919 + H * 31 + dt));
  std::normal_distribution<float> normal(0.f, 1.f);

  // Inputs (padding between rows holds a marker the kernels must not touch).
  HostBuf x(dt, n), dy(dt, n), w(pd, H), b(pd, H);
  for (size_t i = 0; i < n; ++i) {
    const bool pad = static_cast<int64_t>(i % S) >= H;
    x.set(i, pad ? 777.f : k.scale * (3.f + normal(gen)));  // offset mean: exercises the LayerNorm variance
    dy.set(i, pad ? 777.f : normal(gen));
  }
  for (int64_t i = 0; i < H; ++i) {
    w.set(i, 1.f + 0.2f * normal(gen));
    b.set(i, 0.1f * normal(gen));
  }
  HostBuf y_ref = x, dx_ref = x;  // same padding
  HostBuf mean_ref(FUSELET_FLOAT32, R), rstd_ref(FUSELET_FLOAT32, R), dw_ref(pd, H), db_ref(pd, H);
  fuselet_tensor tx = rows_view(x.data(), dt, R, H, S), tdy = rows_view(dy.data(), dt, R, H, S);
  fuselet_tensor tw = vec_view(w.data(), pd, H), tb = vec_view(b.data(), pd, H);
  fuselet_tensor ty = rows_view(y_ref.data(), dt, R, H, S), tdx = rows_view(dx_ref.data(), dt, R, H, S);
  fuselet_tensor tm = vec_view(mean_ref.data(), FUSELET_FLOAT32, R),
                 tr = vec_view(rstd_ref.data(), FUSELET_FLOAT32, R);
  fuselet_tensor tdw = vec_view(dw_ref.data(), pd, H), tdb = vec_view(db_ref.data(), pd, H);
  const std::string name = k.name();
  const uint32_t f = k.flags;
  fuselet_status s;
  if (k.layer_norm) {
    s = fuselet_layer_norm_fwd(&tx, maybe(k.has_w, &tw), maybe(k.has_b, &tb), eps, f, &ty, &tm, &tr);
    if (s == FUSELET_OK)
      s = fuselet_layer_norm_bwd(&tdy, &tx, maybe(k.has_w, &tw), &tm, &tr, f, &tdx, maybe(k.has_w, &tdw),
                                 maybe(k.has_b, &tdb));
  } else {
    s = fuselet_rms_norm_fwd(&tx, maybe(k.has_w, &tw), eps, f, &ty, &tr);
    if (s == FUSELET_OK) s = fuselet_rms_norm_bwd(&tdy, &tx, maybe(k.has_w, &tw), &tr, f, &tdx, maybe(k.has_w, &tdw));
  }
  if (s != FUSELET_OK) {
    check(false, name + ": CPU reference failed: " + fuselet_last_error());
    return;
  }

  // Device: inputs, outputs pre-filled with the reference's padding / garbage.
  DevBuf dx_in(x), ddy(dy), dw_in(w), db_in(b), dmean_ref(mean_ref), drstd_ref(rstd_ref);
  DevBuf dy_out(x), ddx_out(x);  // padding = marker; the row contents get overwritten
  DevBuf dmean(R * 4, 0xff), drstd(R * 4, 0xff), ddw(H * dtype_size(pd), 0xff), ddb(H * dtype_size(pd), 0xff);
  const size_t ws_bytes = fuselet_norm_bwd_workspace_bytes_cuda(R, H);
  check(R == 0 ? ws_bytes == 0 : ws_bytes > 0, name + ": workspace bytes " + std::to_string(ws_bytes));
  DevBuf ws(ws_bytes, 0xff);  // contents must be ignored

  fuselet_tensor gx = rows_view(dx_in.p, dt, R, H, S), gdy = rows_view(ddy.p, dt, R, H, S);
  fuselet_tensor gw = vec_view(dw_in.p, pd, H), gb = vec_view(db_in.p, pd, H);
  fuselet_tensor gy = rows_view(dy_out.p, dt, R, H, S), gdx = rows_view(ddx_out.p, dt, R, H, S);
  fuselet_tensor gm = vec_view(dmean.p, FUSELET_FLOAT32, R), gr = vec_view(drstd.p, FUSELET_FLOAT32, R);
  fuselet_tensor gmr = vec_view(dmean_ref.p, FUSELET_FLOAT32, R), grr = vec_view(drstd_ref.p, FUSELET_FLOAT32, R);
  fuselet_tensor gdw = vec_view(ddw.p, pd, H), gdb = vec_view(ddb.p, pd, H);
  fuselet_tensor *pgw = maybe(k.has_w, &gw), *pgb = maybe(k.has_b, &gb), *pgdw = maybe(k.has_w, &gdw),
                 *pgdb = maybe(k.has_b, &gdb);
  void* st = static_cast<void*>(stream);

  // Forward.
  s = k.layer_norm ? fuselet_layer_norm_fwd_cuda(&gx, pgw, pgb, eps, f, &gy, &gm, &gr, st)
                   : fuselet_rms_norm_fwd_cuda(&gx, pgw, eps, f, &gy, &gr, st);
  expect_ok(s, name + " fwd_cuda");
  CUDA_OK(cudaStreamSynchronize(stream));
  double rstd_max = 0, mean_max = 0, w_max = 1, g_max = 0;
  for (int64_t r = 0; r < R; ++r) rstd_max = std::fmax(rstd_max, std::fabs(rstd_ref.get(r)));
  for (int64_t r = 0; r < R && k.layer_norm; ++r) mean_max = std::fmax(mean_max, std::fabs(mean_ref.get(r)));
  for (int64_t c = 0; c < H && k.has_w; ++c) w_max = std::fmax(w_max, std::fabs(w.get(c)) + 1.0);
  // LayerNorm's y = (x - mean) * rstd * w + b carries the float32 rounding of the mean (a
  // fraction of an ulp of |mean|), amplified by rstd * |w|: far above y's own ulp where a row's
  // spread is small beside its mean (rows of 3 values around 3).
  compare_sums(name + " y", dy_out.download(dt), y_ref, R, H, S, H, mean_max * rstd_max * w_max);
  if (R > 0) {
    compare_sums(name + " rstd", drstd.download(FUSELET_FLOAT32), rstd_ref, 1, R, R, H);
    if (k.layer_norm) compare_sums(name + " mean", dmean.download(FUSELET_FLOAT32), mean_ref, 1, R, R, H);
  }
  // dx = rstd * (dy * w - mean(dy * w) - xhat * mean(dy * w * xhat)): a difference of terms of
  // size rstd * |dy * w|, which can be far larger than dx itself.
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < H; ++c) {
      const double wc = k.has_w ? w.get(c) + (f & FUSELET_NORM_ZERO_CENTERED_GAMMA ? 1.0 : 0.0) : 1.0;
      g_max = std::fmax(g_max, std::fabs(dy.get(static_cast<size_t>(r * S + c)) * wc));
    }

  // Backward, from the reference statistics; twice, to check it is deterministic.
  HostBuf first_dw(pd, H);
  for (int rep = 0; rep < 2; ++rep) {
    s = k.layer_norm ? fuselet_layer_norm_bwd_cuda(&gdy, &gx, pgw, &gmr, &grr, f, &gdx, pgdw, pgdb, ws.p, ws_bytes, st)
                     : fuselet_rms_norm_bwd_cuda(&gdy, &gx, pgw, &grr, f, &gdx, pgdw, ws.p, ws_bytes, st);
    expect_ok(s, name + " bwd_cuda");
    CUDA_OK(cudaStreamSynchronize(stream));
    const HostBuf got_dw = ddw.download(pd);
    if (rep == 1) {
      check(got_dw.bytes == first_dw.bytes, name + ": dweight differs between two identical runs");
      break;
    }
    first_dw = got_dw;
    compare_sums(name + " dx", ddx_out.download(dt), dx_ref, R, H, S, H, rstd_max * g_max);
    if (k.has_w) compare_sums(name + " dweight", got_dw, dw_ref, 1, H, H, R);
    if (k.layer_norm && k.has_b) compare_sums(name + " dbias", ddb.download(pd), db_ref, 1, H, H, R);
    CUDA_OK(cudaMemsetAsync(ws.p, 0xff, ws_bytes, stream));  // poison again for the second run
  }
}

// Invalid calls must be refused before anything is launched, naming the culprit.
void run_error_checks(cudaStream_t stream) {
  const int64_t R = 4, H = 64;
  DevBuf x(R * H * 4, 0), y(R * H * 4, 0), w(H * 4, 0), b(H * 4, 0), m(R * 4, 0), r(R * 4, 0), dw(H * 4, 0);
  fuselet_tensor tx = rows_view(x.p, FUSELET_FLOAT32, R, H, H), ty = rows_view(y.p, FUSELET_FLOAT32, R, H, H);
  fuselet_tensor tw = vec_view(w.p, FUSELET_FLOAT32, H), tb = vec_view(b.p, FUSELET_FLOAT32, H);
  fuselet_tensor tm = vec_view(m.p, FUSELET_FLOAT32, R), tr = vec_view(r.p, FUSELET_FLOAT32, R);
  fuselet_tensor tdw = vec_view(dw.p, FUSELET_FLOAT32, H);
  void* st = static_cast<void*>(stream);
  auto expect_invalid = [](fuselet_status s, const char* needle, const std::string& what) {
    const std::string msg = fuselet_last_error();
    check(s == FUSELET_ERR_INVALID_ARGUMENT && msg.find(needle) != std::string::npos,
          what + ": expected FUSELET_ERR_INVALID_ARGUMENT naming \"" + needle + "\", got " + fuselet_status_string(s) +
              ": \"" + msg + "\"");
  };
  expect_invalid(fuselet_rms_norm_fwd_cuda(&tx, &tw, 0.f, 0, &ty, &tr, st), "eps", "rms_norm_fwd_cuda eps=0");
  expect_invalid(fuselet_layer_norm_fwd_cuda(&tx, &tw, &tb, 0.f, 0, &ty, &tm, &tr, st), "eps",
                 "layer_norm_fwd_cuda eps=0");
  const size_t need = fuselet_norm_bwd_workspace_bytes_cuda(R, H);
  DevBuf ws(need, 0);
  expect_invalid(fuselet_rms_norm_bwd_cuda(&tx, &tx, &tw, &tr, 0, &ty, &tdw, nullptr, need, st), "workspace",
                 "rms_norm_bwd_cuda workspace=NULL");
  expect_invalid(fuselet_rms_norm_bwd_cuda(&tx, &tx, &tw, &tr, 0, &ty, &tdw, ws.p, need - 1, st), "workspace",
                 "rms_norm_bwd_cuda workspace too small");
  check(fuselet_norm_bwd_workspace_bytes_cuda(0, H) == 0, "workspace bytes for 0 rows must be 0");
}

// ---- gated RMSNorm ----

struct GatedCase {
  fuselet_dtype dt;
  int64_t rows, hidden, group_size;  // group_size 0: one group per row
  bool gate_first = false;
  int pdt = -1;  // the weight's dtype (-1: x's)
  bool has_w = true;
  uint32_t flags = 0;                       // fuselet_norm_flags besides FUSELET_NORM_GATE_FIRST
  int64_t x_pad = 0, y_pad = 0, z_pad = 0;  // row strides hidden + pad: of x and dy, y and dx, z and dz
  float scale = 1.f;                        // x = scale * (0.3 + N(0, 1)): 1e30 overflows the float32 sums
  fuselet_dtype param_dtype() const { return pdt < 0 ? dt : static_cast<fuselet_dtype>(pdt); }
  uint32_t all_flags() const { return flags | (gate_first ? static_cast<uint32_t>(FUSELET_NORM_GATE_FIRST) : 0u); }
  std::string name() const {
    char buf[240];
    std::snprintf(buf, sizeof(buf),
                  "gated_rms_norm %s rows=%" PRId64 " H=%" PRId64 " group_size=%" PRId64
                  " gate_first=%d params=%s w=%d flags=%u pads=%" PRId64 ",%" PRId64 ",%" PRId64 " scale=%g",
                  dtype_str(dt), rows, hidden, group_size, gate_first, dtype_str(param_dtype()), has_w, flags, x_pad,
                  y_pad, z_pad, double(scale));
    return buf;
  }
};

double silu_of(double z) { return z / (1.0 + std::exp(-z)); }

// The CUDA gated RMSNorm, forward and backward (from the CPU's rstd), against the CPU's.
void run_gated_case(const GatedCase& k, cudaStream_t stream) {
  const fuselet_dtype dt = k.dt, pd = k.param_dtype();
  const int64_t R = k.rows, H = k.hidden, S = k.group_size > 0 ? k.group_size : H, G = H / S;
  const int64_t xs = H + k.x_pad, ys = H + k.y_pad, zs = H + k.z_pad;
  const float eps = 1e-5f;
  const uint32_t f = k.all_flags();
  std::mt19937 gen(static_cast<uint32_t>(R * 7919 + H * 31 + S * 3 + dt + k.gate_first));
  std::normal_distribution<float> normal(0.f, 1.f);
  // R rows `stride` apart of scale * (mean + N(0, 1)); the padding between them a marker the
  // kernels must not touch.
  const auto rows_of = [&](int64_t stride, float scale, float mean) {
    HostBuf b(dt, static_cast<size_t>(R > 0 ? (R - 1) * stride + H : 0));
    for (size_t i = 0; i < b.n; ++i)
      b.set(i, static_cast<int64_t>(i % stride) >= H ? 777.f : scale * (mean + normal(gen)));
    return b;
  };
  const HostBuf x = rows_of(xs, k.scale, 0.3f), z = rows_of(zs, 2.f, 0.f), dy = rows_of(xs, 1.f, 0.f);
  const HostBuf y0 = rows_of(ys, 0.f, 0.f), z0 = rows_of(zs, 0.f, 0.f);  // the outputs' padding
  HostBuf w(pd, H);
  for (int64_t i = 0; i < H; ++i) w.set(i, 1.f + 0.2f * normal(gen));
  HostBuf y_ref = y0, dx_ref = y0, dz_ref = z0, rstd_ref(FUSELET_FLOAT32, R * G), dw_ref(pd, H);
  HostBuf xh = x, zh = z, dyh = dy, wh = w;  // the CPU's inputs (views take non-const data)
  fuselet_tensor tx = rows_view(xh.data(), dt, R, H, xs), tz = rows_view(zh.data(), dt, R, H, zs),
                 tdy = rows_view(dyh.data(), dt, R, H, xs), tw = vec_view(wh.data(), pd, H);
  fuselet_tensor ty = rows_view(y_ref.data(), dt, R, H, ys), tdx = rows_view(dx_ref.data(), dt, R, H, ys),
                 tdz = rows_view(dz_ref.data(), dt, R, H, zs), tr = vec_view(rstd_ref.data(), FUSELET_FLOAT32, R * G),
                 tdw = vec_view(dw_ref.data(), pd, H);
  const std::string name = k.name();
  fuselet_status s = fuselet_gated_rms_norm_fwd(&tx, &tz, maybe(k.has_w, &tw), eps, k.group_size, f, &ty, &tr);
  if (s == FUSELET_OK)
    s = fuselet_gated_rms_norm_bwd(&tdy, &tx, &tz, maybe(k.has_w, &tw), &tr, k.group_size, f, &tdx, &tdz,
                                   maybe(k.has_w, &tdw));
  if (s != FUSELET_OK) {
    check(false, name + ": CPU reference failed: " + fuselet_last_error());
    return;
  }

  DevBuf dx_in(x), dz_in(z), ddy(dy), dw_in(w), drstd_ref(rstd_ref);
  DevBuf dy_out(y0), ddx_out(y0), ddz_out(z0);  // padding = marker; the rows get overwritten
  DevBuf drstd(static_cast<size_t>(R * G) * 4, 0xff), ddw(H * dtype_size(pd), 0xff);
  const size_t ws_bytes = fuselet_norm_bwd_workspace_bytes_cuda(R, H);
  DevBuf ws(ws_bytes, 0xff);  // contents must be ignored
  fuselet_tensor gx = rows_view(dx_in.p, dt, R, H, xs), gz = rows_view(dz_in.p, dt, R, H, zs),
                 gdy = rows_view(ddy.p, dt, R, H, xs), gw = vec_view(dw_in.p, pd, H);
  fuselet_tensor gy = rows_view(dy_out.p, dt, R, H, ys), gdx = rows_view(ddx_out.p, dt, R, H, ys),
                 gdz = rows_view(ddz_out.p, dt, R, H, zs);
  fuselet_tensor gr = vec_view(drstd.p, FUSELET_FLOAT32, R * G), grr = vec_view(drstd_ref.p, FUSELET_FLOAT32, R * G);
  fuselet_tensor gdw = vec_view(ddw.p, pd, H);
  void* st = static_cast<void*>(stream);

  expect_ok(fuselet_gated_rms_norm_fwd_cuda(&gx, &gz, maybe(k.has_w, &gw), eps, k.group_size, f, &gy, &gr, st),
            name + " fwd_cuda");
  CUDA_OK(cudaStreamSynchronize(stream));
  compare_sums(name + " y", dy_out.download(dt), y_ref, R, H, ys, S);
  if (R > 0) compare_sums(name + " rstd", drstd.download(FUSELET_FLOAT32), rstd_ref, 1, R * G, R * G, S);

  // The sizes of the terms dx and dz are differences of: rstd * |gy * w| (gy = dy * silu(z), or
  // dy with the gate first), times |silu(z)| (dx) or |x * silu'(z)| (dz, silu' <= 1.1) with the
  // gate first.
  double rstd_max = 0, g_max = 0, s_max = 0, x_max = 0;
  for (int64_t i = 0; i < R * G; ++i) rstd_max = std::fmax(rstd_max, std::fabs(rstd_ref.get(i)));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < H; ++c) {
      const double wc = k.has_w ? w.get(c) + (f & FUSELET_NORM_ZERO_CENTERED_GAMMA ? 1.0 : 0.0) : 1.0;
      const double sz = silu_of(z.get(static_cast<size_t>(r * zs + c)));
      const double dyv = dy.get(static_cast<size_t>(r * xs + c));
      g_max = std::fmax(g_max, std::fabs((k.gate_first ? dyv : dyv * sz) * wc));
      s_max = std::fmax(s_max, std::fabs(sz));
      x_max = std::fmax(x_max, std::fabs(x.get(static_cast<size_t>(r * xs + c))));
    }
  const double dh_terms = rstd_max * g_max;

  // Backward, from the reference rstd; twice, to check it is deterministic.
  HostBuf first_dw(pd, H);
  for (int rep = 0; rep < 2; ++rep) {
    expect_ok(fuselet_gated_rms_norm_bwd_cuda(&gdy, &gx, &gz, maybe(k.has_w, &gw), &grr, k.group_size, f, &gdx, &gdz,
                                              maybe(k.has_w, &gdw), ws.p, ws_bytes, st),
              name + " bwd_cuda");
    CUDA_OK(cudaStreamSynchronize(stream));
    const HostBuf got_dw = ddw.download(pd);
    if (rep == 1) {
      check(got_dw.bytes == first_dw.bytes, name + ": dweight differs between two identical runs");
      break;
    }
    first_dw = got_dw;
    compare_sums(name + " dx", ddx_out.download(dt), dx_ref, R, H, ys, S, dh_terms * (k.gate_first ? s_max : 1.0));
    compare_sums(name + " dz", ddz_out.download(dt), dz_ref, R, H, zs, S, k.gate_first ? dh_terms * x_max * 1.1 : 0.0);
    if (k.has_w) compare_sums(name + " dweight", got_dw, dw_ref, 1, H, H, R);
    CUDA_OK(cudaMemsetAsync(ws.p, 0xff, ws_bytes, stream));  // poison again for the second run
  }
}

// Invalid gated calls are refused before anything is launched, naming the culprit.
void run_gated_error_checks(cudaStream_t stream) {
  const int64_t R = 4, H = 64;
  DevBuf x(R * H * 4 + 4, 0), y(R * H * 4 + 4, 0), w(H * 4 + 4, 0), r(R * 4 + 4, 0), dw(H * 4 + 4, 0);
  const auto odd = [](const DevBuf& b) { return static_cast<void*>(static_cast<char*>(b.p) + 2); };
  fuselet_tensor tx = rows_view(x.p, FUSELET_FLOAT32, R, H, H), ty = rows_view(y.p, FUSELET_FLOAT32, R, H, H);
  fuselet_tensor txo = rows_view(odd(x), FUSELET_FLOAT32, R, H, H), tyo = rows_view(odd(y), FUSELET_FLOAT32, R, H, H);
  fuselet_tensor tw = vec_view(w.p, FUSELET_FLOAT32, H), two = vec_view(odd(w), FUSELET_FLOAT32, H);
  fuselet_tensor tr = vec_view(r.p, FUSELET_FLOAT32, R), tro = vec_view(odd(r), FUSELET_FLOAT32, R);
  fuselet_tensor tdw = vec_view(dw.p, FUSELET_FLOAT32, H), tdwo = vec_view(odd(dw), FUSELET_FLOAT32, H);
  void* st = static_cast<void*>(stream);
  auto expect_invalid = [](fuselet_status s, const char* needle, const std::string& what) {
    const std::string msg = fuselet_last_error();
    check(s == FUSELET_ERR_INVALID_ARGUMENT && msg.find(needle) != std::string::npos,
          what + ": expected FUSELET_ERR_INVALID_ARGUMENT naming \"" + needle + "\", got " + fuselet_status_string(s) +
              ": \"" + msg + "\"");
  };
  const float e = 1e-5f;
  expect_invalid(fuselet_gated_rms_norm_fwd_cuda(&tx, &txo, &tw, e, 0, 0, &ty, &tr, st), "z: data pointer",
                 "gated fwd_cuda z misaligned");
  expect_invalid(fuselet_gated_rms_norm_fwd_cuda(&tx, &tx, &two, e, 0, 0, &ty, &tr, st), "weight: data pointer",
                 "gated fwd_cuda weight misaligned");
  expect_invalid(fuselet_gated_rms_norm_fwd_cuda(&tx, &tx, &tw, e, 0, 0, &ty, &tro, st), "rstd: data pointer",
                 "gated fwd_cuda rstd misaligned");
  expect_invalid(fuselet_gated_rms_norm_fwd_cuda(&tx, &tx, &tw, e, 3, 0, &ty, &tr, st), "group_size",
                 "gated fwd_cuda group_size 3 of 64");
  DevBuf r2(2 * R * 4, 0);
  fuselet_tensor tr2 = vec_view(r2.p, FUSELET_FLOAT32, 2 * R);  // rstd of groups of 32: 8 elements
  const size_t need = fuselet_norm_bwd_workspace_bytes_cuda(R, H);
  DevBuf ws(need, 0);
  expect_invalid(fuselet_gated_rms_norm_bwd_cuda(&tx, &tx, &tx, &tw, &tr, 0, 0, &ty, &tyo, &tdw, ws.p, need, st),
                 "dz: data pointer", "gated bwd_cuda dz misaligned");
  expect_invalid(fuselet_gated_rms_norm_bwd_cuda(&tx, &tx, &tx, &tw, &tr, 0, 0, &ty, &ty, &tdwo, ws.p, need, st),
                 "dweight: data pointer", "gated bwd_cuda dweight misaligned");
  expect_invalid(fuselet_gated_rms_norm_bwd_cuda(&tx, &tx, &tx, &tw, &tro, 0, 0, &ty, &ty, &tdw, ws.p, need, st),
                 "rstd: data pointer", "gated bwd_cuda rstd misaligned");
  expect_invalid(fuselet_gated_rms_norm_bwd_cuda(&tx, &tx, &tx, &tw, &tr2, 32, 0, &ty, &ty, &tdw, nullptr, need, st),
                 "workspace", "gated bwd_cuda workspace=NULL");
  expect_invalid(fuselet_gated_rms_norm_bwd_cuda(&tx, &tx, &tx, &tw, &tr, 32, 0, &ty, &ty, &tdw, ws.p, need, st),
                 "rstd: expected 8 elements", "gated bwd_cuda rstd of one group per row with group_size 32");
  expect_invalid(fuselet_gated_rms_norm_bwd_cuda(&tx, &tx, &tx, &tw, &tr, 0, 0, &ty, nullptr, &tdw, ws.p, need, st),
                 "dz: expected a tensor", "gated bwd_cuda without dz");
  expect_invalid(fuselet_gated_rms_norm_fwd_cuda(&tx, &tx, &tw, e, 0, 4, &ty, &tr, st), "flags",
                 "gated fwd_cuda unknown flag");
}

}  // namespace

// test_norm_cuda [DTYPE]: every case, or those of one dtype (float32, float16, bfloat16; the
// emulated runs split the work so).
int main(int argc, char** argv) {
  const std::string only = fuselet_test::start_cuda_test(argc, argv);
  const auto selected = [&only](fuselet_dtype dt) { return fuselet_test::runs_dtype(only, dtype_str(dt)); };
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const fuselet_dtype dtypes[] = {FUSELET_FLOAT32, FUSELET_FLOAT16, FUSELET_BFLOAT16};
  for (int d = 0; d < 3; ++d) {
    if (!selected(dtypes[d])) continue;
    for (bool ln : {false, true}) {
      // Warp rows (scalar; 256: 16-byte vectors), block rows, chunked rows.
      for (int64_t h : {1, 3, 127, 256, 1024, 4097})
        for (int64_t rows : {0, 1, 7, 1000}) run_case(Case{dtypes[d], rows, h, h, ln}, stream);
      // Padded rows: 1024 + 3 defeats the 16-byte path, 1024 + 8 keeps it with stride != H.
      run_case(Case{dtypes[d], 7, 1024, 1027, ln}, stream);
      run_case(Case{dtypes[d], 33, 1024, 1032, ln}, stream);
      // Rows longer than one register chunk: partials in shared memory (20000), or for LayerNorm
      // in the workspace once 2 * H floats exceed the shared memory limit (30000).
      for (int64_t rows : {2, 300}) run_case(Case{dtypes[d], rows, 20000, 20000, ln}, stream);
      run_case(Case{dtypes[d], 40, 30000, 30000, ln}, stream);
      // Parameters: float32 with any x, absent weight / bias, zero-centered gamma; every team kind.
      for (int64_t h : {127, 1024, 4097, 20000})
        for (int64_t rows : {7, 300}) {
          const Case base{dtypes[d], rows, h, h, ln};
          Case k = base;
          k.pdt = FUSELET_FLOAT32;
          run_case(k, stream);
          k = base;
          k.has_w = k.has_b = false;
          run_case(k, stream);
          k = base;
          k.pdt = FUSELET_FLOAT32;
          k.has_b = false;
          k.flags = FUSELET_NORM_ZERO_CENTERED_GAMMA;
          run_case(k, stream);
          k = base;
          k.has_w = false;
          run_case(k, stream);
        }
    }
  }
  // |x| ~ 1e30 (float32, bfloat16): rows whose float32 sum of squares overflows are rescaled,
  // as on the CPU; every team kind (warp, block, chunked).
  for (fuselet_dtype dt : {FUSELET_FLOAT32, FUSELET_BFLOAT16})
    for (bool ln : {false, true})
      for (int64_t h : {127, 4097, 30000}) {
        if (!selected(dt)) continue;
        Case k{dt, 7, h, h, ln};
        k.scale = 1e30f;
        run_case(k, stream);
      }
  // Gated RMSNorm: both gate orders; one group per row and groups of a divisor of H (one element
  // each at H = 1; fewer elements than threads; more: 4097); 0 rows (dweight zeroed, or none);
  // 1000 rows (two rows per backward block); strided rows (x and dy, y and dx, z and dz apart);
  // no weight, float32 weight, zero-centered gamma; |x| ~ 1e30 (float32, bfloat16).
  for (int d = 0; d < 3; ++d) {
    const fuselet_dtype dt = dtypes[d];
    if (!selected(dt)) continue;
    for (bool gf : {false, true}) {
      const auto gated = [&](int64_t rows, int64_t h, int64_t group) { return GatedCase{dt, rows, h, group, gf}; };
      for (const auto& hs : {std::pair<int64_t, int64_t>{1, 0}, {96, 32}, {256, 64}, {256, 0}, {4097, 0}})
        for (int64_t rows : {1, 7}) run_gated_case(gated(rows, hs.first, hs.second), stream);
      run_gated_case(gated(0, 256, 64), stream);
      run_gated_case(gated(1000, 96, 32), stream);
      GatedCase k = gated(7, 256, 64);
      k.x_pad = 3;
      k.y_pad = 8;
      k.z_pad = 44;
      run_gated_case(k, stream);
      for (int64_t rows : {0, 7}) {
        k = gated(rows, 96, 32);
        k.has_w = false;
        run_gated_case(k, stream);
      }
      k = gated(7, 4097, 0);
      k.pdt = FUSELET_FLOAT32;
      run_gated_case(k, stream);
      k = gated(19, 256, 64);
      k.pdt = FUSELET_FLOAT32;
      k.flags = FUSELET_NORM_ZERO_CENTERED_GAMMA;
      run_gated_case(k, stream);
      if (dt != FUSELET_FLOAT16)
        for (int64_t group : {0, 64}) {
          k = gated(7, 256, group);
          k.scale = 1e30f;
          run_gated_case(k, stream);
        }
    }
  }
  if (selected(FUSELET_FLOAT32)) run_error_checks(stream);
  if (selected(FUSELET_FLOAT32)) run_gated_error_checks(stream);
  CUDA_OK(cudaStreamDestroy(stream));
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
