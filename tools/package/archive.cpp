// Reading a package .tar.gz for `keel plugins install` (detail.hpp: extract_package), with
// libarchive.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "error.hpp"
#include "files/files.hpp"
#include "package/detail.hpp"
#include "package/package.hpp"
#include "unique_fd.hpp"

namespace keel::package_detail {

using namespace package_text;

namespace {

// ------------------------------------------------------------------------------------------
// Reading a package .tar.gz

using ReadArchive = std::unique_ptr<struct archive, decltype(&archive_read_free)>;

// A regular file one level below the package's top-level directory, as its header says.
struct TarFile {
  std::string path;  // the entry's path, as written
  std::string name;  // its file name
  uint64_t size = 0;
};

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// Walks the archive's headers with every check that needs no data: absolute paths, '..',
// links, devices, anything but regular files one level below one top-level directory, names a
// package must not use, a name twice, sparse entries, and the bounds of package.hpp (entries,
// each file's size, all files' size). Calls `file` for each regular file, which may read its
// data (libarchive skips what it leaves unread). Returns the top-level directory's name.
template <class F>
std::string walk_package(struct archive* a, const std::string& tarball, F&& file) {
  std::string top;
  std::set<std::string> seen;
  uint64_t entries = 0, total = 0;
  for (;;) {
    struct archive_entry* e = nullptr;
    const int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN)
      fail_at(tarball, std::string("cannot read it as a .tar.gz: ") + archive_error_string(a),
              kTarballHint);
    if (++entries > kMaxPackageEntries)
      fail_at(tarball,
              "more than " + std::to_string(kMaxPackageEntries) + " entries (a package holds "
              "keel-plugin.toml and its plugin files)",
              kTarballHint);
    const char* raw = archive_entry_pathname(e);
    if (raw == nullptr) fail_at(tarball, "an entry without a readable path", kTarballHint);
    const std::string path = raw;
    auto bad = [&](const std::string& why) {
      fail_at(tarball, "entry " + toml_quoted(path) + ": " + why, kTarballHint);
    };
    if (!path.empty() && path[0] == '/') bad("an absolute path");
    std::vector<std::string> parts;
    {
      std::string p = path;
      while (p.rfind("./", 0) == 0) p.erase(0, 2);
      size_t start = 0;
      while (start <= p.size()) {
        const size_t slash = p.find('/', start);
        const std::string part =
            p.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        if (part == "..") bad("a path with '..'");
        if (!part.empty() && part != ".") parts.push_back(part);
        if (slash == std::string::npos) break;
        start = slash + 1;
      }
    }
    const mode_t type = archive_entry_filetype(e);
    if (archive_entry_hardlink(e) != nullptr) bad("a hard link");
    if (type == AE_IFLNK) bad("a symbolic link");
    if (type != AE_IFREG && type != AE_IFDIR) bad("not a regular file or directory");
    // A sparse entry's holes read back as zeros: a few bytes in the archive can stand for
    // gigabytes on disk. `keel plugins pack` writes none.
    if (archive_entry_sparse_count(e) > 0) bad("a sparse file; packages hold no sparse files");
    if (parts.empty()) {
      if (type == AE_IFDIR) continue;  // "./"
      bad("an empty path");
    }
    if (top.empty()) top = parts[0];
    if (parts[0] != top) bad("a second top-level entry beside " + toml_quoted(top + "/"));
    if (parts.size() == 1) {
      if (type != AE_IFDIR) bad("a file outside the package's top-level directory");
      continue;
    }
    if (parts.size() > 2 || type == AE_IFDIR) bad("a subdirectory");
    const std::string& name = parts[1];
    if (name == kInstalledMetadataFile || name[0] == '.') bad("a file name a package must not use");
    if (!seen.insert(name).second) bad("appears twice");
    if (!archive_entry_size_is_set(e) || archive_entry_size(e) < 0) bad("a file without a size");
    const uint64_t size = static_cast<uint64_t>(archive_entry_size(e));
    if (size > kMaxPackageFileBytes)
      bad(std::to_string(size) + " bytes, more than a package file may hold (" +
          mib(kMaxPackageFileBytes) + ")");
    total += size;
    if (total > kMaxPackageBytes)
      bad("the package's files add up to more than " + mib(kMaxPackageBytes));
    file(TarFile{path, name, size});
  }
  if (top.empty()) fail_at(tarball, "an empty archive", kTarballHint);
  return top;
}

// Reads the data of the entry `f` that walk_package just passed, in pieces, to `sink`; more
// bytes than its header said is an error (sink never sees them).
template <class Sink>
void read_entry(struct archive* a, const std::string& tarball, const TarFile& f, Sink&& sink) {
  char buf[1 << 16];
  uint64_t read = 0;
  for (;;) {
    const la_ssize_t n = archive_read_data(a, buf, sizeof buf);
    if (n < 0)
      fail_at(tarball, "entry " + toml_quoted(f.path) + ": cannot read it: " + archive_error_string(a),
              kTarballHint);
    if (n == 0) break;
    read += static_cast<uint64_t>(n);
    if (read > f.size)
      fail_at(tarball,
              "entry " + toml_quoted(f.path) + ": more data than the " + std::to_string(f.size) +
                  " bytes its header says",
              kTarballHint);
    sink(buf, static_cast<size_t>(n));
  }
}

// Runs `walk` over the archive open at `fd`, from its start.
template <class F>
std::string read_package_archive(int fd, const std::string& tarball, F&& file) {
  if (::lseek(fd, 0, SEEK_SET) != 0) sys_fail("reading", tarball, errno);
  ReadArchive a(archive_read_new(), archive_read_free);
  if (!a) throw Error("libarchive could not start reading " + tarball);
  archive_read_support_filter_gzip(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_fd(a.get(), fd, 1 << 16) != ARCHIVE_OK)
    fail_at(tarball, std::string("cannot read it as a .tar.gz: ") + archive_error_string(a.get()),
            kTarballHint);
  return walk_package(a.get(), tarball, [&](const TarFile& f) { file(a.get(), f); });
}

}  // namespace

