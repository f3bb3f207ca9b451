// fuselet's own parallel-for: a persistent pool of std::threads, created on first use.
#include "parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "internal.h"

namespace fuselet {
namespace {

// FUSELET_NUM_THREADS when set to a positive integer (above FUSELET_MAX_THREADS: clamped to
// it, with one warning on stderr), else the hardware threads (at most FUSELET_MAX_THREADS).
int default_threads() {
  if (const char* env = std::getenv("FUSELET_NUM_THREADS")) {
    char* end = nullptr;
    const long long n = std::strtoll(env, &end, 10);  // out of range: LLONG_MIN or LLONG_MAX
    if (end != env && n > FUSELET_MAX_THREADS) {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true))
        std::fprintf(stderr, "fuselet: FUSELET_NUM_THREADS=%s is above the bound of %d threads; using %d\n", env,
                     FUSELET_MAX_THREADS, FUSELET_MAX_THREADS);
      return FUSELET_MAX_THREADS;
    }
    if (end != env && n > 0) return static_cast<int>(n);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(std::min<unsigned>(hw, FUSELET_MAX_THREADS)) : 1;
}

std::atomic<int> g_num_threads{0};

// How long an idle worker spins for the next job (FUSELET_POOL_SPIN_US, microseconds: 20 by
// default, clamped to [0, 1000000]; 0 or a negative value: block at once).
int64_t spin_ns() {
  static const int64_t ns = [] {
    const char* env = std::getenv("FUSELET_POOL_SPIN_US");
    const long long us = env && *env ? std::atoll(env) : 20;
    return std::clamp<int64_t>(us, 0, 1000000) * 1000;
  }();
  return ns;
}
thread_local bool t_in_task = false;

class Pool {
 public:
  // Starts `workers` threads. If one fails to start (std::system_error), the ones started
  // are stopped and joined before the exception leaves: no worker outlives the pool it waits on.
  explicit Pool(int workers) {
    threads_.reserve(static_cast<size_t>(workers));
    try {
      for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  ~Pool() { stop(); }
  int workers() const { return static_cast<int>(threads_.size()); }

  // Runs `chunks` chunks of fn, workers and the caller claiming them from a shared counter.
  // Returns once every chunk ran and no worker still holds this job.
  void run(int64_t chunks, const std::function<void(int64_t)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      chunks_ = chunks;
      next_.store(0);
      pending_ = chunks;
      generation_.store(generation_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    cv_.notify_all();
    drain(fn, chunks);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0 && active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Waits up to spin_ns() for the next job before the worker blocks on cv_: waking a blocked
  // worker (futex wake, then the scheduler) took longer than a whole 1024x1024 float32 SwiGLU
  // on a 2-vCPU VM, so that the caller ran both chunks alone (1 thread 0.16 ms, 2 threads
  // 0.16 ms; torch.compile, whose OpenMP workers spin likewise, 0.09-0.13 ms). 20 us keeps
  // the workers of back-to-back calls awake; 100 us made fuselet calls interleaved with
  // torch's own OpenMP ops slower (both pools spinning over 2 vCPUs: 1.5-2.2 ms -> 2.1-2.6 ms
  // for SwiGLU, GELU, softmax), where 20 us measured no slower than not spinning.
  void spin_for_job(uint64_t seen) {
    const int64_t limit = spin_ns();
    if (limit <= 0) return;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; generation_.load(std::memory_order_acquire) == seen; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(limit)) return;
    }
  }
  void drain(const std::function<void(int64_t)>& fn, int64_t chunks) {
    int64_t done = 0;
    for (int64_t c; (c = next_.fetch_add(1)) < chunks;) {
      t_in_task = true;
      fn(c);
      t_in_task = false;
      ++done;
    }
    std::lock_guard<std::mutex> lock(mu_);
    pending_ -= done;
    if (pending_ == 0) done_cv_.notify_all();
  }
  void work() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)>* fn;
      int64_t chunks;
      spin_for_job(seen);
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (fn_ == nullptr) continue;
        fn = fn_;
        chunks = chunks_;
        ++active_;
      }
      drain(*fn, chunks);
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t chunks_ = 0;
  int64_t pending_ = 0;
  int active_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<uint64_t> generation_{0};  // written under mu_; read without it while spinning
  bool stop_ = false;
};

std::mutex g_pool_mu;    // guards g_pool creation/replacement
std::mutex g_run_mu;     // one parallel_for at a time uses the pool
Pool* g_pool = nullptr;  // leaked at exit on purpose: joining threads during exit can hang
int g_failed = 0;        // the thread count whose pool last failed to start (0: none)

// After fork() the child has no workers: forget the parent's pool (its threads are gone).
void forget_pool_in_child() {
  g_pool = nullptr;
  g_failed = 0;
  new (&g_pool_mu) std::mutex();
  new (&g_run_mu) std::mutex();
}

// The pool of `threads` threads (the caller and threads - 1 workers). When its workers cannot
// all start (a thread limit, no memory), the pool in use stays (or there is none: NULL, the
// caller runs every chunk), with one warning on stderr; a new pool is tried once the thread
// count changes.
Pool* pool_for(int threads) {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, forget_pool_in_child);
    return true;
  }();
  (void)registered;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if ((g_pool != nullptr && g_pool->workers() == threads - 1) || threads == g_failed) return g_pool;
  try {
    Pool* pool = new Pool(threads - 1);  // fully started before it replaces the old one
    delete g_pool;
    g_pool = pool;
    g_failed = 0;
  } catch (const std::exception& e) {
    g_failed = threads;
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr, "fuselet: could not start %d worker threads (%s); the CPU kernels use %d threads\n",
                   threads - 1, e.what(), g_pool ? g_pool->workers() + 1 : 1);
  }
  return g_pool;
}

}  // namespace

