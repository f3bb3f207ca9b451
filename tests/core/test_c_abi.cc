// C++ test of what the C ABI does with views and settings that lie or overflow: negative
// strides, strides and element counts whose offsets overflow int64, last dimensions too large
// to address, thread counts past the bound, and a thread pool that fails to start. Each case
// must come back as a status with a message naming the argument (never a crash, a hang, an
// exception or OK with nothing computed). One group per run: `test_c_abi GROUP` (ctest runs
// each group). Prints "N passed, N failed".
#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "expect.h"
#include "fuselet/cross_entropy.h"
#include "fuselet/glu.h"
#include "fuselet/norm.h"
#include "fuselet/rope.h"
#include "fuselet/softmax.h"

// The sanitizers intercept pthread_create themselves; the pool-failure group runs without them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FUSELET_TEST_NO_HOOK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FUSELET_TEST_NO_HOOK 1
#endif
#endif

namespace {

using fuselet_test::expect;
using fuselet_test::view;

constexpr int64_t k2_32 = int64_t{1} << 32, k2_61 = int64_t{1} << 61, k2_62 = int64_t{1} << 62;
constexpr fuselet_dtype kF32 = FUSELET_FLOAT32, kBF16 = FUSELET_BFLOAT16;

// `s` is FUSELET_ERR_INVALID_ARGUMENT and the message starts with "arg:" and contains `needle`.
void refused(fuselet_status s, const char* arg, const char* needle, const std::string& what) {
  const char* msg = fuselet_last_error();
  const std::string prefix = std::string(arg) + ":";
  expect(s == FUSELET_ERR_INVALID_ARGUMENT && std::strncmp(msg, prefix.c_str(), prefix.size()) == 0 &&
             std::strstr(msg, needle) != nullptr,
         what + " -> status " + std::to_string(static_cast<int>(s)) + " '" + msg + "'");
}

// Plenty of room: the views below claim more than this, and must be refused before any read.
struct Buffers {
  std::vector<float> a = std::vector<float>(4096, 1.f), b = std::vector<float>(4096, 0.f),
                     c = std::vector<float>(4096, 0.f), d = std::vector<float>(4096, 0.f);
  std::vector<int32_t> target = std::vector<int32_t>(64, 0);
};

// A view with exactly these strides (view() multiplies the sizes, which would overflow here).
fuselet_tensor raw(void* data, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  fuselet_tensor t{};
  t.data = data;
  t.dtype = kF32;
  t.ndim = static_cast<int32_t>(shape.size());
  for (int32_t d = 0; d < t.ndim; ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = strides[d];
  }
  return t;
}

fuselet_tensor ints(void* data, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  return view(data, std::move(shape), std::move(strides), FUSELET_INT32);
}

const fuselet_cross_entropy_options kCe{-100, 0.f, 0.f, 0.f};

// ---------------------------------------------------------------------------------------------
// Negative strides: a reversed view (numpy a[::-1]) points at its last row and steps back.

void negative_strides() {
  Buffers m;
  float* last_row = m.a.data() + 3 * 8;  // rows of 8 at a[0..32): the view starts at row 3
  fuselet_tensor rev = view(last_row, {4, 8}, {-8, 1}), fwd = view(m.b.data(), {4, 8});
  fuselet_tensor rev_cols = view(m.a.data() + 7, {4, 8}, {8, -1});
  const char* needle = "negative strides are not supported";

  refused(fuselet_softmax_fwd(&rev, 1.f, 0, &fwd), "x", needle, "softmax_fwd: x reversed rows");
  refused(fuselet_softmax_fwd(&rev_cols, 1.f, 0, &fwd), "x", needle, "softmax_fwd: x reversed columns");
  const char* msg_ok = "dimension 0 has stride -8";
  refused(fuselet_softmax_fwd(&rev, 1.f, 0, &fwd), "x", msg_ok, "softmax_fwd: the message names dim and stride");
  fuselet_tensor x = view(m.a.data(), {4, 8}), y_rev = view(m.b.data() + 24, {4, 8}, {-8, 1});
  refused(fuselet_softmax_fwd(&x, 1.f, 0, &y_rev), "y", needle, "softmax_fwd: y reversed");
  fuselet_tensor dx = view(m.c.data(), {4, 8});
  refused(fuselet_softmax_bwd(&rev, &x, 1.f, &dx), "dy", needle, "softmax_bwd: dy reversed");

  fuselet_tensor gy = view(m.b.data(), {4, 4});
  refused(fuselet_glu_fwd(&rev, FUSELET_GLU_SILU, &gy), "x", needle, "glu_fwd: x reversed");
  fuselet_tensor gy_rev = view(m.b.data() + 12, {4, 4}, {-4, 1});
  refused(fuselet_glu_fwd(&x, FUSELET_GLU_SILU, &gy_rev), "y", needle, "glu_fwd: y reversed");

  fuselet_tensor w = view(m.d.data(), {8}), rstd = view(m.c.data(), {4});
  refused(fuselet_rms_norm_fwd(&rev, &w, 1e-6f, 0, &fwd, &rstd), "x", needle, "rms_norm_fwd: x reversed");
  fuselet_tensor w_rev = view(m.d.data() + 7, {8}, {-1});
  refused(fuselet_rms_norm_fwd(&x, &w_rev, 1e-6f, 0, &fwd, &rstd), "weight", needle, "rms_norm_fwd: weight reversed");
  fuselet_tensor rstd_rev = view(m.c.data() + 3, {4}, {-1});
  refused(fuselet_rms_norm_fwd(&x, &w, 1e-6f, 0, &fwd, &rstd_rev), "rstd", needle, "rms_norm_fwd: rstd reversed");
  fuselet_tensor hout = view(m.c.data() + 64, {4, 8});
  refused(fuselet_add_rms_norm_fwd(&x, &rev, &w, 1e-6f, 0, &fwd, &hout, &rstd), "residual", needle,
          "add_rms_norm_fwd: residual reversed");

  fuselet_tensor tgt = ints(m.target.data(), {4}), loss = view(m.c.data(), {4}), lse = view(m.c.data() + 8, {4});
  refused(fuselet_cross_entropy_fwd(&rev, &tgt, &kCe, &loss, nullptr, &lse), "logits", needle,
          "cross_entropy_fwd: logits reversed");
  fuselet_tensor tgt_rev = ints(m.target.data() + 3, {4}, {-1});
  refused(fuselet_cross_entropy_fwd(&x, &tgt_rev, &kCe, &loss, nullptr, &lse), "target", needle,
          "cross_entropy_fwd: target reversed");

  // rope [S=4, N=1, D=8], cos/sin [S=4, R=8].
  fuselet_tensor rx_rev = view(last_row, {4, 1, 8}, {-8, 8, 1}), ry = view(m.b.data(), {4, 1, 8});
  fuselet_tensor cs = view(m.d.data(), {4, 8}), cs_rev = view(m.d.data() + 24, {4, 8}, {-8, 1});
  refused(fuselet_rope_fwd(&rx_rev, &cs, &cs, 0, &ry), "x", needle, "rope_fwd: x reversed");
  fuselet_tensor rx = view(m.a.data(), {4, 1, 8});
  refused(fuselet_rope_fwd(&rx, &cs_rev, &cs, 0, &ry), "cos", needle, "rope_fwd: cos reversed");

  // The stride of a dimension of size 1 is never used: any value is accepted there.
  fuselet_tensor one_row = view(m.a.data(), {1, 8}, {-5, 1}), one_out = view(m.b.data(), {1, 8});
  expect(fuselet_softmax_fwd(&one_row, 1.f, 0, &one_out) == FUSELET_OK && m.b[0] > 0.12f && m.b[0] < 0.13f,
         "softmax_fwd: a negative stride on a size-1 dimension is ignored");
}

// ---------------------------------------------------------------------------------------------
// Strides whose offsets do not fit in int64 (elements, or bytes).

void stride_overflow() {
  Buffers m;
  const char* needle = "overflow";
  for (int64_t stride : {k2_62, INT64_MAX, k2_61}) {  // 2^61 float32: the elements fit, the bytes do not
    const std::string s = " (row stride " + std::to_string(stride) + ")";
    fuselet_tensor big = view(m.a.data(), {2, 4}, {stride, 1}), ok = view(m.b.data(), {2, 4});
    refused(fuselet_softmax_fwd(&big, 1.f, 0, &ok), "x", needle, "softmax_fwd: x" + s);
    refused(fuselet_softmax_fwd(&ok, 1.f, 0, &big), "y", needle, "softmax_fwd: y" + s);
    fuselet_tensor gy = view(m.c.data(), {2, 2});
    refused(fuselet_glu_fwd(&big, FUSELET_GLU_SILU, &gy), "x", needle, "glu_fwd: x" + s);
    fuselet_tensor w = view(m.d.data(), {4}), rstd = view(m.c.data(), {2});
    refused(fuselet_rms_norm_fwd(&big, &w, 1e-6f, 0, &ok, &rstd), "x", needle, "rms_norm_fwd: x" + s);
    refused(fuselet_rms_norm_fwd(&ok, &w, 1e-6f, 0, &big, &rstd), "y", needle, "rms_norm_fwd: y" + s);
    fuselet_tensor tgt = ints(m.target.data(), {2}), loss = view(m.c.data(), {2}), lse = view(m.c.data() + 8, {2});
    refused(fuselet_cross_entropy_fwd(&big, &tgt, &kCe, &loss, nullptr, &lse), "logits", needle,
            "cross_entropy_fwd: logits" + s);
    fuselet_tensor rx = view(m.a.data(), {2, 1, 4}, {stride, 4, 1}), ry = view(m.b.data(), {2, 1, 4});
    fuselet_tensor cs = view(m.d.data(), {2, 4}), cs_big = view(m.d.data(), {2, 4}, {stride, 1});
    refused(fuselet_rope_fwd(&rx, &cs, &cs, 0, &ry), "x", needle, "rope_fwd: x" + s);
    refused(fuselet_rope_fwd(&ry, &cs_big, &cs, 0, &rx), "cos", needle, "rope_fwd: cos" + s);
  }
  // A leading dim whose stride times size overflows while collapsing the rows.
  fuselet_tensor nested = view(m.a.data(), {4, 2, 4}, {8, k2_62, 1}), out = view(m.b.data(), {4, 2, 4});
  refused(fuselet_softmax_fwd(&nested, 1.f, 0, &out), "x", needle, "softmax_fwd: x leading strides [8, 2^62, 1]");
}

// ---------------------------------------------------------------------------------------------
// Shapes whose number of elements overflows int64: [2^32, 2^32, H] wraps to 0 rows, [3, 2^62, H]
// to a negative count.

void numel_overflow() {
  Buffers m;
  const char* needle = "overflows int64";
  // Strides of [3, 2^62, 4]: 4 * 2^62 wraps to 0 in 64 bits.
  const std::vector<std::vector<int64_t>> shapes{{k2_32, k2_32, 4}, {3, k2_62, 4}};
  const std::vector<std::vector<int64_t>> strides{{4 * k2_32, 4, 1}, {0, 4, 1}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string s = i == 0 ? " [2^32, 2^32, 4]" : " [3, 2^62, 4]";
    fuselet_tensor big = raw(m.a.data(), shapes[i], strides[i]), big2 = raw(m.b.data(), shapes[i], strides[i]);
    refused(fuselet_softmax_fwd(&big, 1.f, 0, &big2), "x", needle, "softmax_fwd: x" + s);
    std::vector<int64_t> half = shapes[i];
    half[2] = 2;
    fuselet_tensor gy = raw(m.b.data(), half, {0, 2, 1});
    refused(fuselet_glu_fwd(&big, FUSELET_GLU_SILU, &gy), "x", needle, "glu_fwd: x" + s);
    fuselet_tensor w = view(m.d.data(), {4}), rstd = view(m.c.data(), {0});
    refused(fuselet_rms_norm_fwd(&big, &w, 1e-6f, 0, &big2, &rstd), "x", needle, "rms_norm_fwd: x" + s);
    fuselet_tensor tgt = ints(m.target.data(), {0}), loss = view(m.c.data(), {0});
    refused(fuselet_cross_entropy_fwd(&big, &tgt, &kCe, &loss, nullptr, &loss), "logits", needle,
            "cross_entropy_fwd: logits" + s);
    std::vector<int64_t> rshape = shapes[i], rstrides = strides[i];
    rshape.insert(rshape.begin() + 2, 1);
    rstrides.insert(rstrides.begin() + 2, 4);
    fuselet_tensor rx = raw(m.a.data(), rshape, rstrides), ry = raw(m.b.data(), rshape, rstrides);
    fuselet_tensor cs = view(m.d.data(), {shapes[i][1], 4}, {4, 1});
    refused(fuselet_rope_fwd(&rx, &cs, &cs, 0, &ry), "x", needle, "rope_fwd: x" + s);
  }
  // An empty view whose leading dims alone overflow: the row count must not wrap either.
  fuselet_tensor empty = raw(m.a.data(), {k2_32, k2_32, 0}, {0, 0, 1});
  fuselet_tensor empty2 = raw(m.b.data(), {k2_32, k2_32, 0}, {0, 0, 1});
  fuselet_tensor w = view(m.d.data(), {0}), rstd = view(m.c.data(), {0});
  refused(fuselet_glu_fwd(&empty, FUSELET_GLU_SILU, &empty2), "x", needle, "glu_fwd: x [2^32, 2^32, 0]");
  refused(fuselet_rms_norm_fwd(&empty, &w, 1e-6f, 0, &empty2, &rstd), "x", needle, "rms_norm_fwd: x [2^32, 2^32, 0]");
}

// ---------------------------------------------------------------------------------------------
// A last dimension of 2^61: its float32 bytes overflow int64 (refused with the view); in
// bfloat16 the view fits but the float32 scratch of a row does not (refused, not thrown).

void huge_last_dim() {
  Buffers m;
  for (fuselet_dtype dt : {kF32, kBF16}) {
    const std::string s = dt == kF32 ? " float32" : " bfloat16";
    const char* needle = dt == kF32 ? "overflow" : "scratch";
    fuselet_tensor x = view(m.a.data(), {1, k2_61}, {}, dt), y = view(m.b.data(), {1, k2_61}, {}, dt);
    refused(fuselet_softmax_fwd(&x, 1.f, 0, &y), "x", needle, "softmax_fwd: [1, 2^61]" + s);
    refused(fuselet_softmax_bwd(&x, &y, 1.f, &x), "y", needle, "softmax_bwd: [1, 2^61]" + s);
    fuselet_tensor gy = view(m.b.data(), {1, k2_61 / 2}, {}, dt);
    refused(fuselet_glu_fwd(&x, FUSELET_GLU_SILU, &gy), "x", needle, "glu_fwd: [1, 2^61]" + s);
    refused(fuselet_glu_bwd(&gy, &x, FUSELET_GLU_SILU, &y), "x", needle, "glu_bwd: [1, 2^61]" + s);
    fuselet_tensor w = view(m.d.data(), {k2_61}, {}, dt), rstd = view(m.c.data(), {1});
    refused(fuselet_rms_norm_fwd(&x, &w, 1e-6f, 0, &y, &rstd), "x", dt == kF32 ? "overflow" : "hidden size",
            "rms_norm_fwd: [1, 2^61]" + s);
    fuselet_tensor tgt = ints(m.target.data(), {1}), loss = view(m.c.data(), {1}), lse = view(m.c.data() + 8, {1});
    refused(fuselet_cross_entropy_fwd(&x, &tgt, &kCe, &loss, nullptr, &lse), "logits", needle,
            "cross_entropy_fwd: [1, 2^61]" + s);
    fuselet_tensor rx = view(m.a.data(), {1, 1, k2_61}, {}, dt), ry = view(m.b.data(), {1, 1, k2_61}, {}, dt);
    fuselet_tensor cs = view(m.d.data(), {1, k2_61}, {}, dt);
    refused(fuselet_rope_fwd(&rx, &cs, &cs, 0, &ry), dt == kF32 ? "x" : "cos", needle, "rope_fwd: [1, 1, 2^61]" + s);
  }
}

// ---------------------------------------------------------------------------------------------
// Thread counts.

constexpr int kBound = 1024;

// rms_norm forward of a fixed 512 x 384 problem (enough rows for several tasks); the outputs.
bool rms_norm(std::vector<float>* y) {
  static std::vector<float> x = [] {
    std::vector<float> v(512 * 384);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % 101) / 50.f - 1.f;
    return v;
  }();
  std::vector<float> w(384, 1.f), rstd(512);
  y->assign(512 * 384 + 512, 0.f);
  fuselet_tensor tx = view(x.data(), {512, 384}), tw = view(w.data(), {384}), ty = view(y->data(), {512, 384});
  fuselet_tensor tr = view(y->data() + 512 * 384, {512});
  return fuselet_rms_norm_fwd(&tx, &tw, 1e-6f, 0, &ty, &tr) == FUSELET_OK;
}

