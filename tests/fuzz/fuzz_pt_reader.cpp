// libFuzzer target: the restricted .pt reader of the torch checkpoint backend
// (plugins/torch_checkpoint/pt_reader.cpp), which reads a .pt file before LibTorch sees any of it.
//
// Input: one mode byte, then, by the mode byte mod 3,
//   0 (file):     the bytes of a whole .pt file (zip archive and all), as the plugin reads it;
//   1 (pickle):   one byte n (taken mod 8), n sizes of 2 bytes (little-endian), then the bytes of
//                 data.pkl: the harness writes a valid stored zip of archive/data.pkl,
//                 archive/version and archive/data/0 .. archive/data/<n-1> (zero bytes of those
//                 sizes), so that mutations of the pickle are not wasted on the zip framing;
//   2 (geometry): one tensor's numbers, the harness writing its pickle and its zip: a byte
//                 choosing the storage class (mod 12), the storage's numel, the storage offset,
//                 a byte of dimensions (mod 9), then a size and a stride per dimension, each
//                 number 8 bytes little-endian (two's complement); its data record holds
//                 numel * element-size zero bytes (taken mod 2^16 when larger, so refused), so
//                 that a view one element past its storage is one integer mutation away.
// std::runtime_error is the expected refusal; anything else escaping, a message that is not one
// line naming the file, or an accepted file whose tensors break the reader's promises (each view
// inside its storage, each storage record inside the file and of the storage's byte size) aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pt_reader.hpp"

namespace pt = keel_torch_pt;

namespace {

const std::string kFile = "fuzz.pt";

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_pt_reader: %s: %s\n", what, detail.c_str());
  std::abort();
}

// ---- a stored zip archive, as torch::pickle_save writes one (CRC included) -------------------

uint32_t crc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (const unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put(std::string& out, uint64_t v, int n) {
  for (int k = 0; k < n; ++k) out += static_cast<char>(v >> (8 * k));
}

std::string stored_zip(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out, central;
  for (const auto& [name, data] : records) {
    const uint64_t offset = out.size();
    const uint32_t crc = crc32(data);
    put(out, 0x04034b50, 4);  // local header
    put(out, 20, 2);          // version needed
    put(out, 0, 2);           // flags
    put(out, 0, 2);           // method: stored
    put(out, 0, 4);           // time, date
    put(out, crc, 4);
    put(out, data.size(), 4);
    put(out, data.size(), 4);
    put(out, name.size(), 2);
    put(out, 0, 2);  // extra
    out += name;
    out += data;
    put(central, 0x02014b50, 4);  // central directory entry
    put(central, 20, 2);          // version made by
    put(central, 20, 2);          // version needed
    put(central, 0, 2);
    put(central, 0, 2);
    put(central, 0, 4);
    put(central, crc, 4);
    put(central, data.size(), 4);
    put(central, data.size(), 4);
    put(central, name.size(), 2);
    put(central, 0, 2);  // extra
    put(central, 0, 2);  // comment
    put(central, 0, 2);  // disk
    put(central, 0, 2);  // internal attributes
    put(central, 0, 4);  // external attributes
    put(central, offset, 4);
    central += name;
  }
  const uint64_t cd_off = out.size();
  out += central;
  put(out, 0x06054b50, 4);  // end record
  put(out, 0, 2);
  put(out, 0, 2);
  put(out, records.size(), 2);
  put(out, records.size(), 2);
  put(out, central.size(), 4);
  put(out, cd_off, 4);
  put(out, 0, 2);  // comment
  return out;
}

// ---- geometry mode: a pickle of {"w": tensor}, as Python's torch.save writes it ---------------

const char* const kStorageClasses[12] = {
    "DoubleStorage", "FloatStorage", "HalfStorage",  "BFloat16Storage",    "LongStorage",
    "IntStorage",    "ShortStorage", "CharStorage",  "ByteStorage",        "BoolStorage",
    "ComplexFloatStorage", "ComplexDoubleStorage"};
const uint64_t kStorageBytes[12] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1, 8, 16};

struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;
  uint64_t u(int n) {
    if (end - p < n) {
      ok = false;
      return 0;
    }
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
    p += n;
    return v;
  }
};

std::string long1(uint64_t v) {  // LONG1 of 8 bytes
  std::string s = "\x8a\x08";
  put(s, v, 8);
  return s;
}

std::string unicode(const std::string& text) {  // BINUNICODE
  std::string s = "X";
  put(s, text.size(), 4);
  return s + text;
}

