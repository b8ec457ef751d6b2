// The Criteo click-log format and reading it (plugins/criteo): the line parser and a file
// source that yields the bytes of a plain or zstd-compressed file. No LibTorch here.
//
// A record is one line of 40 tab-separated fields, `label \t I1..I13 \t C1..C26`:
//   label   "0" or "1"
//   I1..I13 a decimal integer (a sign allowed) or empty (missing)
//   C1..C26 a hexadecimal value of 1 to 16 digits (either case, no "0x") below 2^53, or empty
// A line ends at '\n'; a '\r' before it is dropped; the last line of a file may lack the '\n'.
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

// Parses the line [begin, end) (without its '\n'). On success fills out[kColumns] and *label
// and returns true; otherwise sets *error to what is wrong, naming the field ("C7: 'zz' is not
// hexadecimal") and returns false.
bool parse_record(const char* begin, const char* end, double* out, float* label,
                  std::string* error);

// The bytes of one window file, decompressed when its name ends in ".zst" (libzstd streaming).
class Source {
 public:
  explicit Source(std::string path);  // throws std::runtime_error naming the file
  ~Source();
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  // Up to `n` bytes into `buf`; 0 at the end. A compressed file that ends inside a frame (a
  // truncated .zst) or holds corrupt data throws naming the file.
  size_t read(char* buf, size_t n);
  // Moves to byte `offset` of the (decompressed) stream: a plain file seeks; a .zst is
  // decompressed from its start and the bytes before `offset` discarded. Call it first.
  void skip_to(uint64_t offset);
  const std::string& path() const { return path_; }
  bool compressed() const { return zstd_ != nullptr; }

 private:
  size_t read_raw(char* buf, size_t n);
  std::string path_;
  int fd_ = -1;
  void* zstd_ = nullptr;  // ZSTD_DStream*
  std::string in_;        // compressed bytes read, not yet decompressed
  size_t in_pos_ = 0;
  bool raw_eof_ = false;
  size_t last_hint_ = 0;  // ZSTD_decompressStream's last result (0: at a frame's end)
};

}  // namespace criteo
