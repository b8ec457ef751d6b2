// The process-wide settings of a run (trainer.hpp: apply_process_settings): threads, the
// allocator, the default generator's seed.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "distributed/launch.hpp"
#include "run/trainer.hpp"

namespace keel {

void configure_threads(int64_t threads, int local_processes) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t n = threads > 0 ? threads : std::max<int64_t>(1, cores / std::max(1, local_processes));
  at::set_num_threads(static_cast<int>(n));
  // One pool. OpenBLAS's OpenMP build (openblas_get_parallel() == 2, what setup.sh selects) runs
  // its matrix products on LibTorch's OpenMP threads, and single-threaded inside LibTorch's own
  // parallel regions, so it gets the same n. Its pthread build has a pool of its own whose
  // threads spin against LibTorch's (measured 4x slower on 2 cores), so that one gets 1 thread.
  using GetParallel = int (*)();
  using SetThreads = void (*)(int);
  const auto parallel = reinterpret_cast<GetParallel>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  const auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  const bool openmp_blas = parallel != nullptr && parallel() == 2;
  const int64_t blas_threads = openmp_blas ? n : 1;
  if (set_blas != nullptr) set_blas(static_cast<int>(blas_threads));
  spdlog::debug("{} LibTorch intra-op thread(s) ({} core(s), {} process(es) on this machine); "
                "BLAS: {}", n, cores, std::max(1, local_processes),
                set_blas == nullptr ? "not OpenBLAS, threads left as they are"
                : openmp_blas      ? "OpenBLAS (OpenMP), the same threads"
                                   : "OpenBLAS (not OpenMP), 1 thread");
}

void configure_allocator() {
  // Large tensors (activations, gradients, im2col buffers) are freed and allocated again every
  // step. By default glibc hands blocks above its (dynamic) mmap threshold back to the kernel
  // on free and trims the heap, so every step page-faults them in afresh: 8160 faults/step and
  // 95 ms/step for an MLP 784-2048-2048-10 at batch 256, against 127 faults and 85 ms/step with
  // these settings (bench/bench_vs_python.py). Keep such blocks in the heap instead: the mmap
  // threshold at glibc's 64-bit maximum (32 MiB) and no trimming below 1 GiB of free heap.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void apply_process_settings(const RunConfig& config) {
  const std::optional<Launch> launch = detect_launch();
  configure_threads(config.run.threads, launch ? launch->local_world_size : 1);
  if (config.run.malloc_tuning) configure_allocator();
  at::manual_seed(config.run.seed);
}

}  // namespace keel
