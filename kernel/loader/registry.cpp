#include "registry.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "bounded.hpp"
#include "dependencies.hpp"
#include "digest.hpp"
#include "elf.hpp"
#include "error.hpp"
#include "loader/installed.hpp"
#include "safe_path.hpp"
#include "sealed_copy.hpp"
#include "unique_fd.hpp"

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
    {KEEL_KIND_SPARSE_OPTIMIZER, "sparse_optimizer"}, {KEEL_KIND_STEP, "step"},
};

}  // namespace

std::string without_hint(const std::string& reason) {
  return reason.substr(0, reason.find("; hint: "));
}

namespace {

constexpr const char* kWritableHint =
    "; hint: chmod go-w it and every directory on its path (and keep them yours or root's), or "
    "set KEEL_ALLOW_WRITABLE_PLUGINS=1 to load it anyway";

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
  return std::string(kind_name(kind)) + " '" + name + "' (plugin " + plugin->name + ")";
}

std::string Component::qualified_name() const { return plugin->name + ":" + name; }

Registry::Registry() {
  const char* allow = std::getenv("KEEL_ALLOW_WRITABLE_PLUGINS");
  allow_writable_ = allow && std::string(allow) == "1";
}

void Registry::use_lock(Lock lock) { lock_ = std::move(lock); }

void Registry::use_lock_for_relock(Lock lock, std::vector<std::string> updates) {
  lock_ = std::move(lock);
  relock_ = true;
  updates_ = std::move(updates);
}

