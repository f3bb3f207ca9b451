// Standalone test of the CUDA entry points of add_rms_norm, glu, softmax, rope, cross_entropy, logprobs and divergence against the CPU
// entry points of the same library: float32 over rows of every kernel path, float16 and
// bfloat16 over a shape of each path, and their refusals of bad input. Both sides read the same
// inputs and round their float32 math once to the output dtype. Prints one line per failure and
// "N passed, N failed" last; exits 0 on success, 1 on failure, 77 (ctest skip) without a GPU.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_test.h"
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

// The dtype of the tensors a case makes (float32 unless a case says otherwise), and how far
// two float32 computations rounded once to it may be apart, relative to 1 + |value|: a few units
// in its last place (float32: the reductions' order too).
fuselet_dtype g_dt = FUSELET_FLOAT32;
double tolerance(fuselet_dtype dt) { return dt == FUSELET_FLOAT32 ? 1e-4 : dt == FUSELET_FLOAT16 ? 4e-3 : 3e-2; }
const char* dtype_name(fuselet_dtype dt) {
  return dt == FUSELET_FLOAT32 ? "float32" : dt == FUSELET_FLOAT16 ? "float16" : "bfloat16";
}
size_t dtype_size(fuselet_dtype dt) { return dt == FUSELET_FLOAT32 ? 4 : 2; }

float load_value(const unsigned char* p, fuselet_dtype dt) {
  if (dt == FUSELET_FLOAT32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (dt == FUSELET_FLOAT16) {
    __half h;
    std::memcpy(&h, p, 2);
    return __half2float(h);
  }
  __nv_bfloat16 b;
  std::memcpy(&b, p, 2);
  return __bfloat162float(b);
}

void store_value(unsigned char* p, fuselet_dtype dt, float v) {
  if (dt == FUSELET_FLOAT32) {
    std::memcpy(p, &v, 4);
  } else if (dt == FUSELET_FLOAT16) {
    const __half h = __float2half_rn(v);
    std::memcpy(p, &h, 2);
  } else {
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    std::memcpy(p, &b, 2);
  }
}

// n values of dtype `dt` on the host (what the CPU entry points read and write) and their device
// twin, filled from N(0.3, 2) with `seed` (or zeros).
struct Buf {
  fuselet_dtype dt;
  size_t n;
  std::vector<unsigned char> h;
  void* d = nullptr;
  explicit Buf(size_t count, unsigned seed = 0, fuselet_dtype dtype = g_dt)
      : dt(dtype), n(count), h(count * dtype_size(dtype)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.3f, 2.0f);
    for (size_t i = 0; i < n; ++i) set(i, seed ? dist(rng) : 0.f);
    CUDA_OK(cudaMalloc(&d, (n ? n : 1) * dtype_size(dt)));
    upload();
  }
  ~Buf() { cudaFree(d); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  float get(size_t i) const { return load_value(&h[i * dtype_size(dt)], dt); }
  void set(size_t i, float v) { store_value(&h[i * dtype_size(dt)], dt, v); }
  void* host() { return h.data(); }
  // The host values to the device.
  void upload() {
    if (n) CUDA_OK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  // The host values (the CPU's results), as floats.
  std::vector<float> values() const {
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = get(i);
    return out;
  }
  // The device values (the GPU's results), as floats.
  std::vector<float> download() const {
    std::vector<unsigned char> bytes(h.size());
    if (n) CUDA_OK(cudaMemcpy(bytes.data(), d, bytes.size(), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = load_value(&bytes[i * dtype_size(dt)], dt);
    return out;
  }
};

// Views of a buffer's host or device values, in its dtype.
fuselet_tensor hv(Buf& b, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  return view(b.host(), std::move(shape), std::move(strides), b.dt);
}
fuselet_tensor dv(Buf& b, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  return view(b.d, std::move(shape), std::move(strides), b.dt);
}

void compare(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
             fuselet_dtype dt = g_dt) {
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    err = std::fmax(err, std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i])));
  }
  check(err < tolerance(dt), what + " (" + dtype_name(dt) + "): max error " + std::to_string(err));
}

void glu_case(const fuselet_glu_options& o, int64_t rows, int64_t f, cudaStream_t s) {
  const std::string name = "glu act=" + std::to_string(o.activation) + (o.interleaved ? " interleaved " : " ") +
                           std::to_string(rows) + "x" + std::to_string(f);
  Buf x(rows * 2 * f, 1), dy(rows * f, 2), y(rows * f), dx(rows * 2 * f);
  fuselet_tensor hx = hv(x, {rows, 2 * f}), hdy = hv(dy, {rows, f}), hy = hv(y, {rows, f}),
                 hdx = hv(dx, {rows, 2 * f});
  fuselet_tensor vx = dv(x, {rows, 2 * f}), vdy = dv(dy, {rows, f}), vy = dv(y, {rows, f}),
                 vdx = dv(dx, {rows, 2 * f});
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
  compare(name + " y", y.download(), y.values());
  compare(name + " dx", dx.download(), dx.values());
}

