// Standalone test of the CUDA entry points of add_rms_norm, glu, softmax, rope, cross_entropy and divergence against the CPU
// entry points of the same library (float32, rows of every kernel path). Prints one line per
// failure and "N passed, N failed" last; exits 0 on success, 1 on failure, 77 (ctest skip)
// without a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "fuselet/cross_entropy.h"
#include "fuselet/divergence.h"
#include "fuselet/glu.h"
#include "fuselet/norm.h"
#include "fuselet/rope.h"
#include "fuselet/softmax.h"

namespace {

using fuselet_test::view;

int g_passed = 0, g_failed = 0;

void check(bool ok, const std::string& what) {
  ok ? ++g_passed : ++g_failed;
  if (!ok) std::printf("FAIL: %s (%s)\n", what.c_str(), fuselet_last_error());
}

#define CUDA_OK(expr)                                                                             \
  do {                                                                                            \
    const cudaError_t err_ = (expr);                                                              \
    if (err_ != cudaSuccess) {                                                                    \
      std::printf("FAIL: %s: %s (%s:%d)\n", #expr, cudaGetErrorString(err_), __FILE__, __LINE__); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// A float32 buffer on the host and its device twin.
struct Buf {
  std::vector<float> h;
  float* d = nullptr;
  explicit Buf(size_t n, unsigned seed = 0) : h(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.3f, 2.0f);
    for (auto& v : h) v = seed ? dist(rng) : 0.f;
    CUDA_OK(cudaMalloc(&d, (n ? n : 1) * sizeof(float)));
    if (n) CUDA_OK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~Buf() { cudaFree(d); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  std::vector<float> download() const {
    std::vector<float> out(h.size());
    if (!out.empty()) CUDA_OK(cudaMemcpy(out.data(), d, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }
};

void compare(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i)
    err = std::fmax(err, std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i])));
  check(err < 1e-4, what + ": max error " + std::to_string(err));
}

void glu_case(const fuselet_glu_options& o, int64_t rows, int64_t f, cudaStream_t s) {
  const std::string name = "glu act=" + std::to_string(o.activation) + (o.interleaved ? " interleaved " : " ") +
                           std::to_string(rows) + "x" + std::to_string(f);
  Buf x(rows * 2 * f, 1), dy(rows * f, 2), y(rows * f), dx(rows * 2 * f);
  fuselet_tensor hx = view(x.h.data(), {rows, 2 * f}), hdy = view(dy.h.data(), {rows, f}),
                 hy = view(y.h.data(), {rows, f}), hdx = view(dx.h.data(), {rows, 2 * f});
  fuselet_tensor vx = view(x.d, {rows, 2 * f}), vdy = view(dy.d, {rows, f}), vy = view(y.d, {rows, f}),
                 vdx = view(dx.d, {rows, 2 * f});
  check(fuselet_glu_fwd_ex(&hx, &o, &hy) == FUSELET_OK && fuselet_glu_bwd_ex(&hdy, &hx, &o, &hdx) == FUSELET_OK,
        name + " cpu");
  check(fuselet_glu_fwd_ex_cuda(&vx, &o, &vy, s) == FUSELET_OK &&
            fuselet_glu_bwd_ex_cuda(&vdy, &vx, &o, &vdx, s) == FUSELET_OK,
        name + " cuda");
  if (o.activation != FUSELET_GLU_SILU_CLAMPED && !o.interleaved)  // the plain entry points too
    check(fuselet_glu_fwd_cuda(&vx, o.activation, &vy, s) == FUSELET_OK &&
              fuselet_glu_bwd_cuda(&vdy, &vx, o.activation, &vdx, s) == FUSELET_OK,
          name + " cuda, plain entry points");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " y", y.download(), y.h);
  compare(name + " dx", dx.download(), dx.h);
}

void softmax_case(int64_t b, int64_t q, int64_t k, bool causal, cudaStream_t s) {
  const std::string name =
      "softmax " + std::to_string(b) + "x" + std::to_string(q) + "x" + std::to_string(k) + (causal ? " causal" : "");
  const int64_t n = b * q * k;
  Buf x(n, 3), dy(n, 4), y(n), dx(n);
  const uint32_t flags = causal ? FUSELET_SOFTMAX_CAUSAL : 0;
  fuselet_tensor hx = view(x.h.data(), {b, q, k}), hdy = view(dy.h.data(), {b, q, k}),
                 hy = view(y.h.data(), {b, q, k}), hdx = view(dx.h.data(), {b, q, k});
  fuselet_tensor vx = view(x.d, {b, q, k}), vdy = view(dy.d, {b, q, k}), vy = view(y.d, {b, q, k}),
                 vdx = view(dx.d, {b, q, k});
  check(fuselet_softmax_fwd(&hx, 0.7f, flags, &hy) == FUSELET_OK &&
            fuselet_softmax_bwd(&hdy, &hy, 0.7f, &hdx) == FUSELET_OK,
        name + " cpu");
  // The CUDA backward takes the CPU forward's y, so that both backwards see the same input.
  CUDA_OK(cudaMemcpy(y.d, y.h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  check(fuselet_softmax_bwd_cuda(&vdy, &vy, 0.7f, &vdx, s) == FUSELET_OK, name + " cuda bwd");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " dx", dx.download(), dx.h);
  check(fuselet_softmax_fwd_cuda(&vx, 0.7f, flags, &vy, s) == FUSELET_OK, name + " cuda fwd");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " y", y.download(), y.h);
}

void add_rms_norm_case(int64_t rows, int64_t h, cudaStream_t s) {
  const std::string name = "add_rms_norm " + std::to_string(rows) + "x" + std::to_string(h);
  Buf x(rows * h, 5), res(rows * h, 6), w(h, 7), dy(rows * h, 8), dh(rows * h, 9), y(rows * h), ho(rows * h),
      rstd(rows), dx(rows * h), dw(h);
  auto rows_of = [&](Buf& b, bool dev) { return view(dev ? static_cast<void*>(b.d) : b.h.data(), {rows, h}); };
  auto vec_of = [&](Buf& b, bool dev, int64_t n) { return view(dev ? static_cast<void*>(b.d) : b.h.data(), {n}); };
  for (bool dev : {false, true}) {
    fuselet_tensor tx = rows_of(x, dev), tres = rows_of(res, dev), tw = vec_of(w, dev, h), tdy = rows_of(dy, dev),
                   tdh = rows_of(dh, dev), ty = rows_of(y, dev), tho = rows_of(ho, dev), tr = vec_of(rstd, dev, rows),
                   tdx = rows_of(dx, dev), tdw = vec_of(dw, dev, h);
    if (!dev) {
      check(fuselet_add_rms_norm_fwd(&tx, &tres, &tw, 1e-5f, 0, &ty, &tho, &tr) == FUSELET_OK &&
                fuselet_add_rms_norm_bwd(&tdy, &tdh, &tho, &tw, &tr, 0, &tdx, &tdw) == FUSELET_OK,
            name + " cpu");
      continue;
    }
    const size_t bytes = fuselet_norm_bwd_workspace_bytes_cuda(rows, h);
    void* ws = nullptr;
    if (bytes) CUDA_OK(cudaMalloc(&ws, bytes));
    check(fuselet_add_rms_norm_fwd_cuda(&tx, &tres, &tw, 1e-5f, 0, &ty, &tho, &tr, s) == FUSELET_OK &&
              fuselet_add_rms_norm_bwd_cuda(&tdy, &tdh, &tho, &tw, &tr, 0, &tdx, &tdw, ws, bytes, s) == FUSELET_OK,
          name + " cuda");
    CUDA_OK(cudaStreamSynchronize(s));
    cudaFree(ws);
  }
  compare(name + " residual_out", ho.download(), ho.h);
  compare(name + " y", y.download(), y.h);
  compare(name + " dx", dx.download(), dx.h);
  std::vector<float> got = dw.download(), want = dw.h;
  double err = 0;
  for (int64_t i = 0; i < h; ++i) err = std::fmax(err, std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i])));
  check(err < 1e-4 * std::sqrt(double(rows) + 1.0), name + " dweight: max error " + std::to_string(err));
}

