// libFuzzer target over every entry point of fuselet's C ABI (csrc/core/include/fuselet/*.h).
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
// FUSELET_ERR_UNSUPPORTED.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <vector>

#include "fuselet/cross_entropy.h"
#include "fuselet/divergence.h"
#include "fuselet/fuselet.h"
#include "fuselet/glu.h"
#include "fuselet/norm.h"
#include "fuselet/rope.h"
#include "fuselet/softmax.h"

namespace {

constexpr size_t kMaxBuffer = size_t{1} << 20;  // larger well-formed claims are not called
constexpr size_t kImpossibleBuffer = 16;        // what a claim beyond int64 gets
constexpr int kThreads = 2;                     // reset before every input
constexpr int kMaxCalls = 8;                    // calls per input

[[noreturn]] void finding(const char* what, const char* detail) {
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

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// Sizes and strides a bad view may carry: around 0, around int32 and int64 limits, powers of
// two whose products overflow, sqrt(INT64_MAX).
int64_t interesting_i64(Reader& in, uint8_t which) {
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
int64_t pick_dim(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xC0) {
    const int v = b % 9;
    return v == 8 ? 0 : v + 1;
  }
  if (b < 0xE0) return 1 + in.u16() % 2048;
  return interesting_i64(in, static_cast<uint8_t>(b - 0xE0));
}

// A stride to plant in a view: small ones (negative included) or interesting ones.
int64_t pick_stride(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xE0) return static_cast<int8_t>(in.u8()) % 20;
  return interesting_i64(in, static_cast<uint8_t>(b - 0xE0));
}

// A float dtype mostly; sometimes an integer one or a code no enumerator has.
int32_t pick_dtype(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xF0) return b % 3;
  static const int32_t kTable[] = {FUSELET_INT32, FUSELET_INT64, 5, 7, 8, -1, 255, 1 << 30,
                                   INT32_MIN,     INT32_MAX,     3, 4, 6, 16, 2,   0};
  return kTable[b - 0xF0];
}

