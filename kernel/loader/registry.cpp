#include "registry.hpp"

#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace fs = std::filesystem;

namespace keel {
namespace {

struct KindName {
  keel_kind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {KEEL_KIND_MODEL, "model"},       {KEEL_KIND_DATASET, "dataset"},
    {KEEL_KIND_OPTIMIZER, "optimizer"}, {KEEL_KIND_LR_SCHEDULER, "lr_scheduler"},
    {KEEL_KIND_LOSS, "loss"},         {KEEL_KIND_GRAD_CLIPPER, "grad_clipper"},
    {KEEL_KIND_MFU, "mfu"},           {KEEL_KIND_PROFILER, "profiler"},
    {KEEL_KIND_CHECKPOINT, "checkpoint"}, {KEEL_KIND_HOOK, "hook"},
};

std::string str(const char* s) { return s ? s : ""; }

}  // namespace

const char* kind_name(keel_kind kind) {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k.name;
  return nullptr;
}

bool kind_from_name(const std::string& name, keel_kind* out) {
  for (const auto& k : kKinds)
    if (name == k.name) {
      *out = k.kind;
      return true;
    }
  return false;
}

const char* kernel_torch_version() { return TORCH_VERSION; }
int kernel_cxx11_abi() {
#ifdef _GLIBCXX_USE_CXX11_ABI
  return _GLIBCXX_USE_CXX11_ABI;
#else
  return -1;
#endif
}

std::string Component::label() const {
  return std::string(kind_name(kind)) + " '" + name + "' (plugin " +
         str(plugin->descriptor->name) + ")";
}

std::string Registry::check(const LoadedPlugin& p,
                            std::vector<std::unique_ptr<Component>>& out) const {
  const keel_plugin_descriptor* d = p.descriptor;
  std::ostringstream why;
  if (d->abi_major != KEEL_ABI_MAJOR) {
    why << "built for plugin ABI " << d->abi_major << "." << d->abi_minor << ", this keel speaks "
        << KEEL_ABI_MAJOR << "." << KEEL_ABI_MINOR << "; hint: rebuild the plugin against this "
        << "keel's SDK";
    return why.str();
  }
  if (d->struct_size < sizeof(keel_plugin_descriptor))
    return "descriptor is " + std::to_string(d->struct_size) + " bytes, ABI " +
           std::to_string(KEEL_ABI_MAJOR) + " needs at least " +
           std::to_string(sizeof(keel_plugin_descriptor));
  if (!d->name || !*d->name) return "descriptor has no plugin name";
  const keel_build_fingerprint& f = d->fingerprint;
  if (f.torch_version != nullptr &&
      (std::strcmp(f.torch_version, kernel_torch_version()) != 0 ||
       f.cxx11_abi != kernel_cxx11_abi())) {
    why << "build fingerprint mismatch: plugin built with LibTorch " << f.torch_version
        << " (_GLIBCXX_USE_CXX11_ABI=" << f.cxx11_abi << ", " << str(f.compiler)
        << "), keel uses LibTorch " << kernel_torch_version() << " (_GLIBCXX_USE_CXX11_ABI="
        << kernel_cxx11_abi() << "); hint: rebuild the plugin against this keel's SDK";
    return why.str();
  }
  if (d->component_count > 0 &&
      (d->components == nullptr || d->component_size < sizeof(keel_component_desc)))
    return "component table is missing or its entries are smaller than ABI " +
           std::to_string(KEEL_ABI_MAJOR) + " requires";

  const auto* base = reinterpret_cast<const unsigned char*>(d->components);
  for (uint32_t i = 0; i < d->component_count; ++i) {
    const auto* c = reinterpret_cast<const keel_component_desc*>(base + i * d->component_size);
    const std::string cname = str(c->name);
    if (!kind_name(c->kind))
      return "component " + std::to_string(i) + " ('" + cname + "') has unknown kind " +
             std::to_string(c->kind);
    if (cname.empty() || !c->create)
      return "component " + std::to_string(i) + " has no name or no factory";
    if (c->option_count > 0 && (!c->options || c->option_size < sizeof(keel_option_desc)))
      return "component '" + cname + "' has a malformed option table";
    auto comp = std::make_unique<Component>();
    comp->kind = c->kind;
    comp->name = cname;
    comp->description = str(c->description);
    comp->create = c->create;
    comp->plugin = &p;
    const auto* obase = reinterpret_cast<const unsigned char*>(c->options);
    for (uint32_t j = 0; j < c->option_count; ++j)
      comp->options.push_back(
          *reinterpret_cast<const keel_option_desc*>(obase + j * c->option_size));
    const std::string bad = check_schema(comp->options);
    if (!bad.empty()) return kind_name(c->kind) + std::string(" '") + cname + "': " + bad;
    if (const Component* other = find(c->kind, cname))
      return std::string(kind_name(c->kind)) + " '" + cname + "' is already provided by " +
             other->plugin->path + "; hint: remove one of the two files from the search path";
    for (const auto& mine : out)
      if (mine->kind == c->kind && mine->name == cname)
        return std::string("declares ") + kind_name(c->kind) + " '" + cname + "' twice";
    out.push_back(std::move(comp));
  }
  return "";
}

bool Registry::load(const std::string& path) {
  auto p = std::make_unique<LoadedPlugin>();
  p->path = path;
  auto refuse = [&](const std::string& reason) {
    refusals_.push_back({path, reason});
    return false;
  };
  try {
    p->library.load(path, boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now);
  } catch (const std::exception& e) {
    return refuse(std::string("not a loadable library: ") + e.what());
  }
  if (!p->library.has(KEEL_ENTRY_SYMBOL))
    return refuse(std::string("no entry symbol '") + KEEL_ENTRY_SYMBOL +
                  "'; hint: export it with KEEL_PLUGIN(...) or as extern \"C\"");
  auto entry = p->library.get<const keel_plugin_descriptor*()>(KEEL_ENTRY_SYMBOL);
  p->descriptor = entry();
  if (!p->descriptor) return refuse("keel_plugin_entry returned NULL");
  for (const auto& other : plugins_)
    if (std::strcmp(other->descriptor->name, str(p->descriptor->name).c_str()) == 0)
      return refuse("plugin '" + str(p->descriptor->name) + "' is already loaded from " +
                    other->path);
  std::vector<std::unique_ptr<Component>> comps;
  const std::string bad = check(*p, comps);
  if (!bad.empty()) return refuse(bad);
  for (auto& c : comps) components_.push_back(std::move(c));
  plugins_.push_back(std::move(p));
  return true;
}

void Registry::discover(const std::vector<std::string>& dirs) {
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<std::string> files;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      if (it->is_regular_file(ec) && it->path().extension() == ".so")
        files.push_back(it->path().string());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) load(f);
  }
}

