// fuselet's CUDA emulator: the scheduler. Every CUDA thread of a block is a fiber (a stack of
// its own and a saved stack pointer); the blocks of a grid run one after another on the thread
// that launched it. A fiber runs until it reaches __syncthreads or a warp collective, or returns;
// the scheduler then runs the next ready fiber of the block, in the order FUSELET_EMU_ORDER
// sets: forward (threadIdx order), reverse, or random[:SEED] (a new permutation of the threads at
// every round, and of the blocks of each grid). A block in which no thread can move while some
// have not returned is stuck (a barrier not every thread reaches): the launch fails.
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cxxabi.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "fuselet_emu/simt.h"
#include "state.h"

#if defined(__SANITIZE_ADDRESS__)
#define FUSELET_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUSELET_EMU_ASAN 1
#endif
#endif
#if defined(FUSELET_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__x86_64__)
// ---- context switches ----------------------------------------------------------------------------
// switch_stack(save, to): pushes the callee-saved registers (System V) on the current stack,
// stores its pointer in *save, and resumes the stack `to` (saved by this function, or made by
// new_context) where it left off. The SSE / x87 control words are left alone: no kernel
// changes them, so every fiber runs under the launching thread's.
extern "C" void fuselet_emu_switch_stack(void** save, void* to);
asm(R"(
  .text
  .p2align 4
  .globl fuselet_emu_switch_stack
  .hidden fuselet_emu_switch_stack
  .type fuselet_emu_switch_stack, @function
fuselet_emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size fuselet_emu_switch_stack, .-fuselet_emu_switch_stack
)");

#endif

namespace fuselet_emu {

Thread* g_thread = nullptr;
uint3 g_block_idx{0, 0, 0};
dim3 g_block_dim, g_grid_dim;

namespace {

// ---- context switches ----------------------------------------------------------------------------
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};

// A stack whose first switch enters `entry` (which must never return), as if called.
void new_context(Context* c, char* stack, size_t size, void (*entry)()) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  auto* p = reinterpret_cast<uint64_t*>(top);
  *--p = 0;                                  // alignment: entry starts with rsp = 8 (mod 16)
  *--p = reinterpret_cast<uint64_t>(entry);  // popped by ret
  for (int i = 0; i < 6; ++i) *--p = 0;      // rbp rbx r12 r13 r14 r15
  c->sp = p;
}

inline void switch_context(Context* from, Context* to) { fuselet_emu_switch_stack(&from->sp, to->sp); }
#else
struct Context {
  ucontext_t uc;
};

void new_context(Context* c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}

