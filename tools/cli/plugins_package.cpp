// keel plugins install | remove | pack: thin wrappers around package/package.hpp.
#include <cstdio>

#include "package/package.hpp"
#include "plugins_commands.hpp"
#include "text/text.hpp"

namespace keel::cli {
namespace {

// The one positional argument of `keel plugins <sub>`, or UsageError.
const std::string& one_positional(const PluginsArgs& args, const char* what) {
  if (args.positional.size() != 1)
    throw UsageError("keel plugins " + args.subcommand + ": needs exactly one " + what + ", got " +
                     std::to_string(args.positional.size()) + " arguments; hint: keel plugins " +
                     args.subcommand + " " + what, "plugins");
  return args.positional[0];
}

std::string root_of(const PluginsArgs& args) {
  if (args.prefix) {
    if (args.prefix->empty())
      throw UsageError(
            "--prefix: an empty directory name; hint: --prefix DIR names the plugin "
            "directory", "plugins");
    return *args.prefix;
  }
  return default_install_root();
}

}  // namespace

int plugins_install(const PluginsArgs& args) {
  args.only_flags({"prefix", "force"});
  const std::string& package = one_positional(args, "PACKAGE");
  bool replaced = false;
  const InstalledPackage p = install_package(package, root_of(args), args.force, &replaced);
  std::printf("%s %s %s into %s (components: %s)\n", replaced ? "replaced" : "installed",
              p.info.name.c_str(), p.info.version.c_str(), p.dir.c_str(),
              p.info.components.empty() ? "none" : text::join(p.info.components).c_str());
  return 0;
}

int plugins_remove(const PluginsArgs& args) {
  args.only_flags({"prefix"});
  const std::string& spec = one_positional(args, "NAME[@VERSION]");
  const size_t at = spec.find('@');
  const std::string name = spec.substr(0, at);
  std::optional<std::string> version;
  if (at != std::string::npos) version = spec.substr(at + 1);
  if (name.empty() || (version && version->empty()))
    throw UsageError("'" + spec +
                     "': not NAME or NAME@VERSION; hint: e.g. keel plugins remove "
                     "acme-losses@1.2.0", "plugins");
  const std::string root = root_of(args);
  const std::string removed = remove_package(root, name, version);
  std::printf("removed %s %s from %s\n", name.c_str(), removed.c_str(), root.c_str());
  return 0;
}

int plugins_pack(const PluginsArgs& args) {
  args.only_flags({"output"});
  const std::string& build_dir = one_positional(args, "BUILD_DIR");
  if (args.output && args.output->empty())
    throw UsageError(
          "--output: an empty file name; hint: --output NAME-VERSION.tar.gz, or a "
          "directory name for an unpacked package", "plugins");
  PackageInfo info;
  const std::string out = pack_package(build_dir, args.output, &info);
  std::vector<std::string> files;
  for (const auto& f : info.files) files.push_back(f.first);
  std::printf("packed %s %s (%s) into %s\n", info.name.c_str(), info.version.c_str(),
              text::join(files).c_str(), out.c_str());
  return 0;
}

}  // namespace keel::cli
