// The keel_host table the kernel hands to every plugin (tensors, options, logging).
#pragma once

#include <string>

#include "keel/abi.h"

namespace keel {

const keel_host* host();

// The message a plugin passed to keel_host.report_error since the last call, and clears it
// ("" when none). Per thread: a report belongs to the slot running on that thread.
std::string take_reported_error();

}  // namespace keel