// Extracts the package tarball's files into the empty directory `dest` (files only, mode 0644,
// each fsync'd); returns the name of its one top-level directory. The archive is read twice:
// first its headers and keel-plugin.toml (no data is written), then, with the [files] that
// keel-plugin.toml lists, again to write keel-plugin.toml and exactly those files. An entry
// that walk_package refuses, or a file that [files] does not list, is refused before any of
// its data is written; keel-plugin.toml must read the same both times. `named` is the package
// as the user named it, for messages about keel-plugin.toml.
std::string extract_package(const std::string& tarball, const std::string& dest,
                            const std::string& named) {
  UniqueFd fd(::open(tarball.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) sys_fail("opening", tarball, errno);

  std::optional<std::string> meta;
  std::vector<std::string> names;
  const std::string top = read_package_archive(fd.get(), tarball, [&](struct archive* a, const TarFile& f) {
    names.push_back(f.name);
    if (f.name != kPackageMetadataFile) return;
    if (f.size > kMaxPackageInfoBytes)
      fail_at(tarball,
              "entry " + toml_quoted(f.path) + ": " + std::to_string(f.size) +
                  " bytes, more than a keel-plugin.toml may hold (" + mib(kMaxPackageInfoBytes) + ")",
              kTarballHint);
    meta.emplace();
    read_entry(a, tarball, f, [&](const char* p, size_t n) { meta->append(p, n); });
  });
  const std::string shown = named + ":" + top;
  if (!meta)
    fail_at(shown, std::string("no ") + kPackageMetadataFile + " in it; not a plugin package",
            "make packages from a plugin's build with `keel plugins pack BUILD_DIR`");
  const PackageInfo info =
      parse_package_info(*meta, shown + "/" + kPackageMetadataFile, PackageInfoKeys::kFull).info;
  for (const auto& name : names)
    if (name != kPackageMetadataFile && !info.files.count(name))
      fail_at(shown + "/" + name,
              std::string("not listed in [files] of ") + kPackageMetadataFile +
                  "; nothing of the package was extracted",
              kLayoutHint);

  std::set<std::string> first(names.begin(), names.end());
  const std::string again = read_package_archive(fd.get(), tarball, [&](struct archive* a, const TarFile& f) {
    const bool is_meta = f.name == kPackageMetadataFile;
    if (!first.count(f.name))
      fail_at(tarball, "entry " + toml_quoted(f.path) + " was not there when it was first read",
              "check that nothing rewrites the package file during the install");
    const std::string out = dest + "/" + f.name;
    UniqueFd w = create_file(out);
    std::string text;
    read_entry(a, tarball, f, [&](const char* p, size_t n) {
      if (is_meta) text.append(p, n);
      write_data(w.get(), p, n, out);
    });
    if (is_meta && text != *meta)
      fail_at(tarball, "entry " + toml_quoted(f.path) + " changed while it was read",
              "check that nothing rewrites the package file during the install");
    finish_file(w, out, 0644);
  });
  if (again != top)
    fail_at(tarball, "its top-level directory changed while it was read",
            "check that nothing rewrites the package file during the install");
  return top;
}

}  // namespace keel::package_detail
