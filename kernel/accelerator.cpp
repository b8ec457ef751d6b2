#include "accelerator.hpp"

#include <fmt/format.h>

#ifdef KEEL_WITH_CUDA
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda_runtime_api.h>  // CUDART_VERSION
#endif
#ifdef KEEL_WITH_NCCL
#include <nccl.h>
#endif

#include "error.hpp"

namespace keel {

namespace {
#ifdef KEEL_WITH_NCCL
std::string nccl_text(int code) {  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}
int nccl_library_code() {
  int code = 0;
  return ncclGetVersion(&code) == ncclSuccess ? code : 0;
}
#endif
}  // namespace

std::string accelerator_line(bool count_gpus) {
#ifdef KEEL_WITH_CUDA
  std::string line = fmt::format("CUDA {}.{}", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
#ifdef KEEL_WITH_NCCL
  line += fmt::format(" and NCCL {} (library {})", nccl_text(NCCL_VERSION_CODE),
                      nccl_text(nccl_library_code()));
#endif
  if (count_gpus) {
    const int gpus = at::detail::getCUDAHooks().hasCUDA()
                         ? static_cast<int>(at::detail::getCUDAHooks().getNumGPUs())
                         : 0;
    line += fmt::format(", {} GPU{}", gpus, gpus == 1 ? "" : "s");
  }
  return line;
#else
  (void)count_gpus;
  return "none (this LibTorch is CPU-only)";
#endif
}

void check_nccl_library() {
#ifdef KEEL_WITH_NCCL
  const int library = nccl_library_code();
  if (library / 100 != NCCL_VERSION_CODE / 100)
    throw Error("NCCL: the library loaded is " + nccl_text(library) + " and keel was compiled " +
                "against nccl.h " + nccl_text(NCCL_VERSION_CODE) + "; hint: run keel with the " +
                "NCCL of the torch wheel it was built against (its nvidia-nccl package: " +
                "LD_LIBRARY_PATH must not name another libnccl.so.2)");
#endif
}

}  // namespace keel
