// keel-plugin.toml (read, checked, written) and the complete check of a package directory.
#include "package/package.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "error.hpp"
#include "keel/abi.h"
#include "loader/digest.hpp"
#include "loader/elf.hpp"
#include "loader/registry.hpp"
#include "package/internal.hpp"
#include "text/text.hpp"
#include "unique_fd.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace package_detail {
namespace {

using text::located;

constexpr size_t kMaxNameBytes = 64;

std::string file_name_problem(const std::string& n) {
  if (n.empty()) return "an empty file name";
  if (n.find('/') != std::string::npos || n.find('\0') != std::string::npos)
    return "a file name must not contain '/'";
  if (n[0] == '.') return "a file name must not start with '.'";
  if (n.size() < 4 || n.compare(n.size() - 3, 3, ".so") != 0)
    return "a plugin file name must end in .so";
  if (n.size() > 255) return "a file name must be at most 255 bytes";
  return "";
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

struct Key {
  const char* name;
  bool in_build;  // read by `keel plugins pack` from BUILD_DIR/keel-plugin.toml
  bool optional;
  const char* example;  // for "add it" hints
};
constexpr Key kKeys[] = {
    {"name", true, false, "name = \"acme-losses\""},
    {"version", true, false, "version = \"1.2.0\""},
    {"description", true, false, "description = \"what the plugin provides\""},
    {"license", true, false, "license = \"MIT\" (an SPDX identifier)"},
    {"abi", false, false, "abi = \"" KEEL_PKG_ABI "\""},
    {"torch_version", false, true, ""},
    {"cxx11_abi", false, true, ""},
    {"components", false, false, "components = [\"loss:my_ce\"]"},
    {"files", false, false, "[files] \"libacme.so\" = \"<sha256>\""},
};

}  // namespace

// A TOML basic string ("..." with escapes).
std::string toml_quoted(const std::string& s) {
  std::ostringstream out;
  out << toml::toml_formatter{toml::value<std::string>(s), toml::format_flags::none};
  return out.str();
}

[[noreturn]] void fail_at(const std::string& where, const std::string& what,
                          const std::string& hint) {
  throw Error(text::one_line(where + ": " + what + "; hint: " + hint));
}

Located parse_info(const std::string& text, const std::string& shown, Keys keys) {
  toml::table t;
  try {
    t = toml::parse(text, shown);
  } catch (const toml::parse_error& e) {
    fail_at(located(shown, e.source()), "not valid TOML: " + std::string(e.description()),
            "fix the TOML syntax at that place");
  }
  std::vector<std::string> names;
  for (const Key& k : kKeys)
    if (keys == Keys::full || k.in_build) names.push_back(k.name);
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    if (keys == Keys::build)
      for (const Key& known : kKeys)
        if (key == known.name)
          fail_at(located(shown, k.source()), "'" + key + "' is filled in by `keel plugins pack`",
                  "remove it: the build directory's keel-plugin.toml holds only name, version, "
                  "description and license");
    fail_at(located(shown, k.source()), "unknown key " + toml_quoted(key),
            text::did_you_mean_or(key, names, "keel-plugin.toml holds " + text::join(names)));
  }
  Located out;
  PackageInfo& info = out.info;
  auto node = [&](const Key& k) -> const toml::node* {
    const toml::node* n = t.get(k.name);
    if (n == nullptr && !k.optional)
      fail_at(shown, std::string("no '") + k.name + "'",
              std::string("add ") + k.example +
                  (k.in_build ? "" : " (`keel plugins pack BUILD_DIR` fills it in)"));
    if (n) out.where[k.name] = located(shown, n->source());
    return n;
  };
  auto str = [&](const Key& k) -> std::optional<std::string> {
    const toml::node* n = node(k);
    if (!n) return std::nullopt;
    const auto* s = n->as_string();
    if (!s)
      fail_at(
          located(shown, n->source()), std::string("'") + k.name + "' must be a string",
          std::string("write it quoted") + (*k.example ? std::string(", e.g. ") + k.example : ""));
    return s->get();
  };
  for (const Key& k : kKeys) {
    if (keys == Keys::build && !k.in_build) continue;
    const std::string key = k.name;
    if (key == "name") {
      info.name = *str(k);
      const std::string bad = package_name_problem(info.name);
      if (!bad.empty())
        fail_at(out.where["name"], bad, "use lowercase letters, digits, '.', '_' and '-'");
    } else if (key == "version") {
      info.version = *str(k);
      try {
        Version::parse(info.version);
      } catch (const Error& e) {
        fail_at(out.where["version"], std::string("version ") + e.what(),
                "write a semantic version, e.g. version = \"1.2.0\"");
      }
    } else if (key == "description") {
      info.description = *str(k);
    } else if (key == "license") {
      info.license = *str(k);
      if (info.license.empty())
        fail_at(out.where["license"], "'license' is empty",
                "name an SPDX identifier, e.g. \"MIT\"");
    } else if (key == "abi") {
      const std::string abi = *str(k);
      const size_t dot = abi.find('.');
      auto digits = [](const std::string& s) {
        return !s.empty() && s.size() <= 9 &&
               std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
      };
      if (dot == std::string::npos || !digits(abi.substr(0, dot)) || !digits(abi.substr(dot + 1)))
        fail_at(out.where["abi"], "'abi' is " + toml_quoted(abi) + ", not MAJOR.MINOR",
                std::string("write the plugin ABI the plugins were built for, e.g. abi = \"") +
                    KEEL_PKG_ABI + "\"");
      info.abi_major = static_cast<uint32_t>(std::stoul(abi.substr(0, dot)));
      info.abi_minor = static_cast<uint32_t>(std::stoul(abi.substr(dot + 1)));
    } else if (key == "torch_version") {
      info.torch_version = str(k);
      if (info.torch_version && info.torch_version->empty())
        fail_at(out.where[key], "'torch_version' is empty",
                "leave it out for plain C plugins, else write the LibTorch version, e.g. \"" +
                    std::string(kernel_torch_version()) + "\"");
    } else if (key == "cxx11_abi") {
      if (const toml::node* n = node(k)) {
        const auto* i = n->as_integer();
        if (!i || (i->get() != 0 && i->get() != 1))
          fail_at(located(shown, n->source()), "'cxx11_abi' must be 0 or 1",
                  "write the _GLIBCXX_USE_CXX11_ABI the plugins were built with");
        info.cxx11_abi = static_cast<int>(i->get());
      }
    } else if (key == "components") {
      const toml::node* n = node(k);
      const auto* a = n->as_array();
      if (!a)
        fail_at(located(shown, n->source()), "'components' must be a list of strings",
                "write it as components = [\"loss:my_ce\"]");
      std::set<std::string> seen;
      for (const toml::node& e : *a) {
        const auto* s = e.as_string();
        std::string c = s ? s->get() : "";
        const size_t colon = c.find(':');
        keel_kind kind;
        if (!s || colon == std::string::npos || colon + 1 == c.size() ||
            c.find(':', colon + 1) != std::string::npos ||
            !kind_from_name(c.substr(0, colon), &kind))
          fail_at(located(shown, e.source()),
                  "a component must be a string KIND:NAME with a known kind" +
                      (s ? " (got " + toml_quoted(c) + ")" : std::string()),
                  "KIND is model, dataset, optimizer, lr_scheduler, loss, grad_clipper, mfu, "
                  "profiler, checkpoint or hook, e.g. \"loss:my_ce\"");
        if (!seen.insert(c).second)
          fail_at(located(shown, e.source()), "component " + toml_quoted(c) + " is listed twice",
                  "list each component once");
        info.components.push_back(c);
      }
    } else if (key == "files") {
      const toml::node* n = node(k);
      const auto* ft = n->as_table();
      if (!ft)
        fail_at(located(shown, n->source()), "'files' must be a table",
                "write it as a [files] header followed by \"FILE.so\" = \"<sha256>\" lines");
      if (ft->empty())
        fail_at(located(shown, n->source()), "[files] lists no file",
                "list each plugin .so with its sha256 (`keel plugins pack` does)");
      for (const auto& [fk, fv] : *ft) {
        const std::string file(fk.str());
        const std::string bad = file_name_problem(file);
        if (!bad.empty())
          fail_at(located(shown, fk.source()), "[files] " + toml_quoted(file) + ": " + bad,
                  "list only the plugin .so files at the package's top level");
        const auto* s = fv.as_string();
        if (!s || !is_sha256_hex(s->get()))
          fail_at(located(shown, fv.source()),
                  "[files] " + toml_quoted(file) + " must be a sha256: 64 lowercase hex digits",
                  "`sha256sum FILE` prints it; `keel plugins pack` fills [files] in");
        info.files[file] = s->get();
        out.where["files." + file] = located(shown, fk.source());
      }
    }
  }
  if (keys == Keys::full && info.torch_version.has_value() != info.cxx11_abi.has_value())
    fail_at(shown,
            std::string("'") + (info.torch_version ? "torch_version" : "cxx11_abi") +
                "' is given without '" + (info.torch_version ? "cxx11_abi" : "torch_version") + "'",
            "C++ plugins give both; plain C plugins neither");
  return out;
}