// x [B, S, N, D] (bhsd: [B, N, S, D]) inside rows padded to `pad` >= D elements (pad > D: a
// strided view), cos / sin [S, R] or [B, S, R]; y, dy, dx contiguous.
void rope_case(int64_t b, int64_t sq, int64_t n, int64_t d, int64_t r, int64_t pad, uint32_t flags, bool per_seq,
               cudaStream_t s) {
  const std::string name = "rope " + std::to_string(b) + "x" + std::to_string(sq) + "x" + std::to_string(n) + "x" +
                           std::to_string(d) + " R=" + std::to_string(r) + " pad=" + std::to_string(pad) +
                           " flags=" + std::to_string(flags) + (per_seq ? " per-seq" : "");
  const int64_t rows = b * sq * n, tables = (per_seq ? b : 1) * sq;
  Buf x(rows * pad, 11), dy(rows * d, 12), c(tables * r, 13), sn(tables * r, 14), y(rows * d), dx(rows * d);
  const bool bhsd = flags & FUSELET_ROPE_BHSD;
  const int64_t d1 = bhsd ? n : sq, d2 = bhsd ? sq : n;
  auto xv = [&](void* p) {
    fuselet_tensor t = view(p, {b, d1, d2, d});
    t.strides[2] = pad, t.strides[1] = d2 * pad, t.strides[0] = d1 * d2 * pad;
    return t;
  };
  std::vector<int64_t> cshape = per_seq ? std::vector<int64_t>{b, sq, r} : std::vector<int64_t>{sq, r};
  for (bool dev : {false, true}) {
    fuselet_tensor tx = xv(dev ? static_cast<void*>(x.d) : x.h.data()),
                   tdy = view(dev ? static_cast<void*>(dy.d) : dy.h.data(), {b, d1, d2, d}),
                   ty = view(dev ? static_cast<void*>(y.d) : y.h.data(), {b, d1, d2, d}),
                   tdx = view(dev ? static_cast<void*>(dx.d) : dx.h.data(), {b, d1, d2, d}),
                   tc = view(dev ? static_cast<void*>(c.d) : c.h.data(), cshape),
                   ts = view(dev ? static_cast<void*>(sn.d) : sn.h.data(), cshape);
    if (!dev) {
      check(fuselet_rope_fwd(&tx, &tc, &ts, flags, &ty) == FUSELET_OK &&
                fuselet_rope_bwd(&tdy, &tc, &ts, flags, &tdx) == FUSELET_OK,
            name + " cpu");
      continue;
    }
    check(fuselet_rope_fwd_cuda(&tx, &tc, &ts, flags, &ty, s) == FUSELET_OK &&
              fuselet_rope_bwd_cuda(&tdy, &tc, &ts, flags, &tdx, s) == FUSELET_OK,
          name + " cuda");
    CUDA_OK(cudaStreamSynchronize(s));
  }
  compare(name + " y", y.download(), y.h);
  compare(name + " dx", dx.download(), dx.h);
}

