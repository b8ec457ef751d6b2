// Precompiled header for targets that use LibTorch's C++ API (kernel and C++ plugins).
// Only the heavy, stable headers go here; code still includes what it uses.
#include <torch/torch.h>
#include "keel/plugin.hpp"
