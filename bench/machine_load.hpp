// What the benchmarks measure about the machine they share: this process's CPU time, and the
// CPU other processes used meanwhile.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>

namespace keel_bench {

// User + system CPU time of this process, in seconds.
inline double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

// CPU used by OTHER processes since construction (in cores, averaged over the interval): the
// machine's busy time from /proc/stat minus this process's own CPU time. A benchmark's ratios
// are only meaningful when this stays near 0.
class OtherLoad {
 public:
  OtherLoad() { sample(busy0_, wall0_, self0_); }
  double cores() const {
    double busy, wall, self;
    sample(busy, wall, self);
    if (wall <= wall0_) return 0;
    return std::max(0.0, (busy - busy0_) - (self - self0_)) / (wall - wall0_);
  }

 private:
  static void sample(double& busy, double& wall, double& self) {
    std::ifstream in("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    in >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
    const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
    busy = (user + nice + sys + irq + softirq + steal) / hz;
    wall = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
               .count();
    self = process_cpu_seconds();
  }
  double busy0_ = 0, wall0_ = 0, self0_ = 0;
};

}  // namespace keel_bench
