// Plugin discovery and loading.
//
// Discovery walks the search directories for *.so files and, for each, before anything of it
// runs:
//   1. opens it (O_RDONLY) and, unless KEEL_ALLOW_WRITABLE_PLUGINS=1, checks the path it was
//      found at with unsafe_path (safe_path.hpp): the file and every directory from / down to it,
//      through every symbolic link on the way (the link's own directory and its target's
//      directories), belong to this user or root and are not writable by group or others; a
//      sticky directory such as /tmp may be passed through (only the owner of an entry in it
//      can rename or delete the entry, and that entry must be this user's or root's), but the
//      directory holding the file (or the link) is never writable by others. The file the path
//      ends at must be the one opened (device and inode);
//   2. copies it into a sealed memfd (sealed_copy.hpp) and does every later check on
//      that copy, which nobody can change: what is checked and hashed is what is loaded (under
//      a file size limit below its size that cannot be raised, a file that passed step 1 is
//      used itself, see sealed_copy);
//   3. checks that its ELF dynamic symbol table defines `keel_plugin_entry` (elf.hpp): any
//      other library is skipped without being opened by the dynamic loader;
//   4. hashes it (SHA-256) and, when a lock is in use, refuses it unless the lock lists that
//      hash;
//   5. finds the libraries it needs the way the dynamic loader would (find_dependencies): its
//      RUNPATH entries must be absolute (or $ORIGIN paths inside its directory), exist, and,
//      like every LD_LIBRARY_PATH directory searched, pass unsafe_path; a library found in a
//      system directory is trusted; any other (a helper library beside it) must pass
//      unsafe_path too (unless KEEL_ALLOW_WRITABLE_PLUGINS=1), is copied into a sealed memfd
//      and hashed and, with a lock, must be listed with that hash in the plugin's lock entry
//      (KEEL_ALLOW_WRITABLE_PLUGINS never waives that);
//   6. loads those libraries from their sealed copies (needed ones first), so that the dynamic
//      loader finds each already loaded by its soname instead of searching for the file, then
//      dlopens the plugin's sealed copy (/proc/self/fd/N, RTLD_LOCAL | RTLD_NOW), calls
//      `keel_plugin_entry` and checks the descriptor (ABI version, struct sizes, build
//      fingerprint, component table, option schemas, strings bounded as abi.h says).
// A file that fails a check is recorded as a Refusal with the reason (and, from step 6 on,
// unloaded again); nothing of it is used. Loaded libraries stay loaded for the registry's
// lifetime, which must outlast every instance created from them; a library's sealed copy (one
// per distinct content), the dependencies preloaded and every plugin admitted stay loaded for
// the process's lifetime (a plugin's globals are not reset between the runs of one process).
//
// Two plugins may provide a component of the same kind and name; a manifest then names the
// one it wants as "plugin:component" (matches() returns both for the bare name). Two files of
// the same plugin name: the first found wins, the second is refused and kept in shadowed();
// resolve (run_config.cpp) warns on the console, naming both files and versions, and fails when
// the run uses a plugin whose shadowed copy has another version.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/dll/shared_library.hpp>

#include "keel/abi.h"
#include "lock.hpp"
#include "options.hpp"

namespace keel {

struct Dependency;  // dependencies.hpp

struct LoadedPlugin {
  std::string path;  // the file as found on the search path (it is loaded from a sealed copy)
  std::string sha256;
  // Its non-system dependencies (path and hash as found; loaded from sealed copies).
  std::vector<LockDependency> dependencies;
  // Bounded copies of the descriptor's strings (abi.h: names up to KEEL_NAME_CAPACITY - 1
  // bytes, other strings up to KEEL_STRING_CAPACITY - 1).
  std::string name;
  std::string version;
  std::string description;
  boost::dll::shared_library library;
  const keel_plugin_descriptor* descriptor = nullptr;
};

struct Component {
  keel_kind kind;
  std::string name;
  std::string description;
  Schema options;
  keel_factory_fn create = nullptr;
  const LoadedPlugin* plugin = nullptr;

