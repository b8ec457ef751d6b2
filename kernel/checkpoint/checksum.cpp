#include "checkpoint/checksum.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <vector>

#include "files/files.hpp"

namespace keel {

uint64_t hash_file(const std::string& path, uint64_t* size, bool sync) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw FileError("opening", path, errno);
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                        &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw FileError("reading", path, errno);
    if (n == 0) break;
    XXH3_64bits_update(state.get(), buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  if (sync && ::fsync(fd.get()) != 0) throw FileError("fsync of", path, errno);
  if (size) *size = total;
  return XXH3_64bits_digest(state.get());
}

std::string hash_string(uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "xxh3:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

uint64_t hash_text(const std::string& text) { return XXH3_64bits(text.data(), text.size()); }

}  // namespace keel