namespace {

// One entry of a plugin's component table, checked and copied into `*comp` (its options point
// into the plugin); "" or why it is malformed.
std::string component_problem(const keel_component_desc& c, uint32_t i, Component* comp) {
  constexpr size_t kOption10 = sizeof(keel_option_desc);  // ABI 1.0's size (see check)
  if (c.name && !terminated_within(c.name, KEEL_NAME_CAPACITY))
    return fmt::format("component {}'s name does not end within {} bytes", i,
                       KEEL_NAME_CAPACITY - 1);
  const std::string cname = bounded(c.name, KEEL_NAME_CAPACITY);
  if (!kind_name(c.kind))
    return fmt::format("component {} ('{}') has unknown kind {}", i, cname,
                       static_cast<int>(c.kind));
  if (cname.empty() || !c.create)
    return fmt::format("component {} has no name or no factory", i);
  if (cname.find(':') != std::string::npos)
    return "component '" + cname + "': a name must not contain ':' (it separates the plugin "
           "name in a manifest's type)";
  if (c.option_count > 0 && (!c.options || c.option_size < kOption10))
    return "component '" + cname + "' has a malformed option table";
  comp->kind = c.kind;
  comp->name = cname;
  comp->description = bounded(c.description);
  comp->create = c.create;
  const auto* obase = reinterpret_cast<const unsigned char*>(c.options);
  for (uint32_t j = 0; j < c.option_count; ++j) {
    const auto& o = *reinterpret_cast<const keel_option_desc*>(obase + j * c.option_size);
    // The schema keeps pointers into the plugin: each string must end within its bound.
    const std::string at = fmt::format("component '{}' option {}", cname, j);
    if (o.key && !terminated_within(o.key, KEEL_NAME_CAPACITY))
      return fmt::format("{}: key does not end within {} bytes", at, KEEL_NAME_CAPACITY - 1);
    for (const auto& [field, text] : {std::pair{"default_toml", o.default_toml},
                                      {"help", o.help}, {"choices", o.choices}})
      if (text && !terminated_within(text, KEEL_STRING_CAPACITY))
        return fmt::format("{} ('{}'): {} does not end within {} bytes", at,
                           bounded(o.key, KEEL_NAME_CAPACITY), field, KEEL_STRING_CAPACITY - 1);
    comp->options.push_back(o);
  }
  const std::string bad = check_schema(comp->options);
  return bad.empty() ? "" : kind_name(c.kind) + std::string(" '") + cname + "': " + bad;
}

}  // namespace

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
  if (d->abi_minor > KEEL_ABI_MINOR) {
    why << "built for plugin ABI " << d->abi_major << "." << d->abi_minor
        << ", newer than this keel's " << KEEL_ABI_MAJOR << "." << KEEL_ABI_MINOR
        << "; hint: upgrade keel, or rebuild the plugin against this keel's SDK";
    return why.str();
  }
  // The sizes ABI 1.0 gave these structs (unchanged since: test_abi_versions asserts it). When
  // one grows, an older plugin's smaller one stays valid: compare with 1.0's size, never with
  // the current sizeof.
  constexpr size_t kDescriptor10 = sizeof(keel_plugin_descriptor);
  constexpr size_t kComponent10 = sizeof(keel_component_desc);
  if (d->struct_size < kDescriptor10)
    return fmt::format("descriptor is {} bytes, ABI {} needs at least {}", d->struct_size,
                       KEEL_ABI_MAJOR, kDescriptor10);
  if (!d->name || !*d->name) return "descriptor has no plugin name";
  if (!terminated_within(d->name, KEEL_NAME_CAPACITY))
    return fmt::format("descriptor's plugin name does not end within {} bytes",
                       KEEL_NAME_CAPACITY - 1);
  const keel_build_fingerprint& f = d->fingerprint;
  if (f.torch_version != nullptr &&
      (bounded(f.torch_version) != kernel_torch_version() || f.cxx11_abi != kernel_cxx11_abi())) {
    why << "build fingerprint mismatch: plugin built with LibTorch " << bounded(f.torch_version)
        << " (_GLIBCXX_USE_CXX11_ABI=" << f.cxx11_abi << ", " << bounded(f.compiler)
        << "), keel uses LibTorch " << kernel_torch_version() << " (_GLIBCXX_USE_CXX11_ABI="
        << kernel_cxx11_abi() << "); hint: rebuild the plugin against this keel's SDK";
    return why.str();
  }
  if (d->component_count > 0 &&
      (d->components == nullptr || d->component_size < kComponent10))
    return fmt::format(
        "component table is missing or its entries are smaller than ABI {} requires",
        KEEL_ABI_MAJOR);

  const auto* base = reinterpret_cast<const unsigned char*>(d->components);
  for (uint32_t i = 0; i < d->component_count; ++i) {
    const auto* c = reinterpret_cast<const keel_component_desc*>(base + i * d->component_size);
    auto comp = std::make_unique<Component>();
    if (std::string bad = component_problem(*c, i, comp.get()); !bad.empty()) return bad;
    comp->plugin = &p;
    for (const auto& mine : out)
      if (mine->kind == c->kind && mine->name == comp->name)
        return std::string("declares ") + kind_name(c->kind) + " '" + comp->name + "' twice";
    out.push_back(std::move(comp));
  }
  return "";
}

bool Registry::load(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    refusals_.push_back({path, std::string("cannot open it: ") + std::strerror(errno), false, ""});
    return false;
  }
  const bool ok = load_checked(path, fd);
  close(fd);
  return ok;
}

namespace {

// The sealed copy dlopen loads a plugin through, one per distinct content (SHA-256) for the
// whole process, never closed. The dynamic loader knows a library by the name it was opened
// with, /proc/self/fd/N, and takes a later dlopen of the same name for the library already
// loaded (a C++ plugin stays loaded after dlclose): were N closed and reused for another file, a
// later load would get the wrong library. One descriptor per content keeps each name bound to
// its bytes; a second copy of the same bytes is closed again.
int load_descriptor(int memfd, const std::string& sha256) {
  static std::mutex mutex;
  static std::map<std::string, int> fds;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = fds.find(sha256); it != fds.end()) {
    close(memfd);
    return it->second;
  }
  fds.emplace(sha256, memfd);
  return memfd;
}

