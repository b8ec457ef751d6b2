#include "checkpoint/checksum.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <memory>

#include "files/files.hpp"

namespace keel {

uint64_t hash_fd(int fd, const std::string& path, uint64_t* size) {
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                        &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  uint64_t total = 0;
  read_chunks(fd, path, [&](const char* data, size_t n) {
    XXH3_64bits_update(state.get(), data, n);
    total += n;
  });
  if (size) *size = total;
  return XXH3_64bits_digest(state.get());
}

uint64_t hash_file(const std::string& path, uint64_t* size, bool sync) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw FileError("opening", path, errno);
  const uint64_t h = hash_fd(fd.get(), path, size);
  if (sync && ::fsync(fd.get()) != 0) throw FileError("fsync of", path, errno);
  return h;
}

std::string hash_string(uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "xxh3:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

uint64_t hash_text(const std::string& text) { return XXH3_64bits(text.data(), text.size()); }

}  // namespace keel
