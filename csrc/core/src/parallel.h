// fuselet's own parallel-for over a small persistent pool of std::threads.
// No OpenMP: the core never brings a second OpenMP runtime next to the framework's.
#pragma once

#include <cstdint>
#include <functional>

namespace fuselet {

// Runs fn(chunk, begin, end) over [0, n) split into chunks of at least `grain` items, on the
// calling thread plus up to fuselet_get_num_threads() - 1 pool workers, and returns when
// every chunk is done. `chunk` numbers the chunks 0..min(parallel_chunks(n, grain),
// max_chunks)-1, so a caller can give each its own scratch: sized by an earlier
// parallel_chunks() and passed as max_chunks, as the thread count may change in between.
// Runs inline as one chunk 0 covering [0, n) when n is small, when called from inside a pool
// task, or when another thread is using the pool.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int64_t)>& fn,
                  int64_t max_chunks = INT64_MAX);

// Number of chunks parallel_for(n, grain, ...) would use (>= 1 for n > 0).
int64_t parallel_chunks(int64_t n, int64_t grain);

}  // namespace fuselet
