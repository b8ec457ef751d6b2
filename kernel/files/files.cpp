#include "files/files.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

namespace keel {

FileError::FileError(const std::string& what, const std::string& path, int code)
    : Error(what + " " + path + " failed: " + std::strerror(code)), code_(code) {}

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw FileError(what, path, errno);
}

// fsync of the parent directories of a name that was just changed in each.
void fsync_parents(const std::string& a, const std::string& b) {
  fsync_path(parent_of(b));
  if (parent_of(a) != parent_of(b)) fsync_path(parent_of(a));
}

}  // namespace

std::string parent_of(const std::string& path) {
  const std::filesystem::path p = std::filesystem::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

std::string read_file(const std::string& path, bool follow_links) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | (follow_links ? 0 : O_NOFOLLOW)));
  if (fd.get() < 0) fail("opening", path);
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading", path);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

void read_chunks(int fd, const std::string& path,
                 const std::function<void(const char* data, size_t size)>& consume, off_t from) {
  // 64 KiB, not cleared. With a cleared 1 MiB buffer a call (fresh memory each time under
  // AddressSanitizer), plugin loading took 52% of the sanitizer build's manifest units (perf);
  // 32% with this buffer and sendfile's copies (loader/sealed_copy.cpp).
  constexpr size_t kChunk = size_t{64} << 10;
  const std::unique_ptr<char[]> buf(new char[kChunk]);
  for (off_t offset = from;;) {
    const ssize_t n = ::pread(fd, buf.get(), kChunk, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading", path);
    if (n == 0) return;
    consume(buf.get(), static_cast<size_t>(n));
    offset += n;
  }
}

bool write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void write_data(int fd, const void* data, size_t size, const std::string& path) {
  if (!write_all(fd, data, size)) fail("writing", path);
}

UniqueFd create_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail("creating", path);
  return fd;
}

void finish_file(UniqueFd& fd, const std::string& path, mode_t mode) {
  if (mode != 0 && ::fchmod(fd.get(), mode) != 0) fail("chmod of", path);
  if (::fsync(fd.get()) != 0) fail("fsync of", path);
  if (fd.close() != 0) fail("closing", path);
}

void write_file_durably(const std::string& path, const std::string& text, mode_t mode) {
  UniqueFd fd = create_file(path);
  write_data(fd.get(), text.data(), text.size(), path);
  finish_file(fd, path, mode);
}

void fsync_path(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail("opening", path);
  if (::fsync(fd.get()) != 0) fail("fsync of", path);
}

void durable_rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail("renaming " + from + " to", to);
  fsync_parents(from, to);
}

bool durable_rename_new(const std::string& from, const std::string& to) {
  int rc = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP))
    rc = ::rename(from.c_str(), to.c_str());
  if (rc != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY) return false;
    fail("renaming " + from + " to", to);
  }
  fsync_parents(from, to);
  return true;
}

bool durable_exchange(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
    fail("exchanging " + a + " and", b);
  }
  fsync_parents(a, b);
  return true;
}

}  // namespace keel