inline void switch_context(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

// ---- fibers and blocks --------------------------------------------------------------------------
#if defined(FUSELET_EMU_ASAN)
constexpr size_t kStackBytes = 512 * 1024;  // ASan's frames are larger
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif

enum class State { kReady, kBarrier, kWarp, kDone, kFailed };

struct Fiber {
  Context ctx;
  Thread thread;
  int stack = -1;  // the stack it runs on (StackPool), from its first run until it returns
  State state = State::kReady;
  uint64_t warp_ops = 0;      // warp collectives this thread has entered
  const char* site = nullptr;  // where it waits
  void* fake_stack = nullptr;  // ASan's
};

struct Warp {
  uint64_t slots[2][32];  // by the parity of the collective: op k + 1 never overwrites what op k reads
  uint32_t arrived = 0, mask = 0;
  uint64_t op = 0;
  const char* site = nullptr;
};

struct Block {
  int nthreads = 0, waiting = 0, exited = 0;
  std::vector<int> free_stacks;  // stacks no running thread holds: a thread that returns gives its back
  int returned = -1;             // a thread that returned, its stack given back once it has left it
  std::vector<int> seq;          // the threads in this round's order
  size_t pos = 0;                // the next of them to look at
  bool ran = false;              // whether a thread ran in this round
  const char* barrier_site = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::string error;  // the first error of the block
  size_t static_shared = 0, dynamic_bytes = 0;
};

// Stacks are made once, each with an inaccessible guard page below it, and reused: a thread
// takes one when it first runs and gives it back when it returns, so the threads of a kernel
// without barriers all run on one warm stack, one after another.
class StackPool {
 public:
  char* get(size_t i) {
    while (stacks_.size() <= i) {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) {
        std::fprintf(stderr, "fuselet-emu: error: no memory for the stack of thread %zu\n", stacks_.size());
        std::abort();
      }
      mprotect(m, page, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
      stacks_.push_back(static_cast<char*>(m) + page);
    }
    return stacks_[i];
  }

 private:
  std::vector<char*> stacks_;
};

std::mutex g_launch_mutex;  // one grid at a time: the emulated device runs launches in order
StackPool g_stacks;
Block* g_block = nullptr;
Fiber* g_fiber = nullptr;
Context g_scheduler;
uint64_t g_block_serial = 0;  // counts blocks, for SharedSlot::block
std::vector<unsigned char> g_dynamic;
void (*g_body)(void*) = nullptr;
void* g_body_ctx = nullptr;
std::string g_last_diagnostic;
uint64_t g_errors = 0;
#if defined(FUSELET_EMU_ASAN)
void* g_scheduler_fake_stack = nullptr;
const void* g_scheduler_stack = nullptr;
size_t g_scheduler_stack_size = 0;
#endif

// "thread (x,y,z) of block (x,y,z)", without the heap: the messages of fail_here are built in
// frames that never return.
struct Name {
  char s[96];
};
Name thread_name(const Fiber& f) {
  Name n;
  std::snprintf(n.s, sizeof n.s, "thread (%u,%u,%u) of block (%u,%u,%u)", f.thread.tid.x, f.thread.tid.y,
                f.thread.tid.z, g_block_idx.x, g_block_idx.y, g_block_idx.z);
  return n;
}

void fiber_main();

// The top of stack `i` for its threads: staggered by a few cache lines, as stacks a
// power-of-two-ish distance apart would all map to the same cache sets and every switch miss.
char* stack_top(int i) { return g_stacks.get(static_cast<size_t>(i)) + kStackBytes - (i % 61) * 64 - 8192; }

// The thread that returned last has left its stack: it goes back to the free ones. Under ASan,
// the frames it left there (it never returned from them) are unpoisoned first: the next
// thread's frames overlap them.
void release_returned(Block& b) {
  if (b.returned < 0) return;
  Fiber& f = b.fibers[static_cast<size_t>(b.returned)];
#if defined(FUSELET_EMU_ASAN)
#if defined(__x86_64__)
  char* low = static_cast<char*>(f.ctx.sp) - 512;  // its last frame and the red zone below it
#else
  char* low = g_stacks.get(static_cast<size_t>(f.stack));
#endif
  ASAN_UNPOISON_MEMORY_REGION(low, static_cast<size_t>(stack_top(f.stack) - low));
#endif
  b.free_stacks.push_back(f.stack);
  b.returned = -1;
}

// The stack the scheduler runs on (the launching thread's), for ASan's fiber switches.
#if defined(FUSELET_EMU_ASAN)
void scheduler_stack_bounds() {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* addr = nullptr;
    size_t size = 0;
    pthread_attr_getstack(&attr, &addr, &size);
    g_scheduler_stack = addr;
    g_scheduler_stack_size = size;
    pthread_attr_destroy(&attr);
  }
}
#endif

// The next thread of this round that is ready to run, its stack set up at its first run (a
// stack no running thread holds: a warm one, as a rule); null at the round's end.
Fiber* next_ready(Block& b) {
  while (b.pos < b.seq.size()) {
    Fiber* f = &b.fibers[static_cast<size_t>(b.seq[b.pos++])];
    if (f->state != State::kReady) continue;
    b.ran = true;
    if (f->stack < 0) {
      f->stack = b.free_stacks.back();
      b.free_stacks.pop_back();
      char* base = g_stacks.get(static_cast<size_t>(f->stack));
      new_context(&f->ctx, base, static_cast<size_t>(stack_top(f->stack) - base), fiber_main);
    }
    return f;
  }
  return nullptr;
}

