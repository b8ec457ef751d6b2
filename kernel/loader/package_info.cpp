#include "loader/package_info.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include "error.hpp"
#include "files/files.hpp"
#include "keel/abi.h"
#include "loader/registry.hpp"  // kind_from_name(), kernel_torch_version()
#include "loader/semver.hpp"
#include "text/text.hpp"
#include "unique_fd.hpp"

namespace keel {

namespace package_text {

void fail_at(const std::string& where, const std::string& what, const std::string& hint) {
  throw Error(text::one_line(where + ": " + what + "; hint: " + hint));
}

std::string file_hint(int err) {
  return err == ENOSPC || err == EDQUOT
             ? "free some space on that file system"
             : "check that its directory exists and that you may write there";
}

void sys_fail(const std::string& what, const std::string& path, int err) {
  throw Error(FileError(what, path, err).what() + std::string("; hint: ") + file_hint(err));
}

std::string read_regular(const std::string& path, const std::string& shown) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ELOOP) fail_at(shown, "a symbolic link", kLayoutHint);
    sys_fail("opening", shown, errno);
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) sys_fail("reading", shown, errno);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

std::string toml_quoted(const std::string& s) {
  std::ostringstream out;
  out << toml::toml_formatter{toml::value<std::string>(s), toml::format_flags::none};
  return out.str();
}

std::string abi_text(uint32_t major, uint32_t minor) {
  return fmt::format("{}.{}", major, minor);
}

}  // namespace package_text

namespace {

using namespace package_text;

#define KEEL_PKG_STR2(x) #x
#define KEEL_PKG_STR(x) KEEL_PKG_STR2(x)
// This keel's plugin ABI as "MAJOR.MINOR".
#define KEEL_PKG_ABI KEEL_PKG_STR(KEEL_ABI_MAJOR) "." KEEL_PKG_STR(KEEL_ABI_MINOR)

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

// One key of keel-plugin.toml.
struct Key;
// The parse of one keel-plugin.toml: its table, the name it is shown by, what was read so far.
struct InfoParse {
  const toml::table& t;
  const std::string& shown;
  LocatedPackageInfo& out;

  // The key's node (recording where it sits); a missing required key is an error.
  const toml::node* node(const Key& k);
  // The key's string value (nullopt when an optional key is absent).
  std::optional<std::string> str(const Key& k);
};

struct Key {
  const char* name;
  bool in_build;  // read by `keel plugins pack` from BUILD_DIR/keel-plugin.toml
  bool optional;
  const char* example;  // for "add it" hints
  void (*read)(InfoParse& p, const Key& k);
};

const toml::node* InfoParse::node(const Key& k) {
  const toml::node* n = t.get(k.name);
  if (n == nullptr && !k.optional)
    fail_at(shown, std::string("no '") + k.name + "'",
            std::string("add ") + k.example +
                (k.in_build ? "" : " (`keel plugins pack BUILD_DIR` fills it in)"));
  if (n) out.where[k.name] = text::located(shown, n->source());
  return n;
}

std::optional<std::string> InfoParse::str(const Key& k) {
  const toml::node* n = node(k);
  if (!n) return std::nullopt;
  const auto* s = n->as_string();
  if (!s)
    fail_at(text::located(shown, n->source()), std::string("'") + k.name + "' must be a string",
            std::string("write it quoted") + (*k.example ? std::string(", e.g. ") + k.example : ""));
  return s->get();
}

void read_name(InfoParse& p, const Key& k) {
  p.out.info.name = *p.str(k);
  const std::string bad = package_name_problem(p.out.info.name);
  if (!bad.empty())
    fail_at(p.out.where["name"], bad, "use lowercase letters, digits, '.', '_' and '-'");
}

void read_version(InfoParse& p, const Key& k) {
  p.out.info.version = *p.str(k);
  try {
    Version::parse(p.out.info.version);
  } catch (const Error& e) {
    fail_at(p.out.where["version"], std::string("version ") + e.what(),
            "write a semantic version, e.g. version = \"1.2.0\"");
  }
}

void read_description(InfoParse& p, const Key& k) { p.out.info.description = *p.str(k); }

void read_license(InfoParse& p, const Key& k) {
  p.out.info.license = *p.str(k);
  if (p.out.info.license.empty())
    fail_at(p.out.where["license"], "'license' is empty", "name an SPDX identifier, e.g. \"MIT\"");
}

void read_abi(InfoParse& p, const Key& k) {
  const std::string abi = *p.str(k);
  const size_t dot = abi.find('.');
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 9 &&
           std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
  };
  if (dot == std::string::npos || !digits(abi.substr(0, dot)) || !digits(abi.substr(dot + 1)))
    fail_at(p.out.where["abi"], "'abi' is " + toml_quoted(abi) + ", not MAJOR.MINOR",
            std::string("write the plugin ABI the plugins were built for, e.g. abi = \"") +
                KEEL_PKG_ABI + "\"");
  p.out.info.abi_major = static_cast<uint32_t>(std::stoul(abi.substr(0, dot)));
  p.out.info.abi_minor = static_cast<uint32_t>(std::stoul(abi.substr(dot + 1)));
}

void read_torch_version(InfoParse& p, const Key& k) {
  p.out.info.torch_version = p.str(k);
  if (p.out.info.torch_version && p.out.info.torch_version->empty())
    fail_at(p.out.where[k.name], "'torch_version' is empty",
            "leave it out for plain C plugins, else write the LibTorch version, e.g. \"" +
                std::string(kernel_torch_version()) + "\"");
}

