// What the run tells its plugins as it goes: hook events (the order is abi.h's, keel_hook) and
// the profiler's phase marks.
#pragma once

#include <cstdint>
#include <vector>

#include "keel/abi.h"

namespace keel {

struct Run;

// Sends event `kind` to every hook that knows it (a hook hears only the events of its plugin's
// ABI minor), in call order, and collects the requests they set (run.requests). The optional
// fields are the event's (abi.h, keel_event).
void emit(Run& run, keel_event_kind kind, const char* split = nullptr,
          const std::vector<keel_metric>* metrics = nullptr, const char* path = nullptr,
          int64_t micro_batch = 0, const char* message = nullptr);

// The profiler's begin / end of `phase` at the current step (nothing without a profiler).
void profile_begin(const Run& run, const char* phase);
void profile_end(const Run& run, const char* phase);

}  // namespace keel
