// A third-party plugin (docs/plugins.md's example), built by test_sdk_install.sh against the
// *installed* SDK only: nothing from this source tree is on its include path.
#include <cmath>

#include "keel/plugin.hpp"

constexpr auto kEvery =
    keel::opt_int("every", "1000", "halve the learning rate every N steps", 1, 1e12);

class Halving : public keel::LrScheduler {
 public:
  explicit Halving(const keel::Context& ctx) : every_(ctx.get(kEvery)) {}
  double factor(int64_t step) override { return std::pow(0.5, step / every_); }

 private:
  int64_t every_;
};

static const keel_option_desc kOptions[] = {kEvery};
static const keel_component_desc kComponents[] = {
    keel::component<Halving>("halving", "lr halves every N steps", kOptions),
};
KEEL_PLUGIN("my-schedules", "1.0.0", "My learning-rate schedules", kComponents)