// The running thread stops here (`finished`: for good) and the next ready thread of the round
// runs: a direct switch, or one back to the scheduler when the round is over (or the block
// failed), which starts the next round.
void yield(bool finished = false) {
  Fiber* f = g_fiber;
  Block& b = *g_block;
  Fiber* next = b.error.empty() ? next_ready(b) : nullptr;
  Context* to = &g_scheduler;
  if (next != nullptr) {
    g_fiber = next;
    g_thread = &next->thread;
    to = &next->ctx;
  }
#if defined(FUSELET_EMU_ASAN)
  if (next != nullptr)
    __sanitizer_start_switch_fiber(finished ? nullptr : &f->fake_stack, g_stacks.get(static_cast<size_t>(next->stack)),
                                   kStackBytes);
  else
    __sanitizer_start_switch_fiber(finished ? nullptr : &f->fake_stack, g_scheduler_stack, g_scheduler_stack_size);
#else
  (void)finished;
#endif
  switch_context(&f->ctx, to);
#if defined(FUSELET_EMU_ASAN)
  __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#endif
  release_returned(*g_block);
}

// One round of the block, from the scheduler: its ready threads in the round's order.
void run_round(Block& b) {
  b.pos = 0;
  b.ran = false;
  Fiber* f = next_ready(b);
  if (f == nullptr) return;
  g_fiber = f;
  g_thread = &f->thread;
#if defined(FUSELET_EMU_ASAN)
  __sanitizer_start_switch_fiber(&g_scheduler_fake_stack, g_stacks.get(static_cast<size_t>(f->stack)), kStackBytes);
#endif
  switch_context(&g_scheduler, &f->ctx);
#if defined(FUSELET_EMU_ASAN)
  __sanitizer_finish_switch_fiber(g_scheduler_fake_stack, nullptr, nullptr);
#endif
  release_returned(b);
}

// Records the block's first error; the running fiber stops for good.
[[noreturn]] __attribute__((format(printf, 1, 2))) void fail_here(const char* fmt, ...) {
  char msg[1024];  // on this frame's stack: the thread never returns from here to free anything
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, args);
  va_end(args);
  if (g_block->error.empty()) g_block->error = msg;
  g_fiber->state = State::kFailed;
  for (;;) yield(true);
}

void fiber_main() {
#if defined(FUSELET_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  release_returned(*g_block);
  g_body(g_body_ctx);
  Fiber& f = *g_fiber;
  Block& b = *g_block;
  if (b.waiting > 0)
    fail_here("%s returned while %d threads wait at the __syncthreads of %s", thread_name(f).s, b.waiting,
              b.barrier_site);
  const Warp& w = b.warps[static_cast<size_t>(f.thread.warp)];
  if (w.arrived != 0 && (w.mask >> f.thread.lane & 1u))
    fail_here("%s returned while lanes of its warp wait for it at the warp collective of %s", thread_name(f).s,
              w.site);
  f.state = State::kDone;
  ++b.exited;
  b.returned = f.thread.linear;  // its stack is free once it has switched away from it
  for (;;) yield(true);
}

// FUSELET_EMU_LAUNCHES=FILE: at exit, one line per kernel launched, appended to FILE:
// "THREADS DYNAMIC_SMEM LAUNCHES NAME", the most threads and dynamic shared memory of its
// launches (scripts/cuda_resources.py holds them against what nvcc compiled each kernel to).
struct LaunchStats {
  unsigned threads = 0;
  size_t smem = 0;
  uint64_t count = 0;
};
std::map<std::string, LaunchStats> g_launches;

void write_launches() {
  const char* path = std::getenv("FUSELET_EMU_LAUNCHES");
  if (path == nullptr || *path == '\0' || g_launches.empty()) return;
  std::string text;
  for (const auto& [name, st] : g_launches)
    text += std::to_string(st.threads) + " " + std::to_string(st.smem) + " " + std::to_string(st.count) + " " + name +
            "\n";
  // Test processes run in parallel (ctest -j) and append to one file: each writes its lines under
  // an exclusive lock (a stdio stream would split a record of more than its buffer into several
  // writes, which interleave with another process's).
  const int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX) == 0) {
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
}

void record_launch(const char* name, unsigned threads, size_t smem) {
  if (g_launches.empty()) std::atexit(write_launches);
  LaunchStats& st = g_launches[name];
  st.threads = std::max(st.threads, threads);
  st.smem = std::max(st.smem, smem);
  ++st.count;
}

struct Order {
  enum Kind { kForward, kReverse, kRandom } kind = kForward;
  uint64_t seed = 0;
};