void softmax_case(int64_t b, int64_t q, int64_t k, bool causal, cudaStream_t s) {
  const std::string name =
      "softmax " + std::to_string(b) + "x" + std::to_string(q) + "x" + std::to_string(k) + (causal ? " causal" : "");
  const int64_t n = b * q * k;
  Buf x(n, 3), dy(n, 4), y(n), dx(n);
  const uint32_t flags = causal ? FUSELET_SOFTMAX_CAUSAL : 0;
  fuselet_tensor hx = hv(x, {b, q, k}), hdy = hv(dy, {b, q, k}), hy = hv(y, {b, q, k}), hdx = hv(dx, {b, q, k});
  fuselet_tensor vx = dv(x, {b, q, k}), vdy = dv(dy, {b, q, k}), vy = dv(y, {b, q, k}), vdx = dv(dx, {b, q, k});
  check(fuselet_softmax_fwd(&hx, 0.7f, flags, &hy) == FUSELET_OK &&
            fuselet_softmax_bwd(&hdy, &hy, 0.7f, &hdx) == FUSELET_OK,
        name + " cpu");
  // The CUDA backward takes the CPU forward's y, so that both backwards see the same input.
  y.upload();
  check(fuselet_softmax_bwd_cuda(&vdy, &vy, 0.7f, &vdx, s) == FUSELET_OK, name + " cuda bwd");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " dx", dx.download(), dx.values());
  check(fuselet_softmax_fwd_cuda(&vx, 0.7f, flags, &vy, s) == FUSELET_OK, name + " cuda fwd");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " y", y.download(), y.values());
}

// Residual add + RMSNorm, its parameters in x's dtype or in float32 (`f32_weight`).
void add_rms_norm_case(int64_t rows, int64_t h, cudaStream_t s, bool f32_weight = false) {
  const std::string name =
      "add_rms_norm " + std::to_string(rows) + "x" + std::to_string(h) + (f32_weight ? " float32 weight" : "");
  const fuselet_dtype pd = f32_weight ? FUSELET_FLOAT32 : g_dt;
  Buf x(rows * h, 5), res(rows * h, 6), w(h, 7, pd), dy(rows * h, 8), dh(rows * h, 9), y(rows * h), ho(rows * h),
      rstd(rows, 0, FUSELET_FLOAT32), dx(rows * h), dw(h, 0, pd);
  for (bool dev : {false, true}) {
    auto at = [dev](Buf& b, std::vector<int64_t> shape) { return dev ? dv(b, shape) : hv(b, shape); };
    fuselet_tensor tx = at(x, {rows, h}), tres = at(res, {rows, h}), tw = at(w, {h}), tdy = at(dy, {rows, h}),
                   tdh = at(dh, {rows, h}), ty = at(y, {rows, h}), tho = at(ho, {rows, h}), tr = at(rstd, {rows}),
                   tdx = at(dx, {rows, h}), tdw = at(dw, {h});
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
  compare(name + " residual_out", ho.download(), ho.values());
  compare(name + " y", y.download(), y.values());
  compare(name + " dx", dx.download(), dx.values());
  std::vector<float> got = dw.download(), want = dw.values();
  double err = 0;
  for (int64_t i = 0; i < h; ++i) err = std::fmax(err, std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i])));
  check(err < tolerance(pd) * std::sqrt(double(rows) + 1.0),
        name + " dweight (" + dtype_name(pd) + "): max error " + std::to_string(err));
}

