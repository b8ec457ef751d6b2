// Durable file-system operations for the checkpoint commit protocol, after PostgreSQL's
// durable_rename (src/backend/storage/file/fd.c): data is fsync'd before the name that makes
// it visible, and the directory holding a new name is fsync'd after it. Every function throws
// keel::Error naming the path and the errno text on failure. LibTorch-free.
#pragma once

#include <cstdint>
#include <string>

namespace keel {

// fsync of a file or a directory (opened read-only; Linux flushes either way).
void fsync_path(const std::string& path);

// Writes `text` to a new file `path` (O_EXCL), fsyncs it and closes it.
void write_file_durably(const std::string& path, const std::string& text);

// XXH3-64 of a file's bytes, read in 1 MiB chunks, and its size; with `sync`, the file is
// fsync'd through the same descriptor.
uint64_t hash_file(const std::string& path, uint64_t* size, bool sync);

// The whole content of a file; throws keel::Error "<path>: cannot read it" when it cannot.
std::string read_file(const std::string& path);

// "xxh3:<16 lowercase hex digits>".
std::string hash_string(uint64_t h);
uint64_t hash_text(const std::string& text);

// rename(from, to), then fsync of to's parent directory (and of from's, when it differs).
void durable_rename(const std::string& from, const std::string& to);

// Like durable_rename, but does not replace an existing `to`: returns false, touching nothing,
// when it exists (renameat2 RENAME_NOREPLACE; where the file system lacks that flag, plain
// rename(), which refuses only when `to` is a non-empty directory, as a checkpoint is).
bool durable_rename_new(const std::string& from, const std::string& to);

// Atomically swaps two existing directory entries (renameat2 RENAME_EXCHANGE), then fsyncs
// their parent. Returns false, touching nothing, where the file system cannot exchange.
bool durable_exchange(const std::string& a, const std::string& b);

}  // namespace keel
