// The BLAS that LibTorch's CPU matrix products run on, as this process loaded it, and its
// thread count.
//
// Debian's libtorch_cpu links libblas.so.3 and liblapack.so.3. keel's executables carry a
// DT_RPATH to OpenBLAS's OpenMP build when it is installed (meson.build, option blas_dir), so
// they load that build whatever the machine's BLAS alternatives select; without it they load the
// system's libblas.so.3.
//
// Threads: one pool. OpenBLAS's OpenMP build (openblas_get_parallel() == 2) runs its matrix
// products on LibTorch's OpenMP threads, and single-threaded inside LibTorch's own parallel
// regions, so it gets LibTorch's count. Another OpenBLAS build (pthreads) has a pool of its own
// whose threads spin against LibTorch's (measured 4x slower on 2 cores), so it gets 1 thread.
// The functions find OpenBLAS by its symbols (dlsym), so that any BLAS links.
#pragma once

#include <string>

namespace keel {

struct BlasInfo {
  bool openblas = false;  // OpenBLAS's openblas_* functions are there
  bool openmp = false;    // OpenBLAS's OpenMP build
  bool mkl = false;       // not OpenBLAS but Intel's MKL (inside the wheel's libtorch_cpu), which
                          // runs on LibTorch's OpenMP threads: at::set_num_threads sets its count
  std::string version;    // "OpenBLAS 0.3.21" (the start of openblas_get_config()), "MKL
                          // 2024.2.0", or "unknown"
  std::string library;    // the file that defines dgemm_ (symbolic links resolved), or ""
};

BlasInfo blas_info();

// OpenBLAS's thread count, or -1 when the BLAS is not OpenBLAS.
int blas_threads();
// Sets OpenBLAS's thread count (nothing when the BLAS is not OpenBLAS).
void set_blas_threads(int threads);
// The count keel gives the BLAS when LibTorch runs `torch_threads` threads (see above; MKL:
// `torch_threads`, set by LibTorch); -1 when the BLAS is neither (keel leaves its threads as
// they are).
int blas_threads_for(int torch_threads);

// One line for `keel --version` and run.log: "OpenBLAS 0.3.21 (OpenMP build,
// /usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3), 2 threads". `threads`: the count to
// name (-1: "threads left as they are").
std::string blas_line(int threads);
// blas_line for a run of one process with [run] threads = 0 (a LibTorch thread per core), plus
// " in a run with [run] threads = 0 (N cores)": what `keel --version` prints.
std::string blas_default_line();

}  // namespace keel
