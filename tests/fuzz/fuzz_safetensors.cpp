// libFuzzer target: the safetensors header reader (plugins/safetensors/safetensors_header.cpp).
//
// Input: one mode byte, then
//   mode even: the bytes of a whole file (8-byte length, header, data), as the plugin reads it;
//   mode odd:  2 bytes of data-section size (little-endian), then the header text: the harness
//              writes the length prefix, so mutations of the JSON are not wasted on it.
// std::runtime_error is the expected refusal; anything else escaping, a message that is not
// one line naming the file, or an accepted header that breaks the format's invariants aborts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "safetensors_header.hpp"

namespace st = keel_safetensors;

namespace {

const std::string kFile = "fuzz.safetensors";

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_safetensors: %s: %s\n", what, detail.c_str());
  std::abort();
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[k] = static_cast<char>(n >> (8 * k));
  return s;
}

// An accepted header must describe a well-formed file: names unique, offsets tiling the data
// section, sizes consistent. Written back as JSON it must read back the same.
void check_accepted(const st::Header& h, uint64_t file_size) {
  std::set<std::string> names;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const st::TensorEntry& e : h.tensors) {
    if (!names.insert(e.name).second) die("duplicate name accepted", e.name);
    if (e.name == "__metadata__") die("__metadata__ read as a tensor", e.name);
    if (e.dtype == nullptr || st::find_dtype(e.dtype->name) != e.dtype) die("bad dtype", e.name);
    unsigned __int128 bits = e.dtype->bits;
    for (int64_t d : e.shape) {
      if (d < 0) die("negative dimension accepted", e.name);
      bits *= static_cast<uint64_t>(d);
      if (bits > (static_cast<unsigned __int128>(1) << 70)) bits = static_cast<unsigned __int128>(1) << 70;
    }
    if (bits % 8 != 0 || bits / 8 != e.end - e.begin) die("size mismatch accepted", e.name);
    spans.emplace_back(e.begin, e.end);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t cursor = 0;
  for (const auto& [b, e] : spans) {
    if (b != cursor || e < b) die("offsets do not tile", std::to_string(b));
    cursor = e;
  }
  if (st::kLengthBytes + h.header_size + cursor != file_size) die("data size mismatch accepted", "");

  // Round trip through nlohmann: same entries, same order.
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const st::TensorEntry& e : h.tensors)
    j[e.name] = {{"dtype", e.dtype->name}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  if (!h.metadata.empty()) j["__metadata__"] = h.metadata;
  const std::string text = j.dump();
  const st::Header again = st::parse_header(text, st::kLengthBytes + text.size() + cursor, kFile);
  if (again.tensors.size() != h.tensors.size() || again.metadata != h.metadata)
    die("round trip changed the header", text);
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const st::TensorEntry &a = h.tensors[i], &b = again.tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin ||
        a.end != b.end)
      die("round trip changed a tensor", a.name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string file;
  if ((data[0] & 1) == 0) {
    file = input;
  } else {
    if (input.size() < 2) return 0;
    const size_t data_size = static_cast<unsigned char>(input[0]) |
                             static_cast<size_t>(static_cast<unsigned char>(input[1])) << 8;
    const std::string header = input.substr(2);
    file = le64(header.size()) + header + std::string(data_size, '\0');
  }
  try {
    const st::Header h = st::parse_file(file, kFile);
    check_accepted(h, file.size());
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    if (msg.rfind("'" + kFile + "': ", 0) != 0 || msg.find('\n') != std::string::npos ||
        msg.size() > 1000)
      die("message is not one line naming the file", msg);
  }
  return 0;
}
