/* @{name}: a keel plugin in plain C99 with one @{kind}, `@{component}` (@{summary}).
 * Written by `keel plugins new`; yours to change. It needs keel/abi.h alone, not LibTorch:
 * tensors and options go through the host functions (keel_host). keel/abi.h says when keel
 * calls each slot and from which thread. */
@{includes}#include "keel/abi.h"

@{body}

#ifdef __VERSION__
#define PLUGIN_COMPILER __VERSION__
#else
#define PLUGIN_COMPILER "unknown"
#endif

/* PLUGIN_VERSION is meson.build's project(version: ...), passed in by its c_args. */
static const keel_plugin_descriptor descriptor = {
    .abi_major = KEEL_ABI_MAJOR,
    .abi_minor = KEEL_ABI_MINOR,
    .struct_size = sizeof(keel_plugin_descriptor),
    .name = "@{name}",
    .version = PLUGIN_VERSION,
    .description = "@{summary}",
    .fingerprint = {NULL, PLUGIN_COMPILER, -1}, /* plain C: no LibTorch, no C++ ABI */
    .components = components,
    .component_count = sizeof components / sizeof components[0],
    .component_size = sizeof(keel_component_desc),
};

KEEL_EXPORT const keel_plugin_descriptor* keel_plugin_entry(void) { return &descriptor; }
