#include "lock.hpp"

#include <toml++/toml.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "error.hpp"
#include "files/files.hpp"
#include "manifest.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

bool is_sha256(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

const LockEntry* Lock::by_sha256(const std::string& sha256) const {
  for (const auto& e : entries)
    if (e.sha256 == sha256) return &e;
  return nullptr;
}

const LockEntry* Lock::by_path(const std::string& path) const {
  std::error_code ec;
  const fs::path want = fs::weakly_canonical(path, ec);
  for (const auto& e : entries)
    if (e.path == path || fs::weakly_canonical(e.path, ec) == want) return &e;
  return nullptr;
}

std::string lock_path_for(const std::string& manifest_path) {
  std::error_code ec;
  fs::path real = fs::weakly_canonical(manifest_path, ec);
  if (ec) real = fs::absolute(manifest_path, ec).lexically_normal();
  return real.string() + ".lock";
}

namespace {

// The string `key` of a [[plugin]] or [[plugin.dependencies]] table (`section`), or an error
// located at the key (or at the table when the key is missing).
std::string required_string(const toml::table& t, const char* key, const std::string& section,
                            const std::string& hint) {
  const toml::node* n = t.get(key);
  if (!n || !n->is_string())
    throw Error(where(n ? n->source() : t.source()) + ": " + section + " needs " + key +
                " = \"...\" (a string)" + hint);
  return n->as_string()->get();
}

// One [[plugin.dependencies]] table: name, path and sha256, nothing else.
LockDependency read_dependency(const toml::node& node, const std::string& hint) {
  const toml::table* d = node.as_table();
  if (!d)
    throw Error(where(node.source()) + ": each of [[plugin]] dependencies must be a table "
                "(name, path, sha256)" + hint);
  LockDependency dep;
  dep.name = required_string(*d, "name", "[[plugin.dependencies]]", hint);
  dep.path = required_string(*d, "path", "[[plugin.dependencies]]", hint);
  dep.sha256 = required_string(*d, "sha256", "[[plugin.dependencies]]", hint);
  if (!is_sha256(dep.sha256))
    throw Error(where(d->get("sha256")->source()) + ": sha256 must be 64 lowercase hex digits" +
                hint);
  for (const auto& [k, v] : *d) {
    const std::string key(k.str());
    if (key != "name" && key != "path" && key != "sha256")
      throw Error(where(k.source()) + ": unknown key '" + key +
                  "' in [[plugin.dependencies]] (name, path, sha256)" + hint);
  }
  return dep;
}

// One [[plugin]] table: the file's name, version, path and hash, the components it provides
// and the libraries of its own it loads ([[plugin.dependencies]]).
LockEntry read_entry(const toml::node& node, const std::string& hint) {
  const toml::table* t = node.as_table();
  if (!t) throw Error(where(node.source()) + ": [[plugin]] must be a table" + hint);
  LockEntry e;
  e.name = required_string(*t, "name", "[[plugin]]", hint);
  e.version = required_string(*t, "version", "[[plugin]]", hint);
  e.path = required_string(*t, "path", "[[plugin]]", hint);
  e.sha256 = required_string(*t, "sha256", "[[plugin]]", hint);
  if (!is_sha256(e.sha256))
    throw Error(where(t->get("sha256")->source()) + ": sha256 must be 64 lowercase hex digits" +
                hint);
  if (const toml::array* cs = t->get_as<toml::array>("components"))
    for (const auto& c : *cs)
      if (c.is_string()) e.components.push_back(c.as_string()->get());
  if (const toml::node* deps = t->get("dependencies")) {
    const toml::array* list = deps->as_array();
    if (!list)
      throw Error(where(deps->source()) + ": [[plugin]] dependencies must be an array of " +
                  "tables ([[plugin.dependencies]])" + hint);
    for (const auto& dn : *list) e.dependencies.push_back(read_dependency(dn, hint));
  }
  for (const auto& [k, v] : *t) {
    const std::string key(k.str());
    if (key != "name" && key != "version" && key != "path" && key != "sha256" &&
        key != "components" && key != "dependencies")
      throw Error(where(k.source()) + ": unknown key '" + key +
                  "' in [[plugin]] (name, version, path, sha256, components, dependencies)" +
                  hint);
  }
  return e;
}

}  // namespace

std::optional<Lock> read_lock(const std::string& manifest_path) {
  const std::string file = lock_path_for(manifest_path);
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  const std::string manifest = file.substr(0, file.size() - 5);  // without ".lock"
  const std::string hint = "; hint: regenerate it with `keel plugins lock " + manifest + "`";
  toml::table root;
  try {
    root = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    throw Error(where(e.source()) + ": not a valid lock file: " + std::string(e.description()) +
                hint);
  }
  Lock lock;
  lock.file = file;
  lock.manifest = manifest;
  for (const auto& [k, v] : root)
    if (k.str() != "plugin")
      throw Error(where(k.source()) + ": unknown key '" + std::string(k.str()) +
                  "' in a lock file (it holds [[plugin]] tables)" + hint);
  if (const toml::array* plugins = root["plugin"].as_array())
    for (const auto& node : *plugins) lock.entries.push_back(read_entry(node, hint));
  return lock;
}

std::optional<Lock> find_lock(const std::vector<std::string>& manifest_files) {
  for (const auto& f : manifest_files)
    if (std::optional<Lock> lock = read_lock(f)) return lock;
  return std::nullopt;
}

void write_lock(const Lock& lock, const std::string& manifest) {
  toml::array plugins;
  for (const auto& e : lock.entries) {
    toml::array comps;
    for (const auto& c : e.components) comps.push_back(c);
    toml::table entry{{"name", e.name},
                      {"version", e.version},
                      {"path", e.path},
                      {"sha256", e.sha256},
                      {"components", std::move(comps)}};
    if (!e.dependencies.empty()) {
      toml::array deps;
      for (const auto& d : e.dependencies)
        deps.push_back(toml::table{{"name", d.name}, {"path", d.path}, {"sha256", d.sha256}});
      entry.insert("dependencies", std::move(deps));
    }
    plugins.push_back(std::move(entry));
  }
  toml::table root{{"plugin", std::move(plugins)}};
  std::ostringstream text;
  text << "# The plugin files `keel train " << manifest << "` may load, written by `keel plugins "
       << "lock " << manifest << "`.\n# A plugin file whose sha256 is not listed here, or whose "
       << "own libraries' differ from those listed with it, is\n# refused before any of its code "
       << "runs.\n\n"
       << root << "\n";
  const std::string tmp =
      lock.file + ".tmp-" + std::to_string(getpid());
  std::remove(tmp.c_str());
  add_hint(
      [&] {
        write_file_durably(tmp, text.str());
        durable_rename(tmp, lock.file);
      },
      [&](int code) {
        return code == ENOSPC || code == EDQUOT ? "free some space on that file system"
                                                : "check that you may write " + parent_of(lock.file);
      });
}

}  // namespace keel