// The file, or "" when the input is too short.
std::string geometry_file(const uint8_t* data, size_t size) {
  Reader r{data, data + size};
  const size_t cls = r.u(1) % 12;
  const uint64_t numel = r.u(8), offset = r.u(8);
  const size_t ndim = r.u(1) % 9;
  std::string sizes = "(", strides = "(";
  for (size_t k = 0; k < ndim; ++k) {
    sizes += long1(r.u(8));
    strides += long1(r.u(8));
  }
  if (!r.ok) return "";
  sizes += "t";
  strides += "t";
  const std::string pickle =
      std::string("\x80\x02}") + unicode("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" +
      unicode("storage") + "ctorch\n" + kStorageClasses[cls] + "\n" + unicode("0") +
      unicode("cpu") + long1(numel) + "tQ" + long1(offset) + sizes + strides +
      "\x89" "ccollections\nOrderedDict\n)RtRs.";
  const unsigned __int128 bytes = static_cast<unsigned __int128>(numel) * kStorageBytes[cls];
  const size_t record = bytes <= 65536 ? static_cast<size_t>(bytes) : static_cast<size_t>(bytes % 65536);
  return stored_zip({{"archive/data.pkl", pickle},
                     {"archive/data/0", std::string(record, '\0')},
                     {"archive/version", "3\n"}});
}

// ---- the reader's promises ---------------------------------------------------------------------

// Bytes per element of the dtypes of the storage classes the reader allows, written out here
// (not c10::elementSize) so that the check does not share the reader's table.
uint64_t element_bytes(c10::ScalarType t) {
  using c10::ScalarType;
  switch (t) {
    case ScalarType::Double: case ScalarType::Long: case ScalarType::ComplexFloat: return 8;
    case ScalarType::Float: case ScalarType::Int: return 4;
    case ScalarType::Half: case ScalarType::BFloat16: case ScalarType::Short: return 2;
    case ScalarType::Char: case ScalarType::Byte: case ScalarType::Bool: return 1;
    case ScalarType::ComplexDouble: return 16;
    default: return 0;
  }
}

void check_accepted(const std::vector<pt::TensorSpec>& specs, const std::vector<char>& file) {
  std::set<std::string> names;
  for (const pt::TensorSpec& t : specs) {
    const std::string& n = t.name;
    if (!names.insert(n).second) die("duplicate name accepted", n);
    const uint64_t esize = element_bytes(t.dtype);
    if (esize == 0) die("a dtype outside the storage classes accepted", n);
    if (t.sizes.size() != t.strides.size()) die("sizes and strides of different lengths accepted", n);
    if (t.sizes.size() > 64) die("over 64 dimensions accepted", n);
    if (t.storage_offset < 0) die("negative storage offset accepted", n);
    bool empty = false;
    for (size_t k = 0; k < t.sizes.size(); ++k) {
      if (t.sizes[k] < 0) die("negative size accepted", n);
      if (t.strides[k] < 0) die("negative stride accepted", n);
      empty = empty || t.sizes[k] == 0;
    }
    // The last element the view reaches, in 128 bits (64 dimensions of 2^63 * 2^63 fit).
    unsigned __int128 last = static_cast<uint64_t>(t.storage_offset);
    for (size_t k = 0; k < t.sizes.size() && !empty; ++k)
      last += static_cast<unsigned __int128>(static_cast<uint64_t>(t.sizes[k] - 1)) *
              static_cast<uint64_t>(t.strides[k]);
    if (!empty && last >= t.storage_numel)
      die("a view reaching past its storage accepted", n + " (storage of " +
          std::to_string(t.storage_numel) + " elements)");
    if (empty && static_cast<uint64_t>(t.storage_offset) > t.storage_numel)
      die("an empty view whose offset lies past its storage accepted", n);
    unsigned __int128 bytes = static_cast<unsigned __int128>(t.storage_numel) * esize;
    if (bytes != t.data_bytes) die("a storage record of another byte size accepted", n);
    if (t.data_begin > file.size() || t.data_bytes > file.size() - t.data_begin)
      die("a storage record outside the file accepted", n);
    if (t.dtype == c10::ScalarType::Bool)
      for (uint64_t k = 0; k < t.data_bytes; ++k)
        if (static_cast<unsigned char>(file[t.data_begin + k]) > 1)
          die("a bool other than 0 or 1 accepted", n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<char> file;
  const int mode = data[0] % 3;
  if (mode == 0) {
    file.assign(data + 1, data + size);
  } else if (mode == 2) {
    const std::string zip = geometry_file(data + 1, size - 1);
    if (zip.empty()) return 0;
    file.assign(zip.begin(), zip.end());
  } else {
    if (size < 2) return 0;
    const size_t n = data[1] % 8;
    if (size < 2 + 2 * n) return 0;
    std::vector<std::pair<std::string, std::string>> records;
    const uint8_t* p = data + 2;
    std::vector<size_t> sizes;
    for (size_t k = 0; k < n; ++k, p += 2) sizes.push_back(p[0] | static_cast<size_t>(p[1]) << 8);
    records.emplace_back("archive/data.pkl",
                         std::string(reinterpret_cast<const char*>(p), data + size - p));
    for (size_t k = 0; k < n; ++k)
      records.emplace_back("archive/data/" + std::to_string(k), std::string(sizes[k], '\0'));
    records.emplace_back("archive/version", "3\n");
    const std::string zip = stored_zip(records);
    file.assign(zip.begin(), zip.end());
  }
  try {
    const std::vector<pt::TensorSpec> specs = pt::read_pt(file, kFile);
    check_accepted(specs, file);
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    // The longest message: a geometry of 64 sizes and 64 strides of 20 digits, about 3 KB.
    if (msg.rfind("'" + kFile + "': ", 0) != 0 || msg.find('\n') != std::string::npos ||
        msg.size() > 4096)
      die("message is not one line naming the file", msg);
  }
  return 0;
}