int64_t parallel_chunks(int64_t n, int64_t grain) {
  if (n <= 0) return 1;
  grain = std::max<int64_t>(grain, 1);
  int64_t by_grain = (n + grain - 1) / grain;
  return std::max<int64_t>(1, std::min<int64_t>(by_grain, fuselet_get_num_threads()));
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int64_t)>& fn,
                  int64_t max_chunks) {
  if (n <= 0) return;
  // At most max_chunks: the caller sized per-chunk scratch by an earlier parallel_chunks(),
  // and another thread may have raised the thread count since (fuselet_set_num_threads).
  const int64_t chunks = std::min(parallel_chunks(n, grain), std::max<int64_t>(max_chunks, 1));
  std::unique_lock<std::mutex> run_lock(g_run_mu, std::defer_lock);
  if (chunks == 1 || t_in_task || !run_lock.try_lock()) {
    fn(0, 0, n);
    return;
  }
  const int64_t step = (n + chunks - 1) / chunks;
  const auto chunk = [&](int64_t c) {
    const int64_t begin = c * step;
    const int64_t end = std::min(n, begin + step);
    if (begin < end) fn(c, begin, end);
  };
  if (Pool* pool = pool_for(fuselet_get_num_threads())) {
    pool->run(chunks, chunk);
  } else {
    for (int64_t c = 0; c < chunks; ++c) chunk(c);
  }
}

}  // namespace fuselet

extern "C" {

int fuselet_get_num_threads(void) {
  int n = fuselet::g_num_threads.load();
  if (n <= 0) {
    n = fuselet::default_threads();
    fuselet::g_num_threads.store(n);
  }
  return n;
}

fuselet_status fuselet_set_num_threads(int n) {
  if (n < 1 || n > FUSELET_MAX_THREADS)
    return fuselet::fail(FUSELET_ERR_INVALID_ARGUMENT,
                         "n: expected a number of threads in [1, %d] (FUSELET_MAX_THREADS), got %d",
                         FUSELET_MAX_THREADS, n);
  fuselet::g_num_threads.store(n);
  return fuselet::ok();
}

}  // extern "C"
