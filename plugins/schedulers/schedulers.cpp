// lr_scheduler components. Each one's factor(step) multiplies the base learning rates for
// optimizer step `step` (0-based) and is a pure function of it.
//
// Every schedule starts with keel's linear warmup: factor (step + 1) / warmup_steps during the
// first warmup_steps steps, so step 0 already trains (at 1/warmup) and step warmup - 1 reaches
// 1. (Hugging Face's get_*_schedule_with_warmup ramp step / warmup instead, starting at 0.)
//
//   constant  1 after warmup.
//   step      gamma^floor((step - warmup) / step_size) after warmup.
//   linear    1 at the end of warmup, falling linearly to min_factor at total_steps (with
//             min_factor = 0: get_linear_schedule_with_warmup, but for the warmup ramp).
//   cosine    1 at the end of warmup, half a cosine down to min_factor at total_steps.
//   wsd       warmup-stable-decay: 1 after warmup, then over the last decay steps before
//             total_steps down to min_factor along a linear, cosine or 1 - sqrt curve.
#include <cmath>
#include <string>

#include "keel/plugin.hpp"

namespace {

// Options, each declared once: the schemas below list them, the components read them as the
// types they declare (ctx.get).
constexpr auto kWarmup =
    keel::opt_int("warmup_steps", "0", "linear warmup length in optimizer steps", 0, 1e12);
constexpr auto kTotal =
    keel::opt_int("total_steps", "0", "schedule length (0: the run's planned steps)", 0, 1e12);
constexpr auto kMinFactor =
    keel::opt_float("min_factor", "0.0", "final lr as a fraction of the base lr", 0, 1);
constexpr auto kStepSize =
    keel::opt_int("step_size", nullptr, "optimizer steps between two decays", 1, 1e12);
constexpr auto kGamma =
    keel::opt_float("gamma", "0.1", "factor applied every step_size steps", 0, 1);
constexpr auto kDecaySteps =
    keel::opt_int("decay_steps", "0", "length of the final decay (0: use decay_fraction)", 0, 1e12);
constexpr auto kDecayFraction =
    keel::opt_float("decay_fraction", "0.1", "final decay as a fraction of total_steps", 0, 1);
constexpr auto kDecayShape =
    keel::opt_string("decay_shape", "\"linear\"", "curve of the final decay", "linear|cosine|sqrt");

// Linear warmup from 1/warmup to 1 over the first `warmup_steps` optimizer steps.
double warmup_factor(int64_t step, int64_t warmup) {
  if (warmup <= 0 || step >= warmup) return 1.0;
  return static_cast<double>(step + 1) / static_cast<double>(warmup);
}

class Constant : public keel::LrScheduler {
 public:
  explicit Constant(const keel::Context& ctx) : warmup_(ctx.get(kWarmup)) {}
  double factor(int64_t step) override { return warmup_factor(step, warmup_); }

 private:
  int64_t warmup_;
};

class Step : public keel::LrScheduler {
 public:
  explicit Step(const keel::Context& ctx)
      : warmup_(ctx.get(kWarmup)),
        step_size_(ctx.get(kStepSize)),
        gamma_(ctx.get(kGamma)) {}
  double factor(int64_t step) override {
    if (step < warmup_) return warmup_factor(step, warmup_);
    return std::pow(gamma_, static_cast<double>((step - warmup_) / step_size_));
  }