void thread_bound() {
  const int before = fuselet_get_num_threads();
  for (int n : {INT_MAX, kBound + 1}) {
    const std::string s = std::to_string(n);
    refused(fuselet_set_num_threads(n), "n", ("got " + s).c_str(), "set_num_threads(" + s + ")");
    expect(std::strstr(fuselet_last_error(), "1024") != nullptr, "set_num_threads(" + s + "): names the bound");
    expect(fuselet_get_num_threads() == before, "set_num_threads(" + s + ") leaves the thread count as it was");
  }
  expect(fuselet_set_num_threads(kBound) == FUSELET_OK && fuselet_get_num_threads() == kBound,
         "set_num_threads(1024) is accepted");
  expect(fuselet_set_num_threads(2) == FUSELET_OK, "set_num_threads(2)");
  std::vector<float> y;
  expect(rms_norm(&y), "a kernel after the refused thread counts");
}

// A status code of no enumerator (a C caller's int) is named, not read as the C++ enum: under
// UBSan that load is an error.
void status_codes() {
  const int codes[] = {-1, 5, 65536, INT_MAX};
  for (int code : codes) {
    fuselet_status status;
    std::memcpy(&status, &code, sizeof status);
    expect(std::strcmp(fuselet_status_string(status), "unknown status") == 0,
           "status_string(" + std::to_string(code) + ") is \"unknown status\"");
  }
  expect(std::strcmp(fuselet_status_string(FUSELET_ERR_INTERNAL), "internal error") == 0, "status_string(INTERNAL)");
}

