#include "blas.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <thread>

namespace keel {
namespace {

template <class F>
F symbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

BlasInfo blas_info() {
  BlasInfo info;
  const auto parallel = symbol<int (*)()>("openblas_get_parallel");
  const auto config = symbol<char* (*)()>("openblas_get_config");
  info.openblas = symbol<void (*)(int)>("openblas_set_num_threads") != nullptr;
  info.openmp = parallel != nullptr && parallel() == 2;
  info.version = "unknown";
  if (config != nullptr && config() != nullptr) {
    // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64": the first two words.
    const std::string text = config();
    const size_t space = text.find(' ');
    info.version = text.substr(0, space == std::string::npos ? space : text.find(' ', space + 1));
  } else if (info.openblas) {
    info.version = "OpenBLAS";
  }
  // The MKL that the wheel's libtorch_cpu carries inside (-Dtorch=wheel): "Intel(R) oneAPI Math
  // Kernel Library Version 2024.2.0-Product Build ..." gives "MKL 2024.2.0".
  if (const auto mkl = symbol<void (*)(char*, int)>("MKL_Get_Version_String");
      !info.openblas && mkl != nullptr) {
    char text[256] = {};
    mkl(text, sizeof text - 1);
    const std::string s = text;
    const size_t at = s.find("Version ");
    info.mkl = true;
    info.version = "MKL";
    if (at != std::string::npos)
      info.version += " " + s.substr(at + 8, s.find_first_of("- ", at + 8) - (at + 8));
  }
  Dl_info where{};
  if (void* dgemm = dlsym(RTLD_DEFAULT, "dgemm_");
      dgemm != nullptr && dladdr(dgemm, &where) != 0 && where.dli_fname != nullptr) {
    char* real = realpath(where.dli_fname, nullptr);
    info.library = real != nullptr ? real : where.dli_fname;
    free(real);
  }
  return info;
}

int blas_threads() {
  const auto get = symbol<int (*)()>("openblas_get_num_threads");
  return get != nullptr ? get() : -1;
}

void set_blas_threads(int threads) {
  if (const auto set = symbol<void (*)(int)>("openblas_set_num_threads")) set(threads);
}

int blas_threads_for(int torch_threads) {
  const BlasInfo info = blas_info();
  if (info.mkl) return torch_threads;  // at::set_num_threads sets MKL's count itself
  if (!info.openblas) return -1;
  return info.openmp ? torch_threads : 1;
}

std::string blas_line(int threads) {
  const BlasInfo info = blas_info();
  std::string line = info.openblas || info.mkl ? info.version : "not OpenBLAS";
  std::string notes;
  if (info.openblas) notes = info.openmp ? "OpenMP build" : "not the OpenMP build";
  if (info.mkl) notes = "inside";
  if (!info.library.empty())
    notes += std::string(notes.empty() ? "" : info.mkl ? " " : ", ") + info.library;
  if (!notes.empty()) line += " (" + notes + ")";
  if (threads <= 0) return line + ", threads left as they are";
  return line + ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
}

std::string blas_default_line() {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return fmt::format("{} in a run with [run] threads = 0 ({} {})",
                     blas_line(blas_threads_for(cores)), cores, cores == 1 ? "core" : "cores");
}

}  // namespace keel
