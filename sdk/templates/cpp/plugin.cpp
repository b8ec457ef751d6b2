// @{name}: a keel plugin with one @{kind}, `@{component}` (@{summary}).
// Written by `keel plugins new`; yours to change. keel/abi.h says when keel calls each slot and
// from which thread; keel/plugin.hpp is the C++ layer this file uses.
@{includes}#include "keel/plugin.hpp"

namespace {

@{body}

}  // namespace

// PLUGIN_VERSION is meson.build's project(version: ...), passed in by its cpp_args.
KEEL_PLUGIN("@{name}", PLUGIN_VERSION, "@{summary}", kComponents)
