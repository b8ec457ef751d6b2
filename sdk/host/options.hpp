// Option values: validated against a schema (keel_option_desc, the same description plugins
// publish) and handed to factories as the opaque keel_options of abi.h.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <toml++/toml.h>

#include "keel/abi.h"

using KeelOptionValue = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>,
                                     std::vector<double>>;

// Definition of the ABI's opaque options type: one component's validated values.
struct keel_options {
  std::map<std::string, KeelOptionValue> values;
};

namespace keel {

using Schema = std::vector<keel_option_desc>;

// Checks every key of `table` against `schema` (keys in `reserved` are skipped: they belong to
// the kernel, like `type`), fills in defaults, and returns the typed values. `section` is the
// dotted manifest section used in messages ("optimizer"); `show_command` is the command that
// documents the schema, named in hints ("keel plugins show adamw", "keel options train").
// PATH values are made absolute (see KEEL_OPT_PATH). Throws keel::Error with file:line:col on
// the first problem.
keel_options validate_options(const toml::table& table, const std::string& section,
                              const std::string& show_command, const Schema& schema,
                              const std::set<std::string>& reserved = {});

// Checks that every default in `schema` is valid for its own option; returns "" when all are,
// else a description of the first bad one (used to refuse broken plugins at load).
std::string check_schema(const Schema& schema);

// `path` (the string value of node `n`) made absolute: relative to the directory of the
// manifest file that set it, or to the working directory for --set values and defaults
// ("" stays ""). KEEL_OPT_PATH options and [plugins] paths use it.
std::string absolute_path(const toml::node& n, const std::string& path);

// Human-readable type of an option: "float in [0, 1]", "string (one of mean|sum)".
std::string describe(const keel_option_desc& option);

// The values back as TOML, for manifest.resolved.toml.
toml::table to_toml(const keel_options& options);

}  // namespace keel
