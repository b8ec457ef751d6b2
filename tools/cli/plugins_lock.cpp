// keel plugins lock MANIFEST [--update NAME]...: writes MANIFEST.lock, the plugin files the run
// loads.
//
// The first lock takes the files as they are (their code runs: a lock can only pin what it has
// loaded). Over an existing lock (the manifest's, or the one it runs under along its `extends`
// chain), a locked file that changed is refused before its code runs unless --update names its
// plugin, and a plugin the lock pins that now comes from another file (one new on the search
// path) is not pinned unless --update names it (Registry::use_lock_for_relock).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "loader/lock.hpp"
#include "loader/registry.hpp"
#include "manifest.hpp"
#include "plugins_commands.hpp"
#include "run_config.hpp"

namespace fs = std::filesystem;

namespace keel::cli {
namespace {

// The first file the relocking registry refused because it changed since `lock`, as an error.
void refuse_changed_files(const Registry& registry, const Lock& lock, const std::string& manifest) {
  for (const Refusal& r : registry.refusals()) {
    if (r.changed_from_lock.empty()) continue;
    const LockEntry* e = lock.by_path(r.path);
    throw Error("keel plugins lock " + manifest + ": " + r.path + " changed since " + lock.file +
                " pinned plugin " + r.changed_from_lock +
                (e ? " " + e->version + " (sha256 " + e->sha256.substr(0, 16) + "...)" : "") +
                "; its code was not run; hint: review the new file, then `keel plugins lock " +
                manifest + " --update " + r.changed_from_lock + "`");
  }
}

}  // namespace

int plugins_lock(const PluginsArgs& args) {
  args.only_flags({"update"});
  if (args.positional.size() != 1)
    throw UsageError(std::string(args.positional.empty()
                                     ? "keel plugins lock: needs a MANIFEST"
                                     : args.positional[1] + ": unexpected argument (`keel "
                                                            "plugins lock` takes one MANIFEST)") +
                         "; hint: keel plugins lock configs/quickstart.toml",
                     "plugins");
  const std::string& manifest = args.positional[0];
  Registry registry;
  const Manifest m = load_manifest(manifest, {});
  // Not manifest_lock: [plugins] locked = true must not keep the first lock from being written.
  const std::optional<Lock> previous = find_lock(m.files);
  for (const auto& name : args.update) {
    const bool pinned = previous && std::any_of(previous->entries.begin(),
                                                previous->entries.end(),
                                                [&](const LockEntry& e) { return e.name == name; });
    if (!pinned)
      throw UsageError("--update " + name + ": " +
                       (previous ? previous->file + " pins no plugin named '" + name + "'"
                                 : std::string("there is no lock to update yet")) +
                       "; hint: --update names a plugin the lock pins (keel plugins lock " +
                       manifest + " without --update writes a first lock)", "plugins");
  }
  if (previous) registry.use_lock_for_relock(*previous, args.update);
  RunConfig cfg;
  try {
    cfg = resolve(m, registry, /*use_lock=*/false);
  } catch (const Error&) {
    // A refused changed file explains a missing component better than the error it caused.
    if (previous) refuse_changed_files(registry, *previous, manifest);
    throw;
  }
  if (previous) refuse_changed_files(registry, *previous, manifest);
  Lock lock;
  lock.file = lock_path_for(manifest);
  for (const ComponentSpec* spec : used_components(cfg)) {
    const LoadedPlugin* p = spec->component->plugin;
    if (previous)
      for (const LockEntry& e : previous->entries)
        if (e.name == p->name && e.sha256 != p->sha256 &&
            std::find(args.update.begin(), args.update.end(), e.name) == args.update.end())
          throw Error("keel plugins lock " + manifest + ": plugin " + p->name + " now comes from " +
                      p->path + " (sha256 " + p->sha256.substr(0, 16) + "...), not from the file " +
                      previous->file + " pins (" + e.path + ", sha256 " +
                      e.sha256.substr(0, 16) + "...); hint: review it, then `keel plugins lock " +
                      manifest + " --update " + e.name + "`, or remove it from the search path");
    LockEntry* entry = nullptr;
    for (auto& e : lock.entries)
      if (e.sha256 == p->sha256) entry = &e;
    if (!entry) {
      lock.entries.push_back({p->name, p->version, fs::absolute(p->path).lexically_normal(),
                              p->sha256, {}, p->dependencies});
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