void read_cxx11_abi(InfoParse& p, const Key& k) {
  const toml::node* n = p.node(k);
  if (!n) return;
  const auto* i = n->as_integer();
  if (!i || (i->get() != 0 && i->get() != 1))
    fail_at(text::located(p.shown, n->source()), "'cxx11_abi' must be 0 or 1",
            "write the _GLIBCXX_USE_CXX11_ABI the plugins were built with");
  p.out.info.cxx11_abi = static_cast<int>(i->get());
}

void read_components(InfoParse& p, const Key& k) {
  const toml::node* n = p.node(k);
  const auto* a = n->as_array();
  if (!a)
    fail_at(text::located(p.shown, n->source()), "'components' must be a list of strings",
            "write it as components = [\"loss:my_ce\"]");
  std::set<std::string> seen;
  for (const toml::node& e : *a) {
    const auto* s = e.as_string();
    std::string c = s ? s->get() : "";
    const size_t colon = c.find(':');
    keel_kind kind;
    if (!s || colon == std::string::npos || colon + 1 == c.size() ||
        c.find(':', colon + 1) != std::string::npos || !kind_from_name(c.substr(0, colon), &kind))
      fail_at(text::located(p.shown, e.source()),
              "a component must be a string KIND:NAME with a known kind" +
                  (s ? " (got " + toml_quoted(c) + ")" : std::string()),
              "KIND is model, dataset, optimizer, lr_scheduler, loss, grad_clipper, mfu, "
              "profiler, checkpoint, hook or sparse_optimizer, e.g. \"loss:my_ce\"");
    if (!seen.insert(c).second)
      fail_at(text::located(p.shown, e.source()), "component " + toml_quoted(c) + " is listed twice",
              "list each component once");
    p.out.info.components.push_back(c);
  }
}

void read_files(InfoParse& p, const Key& k) {
  const toml::node* n = p.node(k);
  const auto* ft = n->as_table();
  if (!ft)
    fail_at(text::located(p.shown, n->source()), "'files' must be a table",
            "write it as a [files] header followed by \"FILE.so\" = \"<sha256>\" lines");
  if (ft->empty())
    fail_at(text::located(p.shown, n->source()), "[files] lists no file",
            "list each plugin .so with its sha256 (`keel plugins pack` does)");
  for (const auto& [fk, fv] : *ft) {
    const std::string file(fk.str());
    const std::string bad = file_name_problem(file);
    if (!bad.empty())
      fail_at(text::located(p.shown, fk.source()), "[files] " + toml_quoted(file) + ": " + bad,
              "list only the plugin .so files at the package's top level");
    const auto* s = fv.as_string();
    if (!s || !is_sha256_hex(s->get()))
      fail_at(text::located(p.shown, fv.source()),
              "[files] " + toml_quoted(file) + " must be a sha256: 64 lowercase hex digits",
              "`sha256sum FILE` prints it; `keel plugins pack` fills [files] in");
    p.out.info.files[file] = s->get();
    p.out.where["files." + file] = text::located(p.shown, fk.source());
  }
}

constexpr Key kKeys[] = {
    {"name", true, false, "name = \"acme-losses\"", read_name},
    {"version", true, false, "version = \"1.2.0\"", read_version},
    {"description", true, false, "description = \"what the plugin provides\"", read_description},
    {"license", true, false, "license = \"MIT\" (an SPDX identifier)", read_license},
    {"abi", false, false, "abi = \"" KEEL_PKG_ABI "\"", read_abi},
    {"torch_version", false, true, "", read_torch_version},
    {"cxx11_abi", false, true, "", read_cxx11_abi},
    {"components", false, false, "components = [\"loss:my_ce\"]", read_components},
    {"files", false, false, "[files] \"libacme.so\" = \"<sha256>\"", read_files},
};

// Every key of `t` is one `keys` holds.
void check_unknown_keys(const toml::table& t, const std::string& shown, PackageInfoKeys keys) {
  std::vector<std::string> names;
  for (const Key& k : kKeys)
    if (keys == PackageInfoKeys::kFull || k.in_build) names.push_back(k.name);
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    if (keys == PackageInfoKeys::kBuild)
      for (const Key& known : kKeys)
        if (key == known.name)
          fail_at(text::located(shown, k.source()), "'" + key + "' is filled in by `keel plugins pack`",
                  "remove it: the build directory's keel-plugin.toml holds only name, version, "
                  "description and license");
    fail_at(text::located(shown, k.source()), "unknown key " + toml_quoted(key),
            text::did_you_mean_or(key, names, "keel-plugin.toml holds " + text::join(names)));
  }
}

}  // namespace

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

LocatedPackageInfo parse_package_info(const std::string& text, const std::string& shown,
                                      PackageInfoKeys keys) {
  toml::table t;
  try {
    t = toml::parse(text, shown);
  } catch (const toml::parse_error& e) {
    fail_at(text::located(shown, e.source()), "not valid TOML: " + std::string(e.description()),
            "fix the TOML syntax at that place");
  }
  check_unknown_keys(t, shown, keys);
  LocatedPackageInfo out;
  InfoParse p{t, shown, out};
  for (const Key& k : kKeys)
    if (keys == PackageInfoKeys::kFull || k.in_build) k.read(p, k);
  const PackageInfo& info = out.info;
  if (keys == PackageInfoKeys::kFull && info.torch_version.has_value() != info.cxx11_abi.has_value())
    fail_at(shown,
            std::string("'") + (info.torch_version ? "torch_version" : "cxx11_abi") +
                "' is given without '" + (info.torch_version ? "cxx11_abi" : "torch_version") + "'",
            "C++ plugins give both; plain C plugins neither");
  return out;
}

LocatedPackageInfo read_package_info(const std::string& path, const std::string& shown,
                                     PackageInfoKeys keys) {
  return parse_package_info(read_regular(path, shown), shown, keys);
}

PackageInfo read_package_info(const std::string& path) {
  return read_package_info(path, path, PackageInfoKeys::kFull).info;
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