const Component* Registry::find(keel_kind kind, const std::string& name) const {
  for (const auto& c : components_)
    if (c->kind == kind && c->name == name) return c.get();
  return nullptr;
}

std::vector<const Component*> Registry::of_kind(keel_kind kind) const {
  std::vector<const Component*> out;
  for (const auto& c : components_)
    if (c->kind == kind) out.push_back(c.get());
  return out;
}

std::vector<std::string> plugin_search_path(const std::vector<std::string>& manifest_dirs) {
  std::vector<std::string> dirs = manifest_dirs;
  if (const char* env = std::getenv("KEEL_PLUGIN_PATH")) {
    std::stringstream s(env);
    std::string item;
    while (std::getline(s, item, ':'))
      if (!item.empty()) dirs.push_back(item);
  }
  // A keel running from its build tree uses the plugins built beside it; an installed keel
  // uses the installed ones (never a build tree that happens to still exist).
  std::error_code ec;
  const std::string exe = fs::read_symlink("/proc/self/exe", ec).string();
  const std::string build_root = KEEL_BUILD_ROOT;
  const bool in_build_tree = !ec && exe.rfind(build_root + "/", 0) == 0;
  dirs.push_back(in_build_tree ? KEEL_BUILD_PLUGIN_DIR : KEEL_INSTALL_PLUGIN_DIR);
  // The same directory twice (build dir == install dir) would only yield duplicates.
  std::vector<std::string> unique;
  for (const auto& d : dirs) {
    std::error_code ec;
    const std::string key = fs::weakly_canonical(d, ec).string();
    bool seen = false;
    for (const auto& u : unique) seen |= fs::weakly_canonical(u, ec).string() == key;
    if (!seen) unique.push_back(d);
  }
  return unique;
}

}  // namespace keel
