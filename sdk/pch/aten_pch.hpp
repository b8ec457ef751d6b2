// Lighter precompiled header for targets that need tensors but not torch::nn / torch::optim.
#include <ATen/ATen.h>
#include "keel/plugin.hpp"
