// The text of the console's progress bar (pure functions, so tests can check them):
//   [#####...............] 1234/4690 26% | 1:02 elapsed | 850 it/s | ETA 0:04 | loss 0.3120
// and, without a planned length (a stream without max_steps), from the planned epochs:
//   1234 steps | 2/7 epochs done | 1:02 elapsed | 850 it/s | ETA 1:30 | loss 0.3120
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

// What one frame of the bar shows of a run.
struct Progress {
  int64_t step = 0, max_steps = 0;  // optimizer steps taken; planned (0: no planned length)
  int64_t epoch = 0, epochs = 0;    // the current epoch (0-based); planned epochs (0: unknown)
  double elapsed_s = 0;             // since training started in this process
  double steps_per_s = 0;           // since then (0: not known yet)
  // The epochs that ended since training started in this process, and the seconds from its
  // start to the end of the last of them: a stream's pace per epoch.
  int64_t epochs_done = 0;
  double epochs_done_s = 0;
  double loss = NAN;
  const char* note = nullptr;  // what the run does now, when not a step ("evaluating")
};

// Seconds left (< 0: unknown): with a planned length, its steps at the pace so far; without
// one, the planned epochs at the pace of those ended so far, less the current epoch's time.
inline double eta_seconds(const Progress& p) {
  if (p.max_steps > 0)
    return p.steps_per_s > 0 && p.step <= p.max_steps
               ? static_cast<double>(p.max_steps - p.step) / p.steps_per_s
               : -1;
  if (p.epochs > 0 && p.epochs_done > 0 && p.epoch < p.epochs) {
    const double per_epoch = p.epochs_done_s / static_cast<double>(p.epochs_done);
    return std::max(0.0, per_epoch * static_cast<double>(p.epochs - p.epoch) -
                             (p.elapsed_s - p.epochs_done_s));
  }
  return -1;
}

// One frame of the bar; without a planned length no bar or percentage, and an ETA only from
// the planned epochs.
inline std::string progress_text(const Progress& p) {
  constexpr int64_t kCells = 20;
  std::string out;
  if (p.max_steps > 0) {
    const int64_t filled = std::min(kCells, std::max<int64_t>(0, p.step * kCells / p.max_steps));
    out = "[" + std::string(filled, '#') + std::string(kCells - filled, '.') + "] " +
          std::to_string(p.step) + "/" + std::to_string(p.max_steps) + " " +
          std::to_string(std::min<int64_t>(100, p.step * 100 / p.max_steps)) + "%";
  } else {
    // Epochs done: the current epoch's 0-based number.
    out = std::to_string(p.step) + " steps | " + std::to_string(p.epoch) +
          (p.epochs > 0 ? "/" + std::to_string(p.epochs) : std::string()) + " epochs done";
  }
  out += " | " + clock_text(p.elapsed_s) + " elapsed | " + rate_text(p.steps_per_s);
  const double eta = eta_seconds(p);
  if (eta >= 0) out += " | ETA " + clock_text(eta);
  if (std::isfinite(p.loss)) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " | loss %.4f", p.loss);
    out += buf;
  }
  if (p.note != nullptr) out += std::string(" | ") + p.note;
  return out;
}

}  // namespace sinks
