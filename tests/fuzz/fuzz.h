// The harness of the libFuzzer target over fuselet's C ABI (fuzz_c_abi.cc, fuzz_<stem>.cc): the
// input's reader, the tensor views built from it, and the checks of every call.
//
// An input is a sequence of calls: each starts with one byte that picks the entry point, and
// the bytes after it build the arguments (read from the front; past the end every byte reads
// as 0, and 0 always picks the common, well-formed choice). Tensor views are made to match
// what the entry point expects unless the bytes ask for a change: a NULL view, a NULL data
// pointer, an invalid dtype code, an out-of-range ndim, a shape or a stride replaced by a small
// or an overflow-prone value (negative, 2^61, 2^62, INT64_MAX, ...).
//
// Memory: every view's buffer is allocated with exactly the bytes a well-formed view of its
// claimed shape and strides spans (data at the start; negative strides point before it), so
// AddressSanitizer reports any access a bad view lets through. A claim whose byte span
// overflows int64 (or with a negative size, or a bad ndim) cannot be a real tensor: it gets a
// 16-byte buffer, and the library must refuse it before touching memory. A claim between 1 MiB
// and that is not called at all (it could be a real tensor, too large for a fuzzer).
//
// Findings: a crash, an AddressSanitizer or UndefinedBehaviorSanitizer report, a C++ exception
// crossing the C ABI (std::terminate), a leak, a timeout, or a broken contract checked here:
// every status is a fuselet_status; a failed call leaves a non-empty NUL-terminated message
// in fuselet_last_error(); the `_cuda` entry points of a build without CUDA return
// FUSELET_ERR_UNSUPPORTED; each host entry point's `_check` refuses nothing it accepts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <vector>

#include "fuselet/fuselet.h"

namespace fuselet_fuzz {

inline constexpr size_t kMaxBuffer = size_t{1} << 20;  // larger well-formed claims are not called
inline constexpr size_t kImpossibleBuffer = 16;        // what a claim beyond int64 gets

[[noreturn]] inline void finding(const char* what, const char* detail) {
  std::fprintf(stderr, "fuzz_c_abi: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  std::abort();
}

// Reads the input from the front; past its end every read returns 0.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
  uint32_t u32() { return u16() | static_cast<uint32_t>(u16()) << 16; }
  uint64_t u64() { return u32() | static_cast<uint64_t>(u32()) << 32; }

 private:
  const uint8_t* p_;
  size_t n_;
};

// Every buffer of one input, freed at its end (the target must not leak).
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (void* p : blocks_) std::free(p);
  }
  void* alloc(size_t bytes) {
    void* p = std::malloc(bytes);  // exactly `bytes`: one byte more is an ASan report
    if (p == nullptr && bytes != 0) std::abort();
    blocks_.push_back(p);
    return p;
  }
  fuselet_tensor* view() {
    views_.emplace_back();
    return &views_.back();
  }

 private:
  std::vector<void*> blocks_;
  std::deque<fuselet_tensor> views_;  // stable addresses
};

inline constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
inline constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// Sizes and strides a bad view may carry: around 0, around int32 and int64 limits, powers of
// two whose products overflow, sqrt(INT64_MAX).
inline int64_t interesting_i64(Reader& in, uint8_t which) {
  static const int64_t kTable[] = {0,
                                   -1,
                                   -2,
                                   kI64Min,
                                   kI64Max,
                                   kI64Max - 1,
                                   int64_t{1} << 31,
                                   (int64_t{1} << 31) - 1,
                                   int64_t{1} << 32,
                                   (int64_t{1} << 32) + 1,
                                   int64_t{1} << 61,
                                   int64_t{1} << 62,
                                   -(int64_t{1} << 62),
                                   (int64_t{1} << 62) + 1,
                                   (int64_t{1} << 62) - 1,
                                   -(int64_t{1} << 61),
                                   (int64_t{1} << 61) + 1,
                                   3037000499,
                                   3037000500,
                                   int64_t{1} << 40,
                                   int64_t{1} << 48,
                                   int64_t{1} << 56,
                                   int64_t{1} << 60,
                                   int64_t{1} << 30,
                                   65536,
                                   65537,
                                   int64_t{1} << 20,
                                   kI64Max / 3,
                                   -kI64Max,
                                   -65536};
  constexpr size_t kN = sizeof(kTable) / sizeof(kTable[0]);
  if (which < kN) return kTable[which];
  return static_cast<int64_t>(in.u64());
}

