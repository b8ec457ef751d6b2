// The components of the keel-ctr plugin (plugins/ctr): each file describes its own, ctr.cpp
// lists them in the plugin's descriptor.
#pragma once

#include "keel/abi.h"

namespace keel_ctr {

keel_component_desc dlrm_component();  // dlrm.cpp: model `dlrm`
keel_component_desc bce_component();   // bce.cpp: loss `bce`

}  // namespace keel_ctr
