#include "run/requests.hpp"

#include <string>
#include <vector>

#include "distributed/process_group.hpp"

namespace keel {

int Requests::agree_at_step_end(int signal, std::vector<double>& slowest, bool& saved) {
  return agree(signal, &slowest, &saved);
}

int Requests::agree(int signal, std::vector<double>* slowest, bool* saved) {
  unagreed_ = false;
  if (group_ == nullptr) return signal;
  const auto bit = [&](uint32_t b) { return (bits_ & b) ? 1.0 : 0.0; };
  // A save is finished everywhere when no rank's is still running (the max of "running").
  std::vector<double> v = {bit(KEEL_REQUEST_STOP), bit(KEEL_REQUEST_EVAL),
                           bit(KEEL_REQUEST_CHECKPOINT), static_cast<double>(signal),
                           saved && !*saved ? 1.0 : 0.0};
  constexpr size_t kOwn = 5;
  if (slowest) v.insert(v.end(), slowest->begin(), slowest->end());
  v = group_->max(std::move(v), "agreeing on hook requests at step " +
                                    std::to_string(progress_ ? progress_->step : 0));
  bits_ = (v[0] > 0 ? KEEL_REQUEST_STOP : 0u) | (v[1] > 0 ? KEEL_REQUEST_EVAL : 0u) |
          (v[2] > 0 ? KEEL_REQUEST_CHECKPOINT : 0u);
  if (slowest) slowest->assign(v.begin() + kOwn, v.end());
  if (saved) *saved = v[4] == 0;
  return static_cast<int>(v[3]);
}

}  // namespace keel