// A size: 1..8 mostly (byte 0 reads 1), 0, up to 2048, or an interesting value.
inline int64_t pick_dim(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xC0) {
    const int v = b % 9;
    return v == 8 ? 0 : v + 1;
  }
  if (b < 0xE0) return 1 + in.u16() % 2048;
  return interesting_i64(in, static_cast<uint8_t>(b - 0xE0));
}

// A stride to plant in a view: small ones (negative included) or interesting ones.
inline int64_t pick_stride(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xE0) return static_cast<int8_t>(in.u8()) % 20;
  return interesting_i64(in, static_cast<uint8_t>(b - 0xE0));
}

// A float dtype mostly; sometimes an integer one or a code no enumerator has.
inline int32_t pick_dtype(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xF0) return b % 3;
  static const int32_t kTable[] = {FUSELET_INT32, FUSELET_INT64, 5, 7, 8, -1, 255, 1 << 30,
                                   INT32_MIN,     INT32_MAX,     3, 4, 6, 16, 2,   0};
  return kTable[b - 0xF0];
}

inline int32_t pick_ndim(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xF0) {
    static const int32_t kTable[] = {2, 1, 3, 4, 2, 1, 5, 8, 0};
    return kTable[b % 9];
  }
  static const int32_t kTable[] = {-1, 9, 100, INT32_MIN, INT32_MAX, -8, 0, 8, 7, 6, 16, 64, 1, 2, 3, 4};
  return kTable[b - 0xF0];
}

// eps, scale, smoothing...: `normal` for byte 0, else a small value, a raw bit pattern or a
// special one (NaN, inf, 0, negative, denormal, FLT_MAX).
inline float pick_float(Reader& in, float normal) {
  const uint8_t b = in.u8();
  if (b == 0) return normal;
  if (b < 0x80) return static_cast<float>(b) / 64.f;
  if (b < 0x90) {
    const uint32_t bits = in.u32();
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  static const float kTable[] = {std::numeric_limits<float>::quiet_NaN(),
                                 std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(),
                                 0.f,
                                 -0.f,
                                 -1.f,
                                 -1e-6f,
                                 1e-6f,
                                 1e-30f,
                                 std::numeric_limits<float>::denorm_min(),
                                 std::numeric_limits<float>::min(),
                                 std::numeric_limits<float>::max(),
                                 -std::numeric_limits<float>::max(),
                                 1.f,
                                 1e30f,
                                 0.5f};
  return kTable[b % 16];
}

inline uint32_t pick_flags(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xF0) return b % 4;
  return in.u32();
}

inline int64_t elem_size(int32_t dtype) {
  switch (dtype) {
    case FUSELET_FLOAT32: return 4;
    case FUSELET_FLOAT16: return 2;
    case FUSELET_BFLOAT16: return 2;
    case FUSELET_INT32: return 4;
    case FUSELET_INT64: return 8;
    default: return 1;  // an invalid code: the library must not read it at all
  }
}

// A shape the op expects (its dtype separately).
struct Shape {
  int32_t ndim = 0;
  int64_t d[FUSELET_MAX_DIMS] = {};
};

inline Shape shape_of(std::initializer_list<int64_t> dims) {
  Shape s;
  for (int64_t v : dims) s.d[s.ndim++] = v;
  return s;
}

// Leading dims of s (all but the last), multiplied with wrap-around.
inline int64_t leading(const Shape& s) {
  uint64_t r = 1;
  for (int32_t k = 0; k + 1 < s.ndim && k < FUSELET_MAX_DIMS; ++k) r *= static_cast<uint64_t>(s.d[k]);
  return static_cast<int64_t>(r);
}

