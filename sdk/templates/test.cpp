// Tests of @{component}, run by `meson test -C build`. keel/testing.hpp (installed with the keel
// SDK) creates the component from this plugin's own descriptor, with the options a test gives
// (schema defaults for the rest), over a host that works on at::Tensor.
#include "keel/testing.hpp"  // first: LibTorch's glog CHECK macros would replace doctest's

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

@{includes}// The plugin under test: meson.build links the plugin's object files into this test.
extern "C" const keel_plugin_descriptor* keel_plugin_entry(void);

@{body}