// Keeps the admitted plugin at /proc/self/fd/`load_fd` loaded to the end of the process, once
// per content (load_descriptor keeps that descriptor, so the name stays bound to these bytes).
// A later registry that loads the same bytes (the next run of an in-process caller) then finds
// the library loaded by its name, where mapping it again would walk the dependencies of
// everything it needs against every library loaded: with Debian's LibTorch 1.13 (about 300
// libraries in the process) 70 to 115 ms for the 17 first-party plugins, 6 ms with the wheel's.
void pin_library(int load_fd) {
  static std::mutex mutex;
  static std::set<int> pinned;
  std::lock_guard<std::mutex> lock(mutex);
  if (!pinned.insert(load_fd).second) return;
  // RTLD_NOLOAD: one more reference to the library already loaded, never released.
  dlopen(("/proc/self/fd/" + std::to_string(load_fd)).c_str(),
         RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
}

// Why another user could change what `path` names (safe_path.hpp's rule), or why `path` no
// longer names the file opened as `opened`: "" when neither.
std::string replaced_or_writable(const std::string& path, const struct stat& opened) {
  struct stat named;
  std::string bad = unsafe_path(path, false, &named);
  if (bad.empty() && (named.st_dev != opened.st_dev || named.st_ino != opened.st_ino))
    bad = "its path named another file when it was checked than when it was opened";
  return bad;
}

// The libraries the plugin in `memfd` (found at `path`) brings with it, into `deps`: "" or why
// they cannot be found or trusted.
std::string plugin_dependencies(int memfd, const std::string& path, bool strict,
                                std::vector<Dependency>* deps) {
  std::error_code ec;
  const std::string origin = fs::canonical(path, ec).parent_path().string();
  if (ec) return "cannot resolve its path: " + ec.message();
  const std::string bad = find_dependencies(memfd, origin, strict, deps);
  return bad.empty() ? "" : "not loaded: " + bad;
}

}  // namespace

Registry::~Registry() = default;