Order order_from_env() {
  Order o;
  const char* s = std::getenv("FUSELET_EMU_ORDER");
  if (s == nullptr || *s == '\0' || std::strcmp(s, "forward") == 0) return o;
  if (std::strcmp(s, "reverse") == 0) {
    o.kind = Order::kReverse;
    return o;
  }
  if (std::strncmp(s, "random", 6) == 0 && (s[6] == '\0' || s[6] == ':')) {
    o.kind = Order::kRandom;
    o.seed = s[6] == ':' ? std::strtoull(s + 7, nullptr, 10) : 1;
    return o;
  }
  std::fprintf(stderr, "fuselet-emu: error: FUSELET_EMU_ORDER must be forward, reverse or random[:SEED]; got '%s'\n",
               s);
  std::exit(2);
}

// Runs one block to its end; false (with b.error set) when it failed or got stuck.
bool run_block(Block& b, dim3 block, const Order& order, std::mt19937_64& rng) {
  const int n = b.nthreads;
  b.fibers.assign(static_cast<size_t>(n), Fiber{});
  b.warps.assign(static_cast<size_t>((n + 31) / 32), Warp{});
  b.seq.resize(static_cast<size_t>(n));
  b.free_stacks.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) b.free_stacks[static_cast<size_t>(i)] = n - 1 - i;  // stack 0 first
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[static_cast<size_t>(i)];
    f.thread.linear = i;
    f.thread.lane = i % 32;
    f.thread.warp = i / 32;
    f.thread.tid = make_uint3(static_cast<unsigned>(i) % block.x, (static_cast<unsigned>(i) / block.x) % block.y,
                              static_cast<unsigned>(i) / (block.x * block.y));
    b.seq[static_cast<size_t>(i)] = order.kind == Order::kReverse ? n - 1 - i : i;
  }
  ++g_block_serial;
  std::fill(g_dynamic.begin(), g_dynamic.end(), static_cast<unsigned char>(0xFF));
  for (;;) {
    if (order.kind == Order::kRandom) std::shuffle(b.seq.begin(), b.seq.end(), rng);
    run_round(b);
    if (!b.error.empty()) return false;
    if (b.exited == n) return true;
    if (!b.ran) {
      int at_barrier = 0, at_warp = 0;
      std::string where;
      for (const Fiber& f : b.fibers) {
        if (f.state == State::kBarrier) ++at_barrier;
        if (f.state == State::kWarp) {
          ++at_warp;
          if (where.empty()) where = std::string(" (the first at ") + f.site + ")";
        }
      }
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "stuck: no thread can go on: %d returned, %d wait at __syncthreads%s%s, %d at a warp collective%s",
                    b.exited, at_barrier, b.barrier_site ? " of " : "", b.barrier_site ? b.barrier_site : "", at_warp,
                    where.c_str());
      b.error = buf;
      return false;
    }
  }
}

bool config_ok(const char* name, dim3 grid, dim3 block, size_t smem, const void* kernel) {
  char buf[512];
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > uint64_t(kMaxThreadsPerBlock) || block.x > 1024 || block.y > 1024 ||
      block.z > unsigned(kMaxBlockDimZ)) {
    std::snprintf(buf, sizeof buf, "%s: invalid launch configuration: block (%u,%u,%u) (at most %d threads, z <= %d)",
                  name, block.x, block.y, block.z, kMaxThreadsPerBlock, kMaxBlockDimZ);
    set_error(cudaErrorInvalidConfiguration, buf, true);
    return false;
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > kMaxGridDimX || grid.y > kMaxGridDimYZ ||
      grid.z > kMaxGridDimYZ) {
    std::snprintf(buf, sizeof buf, "%s: invalid launch configuration: grid (%u,%u,%u)", name, grid.x, grid.y, grid.z);
    set_error(cudaErrorInvalidConfiguration, buf, true);
    return false;
  }
  const size_t limit = dynamic_shared_limit(kernel);
  if (smem > limit) {
    std::snprintf(buf, sizeof buf,
                  "%s: %zu bytes of dynamic shared memory, above the kernel's limit of %zu "
                  "(cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) raises it)",
                  name, smem, limit);
    set_error(cudaErrorInvalidValue, buf, true);
    return false;
  }
  return true;
}

}  // namespace

