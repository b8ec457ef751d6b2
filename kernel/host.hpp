// The keel_host table the kernel hands to every plugin (tensors, options, logging, whether a
// stop was requested): the SDK's host services (sdk/host/host_services.hpp), which
// keel::testing uses too, with log lines going to the kernel's log and stop_requested reading
// the flag of the kernel's signal handler (run/signals.hpp).
#pragma once

#include "host_services.hpp"  // take_reported_error()
#include "keel/abi.h"

namespace keel {

const keel_host* host();

}  // namespace keel
