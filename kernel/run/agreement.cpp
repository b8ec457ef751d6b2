#include "run/agreement.hpp"

#include "distributed/process_group.hpp"

namespace keel {

int64_t agree_epoch_batches(ProcessGroup& group, int64_t batches) {
  return static_cast<int64_t>(
      -group.max({-static_cast<double>(batches)}, "agreeing on the batches per epoch")[0]);
}

}  // namespace keel