 private:
  int64_t warmup_, step_size_;
  double gamma_;
};

// Shapes of a decay, from 1 at progress 0 to 0 at progress 1.
enum class Shape { kLinear, kCosine, kSqrt };

Shape shape_from(const std::string& name) {
  if (name == "linear") return Shape::kLinear;
  if (name == "cosine") return Shape::kCosine;
  if (name == "sqrt") return Shape::kSqrt;
  throw std::runtime_error("unknown decay_shape '" + name + "'; hint: use linear, cosine or sqrt");
}

double curve(Shape shape, double progress) {
  switch (shape) {
    case Shape::kLinear: return 1.0 - progress;
    case Shape::kCosine: return 0.5 * (1.0 + std::cos(M_PI * progress));
    case Shape::kSqrt: return 1.0 - std::sqrt(progress);
  }
  return 1.0;
}

// Warmup, then 1 until the decay starts, then `shape` from 1 down to min_factor over the decay
// span (at least one step), staying at min_factor after it. Reads warmup_steps, total_steps
// (0: the run's planned steps) and min_factor.
class Decay : public keel::LrScheduler {
 public:
  double factor(int64_t step) override {
    if (step < warmup_) return warmup_factor(step, warmup_);
    if (step < decay_start_) return 1.0;
    const int64_t span = std::max<int64_t>(1, total_ - decay_start_);
    const double progress = std::min(1.0, static_cast<double>(step - decay_start_) / span);
    return min_factor_ + (1.0 - min_factor_) * curve(shape_, progress);
  }

 protected:
  Decay(const keel::Context& ctx, Shape shape)
      : warmup_(ctx.get(kWarmup)),
        total_(ctx.get(kTotal) > 0 ? ctx.get(kTotal) : ctx.total_steps()),
        min_factor_(ctx.get(kMinFactor)),
        shape_(shape),
        decay_start_(warmup_) {
    if (total_ <= 0)
      throw std::runtime_error(
          "this schedule needs the run's length; hint: set total_steps, or give [train] "
          "max_steps or epochs");
    // Legitimate for short debug runs (--set train.max_steps=20), so a warning, not an error.
    if (warmup_ > total_)
      ctx.log(KEEL_LOG_WARN, "warmup_steps (" + std::to_string(warmup_) +
                                 ") is longer than the schedule (" + std::to_string(total_) +
                                 " steps): the run ends during warmup");
  }

  int64_t warmup_, total_;
  double min_factor_;
  Shape shape_;
  int64_t decay_start_;
};

class Linear : public Decay {
 public:
  explicit Linear(const keel::Context& ctx) : Decay(ctx, Shape::kLinear) {}
};

class Cosine : public Decay {
 public:
  explicit Cosine(const keel::Context& ctx) : Decay(ctx, Shape::kCosine) {}
};

class Wsd : public Decay {
 public:
  explicit Wsd(const keel::Context& ctx) : Decay(ctx, shape_from(ctx.get(kDecayShape))) {
    const int64_t steps = ctx.get(kDecaySteps);
    const int64_t decay =
        steps > 0 ? steps : std::llround(ctx.get(kDecayFraction) * total_);
    if (warmup_ < total_ && warmup_ + decay > total_)
      throw std::runtime_error(
          "warmup_steps (" + std::to_string(warmup_) + ") + decay (" + std::to_string(decay) +
          " steps) exceed total_steps (" + std::to_string(total_) +
          "); hint: lower warmup_steps, decay_steps or decay_fraction, or train longer");
    decay_start_ = std::max(warmup_, total_ - decay);
  }
};

const keel_option_desc kConstantOptions[] = {kWarmup};
const keel_option_desc kStepOptions[] = {kWarmup, kStepSize, kGamma};
const keel_option_desc kDecayOptions[] = {kWarmup, kTotal, kMinFactor};
const keel_option_desc kWsdOptions[] = {kWarmup,     kTotal,         kMinFactor,
                                        kDecaySteps, kDecayFraction, kDecayShape};

const keel_component_desc kComponents[] = {
    keel::component<Constant>("constant", "constant learning rate (optional linear warmup)",
                              kConstantOptions),
    keel::component<Step>("step", "linear warmup, then lr times gamma every step_size steps",
                          kStepOptions),
    keel::component<Linear>("linear", "linear warmup, then linear decay to min_factor",
                            kDecayOptions),
    keel::component<Cosine>("cosine", "linear warmup, then cosine decay to min_factor",
                            kDecayOptions),
    keel::component<Wsd>("wsd", "warmup, stable at the base lr, final decay to min_factor",
                         kWsdOptions),
};

}  // namespace

KEEL_PLUGIN("keel-schedulers", "0.2.0", "Learning-rate schedules", kComponents)
