// TOML text for manifest.resolved.toml and for the values --resume names: laid out as toml++
// writes it (a table's values, then its tables, then its arrays of tables), except that every
// float is written in the shortest form that reads back as the same double ("0.0003" where
// toml++ writes 17 significant digits, "0.00029999999999999997"). LibTorch-free.
#pragma once

#include <string>

#include <toml++/toml.h>

namespace keel {

// The shortest text of `v` that reads back as `v` (1 to 17 significant digits, std::to_chars'
// general form), with ".0" where it would read as an integer; inf, -inf and nan as TOML writes
// them.
std::string float_text(double v);

// One value (not a table header): floats by float_text, arrays element by element (and inline
// tables key by key), anything else as toml++ writes it with `flags` (format_flags::none:
// strings in double quotes with escapes; the default: literal strings where they can be).
std::string value_text_of(const toml::node& value,
                          toml::format_flags flags = toml::toml_formatter::default_flags);

// A whole document that reads back as `table` (tables left without a header when they hold
// only tables, as toml++ does).
std::string toml_text(const toml::table& table);

}  // namespace keel
