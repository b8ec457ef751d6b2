// gpt::parallel_for(begin, end, grain, f): at::parallel_for, on LibTorch's intra-op threads
// whichever compiler builds the plugin. f(chunk begin, chunk end) runs once per thread on
// consecutive chunks of [begin, end) (one call on the calling thread when there are at most
// `grain` iterations, one intra-op thread, or when already inside a parallel region); an
// exception from f is rethrown on the calling thread (the first one thrown).
//
// gpt::parallel_blocks(n, f): blocks 0 .. n-1 shared out as the threads ask for them. f(blocks)
// runs once on each of min(n, intra-op threads) threads (on the calling thread alone where
// parallel_for would) and takes block after block with blocks.next(i) until none is left, so a
// thread that runs slower than the other takes fewer blocks. On the 2-core machine, in two of
// four timed 60-step char-GPT runs, one of the two threads took 16% longer than the other over
// its halves of the Linear layers' products and 41% longer over its half of the attention's
// pairs, and with halves fixed in advance the other waited for it at the end of each region
// (docs/performance.md, "Blocks taken as the threads ask"). Which thread takes which block
// varies from run to run: what a block computes must depend on the block alone, never on the
// thread or on the blocks that thread took before, so that results are the same whichever
// thread takes it (and however many threads there are). Per-thread setup (scratch buffers,
// guards) goes in f before its loop.
//
// Why not at::parallel_for itself under clang: at::parallel_for is a header template whose
// `#pragma omp parallel` is compiled into the plugin. Debian's LibTorch runs its intra-op threads
// on GCC's OpenMP runtime, libgomp; GCC compiles the pragma to libgomp's GOMP_parallel. clang
// compiles it to LLVM's libomp, a second OpenMP runtime in the process: its threads are not
// LibTorch's, their number is libomp's own (OMP_NUM_THREADS or the cores, not what
// at::set_num_threads gave libgomp: a two-file test program), and in the sanitizer build (clang
// 14) LeakSanitizer's tracer crashed at the exit of each of tests/plugins/test_gpt.py's processes
// (gpt_probe and four keel trainings). Under clang (plugins/gpt/meson.build defines
// GPT_GOMP_PARALLEL) this header therefore calls GOMP_parallel as GCC's code does, with the body
// of at::internal::invoke_parallel (ATen/ParallelOpenMP.h, LibTorch 1.13). That assumes LibTorch's
// runtime is libgomp, as Debian's is.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

#include <algorithm>
#include <atomic>

#if GPT_GOMP_PARALLEL
#include <exception>

extern "C" {
// libgomp's ABI (what GCC emits for `#pragma omp parallel`): runs fn(data) on a team of
// threads, the number from the calling thread's ICV (at::set_num_threads) when num_threads is 0.
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
int omp_get_thread_num(void);
int omp_get_num_threads(void);
}
#endif

namespace gpt {

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#if GPT_GOMP_PARALLEL
  if (begin >= end) return;
  at::internal::lazy_init_num_threads();
  const int64_t n = end - begin;
  if (n <= grain || n <= 1 || at::in_parallel_region() || at::get_num_threads() <= 1) {
    at::internal::ThreadIdGuard tid_guard(0);
    f(begin, end);
    return;
  }
  struct Region {
    int64_t begin, end, grain;
    const F* f;
    std::atomic_flag failed = ATOMIC_FLAG_INIT;
    std::exception_ptr error{};
  } region{begin, end, grain, &f};
  GOMP_parallel(
      [](void* data) {
        Region& r = *static_cast<Region*>(data);
        int64_t threads = omp_get_num_threads();
        if (r.grain > 0) threads = std::min(threads, at::divup(r.end - r.begin, r.grain));
        const int64_t tid = omp_get_thread_num(), chunk = at::divup(r.end - r.begin, threads);
        const int64_t first = r.begin + tid * chunk;
        if (first >= r.end) return;
        try {
          at::internal::ThreadIdGuard tid_guard(static_cast<int>(tid));
          (*r.f)(first, std::min(r.end, first + chunk));
        } catch (...) {
          if (!r.failed.test_and_set()) r.error = std::current_exception();
        }
      },
      &region, 0, 0);
  if (region.error) std::rethrow_exception(region.error);
#else
  at::parallel_for(begin, end, grain, f);
#endif
}

// The blocks of one gpt::parallel_blocks call; next(i) is thread-safe.
class Blocks {
 public:
  explicit Blocks(int64_t n) : n_(n) {}
  // The next block not yet taken into `i`; false (and `i` untouched) when all are taken.
  bool next(int64_t& i) {
    const int64_t j = next_.fetch_add(1, std::memory_order_relaxed);
    if (j >= n_) return false;
    i = j;
    return true;
  }

 private:
  int64_t n_;
  std::atomic<int64_t> next_{0};
};

template <typename F>
void parallel_blocks(int64_t n, const F& f) {
  if (n <= 0) return;
  Blocks blocks(n);
  const int64_t threads = std::min<int64_t>(n, at::get_num_threads());
  gpt::parallel_for(0, threads, 1, [&](int64_t, int64_t) { f(blocks); });
}

}  // namespace gpt
