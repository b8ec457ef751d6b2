// keel_metric_writer (abi.h) of one call that puts metrics: a loss's metric_finish, a hook's
// put_metrics (keel.hook.observe/1). Collects the metrics in the order put and remembers the
// first refusal: a NULL, empty, over-long or badly formed key, a key put twice, or one the
// record holds already.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "keel/abi.h"

namespace keel {

struct MetricWriter {
  // `taken`: keys the record has already; `record`: "the evaluation record", for messages;
  // `why`: what a refusal of a taken key adds (" (step, epoch, loss and samples are the
  // kernel's)").
  MetricWriter(std::vector<std::string> taken, std::string record, std::string why = "");

  keel_metric_writer abi{};
  std::vector<std::pair<std::string, double>> metrics;
  std::string refusal;  // "" when every put was kept

 private:
  static int put(keel_metric_writer* w, const char* key, double value) noexcept;
  int add(const char* key, double value);
  int refuse(std::string why);

  std::set<std::string> keys_, taken_;
  std::string record_, why_;
};

}  // namespace keel