// x [B, S, N, D] (bhsd: [B, N, S, D]) inside rows padded to `pad` >= D elements (pad > D: a
// strided view), cos / sin [S, R] or [B, S, R] in x's dtype or float32 (`f32_tables`); y, dy, dx
// contiguous. flags may hold FUSELET_ROPE_PAIR_TABLE (tables of width R/2); `k` > 0: K section
// tables [K, ...] (the sections entry points; FUSELET_ROPE_SECTIONS_INTERLEAVED in flags picks
// the interleaved rule), sections s_k = floor(R/2 / K) for k >= 1, s_0 the rest (which fits it).
void rope_case(int64_t b, int64_t sq, int64_t n, int64_t d, int64_t r, int64_t pad, uint32_t flags, bool per_seq,
               cudaStream_t s, bool f32_tables = true, int32_t k = 0) {
  std::vector<int64_t> sections;
  for (int32_t t = 1; t <= k; ++t) sections.push_back(r / 2 / k);
  if (k) sections[0] = r / 2 - (k - 1) * (r / 2 / k);
  const std::string name = "rope " + std::to_string(b) + "x" + std::to_string(sq) + "x" + std::to_string(n) + "x" +
                           std::to_string(d) + " R=" + std::to_string(r) + " pad=" + std::to_string(pad) +
                           " flags=" + std::to_string(flags) + (per_seq ? " per-seq" : "") +
                           (f32_tables ? "" : " tables in x's dtype") + (k ? " K=" + std::to_string(k) : "");
  const int64_t w = flags & FUSELET_ROPE_PAIR_TABLE ? r / 2 : r;
  const int64_t rows = b * sq * n, tables = (k ? k : 1) * (per_seq ? b : 1) * sq;
  const fuselet_dtype cd = f32_tables ? FUSELET_FLOAT32 : g_dt;
  Buf x(rows * pad, 11), dy(rows * d, 12), c(tables * w, 13, cd), sn(tables * w, 14, cd), y(rows * d), dx(rows * d);
  const bool bhsd = flags & FUSELET_ROPE_BHSD;
  const int64_t d1 = bhsd ? n : sq, d2 = bhsd ? sq : n;
  const std::vector<int64_t> xstrides{d1 * d2 * pad, d2 * pad, pad, 1};
  std::vector<int64_t> cshape = per_seq ? std::vector<int64_t>{b, sq, w} : std::vector<int64_t>{sq, w};
  if (k) cshape.insert(cshape.begin(), k);
  const int64_t* sec = k ? sections.data() : nullptr;
  for (bool dev : {false, true}) {
    auto at = [dev](Buf& buf, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
      return dev ? dv(buf, shape, strides) : hv(buf, shape, strides);
    };
    fuselet_tensor tx = at(x, {b, d1, d2, d}, xstrides), tdy = at(dy, {b, d1, d2, d}), ty = at(y, {b, d1, d2, d}),
                   tdx = at(dx, {b, d1, d2, d}), tc = at(c, cshape), ts = at(sn, cshape);
    if (!dev) {
      check(fuselet_rope_sections_fwd(&tx, &tc, &ts, sec, k, flags, &ty) == FUSELET_OK &&
                fuselet_rope_sections_bwd(&tdy, &tc, &ts, sec, k, flags, &tdx) == FUSELET_OK,
            name + " cpu");
      continue;
    }
    if (k)
      check(fuselet_rope_sections_fwd_cuda(&tx, &tc, &ts, sec, k, flags, &ty, s) == FUSELET_OK &&
                fuselet_rope_sections_bwd_cuda(&tdy, &tc, &ts, sec, k, flags, &tdx, s) == FUSELET_OK,
            name + " cuda");
    else
      check(fuselet_rope_fwd_cuda(&tx, &tc, &ts, flags, &ty, s) == FUSELET_OK &&
                fuselet_rope_bwd_cuda(&tdy, &tc, &ts, flags, &tdx, s) == FUSELET_OK,
            name + " cuda");
    CUDA_OK(cudaStreamSynchronize(s));
  }
  compare(name + " y", y.download(), y.values());
  compare(name + " dx", dx.download(), dx.values());
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
  constexpr fuselet_dtype f32 = FUSELET_FLOAT32;
  Buf x(rows * vocab, 11), g(rows, 12, f32), loss(rows, 0, f32), z(rows, 0, f32), lse(rows, 0, f32), dx(rows * vocab),
      fused(rows * vocab, 11), floss(rows, 0, f32), inplace(rows * vocab, 11);
  Targets t(rows, vocab, o.ignore_index);
  fuselet_tensor ht = view(t.h.data(), {rows}), dt = view(t.d, {rows});
  ht.dtype = dt.dtype = FUSELET_INT64;
  fuselet_tensor hx = hv(x, {rows, vocab}), hg = hv(g, {rows}), hl = hv(loss, {rows}), hz = hv(z, {rows}),
                 hlse = hv(lse, {rows}), hdx = hv(dx, {rows, vocab}), hf = hv(fused, {rows, vocab}),
                 hfl = hv(floss, {rows});
  fuselet_tensor vx = dv(x, {rows, vocab}), vg = dv(g, {rows}), vl = dv(loss, {rows}), vz = dv(z, {rows}),
                 vlse = dv(lse, {rows}), vdx = dv(dx, {rows, vocab}), vf = dv(fused, {rows, vocab}),
                 vfl = dv(floss, {rows}), vip = dv(inplace, {rows, vocab});
  check(fuselet_cross_entropy_fwd(&hx, &ht, &o, &hl, &hz, &hlse) == FUSELET_OK &&
            fuselet_cross_entropy_bwd(&hg, &hx, &ht, &hlse, &o, &hdx) == FUSELET_OK &&
            fuselet_cross_entropy_fwd_bwd(&hf, &ht, &o, 0.5f, &hfl, nullptr, &hf) == FUSELET_OK,
        name + " cpu");
  check(fuselet_cross_entropy_fwd_cuda(&vx, &dt, &o, &vl, &vz, &vlse, s) == FUSELET_OK, name + " cuda fwd");
  CUDA_OK(cudaStreamSynchronize(s));
  // The losses are float32 sums over the row of values read in x's dtype.
  compare(name + " loss", loss.download(), loss.values(), g_dt);
  compare(name + " z", z.download(), z.values(), g_dt);
  compare(name + " lse", lse.download(), lse.values(), g_dt);
  lse.upload();
  check(fuselet_cross_entropy_bwd_cuda(&vg, &vx, &dt, &vlse, &o, &vdx, s) == FUSELET_OK, name + " cuda bwd");
  check(fuselet_cross_entropy_fwd_bwd_cuda(&vf, &dt, &o, 0.5f, &vfl, nullptr, &vf, s) == FUSELET_OK,
        name + " cuda fwd_bwd in place");
  // The backward in place: every thread reads the target's logit before any overwrites it.
  check(fuselet_cross_entropy_bwd_cuda(&vg, &vip, &dt, &vlse, &o, &vip, s) == FUSELET_OK, name + " cuda bwd in place");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " dlogits", dx.download(), dx.values());
  compare(name + " dlogits in place", inplace.download(), dx.values());
  compare(name + " fwd_bwd loss", floss.download(), floss.values(), g_dt);
  compare(name + " fwd_bwd dlogits", fused.download(), fused.values());
}

