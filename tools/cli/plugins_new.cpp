// keel plugins new NAME --kind KIND [--lang c|cpp] DIR: writes a plugin project into DIR.
//
// The project comes from the templates under sdk/templates/ (embedded at build time as
// scaffold_templates.hpp): meson.build and the plugin's source from the language's skeleton
// (cpp/, c/), the component and its test from kinds/KIND/ (component.cpp or component.c, and
// test.cpp, a C++ test for both languages), plus README.md and keel-plugin.toml.in. A kind can
// be written in C when kinds/KIND/component.c exists. Templates use @{key} placeholders; the
// leading preprocessor lines of a kind's file go where its skeleton says @{includes}.
//
// It prints the next step, a shell line that builds the project and runs its test: its
// `meson setup` finds the SDK of this keel (sdk_location: the build's uninstalled SDK when keel
// runs from its build tree, else the installed one beside it), with PKG_CONFIG_PATH when
// pkg-config would not find that by itself.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "cli/commands.hpp"
#include "manifest.hpp"
#include "plugins_commands.hpp"
#include "scaffold_templates.hpp"
#include "text/text.hpp"

namespace keel::cli {
namespace {

namespace fs = std::filesystem;

// What the templates need to know of each kind beyond its files.
struct KindInfo {
  const char* kind;
  const char* table;    // the manifest table that names a component of the kind
  const char* summary;  // the component's (and plugin's) description
  const char* example;  // a manifest line setting the component's option
};
constexpr KindInfo kKinds[] = {
    {"model", "[model]", "a multi-layer perceptron with configurable layer sizes",
     "layers = [784, 256, 10]"},
    {"dataset", "[data.train]", "256 grid points classified by the sign of x * y",
     "batch_size = 32"},
    {"optimizer", "[optimizer]", "plain stochastic gradient descent", "lr = 0.01"},
    {"lr_scheduler", "[lr_scheduler]", "exponential decay of the learning rate", "gamma = 0.999"},
    {"loss", "[loss]", "cross-entropy with label smoothing", "label_smoothing = 0.1"},
    {"grad_clipper", "[grad_clipper]", "clips gradients to a maximum global L2 norm",
     "max_norm = 1.0"},
    {"mfu", "[mfu]", "model FLOPs utilisation against a given hardware peak",
     "peak_tflops = 312.0"},
    {"profiler", "[profiler]", "total time and calls of each training-loop phase",
     "path = \"phases.tsv\""},
    {"checkpoint", "[checkpoint]", "one file per object, with a checksum per tensor",
     "checksum = true"},
    {"hook", "[[hooks]]", "stops the run once the training loss falls below a target",
     "target_loss = 0.05"},
    {"step", "[step]",
     "cross entropy plus a penalty on the distance to a frozen reference model's logits",
     "weight = 0.1"},
};
constexpr size_t kMaxNameBytes = 64;  // a package name's limit (package/package.hpp)

const char* find_template(const std::string& path) {
  for (const auto& t : scaffold::kTemplates)
    if (path == t.path) return t.text;
  return nullptr;
}

const char* template_text(const std::string& path) {
  const char* text = find_template(path);
  if (text == nullptr)
    throw Error("keel plugins new: template '" + path + "' is missing from this keel build; "
                "hint: rebuild keel (its templates come from sdk/templates/)");
  return text;
}

std::vector<std::string> kind_names() {
  std::vector<std::string> out;
  for (const auto& k : kKinds) out.emplace_back(k.kind);
  return out;
}

std::vector<std::string> c_kinds() {
  std::vector<std::string> out;
  for (const auto& k : kKinds)
    if (find_template(std::string("kinds/") + k.kind + "/component.c")) out.emplace_back(k.kind);
  return out;
}

// Why NAME is not a plugin name, or "".
std::string name_problem(const std::string& name) {
  if (name.empty()) return "it is empty";
  if (name.size() > kMaxNameBytes)
    return "it is longer than " + std::to_string(kMaxNameBytes) + " bytes";
  if (name[0] < 'a' || name[0] > 'z') return "it does not start with a lowercase letter";
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return std::string("it holds '") + c + "'";
  return "";
}

// "acme_loss" -> "AcmeLoss": the C++ class of the component.
std::string class_name(const std::string& component) {
  std::string out;
  bool upper = true;
  for (char c : component) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out += upper && c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
    upper = false;
  }
  return out;
}

// `text` with every @{key} replaced by vars[key].
std::string render(const std::string& text, const std::map<std::string, std::string>& vars,
                   const std::string& path) {
  std::string out;
  size_t i = 0;
  for (;;) {
    const size_t at = text.find("@{", i);
    if (at == std::string::npos) break;
    const size_t end = text.find('}', at);
    const std::string key = text.substr(at + 2, end == std::string::npos ? 0 : end - at - 2);
    const auto it = vars.find(key);
    if (end == std::string::npos || it == vars.end())
      throw Error("keel plugins new: template '" + path + "' uses an unknown placeholder '@{" +
                  key + "}'; hint: the placeholders are " + [&] {
                    std::vector<std::string> keys;
                    for (const auto& [k, v] : vars) keys.push_back("@{" + k + "}");
                    return text::join(keys);
                  }());
    out.append(text, i, at - i);
    out += it->second;
    i = end + 1;
  }
  out.append(text, i, std::string::npos);
  return out;
}

// A kind's file split into its leading preprocessor lines (with the blank line after them) and
// the rest, without trailing newlines.
std::pair<std::string, std::string> split_includes(const std::string& text) {
  size_t body = 0;
  for (size_t line = 0; line < text.size();) {
    const size_t next = text.find('\n', line);
    const std::string l = text.substr(line, next == std::string::npos ? std::string::npos
                                                                       : next - line);
    if (!l.empty() && l[0] != '#') break;
    line = next == std::string::npos ? text.size() : next + 1;
    body = line;
  }
  std::string rest = text.substr(body);
  while (!rest.empty() && rest.back() == '\n') rest.pop_back();
  return {text.substr(0, body), rest};
}

[[noreturn]] void fail_io(const std::string& what, const std::string& path, int err) {
  throw Error(what + " '" + path + "' failed: " + std::strerror(err) +
              "; hint: check that its directory is writable");
}

void write_file(const fs::path& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wx");
  if (f == nullptr) fail_io("creating", path.string(), errno);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) fail_io("writing", path.string(), ok ? errno : err);
}

