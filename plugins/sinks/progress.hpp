// The text of the console's progress bar (pure functions, so tests can check them):
//   [#####...............] 1234/4690 26% | 850 it/s | ETA 0:04 | loss 0.3120
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace sinks {

// "0:04", "12:30", "1:02:03".
inline std::string clock_text(double seconds) {
  const int64_t s = std::llround(std::max(0.0, seconds));
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  return buf;
}

// "850 it/s", "12.5 it/s", "2.5 s/it"; "? it/s" before a rate is known.
inline std::string rate_text(double steps_per_s) {
  char buf[48];
  if (!(steps_per_s > 0) || !std::isfinite(steps_per_s)) return "? it/s";
  if (steps_per_s >= 10)
    std::snprintf(buf, sizeof buf, "%.0f it/s", steps_per_s);
  else if (steps_per_s >= 1)
    std::snprintf(buf, sizeof buf, "%.1f it/s", steps_per_s);
  else
    std::snprintf(buf, sizeof buf, "%.1f s/it", 1.0 / steps_per_s);
  return buf;
}

// One frame of the bar; without a planned length (max_steps 0), no bar, percentage or ETA.
inline std::string progress_text(int64_t step, int64_t max_steps, double steps_per_s,
                                 double loss) {
  constexpr int64_t kCells = 20;
  std::string out;
  if (max_steps > 0) {
    const int64_t filled = std::min(kCells, std::max<int64_t>(0, step * kCells / max_steps));
    out = "[" + std::string(filled, '#') + std::string(kCells - filled, '.') + "] " +
          std::to_string(step) + "/" + std::to_string(max_steps) + " " +
          std::to_string(std::min<int64_t>(100, step * 100 / max_steps)) + "%";
  } else {
    out = std::to_string(step) + " steps";
  }
  out += " | " + rate_text(steps_per_s);
  if (max_steps > 0 && steps_per_s > 0 && step <= max_steps)
    out += " | ETA " + clock_text(static_cast<double>(max_steps - step) / steps_per_s);
  if (std::isfinite(loss)) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " | loss %.4f", loss);
    out += buf;
  }
  return out;
}

}  // namespace sinks