// Class ids on the host and their device twin (int64).
struct Targets {
  std::vector<int64_t> h;
  int64_t* d = nullptr;
  Targets(int64_t rows, int64_t vocab, int64_t ignore_index) : h(rows) {
    for (int64_t r = 0; r < rows; ++r) h[r] = r % 4 == 1 ? ignore_index : (r * 7919 + 13) % vocab;
    CUDA_OK(cudaMalloc(&d, (rows ? rows : 1) * sizeof(int64_t)));
    if (rows) CUDA_OK(cudaMemcpy(d, h.data(), rows * sizeof(int64_t), cudaMemcpyHostToDevice));
  }
  ~Targets() { cudaFree(d); }
  Targets(const Targets&) = delete;
  Targets& operator=(const Targets&) = delete;
};

// Forward, backward (from the CPU's lse) and in-place fwd_bwd on the GPU against the CPU.
void cross_entropy_case(int64_t rows, int64_t vocab, fuselet_cross_entropy_options o, cudaStream_t s) {
  const std::string name = "cross_entropy " + std::to_string(rows) + "x" + std::to_string(vocab) +
                           " ls=" + std::to_string(o.label_smoothing) + " z=" + std::to_string(o.z_loss) +
                           " cap=" + std::to_string(o.softcap) + " ignore=" + std::to_string(o.ignore_index);
  Buf x(rows * vocab, 11), g(rows, 12), loss(rows), z(rows), lse(rows), dx(rows * vocab), fused(rows * vocab, 11),
      floss(rows);
  Targets t(rows, vocab, o.ignore_index);
  fuselet_tensor ht = view(t.h.data(), {rows}), dt = view(t.d, {rows});
  ht.dtype = dt.dtype = FUSELET_INT64;
  fuselet_tensor hx = view(x.h.data(), {rows, vocab}), hg = view(g.h.data(), {rows}), hl = view(loss.h.data(), {rows}),
                 hz = view(z.h.data(), {rows}), hlse = view(lse.h.data(), {rows}),
                 hdx = view(dx.h.data(), {rows, vocab}), hf = view(fused.h.data(), {rows, vocab}),
                 hfl = view(floss.h.data(), {rows});
  fuselet_tensor vx = view(x.d, {rows, vocab}), vg = view(g.d, {rows}), vl = view(loss.d, {rows}),
                 vz = view(z.d, {rows}), vlse = view(lse.d, {rows}), vdx = view(dx.d, {rows, vocab}),
                 vf = view(fused.d, {rows, vocab}), vfl = view(floss.d, {rows});
  check(fuselet_cross_entropy_fwd(&hx, &ht, &o, &hl, &hz, &hlse) == FUSELET_OK &&
            fuselet_cross_entropy_bwd(&hg, &hx, &ht, &hlse, &o, &hdx) == FUSELET_OK &&
            fuselet_cross_entropy_fwd_bwd(&hf, &ht, &o, 0.5f, &hfl, nullptr, &hf) == FUSELET_OK,
        name + " cpu");
  check(fuselet_cross_entropy_fwd_cuda(&vx, &dt, &o, &vl, &vz, &vlse, s) == FUSELET_OK, name + " cuda fwd");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " loss", loss.download(), loss.h);
  compare(name + " z", z.download(), z.h);
  compare(name + " lse", lse.download(), lse.h);
  if (rows) CUDA_OK(cudaMemcpy(lse.d, lse.h.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
  check(fuselet_cross_entropy_bwd_cuda(&vg, &vx, &dt, &vlse, &o, &vdx, s) == FUSELET_OK, name + " cuda bwd");
  check(fuselet_cross_entropy_fwd_bwd_cuda(&vf, &dt, &o, 0.5f, &vfl, nullptr, &vf, s) == FUSELET_OK,
        name + " cuda fwd_bwd in place");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " dlogits", dx.download(), dx.h);
  compare(name + " fwd_bwd loss", floss.download(), floss.h);
  compare(name + " fwd_bwd dlogits", fused.download(), fused.h);
}