// The kind --kind names, checked with NAME, DIR's count and --lang.
const KindInfo& checked_kind(const PluginsArgs& args, const std::string& lang) {
  if (!args.kind)
    throw UsageError("keel plugins new: needs --kind KIND; hint: --kind loss (kinds: " +
                     text::join(kind_names()) + ")", "plugins");
  const KindInfo* kind = nullptr;
  for (const auto& k : kKinds)
    if (*args.kind == k.kind) kind = &k;
  if (kind == nullptr)
    throw UsageError("--kind '" + *args.kind + "': not a component kind; hint: " +
                     text::did_you_mean(*args.kind, kind_names()) +
                     "kinds: " + text::join(kind_names()), "plugins");
  if (lang != "c" && lang != "cpp")
    throw UsageError("--lang '" + lang + "': not a language `keel plugins new` writes; hint: "
                     "--lang c or --lang cpp (the default)", "plugins");
  const std::string kind_dir = std::string("kinds/") + kind->kind + "/";
  if (lang == "c" && find_template(kind_dir + "component.c") == nullptr)
    throw UsageError("--lang c: a " + std::string(kind->kind) + " needs LibTorch (autograd or "
                     "direct access to the model's tensors), which the host functions of "
                     "keel/abi.h do not give a C plugin; hint: --lang cpp, or a kind C can "
                     "implement: " + text::join(c_kinds()), "plugins");
  return *kind;
}

// DIR as an absolute path: a new directory, or an empty one (`*existed`).
fs::path checked_target(const std::string& dir, const std::string& name, bool* existed) {
  std::error_code ec;
  fs::path target = fs::absolute(dir, ec).lexically_normal();
  if (ec || dir.empty())
    throw UsageError("DIR '" + dir + "': not a usable path; hint: name a new directory, e.g. " +
                     name, "plugins");
  if (target.filename().empty()) target = target.parent_path();  // "dir/" or "."
  const fs::file_status st = fs::status(target, ec);
  *existed = fs::exists(st);
  if (*existed) {
    if (!fs::is_directory(st))
      throw UsageError("DIR '" + dir + "' exists and is not a directory; hint: name a new "
                       "directory, e.g. " + name, "plugins");
    const bool empty = fs::is_empty(target, ec);
    if (ec) fail_io("listing directory", dir, ec.value());
    if (!empty)
      throw UsageError("DIR '" + dir + "' exists and is not empty; hint: name a new directory, "
                       "or empty this one first", "plugins");
  }
  return target;
}