int32_t pick_ndim(Reader& in) {
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
float pick_float(Reader& in, float normal) {
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

uint32_t pick_flags(Reader& in) {
  const uint8_t b = in.u8();
  if (b < 0xF0) return b % 4;
  return in.u32();
}

int64_t elem_size(int32_t dtype) {
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

Shape shape_of(std::initializer_list<int64_t> dims) {
  Shape s;
  for (int64_t v : dims) s.d[s.ndim++] = v;
  return s;
}

// Leading dims of s (all but the last), multiplied with wrap-around.
int64_t leading(const Shape& s) {
  uint64_t r = 1;
  for (int32_t k = 0; k + 1 < s.ndim && k < FUSELET_MAX_DIMS; ++k) r *= static_cast<uint64_t>(s.d[k]);
  return static_cast<int64_t>(r);
}

Shape with_last(Shape s, int64_t last) {
  if (s.ndim >= 1 && s.ndim <= FUSELET_MAX_DIMS) s.d[s.ndim - 1] = last;
  return s;
}

enum class Span { kSmall, kTooLarge, kImpossible };

// Bytes a well-formed view spans (data at its start; negative strides count as 0 here).
Span span_of(const fuselet_tensor& t, int32_t dtype, size_t* bytes) {
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

void check_string(const char* s, const char* what, bool nonempty) {
  if (s == nullptr) finding(what, "NULL");
  if (strnlen(s, 4096) == 4096) finding(what, "no NUL within 4096 bytes");
  if (nonempty && s[0] == '\0') finding(what, "empty");
}

// Every status: one of the enumerators; a failure leaves a message.
fuselet_status check(fuselet_status status) {
  int code;
  std::memcpy(&code, &status, sizeof code);
  if (code < FUSELET_OK || code > FUSELET_ERR_INTERNAL) finding("status outside fuselet_status", nullptr);
  if (status != FUSELET_OK) check_string(fuselet_last_error(), "fuselet_last_error() after a failed call", true);
  check_string(fuselet_status_string(status), "fuselet_status_string()", true);
  return status;
}

// A `_cuda` entry point: in a build without CUDA it must refuse with FUSELET_ERR_UNSUPPORTED.
void check_cuda(fuselet_status status) {
  check(status);
  if (!fuselet_has_cuda() && status != FUSELET_ERR_UNSUPPORTED)
    finding("a _cuda entry point of a build without CUDA did not return FUSELET_ERR_UNSUPPORTED",
            fuselet_status_string(status));
}

int32_t pick_param_dtype(Ctx& c, int32_t x_dtype) { return (c.in.u8() & 1) ? FUSELET_FLOAT32 : x_dtype; }

// Norms: x [..., H], weight/bias [H], rstd/mean [R].
struct NormArgs {
  int32_t dtype, pdtype;
  Shape x, h, r;
  float eps;
  uint32_t flags;
};

NormArgs norm_args(Ctx& c) {
  NormArgs a;
  a.dtype = pick_dtype(c.in);
  a.pdtype = pick_param_dtype(c, a.dtype);
  a.x = c.shape();
  a.h = shape_of({a.x.ndim >= 1 && a.x.ndim <= FUSELET_MAX_DIMS ? a.x.d[a.x.ndim - 1] : 1});
  a.r = shape_of({leading(a.x)});
  a.eps = pick_float(c.in, 1e-5f);
  a.flags = pick_flags(c.in) & (c.in.u8() < 0xF0 ? 1u : ~0u);
  return a;
}

void op_rms_norm(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* y = c.tensor(a.x, a.dtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  if (c.too_large) return;
  if (cuda) return check_cuda(fuselet_rms_norm_fwd_cuda(x, weight, a.eps, a.flags, y, rstd, c.arena.alloc(0)));
  check(fuselet_rms_norm_fwd(x, weight, a.eps, a.flags, y, rstd));
}

void op_rms_norm_bwd(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* dy = c.tensor(a.x, a.dtype);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.tensor(a.x, a.dtype);
  fuselet_tensor* dweight = c.optional(weight != nullptr, a.h, a.pdtype);
  if (c.too_large) return;
  if (cuda) {
    const size_t ws = c.in.u8() % 64;
    return check_cuda(
        fuselet_rms_norm_bwd_cuda(dy, x, weight, rstd, a.flags, dx, dweight, c.arena.alloc(ws), ws, c.arena.alloc(0)));
  }
  check(fuselet_rms_norm_bwd(dy, x, weight, rstd, a.flags, dx, dweight));
}

void op_layer_norm(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* bias = c.tensor(a.h, a.pdtype);
  fuselet_tensor* y = c.tensor(a.x, a.dtype);
  fuselet_tensor* mean = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  if (c.too_large) return;
  if (cuda)
    return check_cuda(fuselet_layer_norm_fwd_cuda(x, weight, bias, a.eps, a.flags, y, mean, rstd, c.arena.alloc(0)));
  check(fuselet_layer_norm_fwd(x, weight, bias, a.eps, a.flags, y, mean, rstd));
}

void op_layer_norm_bwd(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* dy = c.tensor(a.x, a.dtype);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* mean = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.tensor(a.x, a.dtype);
  fuselet_tensor* dweight = c.optional(weight != nullptr, a.h, a.pdtype);
  fuselet_tensor* dbias = c.optional(false, a.h, a.pdtype);
  if (c.too_large) return;
  if (cuda) {
    const size_t ws = c.in.u8() % 64;
    return check_cuda(fuselet_layer_norm_bwd_cuda(dy, x, weight, mean, rstd, a.flags, dx, dweight, dbias,
                                                  c.arena.alloc(ws), ws, c.arena.alloc(0)));
  }
  check(fuselet_layer_norm_bwd(dy, x, weight, mean, rstd, a.flags, dx, dweight, dbias));
}

void op_add_rms_norm(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* x = c.tensor(a.x, a.dtype);
  fuselet_tensor* residual = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* y = c.tensor(a.x, a.dtype);
  fuselet_tensor* residual_out = c.tensor(a.x, a.dtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  if (c.too_large) return;
  if (cuda)
    return check_cuda(
        fuselet_add_rms_norm_fwd_cuda(x, residual, weight, a.eps, a.flags, y, residual_out, rstd, c.arena.alloc(0)));
  check(fuselet_add_rms_norm_fwd(x, residual, weight, a.eps, a.flags, y, residual_out, rstd));
}

void op_add_rms_norm_bwd(Ctx& c, bool cuda) {
  NormArgs a = norm_args(c);
  fuselet_tensor* dy = c.tensor(a.x, a.dtype);
  fuselet_tensor* dresidual_out = c.tensor(a.x, a.dtype);
  fuselet_tensor* residual_out = c.tensor(a.x, a.dtype);
  fuselet_tensor* weight = c.tensor(a.h, a.pdtype);
  fuselet_tensor* rstd = c.tensor(a.r, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.tensor(a.x, a.dtype);
  fuselet_tensor* dweight = c.optional(weight != nullptr, a.h, a.pdtype);
  if (c.too_large) return;
  if (cuda) {
    const size_t ws = c.in.u8() % 64;
    return check_cuda(fuselet_add_rms_norm_bwd_cuda(dy, dresidual_out, residual_out, weight, rstd, a.flags, dx,
                                                    dweight, c.arena.alloc(ws), ws, c.arena.alloc(0)));
  }
  check(fuselet_add_rms_norm_bwd(dy, dresidual_out, residual_out, weight, rstd, a.flags, dx, dweight));
}

int32_t pick_activation(Ctx& c) {
  const uint8_t b = c.in.u8();
  if (b < 0xF0) return b % 3;
  static const int32_t kTable[] = {3, -1, INT32_MIN, INT32_MAX, 4, 255, 1 << 16, 2};
  return kTable[b % 8];
}

// The _ex entry points' options, read after the tensors (a byte `mode`: 0, and an input that
// ends there, keeps the plain entry points): bit 0 the _ex ones, bit 1 the clamped SwiGLU
// (else `act`), interleaved mostly 0 / 1, alpha and limit anywhere (NaN, inf, 0, negative).
bool pick_glu_options(Ctx& c, int32_t act, fuselet_glu_options* o) {
  const uint8_t mode = c.in.u8();
  if (!(mode & 1)) return false;
  o->activation = mode & 2 ? FUSELET_GLU_SILU_CLAMPED : act;
  const uint8_t b = c.in.u8();
  o->interleaved = b < 0xF0 ? b % 2 : static_cast<int32_t>(b) - 0xF8;
  o->alpha = pick_float(c.in, 1.702f);
  o->limit = pick_float(c.in, 7.f);
  return true;
}

void op_glu(Ctx& c, bool backward, bool cuda) {
  const int32_t dtype = pick_dtype(c.in);
  const int32_t act = pick_activation(c);
  fuselet_glu_options o{};
  Shape y = c.shape();
  const int64_t f = y.ndim >= 1 && y.ndim <= FUSELET_MAX_DIMS ? y.d[y.ndim - 1] : 1;
  Shape x = with_last(y, static_cast<int64_t>(static_cast<uint64_t>(f) * 2));
  if (!backward) {
    fuselet_tensor* tx = c.tensor(x, dtype);
    fuselet_tensor* ty = c.tensor(y, dtype);
    if (c.too_large) return;
    const bool ex = pick_glu_options(c, act, &o);
    if (ex && cuda) return check_cuda(fuselet_glu_fwd_ex_cuda(tx, &o, ty, c.arena.alloc(0)));
    if (cuda) return check_cuda(fuselet_glu_fwd_cuda(tx, act, ty, c.arena.alloc(0)));
    check(ex ? fuselet_glu_fwd_ex(tx, &o, ty) : fuselet_glu_fwd(tx, act, ty));
    return;
  }
  fuselet_tensor* tdy = c.tensor(y, dtype);
  fuselet_tensor* tx = c.tensor(x, dtype);
  fuselet_tensor* tdx = c.tensor(x, dtype);
  if (c.too_large) return;
  const bool ex = pick_glu_options(c, act, &o);
  if (ex && cuda) return check_cuda(fuselet_glu_bwd_ex_cuda(tdy, tx, &o, tdx, c.arena.alloc(0)));
  if (cuda) return check_cuda(fuselet_glu_bwd_cuda(tdy, tx, act, tdx, c.arena.alloc(0)));
  check(ex ? fuselet_glu_bwd_ex(tdy, tx, &o, tdx) : fuselet_glu_bwd(tdy, tx, act, tdx));
}

void op_softmax(Ctx& c, bool backward, bool cuda) {
  const int32_t dtype = pick_dtype(c.in);
  const float scale = pick_float(c.in, 1.f);
  const uint32_t flags = pick_flags(c.in) & (c.in.u8() < 0xF0 ? 1u : ~0u);
  Shape x = c.shape();
  if (!backward) {
    fuselet_tensor* tx = c.tensor(x, dtype);
    fuselet_tensor* ty = c.tensor(x, dtype);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_softmax_fwd_cuda(tx, scale, flags, ty, c.arena.alloc(0)));
    check(fuselet_softmax_fwd(tx, scale, flags, ty));
    return;
  }
  fuselet_tensor* tdy = c.tensor(x, dtype);
  fuselet_tensor* ty = c.tensor(x, dtype);
  fuselet_tensor* tdx = c.tensor(x, dtype);
  if (c.too_large) return;
  if (cuda) return check_cuda(fuselet_softmax_bwd_cuda(tdy, ty, scale, tdx, c.arena.alloc(0)));
  check(fuselet_softmax_bwd(tdy, ty, scale, tdx));
}

void op_rope(Ctx& c, bool backward, bool cuda) {
  const int32_t dtype = pick_dtype(c.in);
  const int32_t cs_dtype = pick_param_dtype(c, dtype);
  const uint32_t flags = pick_flags(c.in) & (c.in.u8() < 0xF0 ? 3u : ~0u);
  const bool batch = !(c.in.u8() & 1), per_sequence = batch && (c.in.u8() & 1);
  const int64_t B = pick_dim(c.in), S = pick_dim(c.in), N = pick_dim(c.in);
  const int64_t D = static_cast<int64_t>(static_cast<uint64_t>(pick_dim(c.in)) * 2u);  // wraps, as a caller's might
  const int64_t half = D / 2 > 0 ? D / 2 : 1;
  const int64_t R = 2 * (1 + static_cast<int64_t>(static_cast<uint64_t>(c.in.u8()) % static_cast<uint64_t>(half)));
  const bool bhsd = flags & FUSELET_ROPE_BHSD;
  const int64_t d1 = bhsd ? N : S, d2 = bhsd ? S : N;
  const Shape x = batch ? shape_of({B, d1, d2, D}) : shape_of({d1, d2, D});
  const Shape cs = per_sequence ? shape_of({B, S, R}) : shape_of({S, R});
  fuselet_tensor* in = c.tensor(x, dtype);
  fuselet_tensor* cos = c.tensor(cs, cs_dtype);
  fuselet_tensor* sin = c.tensor(cs, cs_dtype);
  fuselet_tensor* out = c.tensor(x, dtype);
  if (c.too_large) return;
  if (cuda) {
    void* stream = c.arena.alloc(0);
    return check_cuda(backward ? fuselet_rope_bwd_cuda(in, cos, sin, flags, out, stream)
                               : fuselet_rope_fwd_cuda(in, cos, sin, flags, out, stream));
  }
  check(backward ? fuselet_rope_bwd(in, cos, sin, flags, out) : fuselet_rope_fwd(in, cos, sin, flags, out));
}

void op_cross_entropy(Ctx& c, int which, bool cuda) {  // 0: fwd, 1: bwd, 2: fwd_bwd
  const int32_t dtype = pick_dtype(c.in);
  const uint8_t tb = c.in.u8();
  const int32_t tdtype = tb < 0xF0 ? (tb & 1 ? FUSELET_INT64 : FUSELET_INT32) : pick_dtype(c.in);
  fuselet_cross_entropy_options opts;
  const uint8_t ib = c.in.u8();
  static const int64_t kIgnore[] = {-100, -1, 0, 1, kI64Min, kI64Max, 2, 3};
  opts.ignore_index = ib < 0xF0 ? kIgnore[ib % 8] : static_cast<int64_t>(c.in.u64());
  opts.label_smoothing = pick_float(c.in, 0.f);
  opts.z_loss = pick_float(c.in, 0.f);
  opts.softcap = pick_float(c.in, 0.f);
  const fuselet_cross_entropy_options* popts = c.in.u8() == 0xFF ? nullptr : &opts;
  const float grad_scale = pick_float(c.in, 1.f);
  Shape logits = c.shape();
  const int64_t V = logits.ndim >= 1 && logits.ndim <= FUSELET_MAX_DIMS ? logits.d[logits.ndim - 1] : 1;
  const Shape n = shape_of({leading(logits)});
  fuselet_tensor* tlogits = c.tensor(logits, dtype);
  fuselet_tensor* target = c.tensor(n, tdtype, V);
  void* stream = c.arena.alloc(0);
  if (which == 0) {
    fuselet_tensor* loss = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* z = c.optional(false, n, FUSELET_FLOAT32);
    fuselet_tensor* lse = c.tensor(n, FUSELET_FLOAT32);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_cross_entropy_fwd_cuda(tlogits, target, popts, loss, z, lse, stream));
    check(fuselet_cross_entropy_fwd(tlogits, target, popts, loss, z, lse));
    return;
  }
  const bool in_place = c.in.u8() & 1;
  if (which == 1) {
    fuselet_tensor* dloss = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* lse = c.tensor(n, FUSELET_FLOAT32);
    fuselet_tensor* dlogits = in_place ? tlogits : c.tensor(logits, dtype);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_cross_entropy_bwd_cuda(dloss, tlogits, target, lse, popts, dlogits, stream));
    check(fuselet_cross_entropy_bwd(dloss, tlogits, target, lse, popts, dlogits));
    return;
  }
  fuselet_tensor* loss = c.tensor(n, FUSELET_FLOAT32);
  fuselet_tensor* z = c.optional(false, n, FUSELET_FLOAT32);
  fuselet_tensor* dlogits = in_place ? tlogits : c.tensor(logits, dtype);
  if (c.too_large) return;
  if (cuda)
    return check_cuda(
        fuselet_cross_entropy_fwd_bwd_cuda(tlogits, target, popts, grad_scale, loss, z, dlogits, stream));
  check(fuselet_cross_entropy_fwd_bwd(tlogits, target, popts, grad_scale, loss, z, dlogits));
}

// Divergences: kind (mostly a known one), log_target, beta from the bytes; input and target
// of the same shape (or target of its own, sometimes), dinput / dtarget each optional.
void op_divergence(Ctx& c, bool cuda) {
  const bool backward = c.in.u8() & 1;
  const int32_t dtype = pick_dtype(c.in);
  fuselet_divergence_options opts;
  const uint8_t kb = c.in.u8();
  opts.kind = kb < 0xF0 ? kb % 3 : static_cast<int32_t>(c.in.u32());
  const uint8_t lb = c.in.u8();
  opts.log_target = lb < 0xF0 ? (lb & 1 ? 1 : (opts.kind == FUSELET_DIVERGENCE_KL ? 0 : 1)) : static_cast<int32_t>(lb);
  opts.beta =
      opts.kind == FUSELET_DIVERGENCE_JSD ? pick_float(c.in, 0.5f) : (c.in.u8() < 0xF0 ? 0.f : pick_float(c.in, 0.f));
  const fuselet_divergence_options* popts = c.in.u8() == 0xFF ? nullptr : &opts;
  const Shape x = c.shape();
  const Shape t = c.in.u8() < 0xF0 ? x : c.shape();
  const Shape n = shape_of({leading(x)});
  fuselet_tensor* tx = c.tensor(x, dtype);
  fuselet_tensor* tt = c.tensor(t, c.in.u8() < 0xF0 ? dtype : pick_dtype(c.in));
  void* stream = c.arena.alloc(0);
  if (!backward) {
    fuselet_tensor* loss = c.tensor(n, FUSELET_FLOAT32);
    if (c.too_large) return;
    if (cuda) return check_cuda(fuselet_divergence_fwd_cuda(tx, tt, popts, loss, stream));
    check(fuselet_divergence_fwd(tx, tt, popts, loss));
    return;
  }
  fuselet_tensor* dloss = c.tensor(n, FUSELET_FLOAT32);
  fuselet_tensor* dx = c.optional(false, x, dtype);
  fuselet_tensor* dt = c.optional(false, t, dtype);
  if (c.too_large) return;
  if (cuda) return check_cuda(fuselet_divergence_bwd_cuda(dloss, tx, tt, popts, dx, dt, stream));
  check(fuselet_divergence_bwd(dloss, tx, tt, popts, dx, dt));
}

// A thread count: 1..4 mostly (the fuzzer stays fast), else one a caller must not get a pool
// of: 0, negative, INT32_MAX...
void op_set_num_threads(Ctx& c) {
  const uint8_t b = c.in.u8();
  static const int kHuge[] = {0, -1, INT32_MIN, INT32_MAX, INT32_MAX - 1, 1 << 30, -(1 << 30), 0};
  const int n = b < 0xF0 ? 1 + b % 4 : kHuge[b % 8];
  if (check(fuselet_set_num_threads(n)) == FUSELET_OK && fuselet_get_num_threads() != n)
    finding("fuselet_get_num_threads() after fuselet_set_num_threads(n) returned OK", "not n");
}

void op_set_cpu_isa(Ctx& c) {
  const uint8_t b = c.in.u8();
  static const char* const kNames[] = {"baseline", "avx2", "avx512", nullptr, "", "AVX2", "avx512 ", "avx"};
  const char* name;
  char* raw = nullptr;
  if (b < 0xF0) {
    name = kNames[b % 8];
  } else {  // bytes of the input, NUL-terminated, in a buffer of exactly that size
    const size_t len = c.in.u8() % 24;
    raw = static_cast<char*>(c.arena.alloc(len + 1));
    for (size_t i = 0; i < len; ++i) raw[i] = static_cast<char>(c.in.u8());
    raw[len] = '\0';
    name = raw;
  }
  const fuselet_status s = check(fuselet_set_cpu_isa(name));
  const char* now = fuselet_cpu_isa();
  if (s == FUSELET_OK && name != nullptr && (now == nullptr || std::strcmp(now, name) != 0))
    finding("fuselet_cpu_isa() after fuselet_set_cpu_isa(name) returned OK", "not name");
}

// The getters: none may crash or return a bad string, whatever was set before.
void op_info(Ctx& c) {
  check_string(fuselet_last_error(), "fuselet_last_error()", false);
  check_string(fuselet_version(), "fuselet_version()", true);
  check_string(fuselet_cuda_archs(), "fuselet_cuda_archs()", false);
  const int cuda = fuselet_has_cuda();
  if (cuda != 0 && cuda != 1) finding("fuselet_has_cuda()", "neither 0 nor 1");
  const char* isa = fuselet_cpu_isa();
  if (isa != nullptr) check_string(isa, "fuselet_cpu_isa()", true);
  if (fuselet_get_num_threads() < 1) finding("fuselet_get_num_threads()", "< 1");
  const int32_t code = static_cast<int32_t>(c.in.u32());  // any int, as a C caller may pass
  fuselet_status status;
  std::memcpy(&status, &code, sizeof status);
  check_string(fuselet_status_string(status), "fuselet_status_string()", true);
  const int64_t rows = pick_dim(c.in), hidden = pick_dim(c.in);
  (void)fuselet_norm_bwd_workspace_bytes_cuda(rows, hidden);
}

void call(Ctx& c, uint8_t op) {
  switch (op % 36) {
    case 0: return op_info(c);
    case 1: return op_set_num_threads(c);
    case 2: return op_set_cpu_isa(c);
    case 3: return op_rms_norm(c, false);
    case 4: return op_rms_norm_bwd(c, false);
    case 5: return op_layer_norm(c, false);
    case 6: return op_layer_norm_bwd(c, false);
    case 7: return op_add_rms_norm(c, false);
    case 8: return op_add_rms_norm_bwd(c, false);
    case 9: return op_glu(c, false, false);
    case 10: return op_glu(c, true, false);
    case 11: return op_softmax(c, false, false);
    case 12: return op_softmax(c, true, false);
    case 13: return op_rope(c, false, false);
    case 14: return op_rope(c, true, false);
    case 15: return op_cross_entropy(c, 0, false);
    case 16: return op_cross_entropy(c, 1, false);
    case 17: return op_cross_entropy(c, 2, false);
    case 18: return op_rms_norm(c, true);
    case 19: return op_rms_norm_bwd(c, true);
    case 20: return op_layer_norm(c, true);
    case 21: return op_layer_norm_bwd(c, true);
    case 22: return op_add_rms_norm(c, true);
    case 23: return op_add_rms_norm_bwd(c, true);
    case 24: return op_glu(c, false, true);
    case 25: return op_glu(c, true, true);
    case 26: return op_softmax(c, false, true);
    case 27: return op_softmax(c, true, true);
    case 28: return op_rope(c, false, true);
    case 29: return op_rope(c, true, true);
    case 30: return op_cross_entropy(c, 0, true);
    case 31: return op_cross_entropy(c, 1, true);
    case 32: return op_cross_entropy(c, 2, true);
    case 33: return op_divergence(c, false);
    case 34: return op_divergence(c, true);
    // The kernel that runs most often weighs more.
    default: return op_cross_entropy(c, 2, false);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The same process state before every input: the result of an input is its own.
  if (fuselet_set_num_threads(kThreads) != FUSELET_OK || fuselet_set_cpu_isa(nullptr) != FUSELET_OK) std::abort();
  Ctx c{Reader(data, size)};
  c.seed = static_cast<uint32_t>(size) * 2654435761u + (size ? data[size - 1] : 0);
  for (int k = 0; k < kMaxCalls && !c.in.empty(); ++k) {
    c.too_large = false;
    call(c, c.in.u8());
  }
  return 0;
}