std::string read_regular(const std::string& path, const std::string& shown) {
  try {
    return read_file(path, /*follow_links=*/false);
  } catch (const FileError& e) {
    if (e.code() == ELOOP) fail_at(shown, "a symbolic link", kLayoutHint);
    if (path == shown) throw;
    sys_fail("reading", shown, e.code());
  }
}

Located read_info(const std::string& path, const std::string& shown, Keys keys) {
  return parse_info(read_regular(path, shown), shown, keys);
}

// ------------------------------------------------------------------------------------------
// Checking a package directory


std::string abi_text(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

Located verify_package_dir(const std::string& dir, const std::string& shown) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    const std::string where = shown + "/" + name;
    if (fs::is_symlink(st)) fail_at(where, "a symbolic link", kLayoutHint);
    if (fs::is_directory(st)) fail_at(where, "a subdirectory", kLayoutHint);
    if (!fs::is_regular_file(st)) fail_at(where, "not a regular file", kLayoutHint);
    names.push_back(name);
  }
  if (ec)
    throw Error(shown + ": cannot read it: " + ec.message() + "; hint: check its permissions");
  std::sort(names.begin(), names.end());
  const std::string toml_shown = shown + "/" + kPackageMetadataFile;
  if (std::find(names.begin(), names.end(), kPackageMetadataFile) == names.end())
    fail_at(shown, std::string("no ") + kPackageMetadataFile + " in it; not a plugin package",
            "make packages from a plugin's build with `keel plugins pack BUILD_DIR`");
  Located l = read_info(dir + "/" + kPackageMetadataFile, toml_shown, Keys::full);
  const PackageInfo& info = l.info;

  // Compatible with this keel?
  const std::string mine = abi_text(KEEL_ABI_MAJOR, KEEL_ABI_MINOR);
  const std::string theirs = abi_text(info.abi_major, info.abi_minor);
  if (info.abi_major != KEEL_ABI_MAJOR)
    fail_at(l.where["abi"],
            info.name + " " + info.version + " needs plugin ABI " + theirs + ", this keel speaks " +
                mine,
            "get a build of " + info.name + " made for plugin ABI " +
                std::to_string(KEEL_ABI_MAJOR) + " (this keel's SDK)");
  if (info.abi_minor > KEEL_ABI_MINOR)
    fail_at(l.where["abi"],
            info.name + " " + info.version + " needs plugin ABI " + theirs +
                ", newer than this keel's " + mine,
            "upgrade keel, or get a build of " + info.name + " made against this keel's SDK");
  if (info.torch_version &&
      (*info.torch_version != kernel_torch_version() || *info.cxx11_abi != kernel_cxx11_abi()))
    fail_at(l.where["torch_version"],
            info.name + " " + info.version + " was built with LibTorch " + *info.torch_version +
                " (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(*info.cxx11_abi) +
                "), this keel uses LibTorch " + kernel_torch_version() +
                " (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(kernel_cxx11_abi()) + ")",
            "get a build of " + info.name + " made against this keel's SDK");

  // Exactly the files listed, each the one hashed, each a keel plugin.
  for (const auto& name : names)
    if (name != kPackageMetadataFile && !info.files.count(name))
      fail_at(shown + "/" + name, std::string("not listed in [files] of ") + kPackageMetadataFile,
              kLayoutHint);
  for (const auto& [file, expected] : info.files) {
    const std::string where = shown + "/" + file;
    const std::string listed = l.where["files." + file];
    if (std::find(names.begin(), names.end(), file) == names.end())
      fail_at(listed, "[files] lists " + toml_quoted(file) + ", which the package does not hold",
              "get the package again from its source, or re-pack it with `keel plugins pack`");
    UniqueFd fd(::open((dir + "/" + file).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) sys_fail("opening", where, errno);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) sys_fail("checking", where, errno);
    if (!S_ISREG(st.st_mode)) fail_at(where, "not a regular file", kLayoutHint);
    const std::string actual = sha256_hex(fd.get(), where);
    if (actual != expected)
      fail_at(where,
              "sha256 " + actual.substr(0, 16) + "... differs from " + expected.substr(0, 16) +
                  "... listed at " + listed,
              "the file changed after the package was made: get the package again from its "
              "source, or re-pack it with `keel plugins pack`");
    const std::string not_plugin = elf_plugin_check(fd.get());
    if (!not_plugin.empty())
      fail_at(where, "not a keel plugin: " + not_plugin,
              "a package holds only keel plugin libraries (ones that export keel_plugin_entry)");
  }
  return l;
}
}  // namespace package_detail

