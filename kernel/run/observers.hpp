// The host's side of the extension "keel.hook.observe/1" (sdk/include/keel/ext/hook_observe.h):
// hooks that see training micro-batches and evaluation batches with their outputs, lent for one
// call, and that add scalars of their own to the records.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "components.hpp"
#include "keel/abi.h"
#include "keel/ext/hook_observe.h"
#include "run/named_tensors.hpp"

namespace keel {

class Observers {
 public:
  // Asks `hook` for the extension and keeps it when offered. `hook` must outlive this. [setup]
  void add(const Instance<keel_hook>& hook);
  bool empty() const { return hooks_.empty(); }

  // Lends `batch` (micro-batch `index` of the step) to every hook's on_batch.
  void batch(int64_t index, const Named& batch) const;
  // Lends an evaluation batch of set `split` and the outputs for it to every on_eval_batch.
  void eval_batch(const char* split, const Named& batch, const Named& outputs) const;
  // Appends every hook's put_metrics for a record of `split` to `record` (keys that `record`
  // holds already are refused, naming the hook).
  void metrics(const char* split, std::vector<std::pair<std::string, double>>& record) const;

 private:
  struct Hook {
    const Instance<keel_hook>* hook;
    const keel_hook_observe* ext;
  };
  std::vector<Hook> hooks_;
};

}  // namespace keel
