// What hooks request (KEEL_REQUEST_STOP, _EVAL, _CHECKPOINT), agreed between ranks.
//
// With several ranks, every decision that changes the sequence of collectives must be the same
// on all of them, so a request read is the OR of every rank's requests. The agreement happens
// underneath: reading a request after hooks ran since the last agreement agrees first (one
// all-reduce; every rank reads at the same points, so all take part). The end of each step
// agrees unconditionally (agree_at_step_end), because a stop signal may have arrived on any
// rank in the meantime; that all-reduce carries the log window's times and whether every
// rank's asynchronous checkpoint save has finished too (run/agreement.hpp lists every
// agreement of a step).
#pragma once

#include <cstdint>
#include <vector>

#include "keel/abi.h"

namespace keel {

class ProcessGroup;

class Requests {
 public:
  // `group` null: one process, nothing to agree. `progress` names the step in errors.
  void attach(ProcessGroup* group, const keel_trainer_state* progress) {
    group_ = group;
    progress_ = progress;
  }

  // Hooks ran (they may have set requests on this rank or another): the next read agrees.
  void hooks_ran() { unagreed_ = true; }
  // Requests a hook set during an event on this rank.
  void add(uint32_t bits) { bits_ |= bits; }
  // Requests every rank sets at the same point (the run's own reaction to an agreed signal).
  void add_agreed(uint32_t bits) { bits_ |= bits; }

  bool stop() { return read(KEEL_REQUEST_STOP); }
  bool evaluate() { return read(KEEL_REQUEST_EVAL); }
  bool checkpoint() { return read(KEEL_REQUEST_CHECKPOINT); }

  // Agrees the requests, the stop signal (`signal`: this rank's, 0 for none), `slowest`
  // (this rank's values in, the largest of any rank's out, element-wise: the log window's
  // times) and `saved` (in: this rank's asynchronous save has finished or none is in flight;
  // out: so on every rank) on every rank, in one all-reduce (max); returns the agreed signal
  // (the largest any rank received, 0: none).
  int agree_at_step_end(int signal, std::vector<double>& slowest, bool& saved);

  // Forgets the requests acted on (after a step, after an epoch's end).
  void clear() { bits_ = 0; }

 private:
  bool read(uint32_t bit) {
    if (unagreed_) agree(0, nullptr, nullptr);
    return (bits_ & bit) != 0;
  }
  int agree(int signal, std::vector<double>* slowest, bool* saved);

  ProcessGroup* group_ = nullptr;
  const keel_trainer_state* progress_ = nullptr;
  uint32_t bits_ = 0;
  bool unagreed_ = false;
};

}  // namespace keel
