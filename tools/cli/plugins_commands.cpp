#include "plugins_commands.hpp"

namespace keel::cli {

void PluginsArgs::only_flags(const std::vector<std::string>& allowed) const {
  const std::string where = subcommand.empty() ? "keel plugins" : "keel plugins " + subcommand;
  auto check = [&](bool set, const char* flag) {
    if (!set) return;
    for (const auto& a : allowed)
      if (a == flag) return;
    throw UsageError(std::string("--") + flag + ": `" + where + "` does not take it; hint: `keel " +
                     "plugins --help` says which subcommand takes which flag", "plugins");
  };
  check(kind.has_value(), "kind");
  check(lang.has_value(), "lang");
  check(prefix.has_value(), "prefix");
  check(output.has_value(), "output");
  check(force, "force");
  check(!update.empty(), "update");
  check(manifest.has_value(), "manifest");
}

}  // namespace keel::cli
