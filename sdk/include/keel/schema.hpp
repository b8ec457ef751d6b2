// Helpers to write option schemas (arrays of keel_option_desc) in C++. No LibTorch needed.
//
// Each option is declared once: opt_int(...) and the others return a keel::Option<T>, a
// keel_option_desc that also carries the C++ type its value is read as. Keep it as a constant,
// list it in the component's schema array, and read it with Context::get, which needs no second
// spelling of the key or its type:
//
//   constexpr auto kPatience = keel::opt_int("patience", "3", "evaluations tolerated", 0, 1e12);
//   const keel_option_desc kOptions[] = {kPatience};
//   ...  patience_(ctx.get(kPatience))   // an int64_t
//
// (Context::get_int("patience") and the other by-name getters stay, for schemas written as
// plain keel_option_desc rows.)
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "keel/abi.h"

namespace keel {

// Option schema entries. Bounds are inclusive; leave them out for "unbounded". An exclusive
// bound is the next double inside it, keel::below(1.0) or keel::above(0.0) (below): in doubles,
// [0, below(1)] is [0, 1), and keel shows and checks it as that ("float in [0, 1)").
constexpr double kNoMin = 1.0, kNoMax = 0.0;

// A schema entry whose value reads as a T (bool, int64_t, double, std::string, or a vector of
// int64_t or double). It is a keel_option_desc: it goes into a schema array as it is.
template <class T>
struct Option : keel_option_desc {
  using Value = T;
};

constexpr Option<bool> opt_bool(const char* key, const char* def, const char* help) {
  return {{key, KEEL_OPT_BOOL, def, help, kNoMin, kNoMax, nullptr}};
}
constexpr Option<int64_t> opt_int(const char* key, const char* def, const char* help,
                                  double min = kNoMin, double max = kNoMax) {
  return {{key, KEEL_OPT_INT, def, help, min, max, nullptr}};
}
constexpr Option<double> opt_float(const char* key, const char* def, const char* help,
                                   double min = kNoMin, double max = kNoMax) {
  return {{key, KEEL_OPT_FLOAT, def, help, min, max, nullptr}};
}
constexpr Option<std::string> opt_string(const char* key, const char* def, const char* help,
                                         const char* choices = nullptr) {
  return {{key, KEEL_OPT_STRING, def, help, kNoMin, kNoMax, choices}};
}
// (ABI 1.2) A filesystem path: the kernel hands the factory an absolute path (abi.h).
constexpr Option<std::string> opt_path(const char* key, const char* def, const char* help) {
  return {{key, KEEL_OPT_PATH, def, help, kNoMin, kNoMax, nullptr}};
}
constexpr Option<std::vector<int64_t>> opt_int_list(const char* key, const char* def,
                                                    const char* help, double min = kNoMin,
                                                    double max = kNoMax) {
  return {{key, KEEL_OPT_INT_LIST, def, help, min, max, nullptr}};
}
constexpr Option<std::vector<double>> opt_float_list(const char* key, const char* def,
                                                     const char* help, double min = kNoMin,
                                                     double max = kNoMax) {
  return {{key, KEEL_OPT_FLOAT_LIST, def, help, min, max, nullptr}};
}
constexpr double kInf = std::numeric_limits<double>::infinity();

// The largest double below `x` and the smallest above it (x finite): the inclusive bound that
// stands for the exclusive bound x. constexpr, so that schemas stay constant tables (C:
// nextafter(x, -INFINITY), or a literal such as 0x1.fffffffffffffp-1 for below(1)).
constexpr double above(double x);
constexpr double below(double x) {
  constexpr double kTiny = std::numeric_limits<double>::denorm_min();
  if (x == 0) return -kTiny;
  if (x < 0) return -above(-x);
  double p = 1;  // the power of two with p <= x < 2p
  while (p > x) p /= 2;
  while (p * 2 <= x) p *= 2;
  // The doubles in [p, 2p) are p * epsilon apart, those just below p half that.
  const double gap = (x == p ? p / 2 : p) * std::numeric_limits<double>::epsilon();
  return x - (gap < kTiny ? kTiny : gap);
}
constexpr double above(double x) {
  constexpr double kTiny = std::numeric_limits<double>::denorm_min();
  if (x == 0) return kTiny;
  if (x < 0) return -below(-x);
  double p = 1;
  while (p > x) p /= 2;
  while (p * 2 <= x) p *= 2;
  const double gap = p * std::numeric_limits<double>::epsilon();
  return x + (gap < kTiny ? kTiny : gap);
}

}  // namespace keel
