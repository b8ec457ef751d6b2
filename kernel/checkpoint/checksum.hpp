// The checkpoint's checksums: XXH3-64 of a file or a text, as the commit record writes them.
// LibTorch-free.
#pragma once

#include <cstdint>
#include <string>

namespace keel {

// XXH3-64 of a file's bytes, read in 1 MiB chunks, and its size; with `sync`, the file is
// fsync'd through the same descriptor. Throws keel::FileError (files/files.hpp).
uint64_t hash_file(const std::string& path, uint64_t* size, bool sync);

// XXH3-64 of the bytes of open descriptor `fd` from its current offset to its end, and their
// count (`path` names it in errors). Throws keel::FileError.
uint64_t hash_fd(int fd, const std::string& path, uint64_t* size);

// "xxh3:<16 lowercase hex digits>".
std::string hash_string(uint64_t h);
uint64_t hash_text(const std::string& text);

}  // namespace keel
