// C++ test of fuselet's thread pool under load: many threads calling into fuselet at once
// while another resizes the pool, then fork() after use. Every result must equal the one a
// single caller gets (the row kernels are deterministic). Built plain by ctest and under
// ThreadSanitizer by scripts/sanitize.sh. Prints "N passed, N failed".
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "expect.h"
#include "fuselet/norm.h"

namespace {

using fuselet_test::expect;

constexpr int64_t kRows = 512, kHidden = 384;

fuselet_tensor view(void* data, int64_t rows, int64_t hidden) {
  fuselet_tensor t{};
  t.data = data;
  t.dtype = FUSELET_FLOAT32;
  t.ndim = hidden > 0 ? 2 : 1;
  t.shape[0] = rows;
  t.strides[0] = hidden > 0 ? hidden : 1;
  if (hidden > 0) {
    t.shape[1] = hidden;
    t.strides[1] = 1;
  }
  return t;
}

// rms_norm forward of `x` into y / rstd; true when fuselet returned FUSELET_OK.
bool rms_norm(std::vector<float>& x, std::vector<float>& w, std::vector<float>& y, std::vector<float>& rstd) {
  fuselet_tensor tx = view(x.data(), kRows, kHidden), tw = view(w.data(), kHidden, 0);
  fuselet_tensor ty = view(y.data(), kRows, kHidden), tr = view(rstd.data(), kRows, 0);
  return fuselet_rms_norm_fwd(&tx, &tw, 1e-6f, 0, &ty, &tr) == FUSELET_OK;
}

struct Case {
  std::vector<float> x, w, y, rstd;
};

Case make_case(unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  Case c{std::vector<float>(kRows * kHidden), std::vector<float>(kHidden), std::vector<float>(kRows * kHidden),
         std::vector<float>(kRows)};
  for (auto& v : c.x) v = n(rng);
  for (auto& v : c.w) v = 1.f + 0.1f * n(rng);
  return c;
}

}  // namespace

int main() {
  constexpr int kCallers = 6, kIters = 20;
  std::vector<Case> want;
  for (int t = 0; t < kCallers; ++t) {
    want.push_back(make_case(1234u + t));
    expect(rms_norm(want[t].x, want[t].w, want[t].y, want[t].rstd), "single caller: rms_norm_fwd");
  }

  // Callers run at once while one thread resizes the pool between 1 and 4 threads.
  std::atomic<bool> stop{false};
  std::atomic<int> resizes{0}, refused{0};
  std::thread resizer([&] {
    for (int i = 0; !stop.load(); ++i) {
      (fuselet_set_num_threads(1 + i % 4) == FUSELET_OK ? resizes : refused)++;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      Case c = make_case(1234u + t);
      for (int i = 0; i < kIters; ++i) {
        std::fill(c.y.begin(), c.y.end(), 0.f);
        bool ok = rms_norm(c.x, c.w, c.y, c.rstd);
        bool same = ok && std::memcmp(c.y.data(), want[t].y.data(), c.y.size() * sizeof(float)) == 0 &&
                    std::memcmp(c.rstd.data(), want[t].rstd.data(), c.rstd.size() * sizeof(float)) == 0;
        expect(same, "caller " + std::to_string(t) + " iteration " + std::to_string(i) +
                         ": the result of a single caller, bit for bit");
      }
    });
  }
  for (auto& th : callers) th.join();
  stop.store(true);
  resizer.join();
  expect(resizes.load() > 0 && refused.load() == 0, "the pool was resized while the callers ran");

#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer cannot follow a multi-threaded process into fork() (it stops the child);
  // the plain and AddressSanitizer builds run the part below.
  return fuselet_test::report(" (fork part left to the builds without ThreadSanitizer)");
#endif

  // fork() after the pool ran: the child has no workers and must build its own.
  expect(fuselet_set_num_threads(3) == FUSELET_OK, "set_num_threads(3)");
  Case c = make_case(1234u);
  expect(rms_norm(c.x, c.w, c.y, c.rstd), "parent before fork");
  pid_t pid = fork();
  if (pid == 0) {
    Case d = make_case(1234u);
    bool ok =
        rms_norm(d.x, d.w, d.y, d.rstd) && std::memcmp(d.y.data(), want[0].y.data(), d.y.size() * sizeof(float)) == 0;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  expect(pid > 0 && waitpid(pid, &status, 0) == pid, "fork + waitpid");
  expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child computes the same result");

  return fuselet_test::report();
}