// In a child (the variable is read once per process, on the first use of the thread count):
// FUSELET_NUM_THREADS=`value` gives `want` threads, and a kernel on them computes what it
// computes on one thread. The child's exit code says what went wrong.
void env_case(const char* value, int want) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(120);  // a hang fails the case instead of the whole run
    setenv("FUSELET_NUM_THREADS", value, 1);
    if (fuselet_get_num_threads() != want) _exit(2);
    std::vector<float> y, ref;
    if (!rms_norm(&y)) _exit(3);
    if (fuselet_set_num_threads(1) != FUSELET_OK || !rms_norm(&ref)) _exit(4);
    _exit(y == ref ? 0 : 5);
  }
  int status = 0;
  expect(pid > 0 && waitpid(pid, &status, 0) == pid, "fork + waitpid");
  const std::string what = std::string("FUSELET_NUM_THREADS=") + value + ": " + std::to_string(want) +
                           " threads and the result of one thread (child " +
                           (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                              : "signal " + std::to_string(WTERMSIG(status))) +
                           ")";
  expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, what);
}

// Nothing here may read the thread count before the children do.
void env_threads() {
  env_case("2147483647", kBound);
  env_case("99999999999999999999", kBound);  // past the range of long
  env_case("3", 3);
}

#ifndef FUSELET_TEST_NO_HOOK
// Interposes pthread_create (the test executable exports it, so libstdc++'s std::thread calls
// this one): with g_allow >= 0, that many more threads start, then each start fails (EAGAIN).
std::atomic<int> g_allow{-1}, g_refused{0};
#endif