// Where pkg-config finds the keel SDK that matches this keel, for the project's `meson setup`.
struct SdkLocation {
  std::string pc_dir;  // the directory of keel-sdk.pc, or of keel-sdk-uninstalled.pc
  bool uninstalled;    // this keel runs from its build tree (pc_dir: BUILD/meson-uninstalled)
  bool searched;       // pkg-config searches pc_dir by default: no PKG_CONFIG_PATH needed
};

// A keel running from its build tree (its executable under KEEL_BUILD_ROOT, the rule of the
// plugin search path in loader/registry.cpp) has the uninstalled SDK of that build: sdk/include
// and sdk/plugin.map of the source tree, libkeel-host and libkeel-embedding of the build
// (sdk/meson.build). An installed keel has the SDK installed beside it: <prefix>/<libdir>/
// pkgconfig, <prefix> found from its own path (<prefix>/<bindir>/keel), so that a staged or
// moved installation finds its own SDK.
SdkLocation sdk_location() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const std::string build_root = KEEL_BUILD_ROOT;
  if (!ec && exe.string().rfind(build_root + "/", 0) == 0)
    return {(fs::path(build_root) / "meson-uninstalled").string(), true, false};
  fs::path prefix = KEEL_PREFIX;
  const fs::path bindir = KEEL_BINDIR;
  if (!ec && bindir.is_relative()) {
    prefix = exe.parent_path();
    for (auto it = bindir.begin(); it != bindir.end(); ++it) prefix = prefix.parent_path();
  }
  const fs::path pc_dir = (prefix / KEEL_PKGCONFIG_DIR).lexically_normal();
  bool searched = false;
  std::string path = KEEL_PKG_CONFIG_PATH;  // pkg-config's own search path, when keel was built
  for (size_t i = 0; i <= path.size();) {
    const size_t end = std::min(path.find(':', i), path.size());
    searched |= fs::path(path.substr(i, end - i)).lexically_normal() == pc_dir;
    i = end + 1;
  }
  return {pc_dir.string(), false, searched};
}

// The project's `meson setup`: with PKG_CONFIG_PATH when pkg-config would not find this
// keel's SDK by itself (meson keeps it for `meson compile` and `meson test`).
std::string setup_command(const SdkLocation& sdk) {
  return (sdk.searched ? "" : "PKG_CONFIG_PATH=" + text::shell_word(sdk.pc_dir) + " ") +
         "meson setup build";
}

// What the README says of that SDK.
std::string sdk_note(const SdkLocation& sdk) {
  if (sdk.uninstalled)
    return "The keel that wrote this project runs from its build directory, whose SDK is not "
           "installed: `PKG_CONFIG_PATH=" + sdk.pc_dir + "` names the build's uninstalled .pc "
           "files (the headers and `plugin.map` of keel's source tree `sdk/`, the libraries of "
           "its build).";
  if (!sdk.searched)
    return "The keel that wrote this project has its SDK's .pc files in " + sdk.pc_dir +
           ", where pkg-config does not look by default: `PKG_CONFIG_PATH` names it.";
  return "The keel that wrote this project has them in " + sdk.pc_dir +
         ", where pkg-config looks by default.";
}

// The keel the README's commands run: the one that wrote the project, as an absolute path (the
// README's commands run in the project's directory), or `keel` when it was found on PATH.
std::string readme_keel() {
  const std::string& typed = call_state().argv0;
  if (typed.find('/') == std::string::npos) return "keel";
  return text::shell_word(fs::absolute(typed).lexically_normal().string());
}