inline Shape with_last(Shape s, int64_t last) {
  if (s.ndim >= 1 && s.ndim <= FUSELET_MAX_DIMS) s.d[s.ndim - 1] = last;
  return s;
}

enum class Span { kSmall, kTooLarge, kImpossible };

// Bytes a well-formed view spans (data at its start; negative strides count as 0 here).
inline Span span_of(const fuselet_tensor& t, int32_t dtype, size_t* bytes) {
  if (t.ndim < 0 || t.ndim > FUSELET_MAX_DIMS) return Span::kImpossible;
  int64_t numel = 1, last = 0;
  bool empty = false, overflow = false;
  for (int32_t k = 0; k < t.ndim; ++k) {
    if (t.shape[k] < 0) return Span::kImpossible;
    if (t.shape[k] == 0) empty = true;
    overflow |= __builtin_mul_overflow(numel, t.shape[k], &numel);
    int64_t step;
    const int64_t stride = t.strides[k] > 0 ? t.strides[k] : 0;
    overflow |= __builtin_mul_overflow(t.shape[k] - 1, stride, &step) || __builtin_add_overflow(last, step, &last);
  }
  if (overflow) return Span::kImpossible;
  if (empty) {
    *bytes = 0;
    return Span::kSmall;
  }
  int64_t b;
  if (__builtin_add_overflow(last, 1, &b) || __builtin_mul_overflow(b, elem_size(dtype), &b)) return Span::kImpossible;
  if (static_cast<uint64_t>(b) > kMaxBuffer) return Span::kTooLarge;
  *bytes = static_cast<size_t>(b);
  return Span::kSmall;
}

// One input's state: its bytes, buffers, and whether it asked for an uncallable claim.
struct Ctx {
  Reader in;
  Arena arena;
  uint32_t seed = 1;
  bool too_large = false;

  uint32_t rand() {
    seed = seed * 1664525u + 1013904223u;
    return seed >> 8;
  }

