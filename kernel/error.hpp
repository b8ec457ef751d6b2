// keel::Error: the exception type the kernel throws for bad input or a failing plugin (main.cpp
// adds a UsageError for command-line usage, exit status 2).
// Its message is a single line that says what failed, where, and (after "; hint: ") what to do.
// main() prints it as "keel: error: <message>" and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace keel {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace keel
