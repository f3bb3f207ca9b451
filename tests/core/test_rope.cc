// C++ test of the framework-free core: CPU rope (both layouts, both pairings, partial rotary,
// shared and per-sequence tables, a B-less x, a strided x, empty batches) against a float64
// reference, and the error values of the C ABI. Prints "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "fuselet/rope.h"

namespace {

using fuselet_test::expect;
using fuselet_test::expect_error;
using fuselet_test::view;

// The rotation of rope.h in float64: out_i = a_i c_i + e_i s_i a_p(i) (forward) or
// a_i c_i - e_i s_p(i) a_p(i) (backward).
void reference(const float* a, const float* c, const float* s, int64_t D, int64_t R, bool inter, bool bwd,
               double* out) {
  const int64_t h = R / 2;
  for (int64_t i = 0; i < D; ++i) {
    if (i >= R) {
      out[i] = a[i];
      continue;
    }
    const int64_t p = inter ? (i % 2 ? i - 1 : i + 1) : (i < h ? i + h : i - h);
    const double e = inter ? (i % 2 ? 1.0 : -1.0) : (i < h ? -1.0 : 1.0);
    out[i] = double(a[i]) * c[i] + (bwd ? -e * s[p] : e * s[i]) * double(a[p]);
  }
}

// x / dy in [B, S, N, D] or [B, N, S, D] order (a B-less 3-D view when !has_b); with
// `strided`, x lives inside a buffer with a padded head dim (row stride D + 3).
void check(int64_t B, int64_t S, int64_t N, int64_t D, int64_t R, bool bhsd, bool inter, bool per_seq, bool has_b,
           bool strided) {
  std::mt19937 rng(static_cast<unsigned>(B * 131 + S * 17 + N * 5 + D + R));
  std::normal_distribution<float> dist(0.2f, 1.5f);
  const int64_t pad = strided ? D + 3 : D, rows = B * S * N;
  std::vector<float> x(rows * pad), dy(rows * D), y(rows * D), dx(rows * D), cs((per_seq ? B : 1) * S * R),
      sn((per_seq ? B : 1) * S * R);
  for (auto* v : {&x, &dy, &cs, &sn})
    for (auto& e : *v) e = dist(rng);
  const int64_t d1 = bhsd ? N : S, d2 = bhsd ? S : N;
  std::vector<int64_t> shape = {B, d1, d2, D}, xs = {d1 * d2 * pad, d2 * pad, pad, 1};
  if (!has_b) shape.erase(shape.begin()), xs.erase(xs.begin());
  fuselet_tensor tx = view(x.data(), shape, xs), tdy = view(dy.data(), shape), ty = view(y.data(), shape),
                 tdx = view(dx.data(), shape);
  std::vector<int64_t> cshape = per_seq ? std::vector<int64_t>{B, S, R} : std::vector<int64_t>{S, R};
  fuselet_tensor tc = view(cs.data(), cshape), ts = view(sn.data(), cshape);
  const uint32_t flags = (bhsd ? FUSELET_ROPE_BHSD : 0) | (inter ? FUSELET_ROPE_INTERLEAVED : 0);
  const std::string name = "rope B=" + std::to_string(B) + " S=" + std::to_string(S) + " N=" + std::to_string(N) +
                           " D=" + std::to_string(D) + " R=" + std::to_string(R) + (bhsd ? " bhsd" : " bshd") +
                           (inter ? " interleaved" : "") + (per_seq ? " per-seq" : "") + (has_b ? "" : " no-B") +
                           (strided ? " strided" : "");
  expect(fuselet_rope_fwd(&tx, &tc, &ts, flags, &ty) == FUSELET_OK, name + " fwd");
  expect(fuselet_rope_bwd(&tdy, &tc, &ts, flags, &tdx) == FUSELET_OK, name + " bwd");
  double err = 0;
  std::vector<double> want(D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t row = bhsd ? (b * N + n) * S + s : (b * S + s) * N + n;
        const int64_t t = (per_seq ? b * S : 0) + s;
        reference(&x[row * pad], &cs[t * R], &sn[t * R], D, R, inter, false, want.data());
        for (int64_t i = 0; i < D; ++i) err = std::fmax(err, std::fabs(y[row * D + i] - want[i]));
        reference(&dy[row * D], &cs[t * R], &sn[t * R], D, R, inter, true, want.data());
        for (int64_t i = 0; i < D; ++i) err = std::fmax(err, std::fabs(dx[row * D + i] - want[i]));
      }
  expect(err < 1e-5, name + " values, max error " + std::to_string(err));
}

// The table of pair j (rope.h k(j)), written out apart from the core.
int32_t section_of(int64_t j, const std::vector<int64_t>& sec, bool inter_sec) {
  const int64_t k = static_cast<int64_t>(sec.size());
  if (inter_sec) {
    const int64_t m = j % k;
    return m != 0 && j < k * sec[m] ? static_cast<int32_t>(m) : 0;
  }
  int64_t end = 0;
  for (size_t t = 0; t + 1 < sec.size(); ++t)
    if (j < (end += sec[t])) return static_cast<int32_t>(t);
  return static_cast<int32_t>(k - 1);
}

// Pair tables (`pair`) and / or K section tables (`sec` non-empty): the sections entry points
// against the plain ones on the full-width tables they stand for (equal bit for bit: the same
// float32 products), forward and backward.
void check_tables(int64_t B, int64_t S, int64_t N, int64_t D, int64_t R, bool bhsd, bool inter, bool per_seq,
                  bool pair, const std::vector<int64_t>& sec, bool inter_sec) {
  std::mt19937 rng(static_cast<unsigned>(B * 7 + S * 3 + R + sec.size()));
  std::normal_distribution<float> dist(0.1f, 1.3f);
  const int64_t K = static_cast<int64_t>(sec.size()), W = pair ? R / 2 : R, T = (per_seq ? B : 1) * S,
                rows = B * S * N;
  std::vector<float> x(rows * D), dy(rows * D), cs((K ? K : 1) * T * W), sn(cs.size()), fc(T * R), fs(T * R);
  for (auto* v : {&x, &dy, &cs, &sn})
    for (auto& e : *v) e = dist(rng);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < R; ++i) {
      const int64_t j = inter ? i / 2 : i % (R / 2), k = K ? section_of(j, sec, inter_sec) : 0;
      const int64_t at = (k * T + t) * W + (pair ? j : i);
      fc[t * R + i] = cs[at];
      fs[t * R + i] = sn[at];
    }
  const int64_t d1 = bhsd ? N : S, d2 = bhsd ? S : N;
  const std::vector<int64_t> shape = {B, d1, d2, D};
  std::vector<float> y(rows * D), dx(rows * D), y0(rows * D), dx0(rows * D);
  fuselet_tensor tx = view(x.data(), shape), tdy = view(dy.data(), shape), ty = view(y.data(), shape),
                 tdx = view(dx.data(), shape), ty0 = view(y0.data(), shape), tdx0 = view(dx0.data(), shape);
  std::vector<int64_t> cshape = per_seq ? std::vector<int64_t>{B, S, W} : std::vector<int64_t>{S, W};
  if (K) cshape.insert(cshape.begin(), K);
  std::vector<int64_t> fshape = per_seq ? std::vector<int64_t>{B, S, R} : std::vector<int64_t>{S, R};
  fuselet_tensor tc = view(cs.data(), cshape), ts = view(sn.data(), cshape), tfc = view(fc.data(), fshape),
                 tfs = view(fs.data(), fshape);
  const uint32_t plain = (bhsd ? FUSELET_ROPE_BHSD : 0) | (inter ? FUSELET_ROPE_INTERLEAVED : 0);
  const uint32_t flags =
      plain | (pair ? FUSELET_ROPE_PAIR_TABLE : 0) | (inter_sec ? FUSELET_ROPE_SECTIONS_INTERLEAVED : 0);
  std::string name = "rope tables R=" + std::to_string(R) + " D=" + std::to_string(D) + (bhsd ? " bhsd" : " bshd") +
                     (inter ? " interleaved" : "") + (per_seq ? " per-seq" : "") + (pair ? " pair" : "") +
                     " K=" + std::to_string(K) + (inter_sec ? " interleaved sections" : "");
  const int64_t* sp = K ? sec.data() : nullptr;
  const int32_t n = static_cast<int32_t>(K);
  expect(fuselet_rope_sections_fwd(&tx, &tc, &ts, sp, n, flags, &ty) == FUSELET_OK, name + " fwd");
  expect(fuselet_rope_sections_bwd(&tdy, &tc, &ts, sp, n, flags, &tdx) == FUSELET_OK, name + " bwd");
  expect(fuselet_rope_sections_fwd_check(&tx, &tc, &ts, sp, n, flags) == FUSELET_OK, name + " fwd_check");
  if (!K) {  // the old entry points take the pair flag
    std::vector<float> y1(rows * D);
    fuselet_tensor ty1 = view(y1.data(), shape);
    expect(fuselet_rope_fwd(&tx, &tc, &ts, flags, &ty1) == FUSELET_OK && y1 == y, name + " fwd (no sections)");
  }
  expect(fuselet_rope_fwd(&tx, &tfc, &tfs, plain, &ty0) == FUSELET_OK, name + " plain fwd");
  expect(fuselet_rope_bwd(&tdy, &tfc, &tfs, plain, &tdx0) == FUSELET_OK, name + " plain bwd");
  expect(y == y0, name + " y equals the plain op's on the full tables");
  expect(dx == dx0, name + " dx equals the plain op's on the full tables");
}

}  // namespace