// The log-probabilities: forward (every output) and backward (dlogp and dentropy, then dentropy
// alone, in place) on the GPU against the CPU. Rows 2 mod 4 hold ties for is_top1: their
// target's value copied to a class before it (is_top1 0) or after it.
void logprobs_case(int64_t rows, int64_t vocab, int64_t ignore_index, float softcap, cudaStream_t s) {
  const std::string name = "logprobs " + std::to_string(rows) + "x" + std::to_string(vocab) +
                           " cap=" + std::to_string(softcap) + " ignore=" + std::to_string(ignore_index);
  constexpr fuselet_dtype f32 = FUSELET_FLOAT32;
  const fuselet_cross_entropy_options o{ignore_index, 0.f, 0.f, softcap};
  Buf x(rows * vocab, 31), g(rows, 32, f32), h(rows, 33, f32), dx(rows * vocab), dx2(rows * vocab),
      inplace(rows * vocab, 31);
  Buf out[6] = {Buf(rows, 0, f32), Buf(rows, 0, f32), Buf(rows, 0, f32),
                Buf(rows, 0, f32), Buf(rows, 0, f32), Buf(rows, 0, f32)};
  Targets t(rows, vocab, ignore_index);
  for (int64_t r = 2; r < rows; r += 4) {  // a tie with the target: the max, copied before or after it
    const int64_t tr = t.h[r], other = (tr + (r % 8 == 2 ? vocab - 1 : 1)) % vocab;
    if (tr < 0 || tr >= vocab || other == tr) continue;
    x.set(r * vocab + tr, 30.f);
    x.set(r * vocab + other, 30.f);
  }
  x.upload();
  for (int64_t i = 0; i < rows * vocab; ++i) inplace.set(i, x.get(i));
  inplace.upload();
  fuselet_tensor ht = view(t.h.data(), {rows}), dt = view(t.d, {rows});
  ht.dtype = dt.dtype = FUSELET_INT64;
  fuselet_tensor hx = hv(x, {rows, vocab}), hg = hv(g, {rows}), hh = hv(h, {rows}), hdx = hv(dx, {rows, vocab}),
                 hdx2 = hv(dx2, {rows, vocab});
  fuselet_tensor vx = dv(x, {rows, vocab}), vg = dv(g, {rows}), vh = dv(h, {rows}), vdx = dv(dx, {rows, vocab}),
                 vdx2 = dv(dx2, {rows, vocab}), vip = dv(inplace, {rows, vocab});
  fuselet_tensor ho[6], vo[6];
  for (int k = 0; k < 6; ++k) ho[k] = hv(out[k], {rows}), vo[k] = dv(out[k], {rows});
  check(fuselet_logprobs_fwd(&hx, &ht, &o, &ho[0], &ho[1], &ho[2], &ho[3], &ho[4], &ho[5]) == FUSELET_OK &&
            fuselet_logprobs_bwd(&hg, &hh, &hx, &ht, &ho[1], &ho[2], &o, &hdx) == FUSELET_OK &&
            fuselet_logprobs_bwd(nullptr, &hh, &hx, &ht, &ho[1], &ho[2], &o, &hdx2) == FUSELET_OK,
        name + " cpu");
  check(fuselet_logprobs_fwd_cuda(&vx, &dt, &o, &vo[0], &vo[1], &vo[2], &vo[3], &vo[4], &vo[5], s) == FUSELET_OK,
        name + " cuda fwd");
  CUDA_OK(cudaStreamSynchronize(s));
  const char* names[6] = {" logp", " lse", " entropy", " log_sum_sq_probs", " mean_logits", " is_top1"};
  for (int k = 0; k < 6; ++k) compare(name + names[k], out[k].download(), out[k].values(), g_dt);
  bool ties = true;  // the GPU's is_top1 against the value each tie must give
  const std::vector<float> top1 = out[5].download();
  for (int64_t r = 2; r < rows; r += 4)
    if (t.h[r] >= 0 && t.h[r] < vocab && vocab > 1)
      ties = ties && top1[r] == ((t.h[r] + (r % 8 == 2 ? vocab - 1 : 1)) % vocab > t.h[r] ? 1.f : 0.f);
  check(ties, name + " is_top1 of tied rows: the lowest index");
  for (int k : {1, 2}) out[k].upload();  // the backward from the CPU's lse and entropy
  check(fuselet_logprobs_bwd_cuda(&vg, &vh, &vx, &dt, &vo[1], &vo[2], &o, &vdx, s) == FUSELET_OK &&
            fuselet_logprobs_bwd_cuda(nullptr, &vh, &vx, &dt, &vo[1], &vo[2], &o, &vdx2, s) == FUSELET_OK &&
            fuselet_logprobs_bwd_cuda(&vg, &vh, &vip, &dt, &vo[1], &vo[2], &o, &vip, s) == FUSELET_OK,
        name + " cuda bwd");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " dlogits", dx.download(), dx.values());
  compare(name + " dlogits of dentropy alone", dx2.download(), dx2.values());
  compare(name + " dlogits in place", inplace.download(), dx.values());
}

// A target outside [0, V) (not ignored): NaN in every forward output but lse, a zero gradient
// row; the other rows as usual.
void logprobs_bad_target(cudaStream_t s) {
  const int64_t rows = 3, vocab = 50;
  const fuselet_cross_entropy_options o{-100, 0.f, 0.f, 0.f};
  constexpr fuselet_dtype f32 = FUSELET_FLOAT32;
  Buf x(rows * vocab, 13), lp(rows, 0, f32), lse(rows, 0, f32), ent(rows, 0, f32), top(rows, 0, f32), g(rows, 5, f32),
      dx(rows * vocab, 14);
  Targets t(rows, vocab, -100);
  t.h = {4, -7, 7};
  CUDA_OK(cudaMemcpy(t.d, t.h.data(), rows * sizeof(int64_t), cudaMemcpyHostToDevice));
  fuselet_tensor dt = view(t.d, {rows}), vx = dv(x, {rows, vocab}), vlp = dv(lp, {rows}), vlse = dv(lse, {rows}),
                 vent = dv(ent, {rows}), vtop = dv(top, {rows}), vg = dv(g, {rows}), vdx = dv(dx, {rows, vocab});
  dt.dtype = FUSELET_INT64;
  check(fuselet_logprobs_fwd_cuda(&vx, &dt, &o, &vlp, &vlse, &vent, nullptr, nullptr, &vtop, s) == FUSELET_OK &&
            fuselet_logprobs_bwd_cuda(&vg, nullptr, &vx, &dt, &vlse, nullptr, &o, &vdx, s) == FUSELET_OK,
        "logprobs bad target: cuda");
  CUDA_OK(cudaStreamSynchronize(s));
  const std::vector<float> l = lp.download(), e = ent.download(), tp = top.download(), z = lse.download(),
                           d = dx.download();
  bool zero_row = true;
  for (int64_t j = 0; j < vocab; ++j) zero_row = zero_row && d[vocab + j] == 0.f;
  check(std::isnan(l[1]) && std::isnan(e[1]) && std::isnan(tp[1]) && std::isfinite(z[1]) && std::isfinite(l[0]) &&
            std::isfinite(l[2]) && zero_row,
        "logprobs bad target: NaN outputs, zero gradient row");
}