using namespace package_detail;

std::string package_name_problem(const std::string& name) {
  const std::string q = "'" + name + "': ";
  if (name.empty()) return "an empty package name";
  if (name.size() > kMaxNameBytes)
    return q + "a package name is at most " + std::to_string(kMaxNameBytes) + " bytes";
  auto lower_or_digit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lower_or_digit(name[0]))
    return q + "a package name starts with a lowercase letter or a digit";
  for (char c : name)
    if (!lower_or_digit(c) && c != '.' && c != '_' && c != '-')
      return q + "a package name holds only a-z, 0-9, '.', '_' and '-'";
  return "";
}

PackageInfo read_package_info(const std::string& path) {
  return add_hint([&] { return read_info(path, path, Keys::full).info; }, file_hint);
}

std::string package_info_toml(const PackageInfo& info) {
  std::string s;
  s += "name = " + toml_quoted(info.name) + "\n";
  s += "version = " + toml_quoted(info.version) + "\n";
  s += "description = " + toml_quoted(info.description) + "\n";
  s += "license = " + toml_quoted(info.license) + "\n";
  s += "abi = " + toml_quoted(abi_text(info.abi_major, info.abi_minor)) + "\n";
  if (info.torch_version) s += "torch_version = " + toml_quoted(*info.torch_version) + "\n";
  if (info.cxx11_abi) s += "cxx11_abi = " + std::to_string(*info.cxx11_abi) + "\n";
  std::vector<std::string> comps;
  for (const auto& c : info.components) comps.push_back(toml_quoted(c));
  s += "components = [" + text::join(comps) + "]\n";
  s += "\n[files]\n";
  for (const auto& [file, sha] : info.files)
    s += toml_quoted(file) + " = " + toml_quoted(sha) + "\n";
  return s;
}

}  // namespace keel