int main() {
  for (bool bhsd : {false, true})
    for (bool inter : {false, true})
      for (bool per_seq : {false, true}) {
        check(2, 5, 3, 8, 8, bhsd, inter, per_seq, true, false);
        check(2, 5, 3, 10, 6, bhsd, inter, per_seq, true, false);   // partial rotary, odd units
        check(3, 7, 4, 128, 64, bhsd, inter, per_seq, true, true);  // strided x
        check(1, 33, 2, 130, 2, bhsd, inter, per_seq, true, false);
        check(0, 4, 2, 8, 4, bhsd, inter, per_seq, true, false);    // empty batch
        check(2, 0, 2, 8, 4, bhsd, inter, per_seq, true, false);
      }
  for (bool bhsd : {false, true}) {
    check(1, 6, 3, 16, 12, bhsd, false, false, false, false);
    check(1, 6, 3, 16, 16, bhsd, true, false, false, true);
  }
  check(4, 600, 8, 64, 64, false, false, false, true, false);  // many rows: several tasks

  // Pair tables and sections: K = 0 (no K dim), 1..4, zero-sized sections, partial rotary.
  const std::vector<std::vector<int64_t>> contiguous = {{}, {6}, {2, 4}, {1, 3, 2}, {2, 0, 3, 1}},
                                          interleaved = {{6}, {3, 3}, {2, 2, 2}, {3, 2, 0, 1}};
  for (bool bhsd : {false, true})
    for (bool inter : {false, true})
      for (bool per_seq : {false, true})
        for (bool pair : {false, true}) {
          for (const auto& sec : contiguous) check_tables(2, 5, 3, 16, 12, bhsd, inter, per_seq, pair, sec, false);
          for (const auto& sec : interleaved) check_tables(2, 5, 3, 12, 12, bhsd, inter, per_seq, pair, sec, true);
        }
  check_tables(3, 300, 4, 128, 128, false, false, true, true, {16, 24, 24}, false);  // Qwen2-VL's, several tasks
  check_tables(3, 300, 4, 128, 128, true, false, false, true, {24, 20, 20}, true);   // Qwen3-VL's

  float x[2 * 3 * 2 * 8] = {}, y[2 * 3 * 2 * 8], c[2 * 3 * 8] = {}, s[2 * 3 * 8] = {};
  fuselet_tensor tx = view(x, {2, 3, 2, 8}), ty = view(y, {2, 3, 2, 8}), tc = view(c, {3, 8}), ts = view(s, {3, 8});
  fuselet_tensor bad = tc;
  expect(fuselet_rope_fwd(&tx, &tc, &ts, 0, &ty) == FUSELET_OK, "valid call");
  expect_error(fuselet_rope_fwd(&tx, &tc, &ts, 16, &ty), "flags: unknown bits 0x10", "unknown flag");
  {  // pair tables and sections
    float c4[2 * 2 * 3 * 8] = {}, s4[2 * 2 * 3 * 8] = {};
    const int64_t two[] = {2, 2}, five[] = {1, 1, 1, 1, 0}, neg[] = {5, -1}, short_sum[] = {2, 1}, wide[] = {1, 3};
    fuselet_tensor k2 = view(c4, {2, 3, 8}), k2s = view(s4, {2, 3, 8});
    expect(fuselet_rope_sections_fwd(&tx, &k2, &k2s, two, 2, 0, &ty) == FUSELET_OK, "sections: valid call");
    expect(fuselet_rope_sections_fwd(&tx, &tc, &ts, nullptr, 0, 0, &ty) == FUSELET_OK, "sections: none");
    expect_error(fuselet_rope_fwd(&tx, &tc, &ts, FUSELET_ROPE_SECTIONS_INTERLEAVED, &ty),
                 "flags: FUSELET_ROPE_SECTIONS_INTERLEAVED needs sections (got sections=NULL)",
                 "interleaved sections without sections");
    expect_error(fuselet_rope_sections_fwd(&tx, &k2, &k2s, five, 5, 0, &ty),
                 "sections: expected 1 to 4 sections (one per table), got 5", "5 sections");
    expect_error(fuselet_rope_sections_fwd(&tx, &k2, &k2s, nullptr, 2, 0, &ty), "sections: NULL with n_sections 2",
                 "NULL sections");
    expect_error(fuselet_rope_sections_fwd(&tx, &tc, &ts, two, 0, 0, &ty),
                 "sections: expected 1 to 4 sections (one per table), got 0", "0 sections, not NULL");
    expect_error(fuselet_rope_sections_fwd(&tx, &tc, &ts, two, 2, 0, &ty),
                 "cos: expected shape [K, S, R] or [K, B, S, R], got shape [3, 8]", "sections: no K dim");
    fuselet_tensor k3 = view(c4, {3, 3, 8});
    expect_error(fuselet_rope_sections_fwd(&tx, &k3, &k3, two, 2, 0, &ty),
                 "cos: expected 2 tables (K, one per section), got shape [3, 3, 8]", "sections: K");
    expect_error(fuselet_rope_sections_fwd(&tx, &k2, &k2s, neg, 2, 0, &ty),
                 "sections: expected each >= 0, got -1 (section 1)", "negative section");
    expect_error(fuselet_rope_sections_fwd(&tx, &k2, &k2s, short_sum, 2, 0, &ty),
                 "sections: expected a sum of 4 (R/2, the rotating pairs), got 3", "sections sum");
    expect_error(fuselet_rope_sections_fwd(&tx, &k2, &k2s, wide, 2, FUSELET_ROPE_SECTIONS_INTERLEAVED, &ty),
                 "sections: interleaved section 1 reads pairs 1, 3, ... up to 5, beyond the R/2 = 4 pairs",
                 "interleaved bound");
    expect(fuselet_rope_sections_fwd(&tx, &k2, &k2s, two, 2, FUSELET_ROPE_SECTIONS_INTERLEAVED, &ty) == FUSELET_OK,
           "interleaved sections: valid call");
    fuselet_tensor p5 = view(c, {3, 5}), p4 = view(c, {3, 4});
    expect_error(fuselet_rope_fwd(&tx, &p5, &p5, FUSELET_ROPE_PAIR_TABLE, &ty),
                 "cos: the rotary dim R (2 x the last dimension: a pair table) must be in [2, D=8], got shape [3, 5]",
                 "pair table too wide");
    expect(fuselet_rope_fwd(&tx, &p4, &p4, FUSELET_ROPE_PAIR_TABLE, &ty) == FUSELET_OK, "pair table: valid call");
    fuselet_tensor p1 = view(c, {24});
    expect_error(fuselet_rope_fwd(&tx, &p1, &p1, FUSELET_ROPE_PAIR_TABLE, &ty),
                 "cos: expected shape [S, R/2] or [B, S, R/2], got shape [24]", "pair table: 1-D");
    fuselet_tensor huge = view(nullptr, {1, INT64_MAX / 8}, {0, 1});
    expect_error(fuselet_rope_sections_fwd_check(&tx, &huge, &huge, nullptr, 0, FUSELET_ROPE_PAIR_TABLE),
                 "cos: the rotary dim R (2 x the last dimension: a pair table) must be in [2, D=8]",
                 "pair table: huge");
    const int64_t big[] = {INT64_MAX, INT64_MAX};
    expect_error(fuselet_rope_sections_fwd_check(&tx, &k2, &k2s, big, 2, 0),
                 "sections: expected a sum of 4 (R/2, the rotating pairs), got more", "sections: overflowing sum");
    expect_error(fuselet_rope_sections_bwd_check(&tx, &k2, &k2s, five, -1, 0),
                 "sections: expected 1 to 4 sections (one per table), got -1", "negative n_sections");
    if (!fuselet_has_cuda())
      expect(fuselet_rope_sections_fwd_cuda(&tx, &k2, &k2s, two, 2, 0, &ty, nullptr) == FUSELET_ERR_UNSUPPORTED,
             "sections: CPU-only build");
  }
  expect_error(fuselet_rope_fwd(nullptr, &tc, &ts, 0, &ty), "x: expected a tensor, got NULL", "NULL x");
  expect_error(fuselet_rope_fwd(&tx, nullptr, &ts, 0, &ty), "cos: expected a tensor, got NULL", "NULL cos");
  expect_error(fuselet_rope_fwd(&tx, &tc, nullptr, 0, &ty), "sin: expected a tensor, got NULL", "NULL sin");
  expect_error(fuselet_rope_fwd(&tx, &tc, &ts, 0, nullptr), "y: expected a tensor, got NULL", "NULL y");
  expect_error(fuselet_rope_bwd(&tx, &tc, &ts, 0, nullptr), "dx: expected a tensor, got NULL", "NULL dx");
  fuselet_tensor x2 = view(x, {6, 8});
  expect_error(fuselet_rope_fwd(&x2, &tc, &ts, 0, &ty),
               "x: expected shape [B, S, N, D] or [S, N, D] (flags without FUSELET_ROPE_BHSD), got shape [6, 8]",
               "2-D x");
  expect_error(fuselet_rope_fwd(&x2, &tc, &ts, FUSELET_ROPE_BHSD, &ty),
               "x: expected shape [B, N, S, D] or [N, S, D] (flags with FUSELET_ROPE_BHSD)", "2-D x bhsd");
  fuselet_tensor x0 = view(x, {2, 3, 2, 0});
  expect_error(fuselet_rope_fwd(&x0, &tc, &ts, 0, &ty), "x: the head dim D (last dimension) must be > 0", "D = 0");
  bad = view(c, {3, 7});
  expect_error(fuselet_rope_fwd(&tx, &bad, &bad, 0, &ty),
               "cos: the rotary dim R (last dimension) must be even and in "
               "[2, D=8], got shape [3, 7]",
               "odd R");
  bad = view(c, {3, 10});
  expect_error(fuselet_rope_fwd(&tx, &bad, &bad, 0, &ty), "must be even and in [2, D=8]", "R > D");
  bad = view(c, {4, 8});
  expect_error(fuselet_rope_fwd(&tx, &bad, &bad, 0, &ty),
               "cos: expected 3 positions (S, dim 1 of x [2, 3, 2, 8]), got shape [4, 8]", "cos S");
  expect_error(fuselet_rope_fwd(&tx, &bad, &bad, FUSELET_ROPE_BHSD, &ty),
               "cos: expected 2 positions (S, dim 2 of x [2, 3, 2, 8]), got shape [4, 8]", "cos S bhsd");
  bad = view(c, {1, 3, 8});
  expect_error(fuselet_rope_fwd(&tx, &bad, &bad, 0, &ty),
               "cos: expected a batch of 2 (B, dim 0 of x [2, 3, 2, 8]), got shape [1, 3, 8]", "cos B");
  fuselet_tensor x3 = view(x, {3, 2, 8});
  expect_error(fuselet_rope_fwd(&x3, &bad, &bad, 0, &ty),
               "cos: expected shape [S, R] (x has no batch dim), got shape [1, 3, 8]", "3-D cos with B-less x");
  bad = view(c, {24});
  expect_error(fuselet_rope_fwd(&tx, &bad, &bad, 0, &ty), "cos: expected shape [S, R] or [B, S, R], got shape [24]",
               "1-D cos");
  bad = tc;
  bad.dtype = FUSELET_FLOAT16;
  expect_error(fuselet_rope_fwd(&tx, &bad, &bad, 0, &ty), "cos: expected dtype float32 (the dtype of x), got float16",
               "cos dtype");
  expect_error(fuselet_rope_fwd(&tx, &tc, &bad, 0, &ty), "sin: expected dtype float32 (the dtype of cos), got float16",
               "sin dtype");
  bad = view(s, {3, 4});
  expect_error(fuselet_rope_fwd(&tx, &tc, &bad, 0, &ty), "sin: expected shape [3, 8] (the shape of cos), got [3, 4]",
               "sin shape");
  bad = ty;
  bad.dtype = FUSELET_BFLOAT16;
  expect_error(fuselet_rope_fwd(&tx, &tc, &ts, 0, &bad), "y: expected dtype float32 (the dtype of x), got bfloat16",
               "y dtype");
  bad = view(y, {2, 3, 2, 4});
  expect_error(fuselet_rope_bwd(&tx, &tc, &ts, 0, &bad),
               "dx: expected shape [2, 3, 2, 8] (the shape of dy), got "
               "[2, 3, 2, 4]",
               "dx shape");
  bad = tx;
  bad.strides[3] = 2;
  expect_error(fuselet_rope_fwd(&bad, &tc, &ts, 0, &ty), "x: the last dimension must have stride 1", "x last stride");
  bad = tx;
  bad.strides[1] = -16;
  expect_error(fuselet_rope_fwd(&bad, &tc, &ts, 0, &ty),
               "x: negative strides are not supported (dimension 1 has stride -16)", "negative stride");
  bad = tx;
  bad.strides[0] = INT64_MAX / 2;
  bad.strides[1] = INT64_MAX / 2;
  expect_error(fuselet_rope_fwd(&bad, &tc, &ts, 0, &ty), "x: element offsets overflow int64", "stride overflow");
  bad = tx;
  bad.shape[0] = INT64_MAX / 4;
  expect_error(fuselet_rope_fwd(&bad, &tc, &ts, 0, &ty), "x: the number of elements of shape", "size overflow");
  expect(std::strstr(fuselet_last_error(), "overflows int64") != nullptr, "size overflow: says int64");
  bad = tc;
  bad.data = nullptr;
  expect_error(fuselet_rope_fwd(&tx, &bad, &ts, 0, &ty), "cos: data pointer is NULL", "NULL cos data");
  bad = tx;
  bad.dtype = static_cast<fuselet_dtype>(7);
  expect_error(fuselet_rope_fwd(&bad, &tc, &ts, 0, &ty), "x: expected dtype float32, float16 or bfloat16, got code 7",
               "bad dtype code");
  if (!fuselet_has_cuda())
    expect(fuselet_rope_fwd_cuda(&tx, &tc, &ts, 0, &ty, nullptr) == FUSELET_ERR_UNSUPPORTED, "CPU-only build");
  {  // the `_check` functions: stride-0 and strided views with no data, the entry points' messages
    const int64_t S = int64_t{1} << 30;
    fuselet_tensor x = view(nullptr, {4, S, 2, 8}, {0, 0, 0, 1}), cs = view(nullptr, {S, 4}, {0, 1});
    fuselet_tensor cols = view(nullptr, {2, 3, 8}, {1, 2, 6});  // a last stride of 6: the entry point needs a copy
    fuselet_tensor cs3 = view(nullptr, {3, 4}, {1, 3});
    expect(fuselet_rope_fwd_check(&x, &cs, &cs, 0) == FUSELET_OK, "rope_fwd_check: stride-0 views");
    expect(fuselet_rope_bwd_check(&cols, &cs3, &cs3, FUSELET_ROPE_BHSD) == FUSELET_OK,
           "rope_bwd_check: strided views");
    fuselet_tensor r3 = view(nullptr, {S, 3}, {0, 1});
    expect_error(fuselet_rope_fwd_check(&x, &r3, &r3, 0), "cos: the rotary dim R (last dimension) must be even",
                 "rope_fwd_check: odd R");
    fuselet_tensor sb = view(nullptr, {S, 4}, {0, 1}, FUSELET_BFLOAT16);
    expect_error(fuselet_rope_bwd_check(&x, &cs, &sb, 0),
                 "sin: expected dtype float32 (the dtype of cos), got bfloat16", "rope_bwd_check: sin dtype");
    expect_error(fuselet_rope_fwd_check(&x, &cs, &cs, FUSELET_ROPE_BHSD), "cos: expected 2 positions",
                 "rope_fwd_check: bhsd positions");
  }
  return fuselet_test::report();
}