  // "optimizer 'adamw' (plugin keel-optimizers)", for messages.
  std::string label() const;
  // "keel-optimizers:adamw", the name that picks this one when several plugins provide it.
  std::string qualified_name() const;
};

struct Refusal {
  std::string path;
  std::string reason;
  // False for a file that is not a keel plugin at all (no entry symbol, not a library).
  bool is_plugin = true;
  // The plugin name of the lock entry whose path this file is at, when the lock refused it for
  // a hash other than that entry's ("" otherwise).
  std::string changed_from_lock;
};

// A second file of a plugin already loaded, which was refused.
struct Shadowed {
  std::string name;
  std::string version;       // the refused copy's version
  std::string path;          // the refused copy
  const LoadedPlugin* used;  // the copy loaded
};

// A refusal's reason without its "; hint: ..." (to quote it inside another message).
std::string without_hint(const std::string& reason);

const char* kind_name(keel_kind kind);           // "lr_scheduler"
bool kind_from_name(const std::string& name, keel_kind* out);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(Registry&&) = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // From now on, load only files whose SHA-256 `lock` lists (call before discover). A file
  // whose hash differs is refused, naming the lock entry when its path is one the lock names.
  void use_lock(Lock lock);
  // Relocking (`keel plugins lock` over an existing lock): as use_lock, but a file at a path the
  // lock does not name also loads (a plugin new to the search path: as when locking the first
  // time, its code runs so that its name is known), and so does a changed file at the path of
  // an entry whose plugin name is in `updates` (the user reviewed it and named it). A changed
  // file at any other locked path is refused before its code runs, as under use_lock.
  void use_lock_for_relock(Lock lock, std::vector<std::string> updates);
  const Lock* lock() const { return lock_ ? &*lock_ : nullptr; }

  // Loads every plugin found in `dirs`, in order (recursively, files sorted by path).
  void discover(const std::vector<std::string>& dirs);
  // Loads one file; returns false (and records the refusal) when it is not a valid plugin.
  bool load(const std::string& path);

  // The components of `kind` that a manifest's `type` names: every component called `type`,
  // or, for "plugin:name", the one of that plugin. Several entries mean the bare name is
  // ambiguous.
  std::vector<const Component*> matches(keel_kind kind, const std::string& type) const;
  // The one component `type` names, or nullptr when none or several do.
  const Component* find(keel_kind kind, const std::string& type) const;
  std::vector<const Component*> of_kind(keel_kind kind) const;
  const LoadedPlugin* plugin_named(const std::string& name) const;
  const std::vector<std::unique_ptr<LoadedPlugin>>& plugins() const { return plugins_; }
  const std::vector<std::unique_ptr<Component>>& components() const { return components_; }
  const std::vector<Refusal>& refusals() const { return refusals_; }
  // Second copies of loaded plugins, refused (also in refusals()).
  const std::vector<Shadowed>& shadowed() const { return shadowed_; }
  // The refusals of files that are plugins, as one clause for an error line ("2 plugin files
  // were refused: a.so (why); b.so (why)"), or "" when there are none.
  std::string refusal_summary() const;

 private:
  std::string check(const LoadedPlugin& p, std::vector<std::unique_ptr<Component>>& out) const;
  bool load_checked(const std::string& path, int fd);
  // dlopens the checked copy at `load_fd` into `p.library`, calls its entry and checks the
  // descriptor and components (into `comps`); "" or why not.
  std::string open_plugin(LoadedPlugin& p, int load_fd,
                          std::vector<std::unique_ptr<Component>>& comps) const;
  // Whether the lock in use lets the file with `sha256` at `path` load: "" (with `*locked`, its
  // entry, or nullptr) or the refusal (with `*changed_plugin`, the plugin whose locked file it
  // replaces, when that is why).
  std::string lock_problem(const std::string& path, const std::string& sha256,
                           const LockEntry** locked, std::string* changed_plugin) const;
  // Whether the locked plugin `locked` may load its library `d`: "" or the refusal.
  std::string dependency_lock_problem(const LockEntry* locked, const Dependency& d) const;
  // Takes the loaded plugin `p` and its components `comps` into the registry: "" or, when a
  // plugin of the same name is already loaded, the refusal (`p` is then recorded in shadowed()
  // and left with the caller).
  std::string admit(std::unique_ptr<LoadedPlugin>& p,
                    std::vector<std::unique_ptr<Component>>& comps);

  std::vector<std::unique_ptr<LoadedPlugin>> plugins_;
  std::vector<std::unique_ptr<Component>> components_;
  std::vector<Refusal> refusals_;
  std::vector<Shadowed> shadowed_;
  std::optional<Lock> lock_;
  bool relock_ = false;               // use_lock_for_relock
  std::vector<std::string> updates_;  // its `updates`
  bool allow_writable_ = false;
};

// The default search path: `manifest_dirs`, then KEEL_PLUGIN_PATH (colon-separated), then the
// installed packages (installed.hpp: in default_install_root(), one version of each name: the
// highest that meets its requirement, else the highest), then the build tree's plugins/ when
// this executable runs from the build tree, else the install directory.
// A manifest's [plugins] require entry (run_config.hpp).
struct PluginRequirement {
  std::string name;
  std::string requirement;
  std::string where;  // file:line:col of the entry
};
std::vector<std::string> plugin_search_path(const std::vector<std::string>& manifest_dirs,
                                            const std::vector<PluginRequirement>& requirements = {});

// The kernel's own fingerprint values.
const char* kernel_torch_version();
int kernel_cxx11_abi();

}  // namespace keel
