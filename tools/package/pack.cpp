// `keel plugins pack` (package.hpp: pack_package): a package from a plugin's build directory.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <vector>

#include "error.hpp"
#include "files/files.hpp"
#include "keel/abi.h"
#include "bounded.hpp"
#include "loader/digest.hpp"
#include "loader/elf.hpp"
#include "loader/registry.hpp"
#include "package/detail.hpp"
#include "package/package.hpp"
#include "text/text.hpp"
#include "unique_fd.hpp"

namespace fs = std::filesystem;

namespace keel {

using namespace package_text;
using namespace package_detail;

// ------------------------------------------------------------------------------------------
// pack

namespace {

using WriteArchive = std::unique_ptr<struct archive, decltype(&archive_write_free)>;

struct PackFile {
  std::string name;    // in the package
  std::string path;    // in the build directory
  std::string sha256;  // what the loader hashed
};

// Streams `path` into the archive as the current entry's data; throws when its bytes no longer
// hash to `sha256`.
void write_entry_data(struct archive* a, const PackFile& f, const std::string& out) {
  UniqueFd fd(::open(f.path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) sys_fail("opening", f.path, errno);
  Sha256 sha;
  add_hint([&] {
    read_chunks(fd.get(), f.path, [&](const char* data, size_t n) {
      sha.update(data, n);
      if (archive_write_data(a, data, n) != static_cast<la_ssize_t>(n))
        throw Error("writing " + out + " failed: " + archive_error_string(a) +
                    "; hint: check that its directory is writable and has free space");
    });
  }, file_hint);
  if (sha.hex() != f.sha256)
    throw Error(f.path +
                ": changed while it was packed; hint: pack again once the build has "
                "finished");
}

int64_t source_date() {
  const char* s = std::getenv("SOURCE_DATE_EPOCH");
  if (!s || !*s) return 0;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  return (*end == '\0' && v >= 0) ? static_cast<int64_t>(v) : 0;
}

void write_tarball(const std::string& out, const PackageInfo& info,
                   const std::vector<PackFile>& files) {
  const std::string dir = parent_of(out);
  std::string tmp = dir + "/." + fs::path(out).filename().string() + ".XXXXXX";
  UniqueFd fd(::mkstemp(tmp.data()));
  if (fd.get() < 0) sys_fail("creating a file in", dir, errno);
  struct Unlink {
    std::string path;
    ~Unlink() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } cleanup{tmp};
  if (::fchmod(fd.get(), 0644) != 0) sys_fail("chmod of", tmp, errno);

  WriteArchive a(archive_write_new(), archive_write_free);
  auto check = [&](int r) {
    if (r < ARCHIVE_WARN)
      throw Error("writing " + out + " failed: " + archive_error_string(a.get()) +
                  "; hint: check that its directory is writable and has free space");
  };
  if (!a) throw Error("libarchive could not start writing " + out);
  check(archive_write_add_filter_gzip(a.get()));
  check(archive_write_set_format_pax_restricted(a.get()));
  archive_write_set_options(a.get(), "gzip:!timestamp");  // reproducible: no time in the header
  check(archive_write_open_fd(a.get(), fd.get()));
  const std::string top = info.name + "-" + info.version;
  const int64_t mtime = source_date();
  auto header = [&](const std::string& path, mode_t type, mode_t perm, int64_t size) {
    std::unique_ptr<struct archive_entry, decltype(&archive_entry_free)> e(archive_entry_new(),
                                                                           archive_entry_free);
    archive_entry_set_pathname(e.get(), path.c_str());
    archive_entry_set_filetype(e.get(), type);
    archive_entry_set_perm(e.get(), perm);
    archive_entry_set_size(e.get(), size);
    archive_entry_set_mtime(e.get(), mtime, 0);
    archive_entry_set_uid(e.get(), 0);
    archive_entry_set_gid(e.get(), 0);
    check(archive_write_header(a.get(), e.get()));
  };
  header(top + "/", AE_IFDIR, 0755, 0);
  const std::string meta = package_info_toml(info);
  header(top + "/" + kPackageMetadataFile, AE_IFREG, 0644, static_cast<int64_t>(meta.size()));
  if (archive_write_data(a.get(), meta.data(), meta.size()) != static_cast<la_ssize_t>(meta.size()))
    check(ARCHIVE_FATAL);
  for (const auto& f : files) {
    struct stat st;
    if (::stat(f.path.c_str(), &st) != 0) sys_fail("checking", f.path, errno);
    header(top + "/" + f.name, AE_IFREG, 0644, st.st_size);
    write_entry_data(a.get(), f, out);
  }
  check(archive_write_close(a.get()));
  finish_file(fd, tmp);
  durable_rename(tmp, out);
  cleanup.path.clear();
}

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
  // Where RENAME_NOREPLACE is missing, rename() still refuses a non-empty existing directory.
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

// The plugin libraries of build directory `bd` (`build_dir` as the user named it): the regular
// *.so files at its top level that export the entry symbol, sorted. Throws when there is none.
std::vector<std::string> plugin_files(const std::string& bd, const std::string& build_dir) {
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
                (skipped.empty() ? std::string() : " (skipped: " + text::join(skipped, "; ") + ")") +
                "; hint: build the plugin first (`meson compile -C " + build_dir + "`)");
  return plugins;
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
  const LocatedPackageInfo l = read_package_info(toml_path, toml_path, PackageInfoKeys::kBuild);
  PackageInfo info = l.info;

  const std::vector<std::string> plugins = plugin_files(bd, build_dir);

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

// The file-system layer's errors get the packages' hint (file_hint).
std::string pack_package(const std::string& build_dir, const std::optional<std::string>& output,
                         PackageInfo* packed) {
  return add_hint([&] { return pack(build_dir, output, packed); }, file_hint);
}

}  // namespace keel
