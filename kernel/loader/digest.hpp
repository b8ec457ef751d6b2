// SHA-256 of plugin files (lock files, packages), with OpenSSL's libcrypto.
#pragma once

#include <memory>
#include <string>

typedef struct evp_md_ctx_st EVP_MD_CTX;

namespace keel {

// SHA-256 of bytes as they stream past (OpenSSL EVP).
class Sha256 {
 public:
  Sha256();  // throws keel::Error when OpenSSL cannot start a digest
  void update(const void* data, size_t size);
  // 64 lowercase hex digits; call once, at the end.
  std::string hex();

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

// The SHA-256 of everything in the open file `fd`, from offset 0 to its end (read with pread,
// so the file offset is left alone), as 64 lowercase hex digits. Throws keel::Error when the
// file cannot be read; `what` names it in that message.
std::string sha256_hex(int fd, const std::string& what);
// The same for the file at `path` (opened read-only).
std::string sha256_file(const std::string& path);

}  // namespace keel
