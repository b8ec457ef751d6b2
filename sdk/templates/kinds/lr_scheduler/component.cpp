#include <cmath>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kGamma = keel::opt_float(
    "gamma", "0.999", "the learning rate is multiplied by gamma after every optimizer step", 0.0,
    1.0);

// Exponential decay: the learning rate of every parameter group is its base rate times
// gamma^step.
class @{Class} final : public keel::LrScheduler {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx) : gamma_(ctx.get(kGamma)) {}
  // The multiplier at optimizer step `step` (0-based): a pure function of the step.
  double factor(int64_t step) override { return std::pow(gamma_, static_cast<double>(step)); }

 private:
  double gamma_;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kGamma};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
