// mfu component: model FLOPs utilisation against a fixed hardware peak.
#include <cmath>

#include "keel/plugin.hpp"

namespace {

class PeakFlops : public keel::Mfu {
 public:
  explicit PeakFlops(const keel::Context& ctx) : peak_(ctx.get_float("peak_tflops") * 1e12) {}
  double compute(double flops_per_sample, double samples_per_second) override {
    if (flops_per_sample == 0.0 || !std::isfinite(flops_per_sample)) return 0.0;
    return flops_per_sample * samples_per_second / peak_;
  }

 private:
  double peak_;  // FLOP/s of one device (samples_per_second is per device)
};

const keel_option_desc kPeakFlopsOptions[] = {
    keel::opt_float("peak_tflops", nullptr,
                    "peak TFLOP/s of one device (one rank's; keel hands MFU the samples per second per device)", 1e-9,
                    keel::kInf),
};
const keel_component_desc kComponents[] = {
    keel::component<PeakFlops>("peak_flops", "achieved FLOP/s divided by a given hardware peak",
                               kPeakFlopsOptions),
};

}  // namespace

KEEL_PLUGIN("keel-mfu", "0.1.0", "Model FLOPs utilisation", kComponents)
