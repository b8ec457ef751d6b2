// The file-system layer: reading a whole file, and writing and renaming durably, after
// PostgreSQL's durable_rename (src/backend/storage/file/fd.c): data is fsync'd before the name
// that makes it visible, and the directory holding a new name is fsync'd after it.
//
// Every failure throws keel::FileError, whose message is neutral: what failed, the path and the
// errno text ("renaming a to b failed: No space left on device"). The caller knows what the
// file is for and adds its own hint (add_hint below); this layer never guesses one.
// LibTorch-free.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>

#include "error.hpp"
#include "unique_fd.hpp"

namespace keel {

// A failed file-system call: "<what> <path> failed: <errno text>"; code() is the errno.
class FileError : public Error {
 public:
  FileError(const std::string& what, const std::string& path, int code);
  int code() const { return code_; }

 private:
  int code_;
};

// Runs `body`; a FileError it throws is thrown again as a keel::Error with "; hint: " and
// hint(code) appended. How a caller adds its own hint to this layer's neutral messages.
template <class Body, class Hint>
auto add_hint(Body&& body, Hint&& hint) -> decltype(body()) {
  try {
    return std::forward<Body>(body)();
  } catch (const FileError& e) {
    throw Error(std::string(e.what()) + "; hint: " + hint(e.code()));
  }
}

// The directory holding `path` ("." for a bare name).
std::string parent_of(const std::string& path);

// The whole content of the file `path`. With follow_links false, a symbolic link is refused
// (O_NOFOLLOW: FileError "opening", code ELOOP).
std::string read_file(const std::string& path, bool follow_links = true);

// Reads the open file `fd` from byte `from` to its end with pread (its file offset is left
// alone), 64 KiB at a time into one buffer allocated once and not cleared, and passes each piece
// to consume(data, size) in order. Throws FileError "reading <path>" when a read fails; what
// consume throws passes through.
void read_chunks(int fd, const std::string& path,
                 const std::function<void(const char* data, size_t size)>& consume, off_t from = 0);

// Writes all of `size` bytes at `data` to `fd`; false (errno set) on failure.
bool write_all(int fd, const void* data, size_t size);
inline bool write_all(int fd, const std::string& text) {
  return write_all(fd, text.data(), text.size());
}
// Like write_all, but throws FileError "writing <path>" on failure.
void write_data(int fd, const void* data, size_t size, const std::string& path);

// A new file `path` opened for writing (O_EXCL, O_NOFOLLOW; mode 0644 less the umask).
UniqueFd create_file(const std::string& path);
// Finishes a file written through `fd`: chmod to `mode` exactly (whatever the umask) unless it
// is 0, fsync, close (whose result is checked).
void finish_file(UniqueFd& fd, const std::string& path, mode_t mode = 0);
// A new file `path` (it must not exist) holding `text`, fsync'd: create_file, write_data,
// finish_file(mode).
void write_file_durably(const std::string& path, const std::string& text, mode_t mode = 0);

// fsync of a file or a directory (opened read-only; Linux flushes either way).
void fsync_path(const std::string& path);

// rename(from, to), then fsync of to's parent directory (and of from's, when it differs).
void durable_rename(const std::string& from, const std::string& to);

// Like durable_rename, but does not replace an existing `to`: returns false, touching nothing,
// when it exists (renameat2 RENAME_NOREPLACE; where the file system lacks that flag, plain
// rename(), which refuses only when `to` is a non-empty directory).
bool durable_rename_new(const std::string& from, const std::string& to);

// Atomically swaps two existing directory entries (renameat2 RENAME_EXCHANGE), then fsyncs
// their parents. Returns false, touching nothing, where the file system cannot exchange.
bool durable_exchange(const std::string& a, const std::string& b);

}  // namespace keel
