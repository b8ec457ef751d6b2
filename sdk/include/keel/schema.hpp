// Helpers to write option schemas (arrays of keel_option_desc) in C++. No LibTorch needed.
#pragma once

#include <limits>

#include "keel/abi.h"

namespace keel {

// Option schema entries. Bounds are inclusive; leave them out for "unbounded".
constexpr double kNoMin = 1.0, kNoMax = 0.0;
constexpr keel_option_desc opt_bool(const char* key, const char* def, const char* help) {
  return {key, KEEL_OPT_BOOL, def, help, kNoMin, kNoMax, nullptr};
}
constexpr keel_option_desc opt_int(const char* key, const char* def, const char* help,
                                   double min = kNoMin, double max = kNoMax) {
  return {key, KEEL_OPT_INT, def, help, min, max, nullptr};
}
constexpr keel_option_desc opt_float(const char* key, const char* def, const char* help,
                                     double min = kNoMin, double max = kNoMax) {
  return {key, KEEL_OPT_FLOAT, def, help, min, max, nullptr};
}
constexpr keel_option_desc opt_string(const char* key, const char* def, const char* help,
                                      const char* choices = nullptr) {
  return {key, KEEL_OPT_STRING, def, help, kNoMin, kNoMax, choices};
}
// (ABI 1.2) A filesystem path: the kernel hands the factory an absolute path (abi.h).
constexpr keel_option_desc opt_path(const char* key, const char* def, const char* help) {
  return {key, KEEL_OPT_PATH, def, help, kNoMin, kNoMax, nullptr};
}
constexpr keel_option_desc opt_int_list(const char* key, const char* def, const char* help,
                                        double min = kNoMin, double max = kNoMax) {
  return {key, KEEL_OPT_INT_LIST, def, help, min, max, nullptr};
}
constexpr keel_option_desc opt_float_list(const char* key, const char* def, const char* help,
                                          double min = kNoMin, double max = kNoMax) {
  return {key, KEEL_OPT_FLOAT_LIST, def, help, min, max, nullptr};
}
constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace keel