  // Values: small finite floats, integers (class ids) in [-2, classes + 2).
  void fill(void* data, size_t bytes, int32_t dtype, int64_t classes) {
    const bool specials = (seed & 7) == 7;  // now and then a NaN / inf among them
    auto value = [&]() {
      if (specials && rand() % 17 == 0) {
        const float s[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), 65504.f * 2};
        return s[rand() % 4];
      }
      return static_cast<float>(static_cast<int32_t>(rand() % 2001) - 1000) / 250.f;
    };
    uint8_t* p = static_cast<uint8_t*>(data);
    if (dtype == FUSELET_FLOAT32) {
      for (size_t i = 0; i + 4 <= bytes; i += 4) {
        const float f = value();
        std::memcpy(p + i, &f, 4);
      }
    } else if (dtype == FUSELET_BFLOAT16 || dtype == FUSELET_FLOAT16) {
      for (size_t i = 0; i + 2 <= bytes; i += 2) {
        const float f = value();
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        uint16_t h;
        if (dtype == FUSELET_BFLOAT16) {
          h = static_cast<uint16_t>(bits >> 16);
        } else {  // float16: sign, exponent 2^-6..2^2, random mantissa; NaN / inf kept
          const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
          h = std::isfinite(f) ? static_cast<uint16_t>(sign | (9 + rand() % 9) << 10 | (rand() & 0x3ff))
                               : static_cast<uint16_t>(sign | 0x7c00 | (std::isnan(f) ? 0x200 : 0));
        }
        std::memcpy(p + i, &h, 2);
      }
    } else if (dtype == FUSELET_INT32 || dtype == FUSELET_INT64) {
      const int64_t range = classes > 0 && classes < (1 << 20) ? classes + 4 : 8;
      for (size_t i = 0; i + elem_size(dtype) <= bytes; i += static_cast<size_t>(elem_size(dtype))) {
        const int64_t v = static_cast<int64_t>(rand() % static_cast<uint32_t>(range)) - 2;
        if (dtype == FUSELET_INT32) {
          const int32_t w = static_cast<int32_t>(v);
          std::memcpy(p + i, &w, 4);
        } else {
          std::memcpy(p + i, &v, 8);
        }
      }
    } else {
      for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(rand());
    }
  }

  void mutate(fuselet_tensor* t, int32_t* dtype) {
    const uint8_t field = in.u8() % (2 + 2 * FUSELET_MAX_DIMS);
    if (field == 0) {
      *dtype = pick_dtype(in);
      std::memcpy(&t->dtype, dtype, sizeof *dtype);  // any int32, as a C caller may store it
    } else if (field == 1) {
      t->ndim = pick_ndim(in);
    } else if (field < 2 + FUSELET_MAX_DIMS) {
      t->shape[field - 2] = pick_dim(in);
    } else {
      t->strides[field - 2 - FUSELET_MAX_DIMS] = pick_stride(in);
    }
  }

  // A view of `s` and `dtype`, contiguous, unless the input's bytes change it; NULL for some.
  // `classes`: the value range of an integer (target) view.
  fuselet_tensor* tensor(const Shape& s, int32_t dtype, int64_t classes = 0) {
    const uint8_t mode = in.u8();
    if (mode >= 0xFC) return nullptr;
    fuselet_tensor* t = arena.view();
    std::memset(t, 0, sizeof *t);
    std::memcpy(&t->dtype, &dtype, sizeof dtype);
    t->ndim = s.ndim;
    if (mode >= 0xE0 && mode < 0xF0) {  // anything: ndim, shape, strides from the bytes
      t->ndim = pick_ndim(in);
      for (int k = 0; k < FUSELET_MAX_DIMS; ++k) t->shape[k] = k < t->ndim ? pick_dim(in) : 0;
    } else {
      for (int k = 0; k < FUSELET_MAX_DIMS; ++k) t->shape[k] = s.d[k];
    }
    // Contiguous strides (wrapping on overflow: the claim is then impossible anyway).
    uint64_t step = 1;
    const int32_t nd = t->ndim < 0 ? 0 : (t->ndim > FUSELET_MAX_DIMS ? FUSELET_MAX_DIMS : t->ndim);
    for (int32_t k = nd - 1; k >= 0; --k) {
      t->strides[k] = static_cast<int64_t>(step);
      step *= static_cast<uint64_t>(t->shape[k]);
      if (mode >= 0xA0 && mode < 0xC0 && k == nd - 1) step += mode % 8;  // rows of a wider tensor
    }
    if (mode >= 0xE0 && mode < 0xF0 && (in.u8() & 1))
      for (int32_t k = 0; k < nd; ++k) t->strides[k] = pick_stride(in);
    if (mode >= 0xC0 && mode < 0xE0) mutate(t, &dtype);
    if (mode >= 0xF0) {
      for (int n = 2 + in.u8() % 3; n > 0; --n) mutate(t, &dtype);
    }
    size_t bytes = 0;
    switch (span_of(*t, dtype, &bytes)) {
      case Span::kSmall: break;
      case Span::kTooLarge: too_large = true; return t;
      case Span::kImpossible: bytes = kImpossibleBuffer; break;
    }
    if (in.u8() == 0xFF) return t;  // data NULL
    t->data = arena.alloc(bytes);
    fill(t->data, bytes, dtype, classes);
    return t;
  }

  // A copy of the view `t` with no data (NULL stays NULL): what a `_check` gets, which reads none.
  const fuselet_tensor* no_data(const fuselet_tensor* t) {
    if (t == nullptr) return nullptr;
    fuselet_tensor* v = arena.view();
    *v = *t;
    v->data = nullptr;
    return v;
  }

  // An optional argument: absent (NULL) for byte 0 unless `present`.
  fuselet_tensor* optional(bool present, const Shape& s, int32_t dtype) {
    if (!present && in.u8() == 0) return nullptr;
    return tensor(s, dtype);
  }

  // The main input's shape: ndim and sizes from the bytes.
  Shape shape(int32_t min_ndim = 1) {
    Shape s;
    s.ndim = pick_ndim(in);
    if (s.ndim < min_ndim && s.ndim >= 0) s.ndim = min_ndim;
    for (int k = 0; k < FUSELET_MAX_DIMS; ++k) s.d[k] = k < s.ndim ? pick_dim(in) : 0;
    return s;
  }
};

