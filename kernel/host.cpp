#include "host.hpp"

#include <spdlog/spdlog.h>

#include <string>

#include "bounded.hpp"
#include "run/signals.hpp"

namespace keel {
namespace {

void log(keel_log_level level, const char* origin, const char* message) {
  const std::string o = origin ? bounded(origin, KEEL_NAME_CAPACITY) : "plugin";
  const std::string m = o.empty() ? bounded(message) : "[" + o + "] " + bounded(message);
  switch (level) {
    case KEEL_LOG_DEBUG: spdlog::debug("{}", m); break;
    case KEEL_LOG_INFO: spdlog::info("{}", m); break;
    case KEEL_LOG_WARN: spdlog::warn("{}", m); break;
    default: spdlog::error("{}", m); break;
  }
}

// keel_host.stop_requested (1.10): a SIGTERM or SIGINT reached `keel train`'s loop.
int stop_requested() { return StopSignals::received() != 0 ? 1 : 0; }

}  // namespace

const keel_host* host() {
  static const keel_host table = host_table(log, stop_requested);
  return &table;
}

}  // namespace keel
