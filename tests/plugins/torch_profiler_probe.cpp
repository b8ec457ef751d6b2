// Runs chrome_trace (operators = true) of the built profiler plugin through keel/testing.hpp
// for test_torch_profiler.py. Usage: torch_profiler_probe PLUGIN.so MODE RUN_DIR
//   busy:   LibTorch's profiler is already on in this thread when the range starts; prints the
//           plugin's log lines, then "ok" once flush wrote the trace.
//   marks:  runs steps 0..8 through a chrome_trace with operators in steps 5..6 and prints
//           "enabled <step>:<0|1> ..." (whether LibTorch's profiler is on after each step's
//           begin mark), then times begin/end pairs outside the step range of it and of one
//           without operators (the best of 5 rounds of 10^6 pairs each) and prints
//           "ns_per_pair <with_operators> <without>" (information, not asserted).
// Any failure prints its message on stderr and exits 1. `torch_profiler_probe --batch` runs
// many cases (tests/plugins/probe.hpp).
#include "keel/testing.hpp"  // first: see keel/testing.hpp

#include <ATen/ops/ones.h>

#include "probe.hpp"
#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

namespace torch_profiler_probe {

// ns per begin+end pair, over n pairs at step `step`.
double time_marks(const keel::testing::Instance<keel_profiler>& p, int64_t step, int n) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    p->begin(p->self, "forward", step);
    p->end(p->self, "forward", step);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         n;
}

std::string run(int argc, char** argv) {
  if (argc != 4) throw std::runtime_error("usage: torch_profiler_probe PLUGIN.so MODE RUN_DIR");
  keel::testing::Plugin plugin(probe::open_plugin(argv[1]));
  const std::string mode = argv[2];
  keel::testing::Setup setup;
  setup.run_dir = argv[3];
  namespace impl = torch::profiler::impl;
  std::ostringstream out;
  if (mode == "busy") {
    keel::testing::clear_log_lines();  // an earlier case's, in a batch
    auto p = plugin.create<keel_profiler>(
        "chrome_trace", {{"start_step", int64_t{1}}, {"end_step", int64_t{1}},
                         {"operators", true}}, setup);
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, {impl::ActivityType::CPU});
    torch::autograd::profiler::enableProfiler(config, {impl::ActivityType::CPU});
    for (int64_t step = 0; step < 3; ++step) {
      p.call(p->begin, "forward", step);
      at::ones({4}).add(1);
      p.call(p->end, "forward", step);
    }
    torch::autograd::profiler::disableProfiler();
    p.call(p->flush);
    for (const auto& line : keel::testing::log_lines()) out << line << "\n";
    out << "ok\n";
  } else if (mode == "marks") {
    auto ops = plugin.create<keel_profiler>(
        "chrome_trace", {{"start_step", int64_t{5}}, {"end_step", int64_t{6}},
                         {"operators", true}}, setup);
    auto plain = plugin.create<keel_profiler>(
        "chrome_trace", {{"start_step", int64_t{5}}, {"end_step", int64_t{6}}}, setup);
    out << "enabled";
    for (int64_t step = 0; step <= 8; ++step) {
      ops.call(ops->begin, "forward", step);
      out << " " << step << ":" << (torch::profiler::impl::profilerEnabled() ? 1 : 0);
      ops.call(ops->end, "forward", step);
    }
    out << "\n";
    const int n = 1000000;
    time_marks(ops, 0, n / 10);  // warm up
    time_marks(plain, 0, n / 10);
    double best_ops = 1e300, best_plain = 1e300;
    for (int round = 0; round < 5; ++round) {  // the best of 5, against a busy machine
      best_ops = std::min(best_ops, time_marks(ops, 0, n));
      best_plain = std::min(best_plain, time_marks(plain, 0, n));
    }
    out << "ns_per_pair " << best_ops << " " << best_plain << "\n";
  } else {
    throw std::runtime_error("unknown mode " + mode);
  }
  return out.str();
}

int entry(int argc, char** argv) { return probe::main_guard(run, argc, argv); }

}  // namespace torch_profiler_probe
