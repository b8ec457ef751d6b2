// The safetensors header (https://github.com/huggingface/safetensors): parsing and validation,
// without LibTorch (the plugin, tests/unit/test_safetensors.cpp and tests/fuzz/fuzz_safetensors.cpp
// share it).
//
// A file is: 8-byte little-endian header length N, N bytes of JSON header (a UTF-8 object:
// tensor name -> {"dtype", "shape", "data_offsets"}, plus an optional "__metadata__" map of
// strings), then the data section, which the tensors tile exactly.
//
// Everything the reference implementation refuses (lib read_metadata / Metadata::validate) is
// refused here too, plus duplicate keys, unknown fields in a tensor entry, a header that does
// not start with '{', and dimensions beyond int64. Errors are std::runtime_error with one line:
// "'<file>': <what is wrong> (file corrupt or not written in the safetensors format)".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace keel_safetensors {

constexpr uint64_t kLengthBytes = 8;
constexpr uint64_t kMaxHeaderSize = 100000000;  // the reference's MAX_HEADER_SIZE (100 MB)

struct DType {
  const char* name;
  unsigned bits;  // per element: 4 and 6 for the MX formats, else a multiple of 8
};
// Every dtype the format defines; nullptr for an unknown name.
const DType* find_dtype(std::string_view name);

struct TensorEntry {
  std::string name;
  const DType* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the start of the data section
};

struct Header {
  uint64_t header_size = 0;                     // N
  std::vector<TensorEntry> tensors;             // in header order
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty when absent or null)
  uint64_t data_start() const { return kLengthBytes + header_size; }
};

// N from the first bytes of a file of `file_size` bytes (`prefix` holds at least the first 8
// of them when the file has 8): checks that the file holds the length, N <= kMaxHeaderSize and
// the header fits in the file.
uint64_t read_header_size(std::string_view prefix, uint64_t file_size, const std::string& file);

// Parses and validates `text`, the N header bytes of a file of `file_size` bytes.
Header parse_header(std::string_view text, uint64_t file_size, const std::string& file);

// read_header_size + parse_header for a whole file in memory.
Header parse_file(std::string_view bytes, const std::string& file);

// "[2, 3]" (at most 16 dimensions shown).
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace keel_safetensors
