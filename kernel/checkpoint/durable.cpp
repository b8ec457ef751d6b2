#include "checkpoint/durable.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <utility>
#include <vector>

#include "error.hpp"
#include "unique_fd.hpp"

namespace keel {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error(what + " " + path + " failed: " + std::strerror(errno) +
              (errno == ENOSPC || errno == EFBIG || errno == EDQUOT
                   ? "; hint: free space in the run directory or lower [checkpoint] keep_last"
                   : "; hint: check that the run directory is writable"));
}

std::string parent_of(const std::string& path) {
  const std::filesystem::path p = std::filesystem::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

}  // namespace

void fsync_path(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail("opening", path);
  if (::fsync(fd.get()) != 0) fail("fsync of", path);
}

void write_file_durably(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail("creating", path);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", path);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) fail("fsync of", path);
  if (fd.close() != 0) fail("closing", path);
}

uint64_t hash_file(const std::string& path, uint64_t* size, bool sync) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail("opening", path);
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                        &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading", path);
    if (n == 0) break;
    XXH3_64bits_update(state.get(), buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  if (sync && ::fsync(fd.get()) != 0) fail("fsync of", path);
  if (size) *size = total;
  return XXH3_64bits_digest(state.get());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw Error(path + ": cannot read it; hint: check its permissions");
  return text.str();
}

std::string hash_string(uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "xxh3:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

uint64_t hash_text(const std::string& text) { return XXH3_64bits(text.data(), text.size()); }

void durable_rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail("renaming " + from + " to", to);
  fsync_path(parent_of(to));
  if (parent_of(from) != parent_of(to)) fsync_path(parent_of(from));
}

bool durable_rename_new(const std::string& from, const std::string& to) {
  int rc = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP))
    rc = ::rename(from.c_str(), to.c_str());
  if (rc != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY) return false;
    fail("renaming " + from + " to", to);
  }
  fsync_path(parent_of(to));
  if (parent_of(from) != parent_of(to)) fsync_path(parent_of(from));
  return true;
}

bool durable_exchange(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
    fail("exchanging " + a + " and", b);
  }
  fsync_path(parent_of(b));
  return true;
}

}  // namespace keel
