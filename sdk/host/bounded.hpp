// Reading strings a plugin hands the kernel (or keel::testing's host), never past their bound
// (abi.h: "Strings a plugin hands the kernel are read with a bound").
#pragma once

#include <cstring>
#include <string>

#include "keel/abi.h"

namespace keel {

// Whether `s` is non-NULL and NUL-terminated within `capacity` bytes (its length is at most
// capacity - 1).
inline bool terminated_within(const char* s, size_t capacity) {
  return s != nullptr && strnlen(s, capacity) < capacity;
}

// A copy of `s` up to its NUL or `capacity` - 1 bytes, whichever comes first; "" for NULL.
inline std::string bounded(const char* s, size_t capacity = KEEL_STRING_CAPACITY) {
  return s ? std::string(s, strnlen(s, capacity - 1)) : std::string();
}

}  // namespace keel
