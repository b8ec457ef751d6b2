// `keel plugins pack`: a package made from a plugin's build directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <vector>

#include "error.hpp"
#include "keel/abi.h"
#include "loader/bounded.hpp"
#include "loader/elf.hpp"
#include "loader/registry.hpp"
#include "package/internal.hpp"
#include "text/text.hpp"
#include "unique_fd.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

using namespace package_detail;

void write_package_dir(const std::string& out, const PackageInfo& info,
                       const std::vector<PackFile>& files) {
  const std::string dir = parent_of(out);
  ScratchDir tmp(dir, "." + fs::path(out).filename().string() + ".");
  for (const auto& f : files)
    if (copy_file(f.path, tmp.path() + "/" + f.name) != f.sha256)
      throw Error(f.path +
                  ": changed while it was packed; hint: pack again once the build has "
                  "finished");
  write_file_durably(tmp.path() + "/" + kPackageMetadataFile, package_info_toml(info), 0644);
  if (::chmod(tmp.path().c_str(), 0755) != 0) sys_fail("chmod of", tmp.path(), errno);
  fsync_path(tmp.path());
  if (!durable_rename_new(tmp.path(), out))
    throw Error(out +
                ": already exists; hint: remove it, or write the package elsewhere with "
                "--output");
  tmp.release();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string pack(const std::string& build_dir, const std::optional<std::string>& output,
                 PackageInfo* packed) {
  const std::string bd = absolute_path(build_dir);
  if (!fs::is_directory(bd))
    throw Error(build_dir +
                ": not a directory; hint: name the plugin's build directory (the "
                "one `meson setup` made)");
  const std::string toml_path = bd + "/" + kPackageMetadataFile;
  if (!lexists(toml_path))
    throw Error(toml_path +
                ": not found; hint: the plugin's meson.build writes it into the "
                "build directory (`keel plugins new` sets that up); else write name, version, "
                "description and license there");
  const Located l = read_info(toml_path, toml_path, Keys::build);
  PackageInfo info = l.info;

  // The plugin libraries: regular *.so files at the top level that export the entry symbol.
  std::vector<std::string> candidates, skipped, plugins;
  std::error_code ec;
  for (auto it = fs::directory_iterator(bd, ec); !ec && it != fs::end(it); it.increment(ec)) {
    std::error_code sec;
    const std::string name = it->path().filename().string();
    if (fs::is_regular_file(it->symlink_status(sec)) && ends_with(name, ".so"))
      candidates.push_back(name);
  }
  if (ec)
    throw Error(build_dir + ": cannot read it: " + ec.message() + "; hint: check its permissions");
  std::sort(candidates.begin(), candidates.end());
  for (const auto& name : candidates) {
    UniqueFd fd(::open((bd + "/" + name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) sys_fail("opening", bd + "/" + name, errno);
    const std::string why = elf_plugin_check(fd.get());
    if (why.empty())
      plugins.push_back(name);
    else
      skipped.push_back(name + " (" + why + ")");
  }
  if (plugins.empty())
    throw Error(build_dir + ": no keel plugin .so in it" +
                (skipped.empty() ? "" : " (skipped: " + text::join(skipped, "; ") + ")") +
                "; hint: build the plugin first (`meson compile -C " + build_dir + "`)");

  Registry registry;
  std::vector<PackFile> files;
  const LoadedPlugin* cxx = nullptr;  // the first C++ plugin (with a LibTorch fingerprint)
  for (const auto& name : plugins) {
    const std::string path = bd + "/" + name;
    if (!registry.load(path))
      throw Error(text::one_line(path + ": cannot pack it: " + registry.refusals().back().reason));
    const LoadedPlugin& p = *registry.plugins().back();
    if (p.version != info.version)
      fail_at(l.where.at("version"),
              "says version " + info.version + ", but " + name + " declares " + p.version,
              "make them agree (the plugin's KEEL_PLUGIN(...) version and its meson.build "
              "project version), rebuild, and pack again");
    const keel_build_fingerprint& f = p.descriptor->fingerprint;
    if (f.torch_version != nullptr) {
      const std::string tv = bounded(f.torch_version);
      if (cxx && (tv != *info.torch_version || f.cxx11_abi != *info.cxx11_abi))
        throw Error(path + ": built with LibTorch " + tv +
                    " (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(f.cxx11_abi) + "), but " +
                    cxx->path + " with LibTorch " + *info.torch_version +
                    " (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(*info.cxx11_abi) +
                    "); hint: build every plugin of a package "
                    "against the same SDK");
      if (!cxx) {
        cxx = &p;
        info.torch_version = tv;
        info.cxx11_abi = f.cxx11_abi;
      }
    }
    info.abi_major = KEEL_ABI_MAJOR;  // the loader refuses every other major
    info.abi_minor = std::max(info.abi_minor, p.descriptor->abi_minor);
    info.files[name] = p.sha256;
    files.push_back({name, path, p.sha256});
  }
  for (const auto& c : registry.components())
    info.components.push_back(std::string(kind_name(c->kind)) + ":" + c->name);

  std::string out = output ? *output : info.name + "-" + info.version + ".tar.gz";
  out = absolute_path(out);
  if (ends_with(out, ".tar.gz")) {
    write_tarball(out, info, files);
  } else {
    if (lexists(out))
      throw Error(out +
                  ": already exists; hint: remove it, or write the package elsewhere with "
                  "--output");
    write_package_dir(out, info, files);
  }
  if (packed) *packed = info;
  return out;
}

}  // namespace

std::string pack_package(const std::string& build_dir, const std::optional<std::string>& output,
                         PackageInfo* packed) {
  return add_hint([&] { return pack(build_dir, output, packed); }, file_hint);
}

}  // namespace keel