// Divergences: forward and both gradients on the GPU against the CPU, input and target as
// log-softmax rows (probabilities for KL with log_target = 0).
void divergence_case(int64_t rows, int64_t vocab, fuselet_divergence_options o, cudaStream_t s) {
  const std::string name = "divergence kind=" + std::to_string(o.kind) +
                           " log_target=" + std::to_string(o.log_target) + " beta=" + std::to_string(o.beta) + " " +
                           std::to_string(rows) + "x" + std::to_string(vocab);
  Buf x(rows * vocab, 21), t(rows * vocab, 22), g(rows, 23, FUSELET_FLOAT32), loss(rows, 0, FUSELET_FLOAT32),
      dx(rows * vocab), dt(rows * vocab);
  for (Buf* b : {&x, &t}) {
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> row(vocab);
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < vocab; ++j) m = std::fmax(m, row[j] = b->get(r * vocab + j));
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - m);
      for (int64_t j = 0; j < vocab; ++j) {
        const double v = row[j] - m - std::log(sum);
        b->set(r * vocab + j, static_cast<float>(b == &t && !o.log_target ? std::exp(v) : v));
      }
    }
    b->upload();
  }
  fuselet_tensor hx = hv(x, {rows, vocab}), ht = hv(t, {rows, vocab}), hg = hv(g, {rows}), hl = hv(loss, {rows}),
                 hdx = hv(dx, {rows, vocab}), hdt = hv(dt, {rows, vocab});
  fuselet_tensor vx = dv(x, {rows, vocab}), vt = dv(t, {rows, vocab}), vg = dv(g, {rows}), vl = dv(loss, {rows}),
                 vdx = dv(dx, {rows, vocab}), vdt = dv(dt, {rows, vocab});
  check(fuselet_divergence_fwd(&hx, &ht, &o, &hl) == FUSELET_OK &&
            fuselet_divergence_bwd(&hg, &hx, &ht, &o, &hdx, &hdt) == FUSELET_OK,
        name + " cpu");
  check(fuselet_divergence_fwd_cuda(&vx, &vt, &o, &vl, s) == FUSELET_OK &&
            fuselet_divergence_bwd_cuda(&vg, &vx, &vt, &o, &vdx, &vdt, s) == FUSELET_OK,
        name + " cuda");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " loss", loss.download(), loss.values(), g_dt);
  compare(name + " dinput", dx.download(), dx.values());
  compare(name + " dtarget", dt.download(), dt.values());
}

// Divergences over logits (fuselet_divergence_logits): the loss and the logits' gradient written in
// place, on the GPU against the CPU.
void divergence_logits_case(int64_t rows, int64_t vocab, fuselet_divergence_options o, float scale, cudaStream_t s) {
  const std::string name = "divergence logits kind=" + std::to_string(o.kind) + " beta=" + std::to_string(o.beta) +
                           " scale=" + std::to_string(scale) + " " + std::to_string(rows) + "x" +
                           std::to_string(vocab);
  Buf x(rows * vocab, 31), t(rows * vocab, 32), g(rows, 33, FUSELET_FLOAT32), loss(rows, 0, FUSELET_FLOAT32);
  fuselet_tensor hx = hv(x, {rows, vocab}), ht = hv(t, {rows, vocab}), hg = hv(g, {rows}), hl = hv(loss, {rows});
  fuselet_tensor vx = dv(x, {rows, vocab}), vt = dv(t, {rows, vocab}), vg = dv(g, {rows}), vl = dv(loss, {rows});
  check(fuselet_divergence_logits_cuda(&vx, &vt, &vg, &o, scale, &vl, s) == FUSELET_OK, name + " cuda");
  check(fuselet_divergence_logits(&hx, &ht, &hg, &o, scale, &hl) == FUSELET_OK, name + " cpu");
  CUDA_OK(cudaStreamSynchronize(s));
  compare(name + " loss", loss.download(), loss.values(), g_dt);
  compare(name + " dlogits", x.download(), x.values());
}

