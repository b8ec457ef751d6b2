// The keel_host table the kernel hands to every plugin (tensors, options, logging).
#pragma once

#include "keel/abi.h"

namespace keel {

const keel_host* host();

}  // namespace keel
