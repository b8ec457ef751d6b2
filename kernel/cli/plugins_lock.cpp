// keel plugins lock MANIFEST: writes MANIFEST.lock, the plugin files the run loads.
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <set>

#include "loader/lock.hpp"
#include "loader/registry.hpp"
#include "manifest.hpp"
#include "plugins_commands.hpp"
#include "run_config.hpp"

namespace fs = std::filesystem;

namespace keel::cli {

int plugins_lock(const PluginsArgs& args) {
  args.only_flags({});
  if (args.positional.size() != 1)
    throw ArgError(std::string(args.positional.empty() ? "keel plugins lock: needs a MANIFEST"
                                                       : args.positional[1] +
                                                             ": unexpected argument (`keel "
                                                             "plugins lock` takes one MANIFEST)") +
                   "; hint: keel plugins lock configs/quickstart.toml");
  const std::string& manifest = args.positional[0];
  Registry registry;
  const Manifest m = load_manifest(manifest, {});
  // Resolved without the lock that may already exist: locking again takes the files as they
  // are now.
  const RunConfig cfg = resolve(m, registry, /*use_lock=*/false);
  Lock lock;
  lock.file = lock_path_for(manifest);
  for (const ComponentSpec* spec : used_components(cfg)) {
    const LoadedPlugin* p = spec->component->plugin;
    LockEntry* entry = nullptr;
    for (auto& e : lock.entries)
      if (e.sha256 == p->sha256) entry = &e;
    if (!entry) {
      lock.entries.push_back({p->name, p->version, fs::absolute(p->path).lexically_normal(),
                              p->sha256, {}});
      entry = &lock.entries.back();
    }
    const std::string c = std::string(kind_name(spec->component->kind)) + ":" + spec->component->name;
    if (std::find(entry->components.begin(), entry->components.end(), c) == entry->components.end())
      entry->components.push_back(c);
  }
  std::sort(lock.entries.begin(), lock.entries.end(),
            [](const LockEntry& a, const LockEntry& b) { return a.name < b.name; });
  write_lock(lock, manifest);
  std::printf("%s: %zu plugin%s locked\n", lock.file.c_str(), lock.entries.size(),
              lock.entries.size() == 1 ? "" : "s");
  for (const auto& e : lock.entries)
    std::printf("  %-22s %-8s %s  %s\n", e.name.c_str(), e.version.c_str(),
                e.sha256.substr(0, 16).c_str(), e.path.c_str());
  return 0;
}

}  // namespace keel::cli
