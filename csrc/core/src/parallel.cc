// fuselet's own parallel-for: a persistent pool of std::threads, created on first use.
#include "parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "internal.h"

namespace fuselet {
namespace {

int default_threads() {
  if (const char* env = std::getenv("FUSELET_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
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
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
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

// After fork() the child has no workers: forget the parent's pool (its threads are gone).
void forget_pool_in_child() {
  g_pool = nullptr;
  new (&g_pool_mu) std::mutex();
  new (&g_run_mu) std::mutex();
}

Pool* pool_for(int threads) {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, forget_pool_in_child);
    return true;
  }();
  (void)registered;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (g_pool == nullptr || g_pool->workers() != threads - 1) {
    delete g_pool;
    g_pool = new Pool(threads - 1);
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
  Pool* pool = pool_for(fuselet_get_num_threads());
  pool->run(chunks, [&](int64_t c) {
    const int64_t begin = c * step;
    const int64_t end = std::min(n, begin + step);
    if (begin < end) fn(c, begin, end);
  });
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
  if (n < 1) return fuselet::fail(FUSELET_ERR_INVALID_ARGUMENT, "n: expected a number of threads >= 1, got %d", n);
  fuselet::g_num_threads.store(n);
  return fuselet::ok();
}

}  // extern "C"
