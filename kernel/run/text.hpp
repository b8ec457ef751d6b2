// The loop's small text helpers, in one place (shapes and numbers in messages).
#pragma once

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <cmath>
#include <string>

namespace keel {

// "[2, 3]"
inline std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

inline std::string shape_of(const at::Tensor& t) { return shape_text(t.sizes()); }

// A value for a message: its shortest exact form, "nan" for NaN.
inline std::string number_text(double v) {
  return std::isnan(v) ? "nan" : fmt::format("{}", v);
}

}  // namespace keel