void pool_failure() {
#ifdef FUSELET_TEST_NO_HOOK
  std::printf("skipped: needs to interpose pthread_create, which the sanitizers do\n");
  expect(true, "skipped under a sanitizer");
#else
  std::vector<float> ref, y;
  expect(fuselet_set_num_threads(1) == FUSELET_OK && rms_norm(&ref), "the reference on one thread");
  expect(fuselet_set_num_threads(2) == FUSELET_OK && rms_norm(&y) && y == ref, "2 threads: a pool of 1 worker");

  // Growing to 4 threads: the 2nd of 3 new workers fails to start; the kernel still succeeds.
  g_allow = 1;
  expect(fuselet_set_num_threads(4) == FUSELET_OK && rms_norm(&y) && y == ref,
         "4 threads, a worker fails to start: the kernel succeeds with the same result");
  expect(g_refused.load() > 0, "the thread start was refused (the hook is in place)");
  expect(rms_norm(&y) && y == ref, "again, while threads still fail to start");
  g_allow = -1;
  expect(fuselet_set_num_threads(3) == FUSELET_OK && rms_norm(&y) && y == ref, "3 threads once threads start again");

  // No pool at all (a fresh child) and no thread starts: the kernel runs on the caller.
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(120);
    g_allow = 0;
    const int before = g_refused.load();
    std::vector<float> z;
    const bool ok = fuselet_set_num_threads(4) == FUSELET_OK && rms_norm(&z) && z == ref;
    _exit(ok && g_refused.load() > before ? 0 : 1);
  }
  int status = 0;
  expect(pid > 0 && waitpid(pid, &status, 0) == pid, "fork + waitpid");
  expect(
      WIFEXITED(status) && WEXITSTATUS(status) == 0,
      "no pool and no thread starts: the kernel succeeds on the caller (child status " + std::to_string(status) + ")");