// ---- the device side -------------------------------------------------------------------------------
void syncthreads(const char* site) {
  Block& b = *g_block;
  Fiber& f = *g_fiber;
  if (b.exited > 0)
    fail_here("__syncthreads at %s: %d threads of the block returned before reaching it (%s waits)", site, b.exited,
              thread_name(f).s);
  if (b.waiting > 0 && b.barrier_site != site && std::strcmp(b.barrier_site, site) != 0)
    fail_here("threads of a block wait at different __syncthreads: %s and %s (%s)", b.barrier_site, site,
              thread_name(f).s);
  b.barrier_site = site;
  f.state = State::kBarrier;
  f.site = site;
  if (++b.waiting == b.nthreads) {
    for (Fiber& g : b.fibers)
      if (g.state == State::kBarrier) g.state = State::kReady;
    b.waiting = 0;
    b.barrier_site = nullptr;
  }
  yield();
}

const uint64_t* warp_exchange(uint32_t mask, uint64_t value, const char* site) {
  Block& b = *g_block;
  Fiber& f = *g_fiber;
  Warp& w = b.warps[static_cast<size_t>(f.thread.warp)];
  const int first = f.thread.warp * 32;
  const int present_lanes = std::min(32, b.nthreads - first);
  const uint32_t present = present_lanes == 32 ? 0xffffffffu : (1u << present_lanes) - 1u;
  char buf[512];
  if (!(mask >> f.thread.lane & 1u)) {
    std::snprintf(buf, sizeof buf,
                  "warp collective at %s: lane %d calls it with mask 0x%08x, which leaves it out (%s)", site,
                  f.thread.lane, mask, thread_name(f).s);
    fail_here("%s", buf);
  }
  if (mask & ~present) {
    std::snprintf(buf, sizeof buf,
                  "warp collective at %s: mask 0x%08x names lanes the warp does not have (lanes present: 0x%08x; %s)",
                  site, mask, present, thread_name(f).s);
    fail_here("%s", buf);
  }
  const uint64_t op = ++f.warp_ops;
  if (w.arrived == 0) {
    w.mask = mask;
    w.op = op;
    w.site = site;
  } else if (w.mask != mask || w.op != op || (w.site != site && std::strcmp(w.site, site) != 0)) {
    std::snprintf(buf, sizeof buf,
                  "lanes of warp %d met at different warp collectives: %s (mask 0x%08x, its collective %" PRIu64
                  ") and %s (mask 0x%08x, its collective %" PRIu64 ")",
                  f.thread.warp, w.site, w.mask, w.op, site, mask, op);
    fail_here("%s", buf);
  }
  w.slots[op & 1][f.thread.lane] = value;
  w.arrived |= 1u << f.thread.lane;
  f.state = State::kWarp;
  f.site = site;
  if (w.arrived == mask) {
    for (int l = 0; l < 32; ++l)
      if (mask >> l & 1u) b.fibers[static_cast<size_t>(first + l)].state = State::kReady;
    w.arrived = 0;
  }
  yield();
  return w.slots[op & 1];
}

void thread_error(const char* site, const char* what) { fail_here("%s: %s", site, what); }

void* shared_storage(SharedSlot* slot) {
  if (slot->block != g_block_serial) {  // the block's first use of this declaration
    if (slot->data == nullptr) slot->data = new (std::align_val_t(slot->align)) unsigned char[slot->bytes];
    std::memset(slot->data, 0xFF, slot->bytes);
    slot->block = g_block_serial;
    g_block->static_shared += slot->bytes;
    if (g_block->static_shared > kStaticSharedLimit)
      fail_here("static shared memory of %zu bytes, above CUDA's %zu", g_block->static_shared, kStaticSharedLimit);
    if (g_block->static_shared + g_block->dynamic_bytes > kOptinShared)
      fail_here("static (%zu bytes) and dynamic (%zu bytes) shared memory above the block's %zu",
                g_block->static_shared, g_block->dynamic_bytes, kOptinShared);
  }
  return slot->data;
}

void* dynamic_shared_storage() {
  if (g_block->dynamic_bytes == 0) return nullptr;
  return g_dynamic.data();
}

void run_grid(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t,
              void (*body)(void*), void* ctx) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  if (!config_ok(name, grid, block, dynamic_smem, kernel)) return;
  record_launch(name, block.x * block.y * block.z, dynamic_smem);
  const Order order = order_from_env();
  std::mt19937_64 rng(order.seed);