// The plugin's files (path in DIR, text), rendered in memory: a template problem leaves
// nothing behind. `sdk`: where the project's `meson setup` finds the SDK.
std::vector<std::pair<std::string, std::string>> rendered_files(const std::string& name,
                                                                const KindInfo& kind,
                                                                const std::string& lang,
                                                                const SdkLocation& sdk,
                                                                std::string* component_out) {
  std::string component = name;
  for (char& c : component)
    if (c == '-') c = '_';
  *component_out = component;
  const std::string kind_dir = std::string("kinds/") + kind.kind + "/";
  const std::string ext = lang == "c" ? "c" : "cpp";
  const std::string source = "src/" + component + "." + ext;
  std::map<std::string, std::string> vars = {
      {"name", name},
      {"component", component},
      {"Class", class_name(component)},
      {"kind", kind.kind},
      {"summary", kind.summary},
      {"table", kind.table},
      {"option_example", kind.example},
      {"source", source},
      {"language", lang == "c" ? "plain C99" : "C++"},
      {"torch_note", lang == "c" ? "The plugin itself needs no LibTorch; its test does "
                                   "(keel/testing.hpp runs the component over at::Tensor)."
                                 : "Build with the LibTorch the loading keel was built with: "
                                   "keel refuses a C++ plugin built with another."},
      {"meson_setup", setup_command(sdk)},
      {"sdk_note", sdk_note(sdk)},
      {"keel", readme_keel()},
  };
  auto with_kind_file = [&](const std::string& skeleton, const std::string& kind_file) {
    const auto [includes, body] = split_includes(template_text(kind_dir + kind_file));
    std::map<std::string, std::string> v = vars;
    v["includes"] = render(includes, vars, kind_dir + kind_file);
    v["body"] = render(body, vars, kind_dir + kind_file);
    return render(template_text(skeleton), v, skeleton);
  };
  return {
      {"meson.build", render(template_text(lang + "/meson.build.in"), vars, lang + "/meson.build.in")},
      {"README.md", render(template_text("README.md"), vars, "README.md")},
      {"keel-plugin.toml.in", render(template_text("keel-plugin.toml.in"), vars,
                                     "keel-plugin.toml.in")},
      {source, with_kind_file(lang + "/plugin." + ext, "component." + ext)},
      {"tests/test_" + component + ".cpp", with_kind_file("test.cpp", "test.cpp")},
  };
}

// Writes `files` into `target`; on a failure DIR is left as it was: removed when this created
// it (`existed` false), else emptied again.
void write_files(const fs::path& target, bool existed,
                 const std::vector<std::pair<std::string, std::string>>& files) {
  std::error_code ec;
  try {
    for (const auto& [path, text] : files) {
      const fs::path p = target / path;
      fs::create_directories(p.parent_path(), ec);
      if (ec) fail_io("creating directory", p.parent_path().string(), ec.value());
      write_file(p, text);
    }
  } catch (...) {
    if (!existed) {
      fs::remove_all(target, ec);
    } else {
      std::vector<fs::path> written;
      for (const auto& entry : fs::directory_iterator(target, ec)) written.push_back(entry);
      for (const auto& p : written) fs::remove_all(p, ec);
    }
    throw;
  }
}

}  // namespace

int plugins_new(const PluginsArgs& args) {
  args.only_flags({"kind", "lang"});
  const char* example = "keel plugins new acme-loss --kind loss acme-loss";
  if (args.positional.size() < 2)
    throw UsageError("keel plugins new: needs NAME and DIR, got " +
                     std::to_string(args.positional.size()) + " arguments; hint: " + example,
        "plugins");
  if (args.positional.size() > 2)
    throw UsageError(args.positional[2] + ": unexpected argument (`keel plugins new` takes "
                     "NAME and DIR); hint: " + example, "plugins");
  const std::string& name = args.positional[0];
  const std::string& dir = args.positional[1];
  const std::string problem = name_problem(name);
  if (!problem.empty())
    throw UsageError("NAME '" + name + "': not a plugin name: " + problem + "; hint: lowercase "
                     "letters, digits, '-' and '_', starting with a letter, at most " +
                     std::to_string(kMaxNameBytes) + " bytes, e.g. acme-loss", "plugins");
  const std::string lang = args.lang.value_or("cpp");
  const KindInfo& kind = checked_kind(args, lang);
  bool existed = false;
  const fs::path target = checked_target(dir, name, &existed);
  std::string component;
  const SdkLocation sdk = sdk_location();
  const auto files = rendered_files(name, kind, lang, sdk, &component);
  write_files(target, existed, files);

  std::vector<std::string> written;
  for (const auto& f : files) written.push_back(f.first);
  // The next line runs as printed, in the directory keel ran in (tests/sdk/test_plugins_new.sh).
  std::printf("wrote the %s plugin %s (%s `%s`) into %s: %s\nnext: cd %s && %s && meson compile "
              "-C build && meson test -C build\n(its README.md says how keel loads it, and how to "
              "pack and install it)\n",
              lang == "c" ? "C" : "C++", name.c_str(), kind.kind, component.c_str(),
              target.c_str(), text::join(written).c_str(), text::shell_word(dir).c_str(),
              setup_command(sdk).c_str());
  return 0;
}

}  // namespace keel::cli
