// The process-wide settings of a run (trainer.hpp: apply_process_settings): threads, the
// allocator, the default generator's seed.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Logging.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <thread>

#include "blas.hpp"
#include "distributed/launch.hpp"
#include "run/trainer.hpp"

namespace keel {

void configure_threads(int64_t threads, int local_processes) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t n = threads > 0 ? threads : std::max<int64_t>(1, cores / std::max(1, local_processes));
  // Only when it changes: LibTorch builds with a pthreadpool (Debian's 1.13) destroy and create
  // that pool on every call, and its new threads spin before they sleep.
  if (at::get_num_threads() != n) at::set_num_threads(static_cast<int>(n));
  const int blas_threads = blas_threads_for(static_cast<int>(n));  // one pool: see blas.hpp
  if (blas_threads > 0) set_blas_threads(blas_threads);
  spdlog::debug("{} LibTorch intra-op thread(s) ({} core(s), {} process(es) on this machine); "
                "BLAS: {}", n, cores, std::max(1, local_processes), blas_line(blas_threads));
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
  // LibTorch's own C++ log (c10's LOG) only from ERROR up, unless TORCH_CPP_LOG_LEVEL says
  // otherwise: PyTorch 2.x's c10d logs two WARNING lines to stderr for a store wait that times
  // out, before keel's own one-line error about the rank that failed (Debian's 1.13 logs
  // through glog, which this flag does not govern).
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr)
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);
}

}  // namespace keel
