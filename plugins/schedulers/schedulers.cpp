// lr_scheduler components: constant and cosine with linear warmup.
#include <cmath>

#include "keel/plugin.hpp"

namespace {

// Linear warmup from 1/warmup to 1 over the first `warmup_steps` optimizer steps.
double warmup_factor(int64_t step, int64_t warmup) {
  if (warmup <= 0 || step >= warmup) return 1.0;
  return static_cast<double>(step + 1) / static_cast<double>(warmup);
}

class Constant : public keel::LrScheduler {
 public:
  explicit Constant(const keel::Context& ctx) : warmup_(ctx.get_int("warmup_steps")) {}
  double factor(int64_t step) override { return warmup_factor(step, warmup_); }

 private:
  int64_t warmup_;
};

class Cosine : public keel::LrScheduler {
 public:
  explicit Cosine(const keel::Context& ctx)
      : warmup_(ctx.get_int("warmup_steps")),
        total_(ctx.get_int("total_steps") > 0 ? ctx.get_int("total_steps") : ctx.total_steps()),
        min_factor_(ctx.get_float("min_factor")) {
    if (total_ <= 0)
      throw std::runtime_error(
          "cosine needs the run's length: set total_steps, or give [train] max_steps or epochs");
  }
  double factor(int64_t step) override {
    if (step < warmup_) return warmup_factor(step, warmup_);
    const int64_t span = std::max<int64_t>(1, total_ - warmup_);
    const double progress = std::min(1.0, static_cast<double>(step - warmup_) / span);
    return min_factor_ + (1.0 - min_factor_) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }

 private:
  int64_t warmup_, total_;
  double min_factor_;
};

const keel_option_desc kConstantOptions[] = {
    keel::opt_int("warmup_steps", "0", "linear warmup length in optimizer steps", 0, 1e12),
};
const keel_option_desc kCosineOptions[] = {
    keel::opt_int("warmup_steps", "0", "linear warmup length in optimizer steps", 0, 1e12),
    keel::opt_int("total_steps", "0", "steps to decay over (0: the run's planned steps)", 0, 1e12),
    keel::opt_float("min_factor", "0.0", "final lr as a fraction of the base lr", 0, 1),
};
const keel_component_desc kComponents[] = {
    keel::component<Constant>("constant", "constant learning rate (optional linear warmup)",
                              kConstantOptions),
    keel::component<Cosine>("cosine", "linear warmup, then cosine decay to min_factor",
                            kCosineOptions),
};

}  // namespace

KEEL_PLUGIN("keel-schedulers", "0.1.0", "Learning-rate schedules", kComponents)