bool Registry::load_checked(const std::string& path, int fd) {
  auto refuse = [&](const std::string& reason, bool is_plugin = true) {
    refusals_.push_back({path, reason, is_plugin, ""});
    return false;
  };
  struct stat st;
  if (fstat(fd, &st) != 0) return refuse(std::string("cannot stat it: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return refuse("not a regular file", false);
  // 1. Nobody else can have changed it, or what its path names.
  if (!allow_writable_)
    if (const std::string bad = replaced_or_writable(path, st); !bad.empty())
      return refuse("not loaded: " + bad + kWritableHint);
  // 2. A copy nobody can change: everything below checks, hashes and loads that.
  std::string copy_error;
  UniqueFd copy(sealed_copy(fd, fs::path(path).filename().string(), !allow_writable_, &copy_error));
  if (copy.get() < 0) return refuse(copy_error);
  const int memfd = copy.get();
  // 3. A keel plugin, told from its symbol table without running it.
  const std::string not_plugin = elf_plugin_check(memfd);
  if (!not_plugin.empty()) return refuse("not a keel plugin: " + not_plugin, false);
  // 4. Its hash, and the lock.
  auto p = std::make_unique<LoadedPlugin>();
  p->path = path;
  try {
    p->sha256 = sha256_hex(memfd, path);
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  const LockEntry* locked = nullptr;
  {
    std::string changed_plugin;
    if (std::string bad = lock_problem(path, p->sha256, &locked, &changed_plugin); !bad.empty()) {
      refuse(bad);
      refusals_.back().changed_from_lock = changed_plugin;
      return false;
    }
  }
  // 5. The libraries it brings with it.
  std::vector<Dependency> deps;
  if (const std::string bad = plugin_dependencies(memfd, path, !allow_writable_, &deps);
      !bad.empty())
    return refuse(bad);
  struct DepCloser {
    std::vector<Dependency>* deps;
    ~DepCloser() {
      for (auto& d : *deps)
        if (d.memfd >= 0) close(d.memfd);
    }
  } dep_closer{&deps};
  for (const Dependency& d : deps) {
    p->dependencies.push_back({d.needed, d.path, d.sha256});
    if (std::string bad = dependency_lock_problem(locked, d); !bad.empty()) return refuse(bad);
  }
  // 6. Load what was checked: the libraries first, then the plugin, from their sealed copies.
  for (Dependency& d : deps)
    if (d.memfd >= 0)
      if (const std::string bad = preload_dependency(d); !bad.empty())
        return refuse("its library " + d.needed + " (" + d.path + ") does not load: " + bad);
  const int load_fd = load_descriptor(copy.release(), p->sha256);  // kept there, or closed
  std::vector<std::unique_ptr<Component>> comps;
  if (std::string bad = open_plugin(*p, load_fd, comps); !bad.empty()) return refuse(bad);
  p->name = bounded(p->descriptor->name, KEEL_NAME_CAPACITY);
  p->version = bounded(p->descriptor->version);
  p->description = bounded(p->descriptor->description);
  // 7. One plugin per name.
  if (std::string bad = admit(p, comps); !bad.empty()) return refuse(bad);
  pin_library(load_fd);
  return true;
}

std::string Registry::admit(std::unique_ptr<LoadedPlugin>& p,
                            std::vector<std::unique_ptr<Component>>& comps) {
  for (const auto& other : plugins_)
    if (other->name == p->name) {
      shadowed_.push_back({p->name, p->version, p->path, other.get()});
      return "plugin '" + p->name + "' " + p->version + " is already loaded from " +
             other->path + " (version " + other->version + "); hint: remove one of the two "
             "files from the search path";
    }
  for (auto& c : comps) components_.push_back(std::move(c));
  plugins_.push_back(std::move(p));
  return "";
}

std::string Registry::open_plugin(LoadedPlugin& p, int load_fd,
                                  std::vector<std::unique_ptr<Component>>& comps) const {
  try {
    p.library.load("/proc/self/fd/" + std::to_string(load_fd),
                   boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now);
  } catch (const std::exception& e) {
    return std::string("not a loadable library: ") + e.what();
  }
  if (!p.library.has(KEEL_ENTRY_SYMBOL))
    return std::string("no entry symbol '") + KEEL_ENTRY_SYMBOL +
           "'; hint: export it with KEEL_PLUGIN(...) or as extern \"C\"";
  auto entry = p.library.get<const keel_plugin_descriptor*()>(KEEL_ENTRY_SYMBOL);
  p.descriptor = entry();
  if (!p.descriptor) return "keel_plugin_entry returned NULL";
  return check(p, comps);
}

std::string Registry::lock_problem(const std::string& path, const std::string& sha256,
                                   const LockEntry** locked, std::string* changed_plugin) const {
  *locked = lock_ ? lock_->by_sha256(sha256) : nullptr;
  if (!lock_ || *locked) return "";
  const LockEntry* e = lock_->by_path(path);
  const bool relock_allows =
      relock_ && (!e || std::find(updates_.begin(), updates_.end(), e->name) != updates_.end());
  if (relock_allows) return "";
  if (e) {
    *changed_plugin = e->name;
    return "not loaded: its sha256 " + sha256.substr(0, 16) + "... differs from " +
           e->sha256.substr(0, 16) + "... that " + lock_->file + " holds for plugin " + e->name +
           " " + e->version + "; hint: if this file is the one you want, review it and run "
           "`keel plugins lock " + lock_->manifest + " --update " + e->name + "`";
  }
  return "not loaded: " + lock_->file + " does not list this file (sha256 " +
         sha256.substr(0, 16) + "...); hint: `keel plugins lock` adds the plugins a manifest uses";
}

std::string Registry::dependency_lock_problem(const LockEntry* locked,
                                              const Dependency& d) const {
  // Relocking with --update naming the plugin: its libraries are pinned anew.
  if (!locked ||
      (relock_ && std::find(updates_.begin(), updates_.end(), locked->name) != updates_.end()))
    return "";
  const LockDependency* want = nullptr;
  for (const auto& l : locked->dependencies)
    if (l.name == d.needed) want = &l;
  const std::string what = "its library " + d.needed + " (" + d.path + ", sha256 " +
                           d.sha256.substr(0, 16) + "...)";
  if (!want)
    return "not loaded: " + what + " is not listed with plugin " + locked->name + " " +
           locked->version + " in " + lock_->file + "; hint: review it, then `keel plugins "
           "lock " + lock_->manifest + " --update " + locked->name + "`";
  if (want->sha256 != d.sha256)
    return "not loaded: " + what + " differs from " + want->sha256.substr(0, 16) + "... that " +
           lock_->file + " holds for it; hint: restore the locked file, or review the new one, "
           "then `keel plugins lock " + lock_->manifest + " --update " + locked->name + "`";
  return "";
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

std::vector<const Component*> Registry::matches(keel_kind kind, const std::string& type) const {
  const size_t colon = type.find(':');
  const std::string plugin = colon == std::string::npos ? "" : type.substr(0, colon);
  const std::string name = colon == std::string::npos ? type : type.substr(colon + 1);
  std::vector<const Component*> out;
  for (const auto& c : components_)
    if (c->kind == kind && c->name == name && (plugin.empty() || c->plugin->name == plugin))
      out.push_back(c.get());
  return out;
}

const Component* Registry::find(keel_kind kind, const std::string& type) const {
  const auto m = matches(kind, type);
  return m.size() == 1 ? m[0] : nullptr;
}

std::vector<const Component*> Registry::of_kind(keel_kind kind) const {
  std::vector<const Component*> out;
  for (const auto& c : components_)
    if (c->kind == kind) out.push_back(c.get());
  return out;
}

const LoadedPlugin* Registry::plugin_named(const std::string& name) const {
  for (const auto& p : plugins_)
    if (p->name == name) return p.get();
  return nullptr;
}

std::string Registry::refusal_summary() const {
  std::vector<const Refusal*> shown;
  for (const auto& r : refusals_)
    if (r.is_plugin) shown.push_back(&r);
  if (shown.empty()) return "";
  std::string out = std::to_string(shown.size()) + " plugin file" +
                    (shown.size() == 1 ? " was" : "s were") + " refused: ";
  for (size_t i = 0; i < shown.size() && i < 3; ++i)
    out += (i ? "; " : "") + shown[i]->path + " (" + without_hint(shown[i]->reason) + ")";
  if (shown.size() > 3) out += "; and " + std::to_string(shown.size() - 3) + " more";
  return out;
}

std::vector<std::string> plugin_search_path(const std::vector<std::string>& manifest_dirs,
                                            const std::vector<PluginRequirement>& requirements) {
  std::vector<std::string> dirs = manifest_dirs;
  if (const char* env = std::getenv("KEEL_PLUGIN_PATH")) {
    std::stringstream s(env);
    std::string item;
    while (std::getline(s, item, ':')) {
      if (item.empty()) continue;
      std::error_code ec;
      if (!fs::is_directory(item, ec))
        spdlog::warn("KEEL_PLUGIN_PATH: {} is not a directory; no plugins are searched there",
                     item);
      dirs.push_back(item);
    }
  }
  // Installed packages: one version of each (installed.hpp).
  std::map<std::string, VersionRequirement> wanted;
  for (const auto& r : requirements) wanted[r.name] = VersionRequirement::parse(r.requirement);
  std::string root;
  try {
    root = default_install_root();
  } catch (const Error& e) {
    spdlog::debug("no installed packages searched: {}", e.what());
  }
  if (!root.empty())
    for (const auto& p : select_installed(root, wanted).chosen) dirs.push_back(p.dir);
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