#if defined(FUSELET_EMU_ASAN)
  scheduler_stack_bounds();
#endif
  g_body = body;
  g_body_ctx = ctx;
  g_grid_dim = grid;
  g_block_dim = block;
  std::vector<unsigned char>().swap(g_dynamic);  // exactly the launch's size: ASan sees a read past it
  g_dynamic.resize(dynamic_smem);
  const uint64_t nblocks = uint64_t(grid.x) * grid.y * grid.z;
  std::vector<uint64_t> blocks;
  if (order.kind == Order::kRandom) {
    blocks.resize(nblocks);
    for (uint64_t i = 0; i < nblocks; ++i) blocks[i] = i;
    std::shuffle(blocks.begin(), blocks.end(), rng);
  }
  for (uint64_t i = 0; i < nblocks; ++i) {
    const uint64_t k = order.kind == Order::kRandom ? blocks[i] : order.kind == Order::kReverse ? nblocks - 1 - i : i;
    g_block_idx = make_uint3(static_cast<unsigned>(k % grid.x), static_cast<unsigned>(k / grid.x % grid.y),
                             static_cast<unsigned>(k / (uint64_t(grid.x) * grid.y)));
    Block b;
    b.nthreads = static_cast<int>(block.x * block.y * block.z);
    b.dynamic_bytes = dynamic_smem;
    g_block = &b;
    const bool ok = run_block(b, block, order, rng);
#if defined(FUSELET_EMU_ASAN)
    if (!ok)  // threads left for good in the middle of their frames: their stacks, unpoisoned
      for (const Fiber& f : b.fibers)
        if (f.stack >= 0) ASAN_UNPOISON_MEMORY_REGION(g_stacks.get(static_cast<size_t>(f.stack)), kStackBytes);
#endif
    g_block = nullptr;
    g_fiber = nullptr;
    g_thread = nullptr;
    if (!ok) {
      char where[64];
      std::snprintf(where, sizeof where, " in block (%u,%u,%u)", g_block_idx.x, g_block_idx.y, g_block_idx.z);
      set_error(cudaErrorLaunchFailure, std::string(name) + where + ": " + b.error, true);
      return;  // the other blocks do not run: the launch failed, as a trapped kernel does
    }
  }
}

const char* kernel_name_of(const char* mangled_type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled_type, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled_type;
  std::free(demangled);
  // "std::integral_constant<void (*)(Args), &(void NAME(Args))>" (a function template's
  // instance) or "...&NAME>" (a plain function) -> NAME
  const size_t at = name.rfind(", &");
  if (at != std::string::npos && name.size() > at + 4 && name.back() == '>') {
    name = name.substr(at + 3, name.size() - at - 4);
    if (name.rfind("(void ", 0) == 0 && name.back() == ')') name = name.substr(6, name.size() - 7);
    if (!name.empty() && name.back() == ')') {  // drop "(Args)": back to its matching '('
      int depth = 0;
      for (size_t i = name.size(); i-- > 0;) {
        depth += name[i] == ')' ? 1 : name[i] == '(' ? -1 : 0;
        if (depth == 0) {
          name.resize(i);
          break;
        }
      }
    }
  }
  static std::mutex m;
  static std::vector<std::unique_ptr<std::string>> names;  // kept for the process's life
  std::lock_guard<std::mutex> lock(m);
  names.push_back(std::make_unique<std::string>(name));
  return names.back()->c_str();
}

int64_t grid_cap(int64_t dflt) {
  const char* s = std::getenv("FUSELET_EMU_MAX_GRID");
  if (s == nullptr || *s == '\0') return dflt;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (*end != '\0' || v <= 0) {
    std::fprintf(stderr, "fuselet-emu: error: FUSELET_EMU_MAX_GRID must be a positive count of blocks; got '%s'\n", s);
    std::exit(2);
  }
  return std::min<int64_t>(dflt, v);
}

const char* last_diagnostic() { return g_last_diagnostic.c_str(); }
uint64_t error_count() { return g_errors; }

void note_diagnostic(const std::string& message) {
  g_last_diagnostic = message;
  ++g_errors;
}

}  // namespace fuselet_emu