// Divergences: forward and both gradients on the GPU against the CPU, input and target as
// log-softmax rows (probabilities for KL with log_target = 0).
void divergence_case(int64_t rows, int64_t vocab, fuselet_divergence_options o, cudaStream_t s) {
  const std::string name = "divergence kind=" + std::to_string(o.kind) +
                           " log_target=" + std::to_string(o.log_target) + " beta=" + std::to_string(o.beta) + " " +
                           std::to_string(rows) + "x" + std::to_string(vocab);
  Buf x(rows * vocab, 21), t(rows * vocab, 22), g(rows, 23), loss(rows), dx(rows * vocab), dt(rows * vocab);
  for (Buf* b : {&x, &t})
    for (int64_t r = 0; r < rows; ++r) {
      float* row = b->h.data() + r * vocab;
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < vocab; ++j) m = std::fmax(m, row[j]);
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - m);
      for (int64_t j = 0; j < vocab; ++j) row[j] = static_cast<float>(row[j] - m - std::log(sum));
      if (b == &t && !o.log_target)
        for (int64_t j = 0; j < vocab; ++j) row[j] = std::exp(row[j]);
    }
  if (rows) {
    CUDA_OK(cudaMemcpy(x.d, x.h.data(), rows * vocab * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(t.d, t.h.data(), rows * vocab * sizeof(float), cudaMemcpyHostToDevice));
  }
  fuselet_tensor hx = view(x.h.data(), {rows, vocab}), ht = view(t.h.data(), {rows, vocab}),
                 hg = view(g.h.data(), {rows}), hl = view(loss.h.data(), {rows}),
                 hdx = view(dx.h.data(), {rows, vocab}), hdt = view(dt.h.data(), {rows, vocab});
  fuselet_tensor vx = view(x.d, {rows, vocab}), vt = view(t.d, {rows, vocab}), vg = view(g.d, {rows}),
                 vl = view(loss.d, {rows}), vdx = view(dx.d, {rows, vocab}), vdt = view(dt.d, {rows, vocab});
  check(fuselet_divergence_fwd(&hx, &ht, &o, &hl) == FUSELET_OK &&
            fuselet_divergence_bwd(&hg, &hx, &ht, &o, &hdx, &hdt) == FUSELET_OK,
        name + " cpu");
  check(fuselet_divergence_fwd_cuda(&vx, &vt, &o, &vl, s) == FUSELET_OK &&
            fuselet_divergence_bwd_cuda(&vg, &vx, &vt, &o, &vdx, &vdt, s) == FUSELET_OK,
        name + " cuda");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " loss", loss.download(), loss.h);
  compare(name + " dinput", dx.download(), dx.h);
  compare(name + " dtarget", dt.download(), dt.h);
}

