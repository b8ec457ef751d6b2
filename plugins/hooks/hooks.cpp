// keel-hooks: hooks that steer the run (early_stopping.cpp) and that keep weights of their own
// (ema.cpp).
#include "components.hpp"
#include "keel/plugin.hpp"

namespace {

const keel_component_desc kComponents[] = {
    keel_hooks::early_stopping_component(),
    keel_hooks::ema_component(),
};

}  // namespace

KEEL_PLUGIN("keel-hooks", "0.2.0",
            "Hooks: early stopping, and an exponential moving average of the weights", kComponents)
