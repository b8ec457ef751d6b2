#include "run/signals.hpp"

#include <unistd.h>

#include <atomic>

namespace keel {

namespace {

// Set by the handler, read by the loop and by keel_host.stop_requested on any thread.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (!g_stop_signal.compare_exchange_strong(expected, sig)) _exit(128 + sig);
  static const char msg[] =
      "keel: signal received, stopping after the current step, or now if waiting for data (again "
      "to exit at once)\n";
  (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
}

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGINT, &sa, &old_int_);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
  g_stop_signal = 0;  // keel_host.stop_requested is 0 outside a training run (abi.h)
}

int StopSignals::received() { return g_stop_signal.load(); }

NextResult next_result(const Instance<keel_dataset>& data, int has_batch) {
  if (has_batch == 0) return NextResult::kEnd;
  if (has_batch != KEEL_BATCH_STOPPED || data.abi_minor() < 10) return NextResult::kBatch;
  if (StopSignals::received() == 0)
    throw data.error("next returned KEEL_BATCH_STOPPED (stopped while waiting for data) but no "
                     "stop was requested; hint: return it only after keel_host.stop_requested "
                     "returned nonzero (abi.h)");
  return NextResult::kStopped;
}

}  // namespace keel
