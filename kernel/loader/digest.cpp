#include "digest.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "error.hpp"
#include "files/files.hpp"

namespace keel {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
    throw Error("OpenSSL could not start a SHA-256 digest");
}

void Sha256::update(const void* data, size_t size) { EVP_DigestUpdate(ctx_.get(), data, size); }

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_.get(), md, &len);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += digits[md[i] >> 4];
    out += digits[md[i] & 15];
  }
  return out;
}

std::string sha256_hex(int fd, const std::string& what) {
  Sha256 sha;
  read_chunks(fd, what, [&](const char* data, size_t size) { sha.update(data, size); });
  return sha.hex();
}

std::string sha256_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  try {
    std::string h = sha256_hex(fd, path);
    close(fd);
    return h;
  } catch (...) {
    close(fd);
    throw;
  }
}

}  // namespace keel
