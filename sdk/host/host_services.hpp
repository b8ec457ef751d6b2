// The host services every keel_host table holds (abi.h): tensors, option values, reported
// errors. The kernel's table (kernel/host.cpp) and keel::testing's (keel/testing.hpp) are both
// made here and differ only in where log lines go.
#pragma once

#include <string>

#include "keel/abi.h"

namespace keel {

// A keel_host of this ABI whose `log` slot is `log`, whose `stop_requested` slot (1.10) is
// `stop_requested` (nullptr: one that always returns 0) and whose other slots are this
// library's.
keel_host host_table(void (*log)(keel_log_level level, const char* origin, const char* message),
                     int (*stop_requested)() = nullptr);

// The message a plugin passed to keel_host.report_error since the last call, and clears it
// ("" when none). Per thread: a report belongs to the slot running on that thread.
std::string take_reported_error();

}  // namespace keel
