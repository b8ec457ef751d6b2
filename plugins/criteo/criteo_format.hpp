// The Criteo click-log format and reading it (plugins/criteo): the line parser and a file
// source that yields the bytes of a plain or zstd-compressed file. No LibTorch here.
//
// A record is one line of 40 tab-separated fields, `label \t I1..I13 \t C1..C26`:
//   label   "0" or "1"
//   I1..I13 a decimal integer (a sign allowed) or empty (missing)
//   C1..C26 a hexadecimal value of 1 to 16 digits (either case, no "0x") below 2^53, or empty
// A line ends at '\n'; a '\r' before it is dropped; the last line of a file may lack the '\n'.
// An integer may be any int64, INT64_MIN included.
// parse_record writes the record in the batch layout (docs/recommendation.md, "Data"):
//   out[0..12]  log(1 + max(I, 0)), missing -> 0
//   out[13..38] the categorical value as a number (exact in float64 below 2^53), missing -> -1
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace criteo {

constexpr int kNumeric = 13;
constexpr int kCategorical = 26;
constexpr int kColumns = kNumeric + kCategorical;  // 39: the batch's inputs columns
constexpr int kFields = 1 + kColumns;              // 40 per line

// The largest zstd window a .zst window file may ask for: 2^27 bytes (128 MiB), libzstd's own
// default for streaming, set explicitly so that a frame's header cannot make one reader hold
// more (ZSTD_d_windowLogMax). `zstd --long` (27) writes files within it.
constexpr int kZstdWindowLogMax = 27;

// Parses the line [begin, end) (without its '\n'). On success fills out[kColumns] and *label
// and returns true; otherwise sets *error to what is wrong, naming the field and quoting its
// first 32 bytes with keel::text::printable, so that the error is one line without control
// bytes ("C7: 'zz' is not hexadecimal") and returns false.
bool parse_record(const char* begin, const char* end, double* out, float* label,
                  std::string* error);

// The bytes of one window file, decompressed when its name ends in ".zst" (libzstd streaming).
// The file is opened without following a symbolic link and without blocking (a FIFO), and read
// only when it is a regular file: a window listed as a regular file and replaced since by a
// link, a FIFO or a device is refused, not followed, waited on or read for ever.
class Source {
 public:
  // Throws std::runtime_error naming the file (its name quoted with keel::text::printable, as
  // in every message of the Source).
  explicit Source(std::string path);
  ~Source();
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  // Up to `n` bytes into `buf`; 0 at the end. A compressed file that ends inside a frame (a
  // truncated .zst), holds corrupt data or a frame needing a window over kZstdWindowLogMax
  // throws naming the file.
  size_t read(char* buf, size_t n);
  // Moves to byte `offset` of the (decompressed) stream: a plain file seeks; a .zst is
  // decompressed from its start and the bytes before `offset` discarded. Call it first.
  void skip_to(uint64_t offset);
  const std::string& path() const { return path_; }
  const std::string& shown() const { return shown_; }  // path() for a message
  bool compressed() const { return zstd_ != nullptr; }

 private:
  size_t read_raw(char* buf, size_t n);
  std::string path_, shown_;
  int fd_ = -1;
  void* zstd_ = nullptr;  // ZSTD_DStream*
  std::string in_;        // compressed bytes read, not yet decompressed
  size_t in_pos_ = 0;
  bool raw_eof_ = false;
  size_t last_hint_ = 0;  // ZSTD_decompressStream's last result (0: at a frame's end)
  std::string header_;    // the first bytes of the frame being started (for its window size)
};

}  // namespace criteo