// A target outside [0, V) (not ignored): NaN loss and a zero gradient row on the GPU, the
// other rows as usual.
void cross_entropy_bad_target(cudaStream_t s) {
  const int64_t rows = 3, vocab = 50;
  const fuselet_cross_entropy_options o{-100, 0.f, 0.f, 0.f};
  Buf x(rows * vocab, 13), loss(rows, 0, FUSELET_FLOAT32), dx(rows * vocab, 14);
  Targets t(rows, vocab, -100);
  t.h = {4, 50, 7};
  CUDA_OK(cudaMemcpy(t.d, t.h.data(), rows * sizeof(int64_t), cudaMemcpyHostToDevice));
  fuselet_tensor dt = view(t.d, {rows}), vx = dv(x, {rows, vocab}), vl = dv(loss, {rows}), vdx = dv(dx, {rows, vocab});
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

// The `_cuda` entry points refuse what they cannot run before they launch anything: a data
// pointer not aligned to its element size (a GPU would fault on it), and a bad argument (each
// family's checks, shared with the CPU).
void bad_input(cudaStream_t s) {
  auto refused = [](fuselet_status st, const char* needle, const std::string& what) {
    const std::string msg = fuselet_last_error();
    check(st == FUSELET_ERR_INVALID_ARGUMENT && msg.find(needle) != std::string::npos,
          what + ": expected FUSELET_ERR_INVALID_ARGUMENT naming '" + needle + "', got " + fuselet_status_string(st) +
              " '" + msg + "'");
  };
  const int64_t rows = 4, v = 16;
  Buf a(rows * v + 1, 1, FUSELET_FLOAT16), b(rows * v + 1, 2, FUSELET_FLOAT16), f(rows + 1, 3, FUSELET_FLOAT32),
      f2(rows + 1, 4, FUSELET_FLOAT32);
  Targets t(rows, v, -100);
  // One element in: 2-byte data at an odd address (float16), 4-byte data at 2 (mod 4).
  auto odd = [](Buf& buf, std::vector<int64_t> shape) {
    fuselet_tensor x = dv(buf, shape);
    x.data = static_cast<char*>(buf.d) + 1;
    return x;
  };
  auto off2 = [](Buf& buf, std::vector<int64_t> shape) {
    fuselet_tensor x = dv(buf, shape);
    x.data = static_cast<char*>(buf.d) + 2;
    return x;
  };
  fuselet_tensor x = dv(a, {rows, v}), y = dv(b, {rows, v}), xo = odd(a, {rows, v}), yo = odd(b, {rows, v});
  fuselet_tensor lossv = dv(f, {rows}), losso = off2(f, {rows}), gv = dv(f2, {rows});
  fuselet_tensor tg = view(t.d, {rows});
  tg.dtype = FUSELET_INT64;
  refused(fuselet_softmax_fwd_cuda(&xo, 1.f, 0, &y, s), "not aligned", "softmax x misaligned");
  refused(fuselet_softmax_bwd_cuda(&x, &x, 1.f, &yo, s), "not aligned", "softmax dx misaligned");
  const fuselet_glu_options glu{FUSELET_GLU_SILU, 0, 0.f, 0.f};
  fuselet_tensor half = dv(b, {rows, v / 2});
  refused(fuselet_glu_fwd_ex_cuda(&xo, &glu, &half, s), "not aligned", "glu x misaligned");
  const fuselet_cross_entropy_options ce{-100, 0.f, 0.f, 0.f};
  refused(fuselet_cross_entropy_fwd_cuda(&xo, &tg, &ce, &lossv, nullptr, &gv, s), "not aligned",
          "cross_entropy logits misaligned");
  refused(fuselet_cross_entropy_fwd_cuda(&x, &tg, &ce, &losso, nullptr, &gv, s), "not aligned",
          "cross_entropy loss misaligned");
  fuselet_tensor t32 = view(static_cast<char*>(static_cast<void*>(t.d)) + 4, {rows});
  t32.dtype = FUSELET_INT64;
  refused(fuselet_cross_entropy_fwd_cuda(&x, &t32, &ce, &lossv, nullptr, &gv, s), "not aligned",
          "cross_entropy int64 target misaligned");
  refused(fuselet_cross_entropy_fwd_bwd_cuda(&x, &tg, nullptr, 1.f, &lossv, nullptr, &y, s), "opts",
          "cross_entropy fwd_bwd without options");
  refused(fuselet_logprobs_fwd_cuda(&x, &tg, &ce, &lossv, &gv, &losso, nullptr, nullptr, nullptr, s), "not aligned",
          "logprobs entropy misaligned");
  refused(fuselet_logprobs_fwd_cuda(&x, &t32, &ce, &lossv, &gv, nullptr, nullptr, nullptr, nullptr, s), "not aligned",
          "logprobs int64 target misaligned");
  refused(fuselet_logprobs_bwd_cuda(&lossv, nullptr, &x, &tg, &gv, nullptr, &ce, &yo, s), "not aligned",
          "logprobs dlogits misaligned");
  const fuselet_cross_entropy_options smoothed{-100, 0.1f, 0.f, 0.f};
  refused(fuselet_logprobs_fwd_cuda(&x, &tg, &smoothed, &lossv, &gv, nullptr, nullptr, nullptr, nullptr, s),
          "label_smoothing: expected 0", "logprobs with label smoothing");
  const fuselet_divergence_options kl{FUSELET_DIVERGENCE_KL, 1, 0.f};
  refused(fuselet_divergence_fwd_cuda(&xo, &y, &kl, &lossv, s), "not aligned", "divergence input misaligned");
  refused(fuselet_divergence_logits_cuda(&xo, &y, &lossv, &kl, 1.f, &lossv, s), "not aligned",
          "divergence logits input misaligned");
  fuselet_tensor w = dv(b, {v}), wo = odd(b, {v});
  refused(fuselet_rms_norm_fwd_cuda(&xo, &w, 1e-5f, 0, &y, &lossv, s), "not aligned", "rms_norm x misaligned");
  refused(fuselet_rms_norm_fwd_cuda(&x, &wo, 1e-5f, 0, &y, &lossv, s), "not aligned", "rms_norm weight misaligned");
  refused(fuselet_rms_norm_fwd_cuda(&x, &w, 1e-5f, 0, &y, &losso, s), "not aligned", "rms_norm rstd misaligned");
  const size_t ws_bytes = fuselet_norm_bwd_workspace_bytes_cuda(rows, v);
  Buf ws(ws_bytes / 4 + 2, 0, FUSELET_FLOAT32), dwb(v, 0, FUSELET_FLOAT16);
  fuselet_tensor dw = dv(dwb, {v});
  refused(fuselet_rms_norm_bwd_cuda(&xo, &x, &w, &lossv, 0, &y, &dw, ws.d, ws_bytes, s), "not aligned",
          "rms_norm_bwd dy misaligned");
  refused(fuselet_rms_norm_bwd_cuda(&x, &x, &wo, &lossv, 0, &y, &dw, ws.d, ws_bytes, s), "not aligned",
          "rms_norm_bwd weight misaligned");
  refused(fuselet_rms_norm_bwd_cuda(&x, &x, &w, &losso, 0, &y, &dw, ws.d, ws_bytes, s), "not aligned",
          "rms_norm_bwd rstd misaligned");
  refused(fuselet_rms_norm_bwd_cuda(&x, &x, &w, &lossv, 0, &y, &dw, static_cast<char*>(ws.d) + 2, ws_bytes, s),
          "workspace", "rms_norm_bwd workspace misaligned");
  // Each norm entry point's own checks (shared with the CPU), before any launch.
  refused(fuselet_rms_norm_bwd_cuda(&x, &x, &w, &lossv, 0, nullptr, &dw, ws.d, ws_bytes, s), "dx",
          "rms_norm_bwd without dx");
  refused(fuselet_add_rms_norm_fwd_cuda(&x, nullptr, &w, 1e-5f, 0, &y, &y, &lossv, s), "residual",
          "add_rms_norm_fwd without residual");
  refused(fuselet_add_rms_norm_bwd_cuda(&x, &x, &x, &w, nullptr, 0, &y, &dw, ws.d, ws_bytes, s), "rstd",
          "add_rms_norm_bwd without rstd");
  refused(fuselet_layer_norm_bwd_cuda(&x, &x, &w, nullptr, &lossv, 0, &y, &dw, nullptr, ws.d, ws_bytes, s), "mean",
          "layer_norm_bwd without mean");
  // No rows: dweight is zeroed with cudaMemsetAsync, which refuses memory that is not the
  // device's (a host pointer passed as dweight): the emulator always, a GPU unless its system
  // maps pageable host memory for the device (HMM), where the zeros are written.
  std::vector<__half> host_dw(v, __float2half_rn(1.f));
  fuselet_tensor x0 = dv(a, {0, v}), r0 = dv(f, {0}), hdw = view(host_dw.data(), {v}, {}, FUSELET_FLOAT16);
  const fuselet_status st = fuselet_rms_norm_bwd_cuda(&x0, &x0, &w, &r0, 0, &x0, &hdw, nullptr, 0, s);
  cudaStreamSynchronize(s);
  const bool emulated = std::strcmp(fuselet_cuda_archs(), "emu") == 0;
  const bool zeroed = st == FUSELET_OK && __half2float(host_dw[0]) == 0.f && __half2float(host_dw[v - 1]) == 0.f;
  check((st == FUSELET_ERR_CUDA && std::string(fuselet_last_error()).find("cudaMemsetAsync") != std::string::npos) ||
            (!emulated && zeroed),
        std::string("rms_norm_bwd of no rows, dweight in host memory: expected FUSELET_ERR_CUDA naming "
                    "cudaMemsetAsync, got ") +
            fuselet_status_string(st) + " '" + fuselet_last_error() + "'");
  cudaGetLastError();
  fuselet_tensor c = dv(a, {1, v}), co = odd(a, {1, v});
  fuselet_tensor x4 = dv(a, {1, 1, 1, v}), y4 = dv(b, {1, 1, 1, v}), x4o = odd(a, {1, 1, 1, v});
  refused(fuselet_rope_fwd_cuda(&x4o, &c, &c, 0, &y4, s), "not aligned", "rope x misaligned");
  refused(fuselet_rope_fwd_cuda(&x4, &co, &co, 0, &y4, s), "not aligned", "rope cos misaligned");
  const int64_t five[] = {1, 1, 1, 1, 0};
  fuselet_tensor c3 = dv(a, {1, 1, v});
  refused(fuselet_rope_sections_fwd_cuda(&x4, &c3, &c3, five, 5, 0, &y4, s), "sections: expected 1 to 4 sections",
          "rope 5 sections");
  refused(fuselet_rope_sections_bwd_cuda(&x4, &c3, &c3, five, 1, 0, &y4, s), "sections: expected a sum of",
          "rope sections sum");
}

// float32: rows of every kernel path and every option; `wide`: the full matrix of shapes.
void run_all(cudaStream_t s, bool wide) {
  const std::vector<int64_t> sizes =
      wide ? std::vector<int64_t>{1, 3, 127, 4096, 4097} : std::vector<int64_t>{3, 4096};
  for (int act : {FUSELET_GLU_SILU, FUSELET_GLU_GELU, FUSELET_GLU_GELU_TANH, FUSELET_GLU_SILU_CLAMPED})
    for (int interleaved : {0, 1})
      for (int64_t f : sizes)
        glu_case({act, interleaved, 1.702f, 1.5f}, 9, f, s);  // a limit inside the inputs' spread
  if (wide) glu_case({FUSELET_GLU_SILU, 0, 0.f, 0.f}, 70000, 8, s);  // more rows than the grid's y extent
  for (bool causal : {false, true}) {
    for (int64_t k : sizes) softmax_case(2, 5, k, causal, s);
    softmax_case(1, 7, 3, causal, s);  // Q > K: fully masked rows
    if (wide) softmax_case(3, 130, 129, causal, s);
  }
  // Warp rows, block rows, chunked rows (shared memory and workspace partials), 16-byte and scalar.
  for (int64_t h : wide ? std::vector<int64_t>{1, 3, 127, 512, 1027, 4096, 20000, 20001}
                        : std::vector<int64_t>{3, 512, 1027, 20000, 20001})
    add_rms_norm_case(33, h, s);
  if (wide) add_rms_norm_case(1000, 1024, s);
  if (g_dt != FUSELET_FLOAT32) add_rms_norm_case(9, 1024, s, true);  // float32 weight with half activations
  // Vector units (D, R, strides multiples of 4) and scalar ones, both pairings and layouts.
  for (uint32_t flags = 0; flags < 4; ++flags)
    for (bool per_seq : {false, true}) {
      rope_case(2, 17, 4, 128, 128, 128, flags, per_seq, s);
      rope_case(2, 17, 4, 128, 64, 136, flags, per_seq, s);  // partial rotary, padded rows
      rope_case(3, 5, 3, 10, 6, 10, flags, per_seq, s);  // scalar units
      rope_case(1, 9, 2, 12, 4, 13, flags, per_seq, s);  // scalar: odd row stride
      if (g_dt != FUSELET_FLOAT32) {  // cos / sin in x's dtype
        rope_case(2, 17, 4, 128, 128, 128, flags, per_seq, s, false);
        rope_case(3, 5, 3, 10, 6, 10, flags, per_seq, s, false);
      }
    }
  if (wide) rope_case(4, 2048, 8, 64, 64, 64, 0, false, s);  // more units than the grid
  // Pair tables (K = 0) and K section tables, contiguous and interleaved, every layout and
  // pairing: vector units with partial rotary in padded rows, and scalar ones.
  for (uint32_t flags = 0; flags < 4; ++flags)
    for (int32_t k : {0, 1, 3, 4})
      for (uint32_t form : {0u, 1u, 2u, 3u}) {  // bit 0: pair table, bit 1: interleaved sections
        const bool pair = form & 1, inter_sec = form & 2;
        if (!k && (inter_sec || !pair)) continue;  // K = 0: the pair table alone
        const uint32_t f =
            flags | (pair ? FUSELET_ROPE_PAIR_TABLE : 0u) | (inter_sec ? FUSELET_ROPE_SECTIONS_INTERLEAVED : 0u);
        const bool per_seq = (k + form) % 2;
        rope_case(2, 9, 3, 64, 48, 72, f, per_seq, s, true, k);
        rope_case(2, 5, 3, 10, 6, 10, f, !per_seq, s, g_dt == FUSELET_FLOAT32, k);
      }
  // Cross-entropy: odd, vocabulary-sized and 128k+ rows (strided), every option, ignore_index in [0, V).
  for (int64_t v : wide ? std::vector<int64_t>{1, 3, 127, 4097, 32000, 32001} : std::vector<int64_t>{3, 4097})
    cross_entropy_case(9, v, {-100, 0.f, 0.f, 0.f}, s);
  cross_entropy_case(6, wide ? 32001 : 4097, {-100, 0.1f, 1e-3f, 30.f}, s);
  cross_entropy_case(5, 3, {2, 0.2f, 1e-2f, 5.f}, s);
  if (wide) {
    cross_entropy_case(3, 131072 + 5, {-100, 0.05f, 1e-4f, 0.f}, s);
    cross_entropy_case(2, 262144, {-100, 0.f, 0.f, 15.f}, s);
    cross_entropy_case(0, 8, {-100, 0.f, 0.f, 0.f}, s);
    cross_entropy_case(70000, 4, {-100, 0.1f, 0.f, 0.f}, s);  // more rows than a block's share
    cross_entropy_bad_target(s);
  }
  // Log-probabilities: odd, vocabulary-sized and 128k+ rows, softcap, ignore_index in [0, V).
  for (int64_t v : wide ? std::vector<int64_t>{1, 3, 127, 4097, 32001} : std::vector<int64_t>{3, 4097})
    logprobs_case(9, v, -100, 0.f, s);
  logprobs_case(6, wide ? 32001 : 4097, -100, 30.f, s);
  logprobs_case(5, 3, 2, 5.f, s);
  if (wide) {
    logprobs_case(2, 131072 + 5, -100, 0.f, s);
    logprobs_case(0, 8, -100, 0.f, s);
    logprobs_case(70000, 4, -100, 0.f, s);  // more rows than a block's share
    logprobs_bad_target(s);
  }
  // Divergences: every kind, beta at its special values, odd and vocabulary-sized rows, no rows.
  for (int64_t v : wide ? std::vector<int64_t>{1, 3, 127, 4097, 32001} : std::vector<int64_t>{127}) {
    divergence_case(9, v, {FUSELET_DIVERGENCE_KL, 1, 0.f}, s);
    divergence_case(9, v, {FUSELET_DIVERGENCE_KL, 0, 0.f}, s);
    for (float beta : {0.f, 0.3f, 1.f}) divergence_case(9, v, {FUSELET_DIVERGENCE_JSD, 1, beta}, s);
    divergence_case(9, v, {FUSELET_DIVERGENCE_TVD, 1, 0.f}, s);
    divergence_logits_case(9, v, {FUSELET_DIVERGENCE_KL, 1, 0.f}, 1.f, s);
    for (float beta : {0.f, 0.3f, 1.f}) divergence_logits_case(9, v, {FUSELET_DIVERGENCE_JSD, 1, beta}, 0.5f, s);
    divergence_logits_case(9, v, {FUSELET_DIVERGENCE_TVD, 1, 0.f}, 2.f, s);
  }
  if (wide) {
    divergence_case(0, 8, {FUSELET_DIVERGENCE_JSD, 1, 0.5f}, s);
    divergence_case(70000, 4, {FUSELET_DIVERGENCE_JSD, 1, 0.5f}, s);
    divergence_logits_case(0, 8, {FUSELET_DIVERGENCE_JSD, 1, 0.5f}, 1.f, s);
    divergence_logits_case(70000, 4, {FUSELET_DIVERGENCE_JSD, 1, 0.5f}, 1.f, s);
    bad_input(s);
  }
}

}  // namespace

// test_ops_cuda [DTYPE]: every dtype, or one (float32: every shape of every path; float16 and
// bfloat16: a shape of each path; the emulated runs split the work so).
int main(int argc, char** argv) {
  const std::string only = fuselet_test::start_cuda_test(argc, argv);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (fuselet_dtype dt : {FUSELET_FLOAT32, FUSELET_FLOAT16, FUSELET_BFLOAT16}) {
    if (!fuselet_test::runs_dtype(only, dtype_name(dt))) continue;
    g_dt = dt;
    run_all(s, dt == FUSELET_FLOAT32);
  }
  CUDA_OK(cudaStreamDestroy(s));
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
