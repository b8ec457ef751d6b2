#include "run/requests.hpp"

#include <string>
#include <vector>

#include "distributed/process_group.hpp"

namespace keel {

int Requests::agree_at_step_end(int signal) { return agree(signal); }

int Requests::agree(int signal) {
  unagreed_ = false;
  if (group_ == nullptr) return signal;
  const auto bit = [&](uint32_t b) { return (bits_ & b) ? 1.0 : 0.0; };
  const std::vector<double> v = group_->max(
      {bit(KEEL_REQUEST_STOP), bit(KEEL_REQUEST_EVAL), bit(KEEL_REQUEST_CHECKPOINT),
       static_cast<double>(signal)},
      "agreeing on hook requests at step " + std::to_string(progress_ ? progress_->step : 0));
  bits_ = (v[0] > 0 ? KEEL_REQUEST_STOP : 0u) | (v[1] > 0 ? KEEL_REQUEST_EVAL : 0u) |
          (v[2] > 0 ? KEEL_REQUEST_CHECKPOINT : 0u);
  return static_cast<int>(v[3]);
}

}  // namespace keel