#endif
}

}  // namespace

#ifndef FUSELET_TEST_NO_HOOK
extern "C" __attribute__((visibility("default"))) int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                                                     void* (*fn)(void*), void* arg) {
  using Real = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_create"));
  for (int n = g_allow.load(); n >= 0; n = g_allow.load()) {
    if (n == 0) {
      ++g_refused;
      return EAGAIN;
    }
    if (g_allow.compare_exchange_weak(n, n - 1)) break;
  }
  return real(thread, attr, fn, arg);
}
#endif

int main(int argc, char** argv) {
  const std::string group = argc > 1 ? argv[1] : "";
  if (group == "negative_strides")
    negative_strides();
  else if (group == "stride_overflow")
    stride_overflow();
  else if (group == "numel_overflow")
    numel_overflow();
  else if (group == "huge_last_dim")
    huge_last_dim();
  else if (group == "thread_bound")
    thread_bound();
  else if (group == "env_threads")
    env_threads();
  else if (group == "pool_failure")
    pool_failure();
  else if (group == "status_codes")
    status_codes();
  else {
    std::printf(
        "usage: test_c_abi negative_strides|stride_overflow|numel_overflow|huge_last_dim|thread_bound|"
        "env_threads|pool_failure|status_codes\n");
    return 2;
  }
  return fuselet_test::report();
}