// A target outside [0, V) (not ignored): NaN loss and a zero gradient row on the GPU, the
// other rows as usual.
void cross_entropy_bad_target(cudaStream_t s) {
  const int64_t rows = 3, vocab = 50;
  const fuselet_cross_entropy_options o{-100, 0.f, 0.f, 0.f};
  Buf x(rows * vocab, 13), loss(rows), dx(rows * vocab, 14);
  Targets t(rows, vocab, -100);
  t.h = {4, 50, 7};
  CUDA_OK(cudaMemcpy(t.d, t.h.data(), rows * sizeof(int64_t), cudaMemcpyHostToDevice));
  fuselet_tensor dt = view(t.d, {rows}), vx = view(x.d, {rows, vocab}), vl = view(loss.d, {rows}),
                 vdx = view(dx.d, {rows, vocab});
  dt.dtype = FUSELET_INT64;
  check(fuselet_cross_entropy_fwd_bwd_cuda(&vx, &dt, &o, 1.f, &vl, nullptr, &vdx, s) == FUSELET_OK,
        "cross_entropy bad target: cuda");
  CUDA_OK(cudaStreamSynchronize(s));
  const std::vector<float> l = loss.download(), d = dx.download();
  bool zero_row = true;
  for (int64_t j = 0; j < vocab; ++j) zero_row = zero_row && d[vocab + j] == 0.f;
  check(std::isnan(l[1]) && std::isfinite(l[0]) && std::isfinite(l[2]) && zero_row,
        "cross_entropy bad target: NaN loss, zero gradient row");
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  if (!fuselet_has_cuda()) {
    std::printf("libfuselet was built without CUDA: skipped\n");
    return 77;
  }
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int act : {FUSELET_GLU_SILU, FUSELET_GLU_GELU, FUSELET_GLU_GELU_TANH, FUSELET_GLU_SILU_CLAMPED})
    for (int interleaved : {0, 1})
      for (int64_t f : {1, 3, 127, 4096, 4097})
        glu_case({act, interleaved, 1.702f, 1.5f}, 9, f, s);  // a limit inside the inputs' spread
  glu_case({FUSELET_GLU_SILU, 0, 0.f, 0.f}, 70000, 8, s);  // more rows than the grid's y extent
  for (bool causal : {false, true}) {
    for (int64_t k : {1, 3, 127, 4096, 4097}) softmax_case(2, 5, k, causal, s);
    softmax_case(1, 7, 3, causal, s);  // Q > K: fully masked rows
    softmax_case(3, 130, 129, causal, s);
  }
  // Warp rows, block rows, chunked rows (shared memory and workspace partials), 16-byte and scalar.
  for (int64_t h : {1, 3, 127, 512, 1027, 4096, 20000}) add_rms_norm_case(33, h, s);
  add_rms_norm_case(1000, 1024, s);
  // Vector units (D, R, strides multiples of 4) and scalar ones, both pairings and layouts.
  for (uint32_t flags = 0; flags < 4; ++flags)
    for (bool per_seq : {false, true}) {
      rope_case(2, 17, 4, 128, 128, 128, flags, per_seq, s);
      rope_case(2, 17, 4, 128, 64, 136, flags, per_seq, s);  // partial rotary, padded rows
      rope_case(3, 5, 3, 10, 6, 10, flags, per_seq, s);  // scalar units
      rope_case(1, 9, 2, 12, 4, 13, flags, per_seq, s);  // scalar: odd row stride
    }
  rope_case(4, 2048, 8, 64, 64, 64, 0, false, s);  // more units than the grid
  // Cross-entropy: odd, vocabulary-sized and 128k+ rows (strided), every option, ignore_index in [0, V).
  for (int64_t v : {1, 3, 127, 4097, 32000, 32001}) cross_entropy_case(9, v, {-100, 0.f, 0.f, 0.f}, s);
  cross_entropy_case(6, 32001, {-100, 0.1f, 1e-3f, 30.f}, s);
  cross_entropy_case(5, 3, {2, 0.2f, 1e-2f, 5.f}, s);
  cross_entropy_case(3, 131072 + 5, {-100, 0.05f, 1e-4f, 0.f}, s);
  cross_entropy_case(2, 262144, {-100, 0.f, 0.f, 15.f}, s);
  cross_entropy_case(0, 8, {-100, 0.f, 0.f, 0.f}, s);
  cross_entropy_case(70000, 4, {-100, 0.1f, 0.f, 0.f}, s);  // more rows than a block's share
  cross_entropy_bad_target(s);
  // Divergences: every kind, beta at its special values, odd and vocabulary-sized rows, no rows.
  for (int64_t v : {1, 3, 127, 4097, 32001}) {
    divergence_case(9, v, {FUSELET_DIVERGENCE_KL, 1, 0.f}, s);
    divergence_case(9, v, {FUSELET_DIVERGENCE_KL, 0, 0.f}, s);
    for (float beta : {0.f, 0.3f, 1.f}) divergence_case(9, v, {FUSELET_DIVERGENCE_JSD, 1, beta}, s);
    divergence_case(9, v, {FUSELET_DIVERGENCE_TVD, 1, 0.f}, s);
  }
  divergence_case(0, 8, {FUSELET_DIVERGENCE_JSD, 1, 0.5f}, s);
  divergence_case(70000, 4, {FUSELET_DIVERGENCE_JSD, 1, 0.5f}, s);
  CUDA_OK(cudaStreamDestroy(s));
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
