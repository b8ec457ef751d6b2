// The components of the keel-hooks plugin (plugins/hooks): each file describes its own,
// hooks.cpp lists them in the plugin's descriptor.
#pragma once

#include "keel/abi.h"

namespace keel_hooks {

keel_component_desc early_stopping_component();  // early_stopping.cpp
keel_component_desc ema_component();             // ema.cpp

}  // namespace keel_hooks
