// Plugin discovery and loading.
//
// Every *.so under the search directories is opened with Boost.DLL (RTLD_LOCAL | RTLD_NOW),
// its `keel_plugin_entry` called, and the descriptor checked (ABI major, struct sizes, build
// fingerprint, component table, option defaults). A file that fails any check is unloaded
// again and recorded as a Refusal with the reason; nothing of it is used. Loaded libraries stay
// loaded for the registry's lifetime, which must outlast every instance created from them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <boost/dll/shared_library.hpp>

#include "keel/abi.h"
#include "options.hpp"

namespace keel {

struct LoadedPlugin {
  std::string path;
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
};

struct Refusal {
  std::string path;
  std::string reason;
};

const char* kind_name(keel_kind kind);           // "lr_scheduler"
bool kind_from_name(const std::string& name, keel_kind* out);

class Registry {
 public:
  // Loads every plugin found in `dirs`, in order; a plugin name or component already
  // registered from an earlier directory wins and the later file is refused as a duplicate.
  void discover(const std::vector<std::string>& dirs);
  // Loads one file; returns false (and records the refusal) when it is not a valid plugin.
  bool load(const std::string& path);

  const Component* find(keel_kind kind, const std::string& name) const;
  std::vector<const Component*> of_kind(keel_kind kind) const;
  const std::vector<std::unique_ptr<LoadedPlugin>>& plugins() const { return plugins_; }
  const std::vector<std::unique_ptr<Component>>& components() const { return components_; }
  const std::vector<Refusal>& refusals() const { return refusals_; }

 private:
  std::string check(const LoadedPlugin& p, std::vector<std::unique_ptr<Component>>& out) const;

  std::vector<std::unique_ptr<LoadedPlugin>> plugins_;
  std::vector<std::unique_ptr<Component>> components_;
  std::vector<Refusal> refusals_;
};

// The default search path: `manifest_dirs`, then KEEL_PLUGIN_PATH (colon-separated), then the
// build tree's plugins/ when this executable runs from the build tree, else the install
// directory.
std::vector<std::string> plugin_search_path(const std::vector<std::string>& manifest_dirs);

// The kernel's own fingerprint values.
const char* kernel_torch_version();
int kernel_cxx11_abi();

}  // namespace keel
