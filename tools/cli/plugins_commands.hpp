// The subcommands of `keel plugins` other than the listing and `show` (plugins_list.cpp).
//
// flags.cpp parses the flags of `keel plugins` once (program_options) into PluginsArgs, and
// plugins_list.cpp calls the function of the subcommand named by the first positional argument.
// Each function checks that it got the arguments and flags it takes, and reports a wrong one by
// throwing UsageError(..., "plugins") (usage.hpp: "keel: error: <message>" plus the usage line of
// `keel plugins`, exit 2); any other failure throws keel::Error (one line, exit 1). They return
// the process's exit status.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cli/usage.hpp"

namespace keel::cli {

struct PluginsArgs {
  std::string subcommand;               // "new", "install", ...
  std::vector<std::string> positional;  // after the subcommand
  std::optional<std::string> kind;      // --kind
  std::optional<std::string> lang;      // --lang
  std::optional<std::string> prefix;    // --prefix
  std::optional<std::string> output;    // --output, -o
  bool force = false;                   // --force
  std::vector<std::string> update;      // --update NAME (repeatable)
  std::optional<std::string> manifest;  // --manifest

  // Throws UsageError naming the first flag that is set but not in `allowed` ("kind", "lang",
  // "prefix", "output", "force", "update", "manifest").
  void only_flags(const std::vector<std::string>& allowed) const;
};

// keel plugins new NAME --kind KIND [--lang c|cpp] DIR            (cli/plugins_new.cpp)
int plugins_new(const PluginsArgs& args);
// keel plugins reference                                          (cli/plugins_reference.cpp)
int plugins_reference(const PluginsArgs& args);
// keel plugins install PACKAGE [--prefix DIR] [--force]            (cli/plugins_package.cpp)
int plugins_install(const PluginsArgs& args);
// keel plugins remove NAME[@VERSION] [--prefix DIR]               (cli/plugins_package.cpp)
int plugins_remove(const PluginsArgs& args);
// keel plugins pack BUILD_DIR [--output FILE]                     (cli/plugins_package.cpp)
int plugins_pack(const PluginsArgs& args);
// keel plugins lock MANIFEST [--update NAME]...                   (cli/plugins_lock.cpp)
int plugins_lock(const PluginsArgs& args);

}  // namespace keel::cli
