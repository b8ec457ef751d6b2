// keel::Error: the exception type the kernel and its option checks (options.cpp, which
// keel::testing runs too) throw for bad input or a failing plugin (the command line adds
// cli::UsageError for its usage errors, exit status 2: tools/cli/usage.hpp).
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
