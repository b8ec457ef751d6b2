// What this keel was built with beyond the CPU, and what the process finds: CUDA and NCCL
// (a -Dtorch=wheel build whose wheel has them, meson.build), for `keel --version` and run.log.
#pragma once

#include <string>

namespace keel {

// "CUDA 13.0 and NCCL 2.28.9 (library 2.28.9), 1 GPU" in a CUDA build (the GPU count only when
// `count_gpus`: it initialises CUDA), "none (this LibTorch is CPU-only)" otherwise.
std::string accelerator_line(bool count_gpus);

// NCCL's library (libnccl.so.2 as loaded) against the nccl.h keel was compiled with:
// ProcessGroupNCCL's options embed NCCL's config struct, whose size changes between releases.
// Throws keel::Error naming both versions when they differ in major or minor; does nothing in a
// build without NCCL.
void check_nccl_library();

}  // namespace keel
