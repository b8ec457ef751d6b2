// toml++'s implementation, compiled once, with the fuzz flags (its parser is instrumented like
// the code that calls it); every other source of the fuzz targets includes toml++ with
// TOML_HEADER_ONLY=0 and links this.
#define TOML_IMPLEMENTATION
#include <toml++/toml.h>
