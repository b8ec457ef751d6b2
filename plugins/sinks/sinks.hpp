// Components of the sinks plugin defined outside sinks.cpp (which lists them all).
#pragma once

#include "keel/abi.h"

namespace sinks {

keel_component_desc console_component();  // console.cpp
keel_component_desc csv_component();       // csv.cpp

}  // namespace sinks
