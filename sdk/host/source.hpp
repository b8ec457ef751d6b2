// Where a TOML value came from, for the messages of the manifest (kernel/manifest.cpp) and of
// the option checks (options.cpp).
#pragma once

#include <string>

#include <toml++/toml.h>

namespace keel {

// The source path of a value a --set argument gave: "--set KEY=VALUE".
inline constexpr const char* kSetPrefix = "--set ";

// "file:line:col" of a node (or key), or the --set argument it came from.
std::string where(const toml::source_region& source);

}  // namespace keel
