#include "run/events.hpp"

#include <fmt/format.h>

#include "run/run.hpp"

namespace keel {

void emit(Run& run, keel_event_kind kind, const char* split,
          const std::vector<keel_metric>* metrics, const char* path, int64_t micro_batch,
          const char* message) {
  if (run.components.hooks.empty()) return;
  run.requests.hooks_ran();
  profile_begin(run, "hooks");
  // A hook hears only the events of its plugin's ABI minor (abi.h: 1.0 knew kinds 1-10).
  const uint32_t since = kind >= KEEL_EVENT_AFTER_DATA ? 1 : 0;
  for (const auto& h : run.components.hooks) {
    if (h.abi_minor() < since) continue;
    keel_event ev{};
    ev.struct_size = sizeof(ev);
    ev.kind = kind;
    ev.state = &run.progress;
    ev.split = split;
    ev.metrics = metrics ? metrics->data() : nullptr;
    ev.metric_count = metrics ? metrics->size() : 0;
    ev.path = path;
    ev.micro_batch = micro_batch;
    ev.message = message;
    h.call("on_event", h->on_event, &ev);
    constexpr uint32_t kKnown = KEEL_REQUEST_STOP | KEEL_REQUEST_EVAL | KEEL_REQUEST_CHECKPOINT;
    if (ev.requests & ~kKnown)
      throw h.error(fmt::format("on_event set unknown request bits 0x{:x} (known: STOP 0x1, "
                                "EVAL 0x2, CHECKPOINT 0x4)", ev.requests & ~kKnown));
    run.requests.add(ev.requests);
  }
  profile_end(run, "hooks");
}

void profile_begin(const Run& run, const char* phase) {
  const auto& profiler = run.components.profiler;
  if (profiler) profiler.run("begin", profiler->begin, phase, run.progress.step);
}

void profile_end(const Run& run, const char* phase) {
  const auto& profiler = run.components.profiler;
  if (profiler) profiler.run("end", profiler->end, phase, run.progress.step);
}

}  // namespace keel