inline void check_string(const char* s, const char* what, bool nonempty) {
  if (s == nullptr) finding(what, "NULL");
  if (strnlen(s, 4096) == 4096) finding(what, "no NUL within 4096 bytes");
  if (nonempty && s[0] == '\0') finding(what, "empty");
}

// Every status: one of the enumerators; a failure leaves a message.
inline fuselet_status check(fuselet_status status) {
  int code;
  std::memcpy(&code, &status, sizeof code);
  if (code < FUSELET_OK || code > FUSELET_ERR_INTERNAL) finding("status outside fuselet_status", nullptr);
  if (status != FUSELET_OK) check_string(fuselet_last_error(), "fuselet_last_error() after a failed call", true);
  check_string(fuselet_status_string(status), "fuselet_status_string()", true);
  return status;
}

// A `_cuda` entry point: in a build without CUDA it must refuse with FUSELET_ERR_UNSUPPORTED.
inline void check_cuda(fuselet_status status) {
  check(status);
  if (!fuselet_has_cuda() && status != FUSELET_ERR_UNSUPPORTED)
    finding("a _cuda entry point of a build without CUDA did not return FUSELET_ERR_UNSUPPORTED",
            fuselet_status_string(status));
}

// An entry point's `_check` on its inputs (fuselet.h): FUSELET_OK or
// FUSELET_ERR_INVALID_ARGUMENT. `then` is the entry point on the same inputs, which runs the same
// checks first: a call the `_check` refuses it refuses too.
template <typename Entry>
void check_then(fuselet_status checked, Entry&& then) {
  check(checked);
  if (checked != FUSELET_OK && checked != FUSELET_ERR_INVALID_ARGUMENT)
    finding("a _check returned neither FUSELET_OK nor FUSELET_ERR_INVALID_ARGUMENT", fuselet_status_string(checked));
  if (check(then()) == FUSELET_OK && checked != FUSELET_OK)
    finding("an entry point accepted what its _check refused", nullptr);
}

inline int32_t pick_param_dtype(Ctx& c, int32_t x_dtype) { return (c.in.u8() & 1) ? FUSELET_FLOAT32 : x_dtype; }

// The entry points of each header of the C ABI, one file each (fuzz_<stem>.cc: fuselet/<stem>.h);
// call() of fuzz_c_abi.cc picks one by the first byte of each call. `cuda`: the `_cuda` one.
// fuzz_fuselet.cc: fuselet/fuselet.h
void op_info(Ctx& c);
void op_set_num_threads(Ctx& c);
void op_set_cpu_isa(Ctx& c);
// fuzz_norm.cc
void op_rms_norm(Ctx& c, bool cuda);
void op_rms_norm_bwd(Ctx& c, bool cuda);
void op_layer_norm(Ctx& c, bool cuda);
void op_layer_norm_bwd(Ctx& c, bool cuda);
void op_add_rms_norm(Ctx& c, bool cuda);
void op_add_rms_norm_bwd(Ctx& c, bool cuda);
void op_gated_rms_norm(Ctx& c, bool cuda);
void op_gated_rms_norm_bwd(Ctx& c, bool cuda);
// fuzz_glu.cc, fuzz_softmax.cc, fuzz_rope.cc
void op_glu(Ctx& c, bool backward, bool cuda);
void op_softmax(Ctx& c, bool backward, bool cuda);
void op_rope(Ctx& c, bool backward, bool cuda);
void op_rope_sections(Ctx& c);
// fuzz_cross_entropy.cc: 0 the forward, 1 the backward, 2 the fused forward + backward
void op_cross_entropy(Ctx& c, int which, bool cuda);
void op_logprobs(Ctx& c, bool bwd, bool cuda);
// fuzz_divergence.cc
void op_divergence(Ctx& c, bool cuda);

}  // namespace fuselet_fuzz
