// checkpoint component: the safetensors format (https://github.com/huggingface/safetensors).
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header (padded with spaces to
// a multiple of 8), then the tensors' raw little-endian bytes, back to back, in header order.
#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "json_string.hpp"
#include "keel/plugin.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the safetensors plugin assumes a little-endian host"
#endif

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // same cap as the reference implementation

struct DType {
  const char* name;
  size_t size;
  at::ScalarType scalar;  // at::ScalarType::Undefined: valid in the format, not loadable here
};
const DType kDTypes[] = {
    {"F32", 4, at::kFloat},
    {"F64", 8, at::kDouble},
    {"F16", 2, at::kHalf},
    {"BF16", 2, at::kBFloat16},
    {"I64", 8, at::kLong},
    {"I32", 4, at::kInt},
    {"I8", 1, at::kChar},
    {"U8", 1, at::kByte},
    {"BOOL", 1, at::kBool},
    {"I16", 2, at::ScalarType::Undefined},
    {"U16", 2, at::ScalarType::Undefined},
    {"U32", 4, at::ScalarType::Undefined},
    {"U64", 8, at::ScalarType::Undefined},
    {"F8_E4M3", 1, at::ScalarType::Undefined},
    {"F8_E5M2", 1, at::ScalarType::Undefined},
};

const DType* dtype_by_name(const std::string& name) {
  for (const DType& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}
const DType* dtype_of(at::ScalarType s) {
  for (const DType& d : kDTypes)
    if (d.scalar == s && s != at::ScalarType::Undefined) return &d;
  return nullptr;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

using keel_plugins::json_string;

// ---------------------------------------------------------------------------------------------
// A strict parser for exactly the JSON a safetensors header may hold.
// ---------------------------------------------------------------------------------------------
struct Entry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& file) : s_(text), file_(file) {}

  // Tensor entries in header order.
  std::vector<std::pair<std::string, Entry>> parse() {
    std::vector<std::pair<std::string, Entry>> out;
    std::map<std::string, bool> seen;
    if (s_.empty() || s_[0] != '{') fail("header does not start with '{'");
    object([&](const std::string& key) {
      if (!seen.emplace(key, true).second) fail("duplicate key " + json_string(key));
      if (key == "__metadata__") {
        object([&](const std::string&) { string(); });
      } else {
        out.emplace_back(key, entry(key));
      }
    });
    ws();
    if (i_ != s_.size()) fail("unexpected data after the header object");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("'" + file_ + "': malformed header at byte " + std::to_string(i_) +
                             ": " + what +
                             " (file corrupt or not written in the safetensors format)");
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  void expect(char c) {
    ws();
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  bool peek(char c) {
    ws();
    return i_ < s_.size() && s_[i_] == c;
  }
  // '{' "key" ':' value (',' "key" ':' value)* '}'; `member` parses each value.
  template <class F>
  void object(F&& member) {
    expect('{');
    if (peek('}')) {
      ++i_;
      return;
    }
    for (;;) {
      const std::string key = string();
      expect(':');
      member(key);
      if (!peek(',')) break;
      ++i_;
    }
    expect('}');
  }
  template <class F>
  void array(F&& element) {
    expect('[');
    if (peek(']')) {
      ++i_;
      return;
    }
    for (;;) {
      element();
      if (!peek(',')) break;
      ++i_;
    }
    expect(']');
  }
  uint64_t integer() {
    ws();
    const size_t start = i_;
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const uint64_t d = static_cast<uint64_t>(s_[i_] - '0');
      if (v > (UINT64_MAX - d) / 10) fail("integer out of range");
      v = v * 10 + d;
      ++i_;
    }
    if (i_ == start) fail("expected a non-negative integer");
    if (s_[start] == '0' && i_ - start > 1) fail("integer with a leading zero");
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      fail("expected an integer, found a fraction or exponent");
    return v;
  }
  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return out;
      if (c < 0x20) fail("control character in string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      switch (s_[i_++]) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u')
              fail("unpaired high surrogate");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default:
          fail("unknown escape");
      }
    }
  }
  Entry entry(const std::string& name) {
    Entry e;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    object([&](const std::string& key) {
      if (key == "dtype" && !has_dtype) {
        e.dtype = string();
        has_dtype = true;
      } else if (key == "shape" && !has_shape) {
        array([&] {
          const uint64_t d = integer();
          if (d > static_cast<uint64_t>(INT64_MAX)) fail("dimension out of range");
          e.shape.push_back(static_cast<int64_t>(d));
        });
        has_shape = true;
      } else if (key == "data_offsets" && !has_offsets) {
        std::vector<uint64_t> v;
        array([&] { v.push_back(integer()); });
        if (v.size() != 2) fail("data_offsets of " + json_string(name) + " must hold 2 integers");
        e.begin = v[0];
        e.end = v[1];
        has_offsets = true;
      } else {
        fail("unexpected or repeated field " + json_string(key) + " in " + json_string(name));
      }
    });
    if (!has_dtype || !has_shape || !has_offsets)
      fail("tensor " + json_string(name) + " lacks one of dtype, shape, data_offsets");
    return e;
  }

  const std::string& s_;
  const std::string& file_;
  size_t i_ = 0;
};

// ---------------------------------------------------------------------------------------------
// File access.
// ---------------------------------------------------------------------------------------------
class File {
 public:
  File(const std::string& path, const char* mode)
      : path_(path), f_(std::fopen(path.c_str(), mode)) {
    if (f_ == nullptr)
      throw std::runtime_error(
          "cannot open '" + path + "': " + std::strerror(errno) +
          (mode[0] == 'r' ? " (does the checkpoint exist?)" : " (is the directory writable?)"));
  }
  ~File() {
    if (f_) std::fclose(f_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  void write(const void* data, size_t n) {
    if (n > 0 && std::fwrite(data, 1, n, f_) != n)
      throw std::runtime_error("writing '" + path_ + "' failed (disk full?)");
  }
  void read(void* data, size_t n, const char* what) {
    if (n > 0 && std::fread(data, 1, n, f_) != n)
      throw std::runtime_error("'" + path_ + "': cannot read " + what + " (file truncated?)");
  }
  void seek(uint64_t pos) {
    if (fseeko(f_, static_cast<off_t>(pos), SEEK_SET) != 0)
      throw std::runtime_error("'" + path_ + "': seek failed");
  }
  uint64_t size() {
    if (fseeko(f_, 0, SEEK_END) != 0) throw std::runtime_error("'" + path_ + "': seek failed");
    const off_t n = ftello(f_);
    seek(0);
    return static_cast<uint64_t>(n);
  }
  void close() {
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0)
      throw std::runtime_error("closing '" + path_ + "' failed (disk full?)");
  }

 private:
  std::string path_;
  std::FILE* f_;
};

class SafeTensors : public keel::Checkpoint {
 public:
  explicit SafeTensors(const keel::Context&) {}

  void save(const std::string& dir, const std::string& stem,
            const keel::NamedTensors& tensors) override {
    const std::string path = dir + "/" + stem + ".safetensors";
    std::vector<at::Tensor> data;
    std::map<std::string, bool> seen;
    std::string header = "{";
    uint64_t offset = 0;
    for (const auto& [name, tensor] : tensors) {
      if (!seen.emplace(name, true).second)
        throw std::runtime_error("saving '" + path + "': tensor name '" + name +
                                 "' appears twice; names must be unique");
      if (name == "__metadata__")
        throw std::runtime_error("saving '" + path +
                                 "': '__metadata__' is reserved and cannot name a tensor");
      const DType* d = dtype_of(tensor.scalar_type());
      if (d == nullptr)
        throw std::runtime_error("saving '" + path + "': tensor '" + name +
                                 "' has unsupported dtype " +
                                 std::string(at::toString(tensor.scalar_type())) +
                                 " (supported: F32 F64 F16 BF16 I64 I32 I8 U8 BOOL)");
      at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
      const uint64_t n = t.nbytes();
      header += json_string(name) + ":{\"dtype\":\"" + d->name +
                "\",\"shape\":" + shape_str(t.sizes().vec()) + ",\"data_offsets\":[" +
                std::to_string(offset) + "," + std::to_string(offset + n) + "]},";
      offset += n;
      data.push_back(std::move(t));
    }
    header += "\"__metadata__\":{\"format\":\"pt\"}}";
    header.append((8 - header.size() % 8) % 8, ' ');

    File f(path, "wb");
    unsigned char len[8];
    for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>(header.size() >> (8 * k));
    f.write(len, 8);
    f.write(header.data(), header.size());
    for (const at::Tensor& t : data) f.write(t.data_ptr(), t.nbytes());
    f.close();
  }

  void load(const std::string& dir, const std::string& stem,
            const keel::NamedTensors& into) override {
    const std::string path = dir + "/" + stem + ".safetensors";
    File f(path, "rb");
    const uint64_t file_size = f.size();
    auto bad = [&](const std::string& what) {
      return std::runtime_error("'" + path + "': " + what +
                                " (file corrupt or not written in the safetensors format)");
    };
    if (file_size < 8)
      throw bad("file is " + std::to_string(file_size) +
                " bytes, shorter than the 8-byte header length");
    unsigned char len[8];
    f.read(len, 8, "the header length");
    uint64_t n = 0;
    for (int k = 7; k >= 0; --k) n = (n << 8) | len[k];
    if (n > kMaxHeader)
      throw bad("header length " + std::to_string(n) + " exceeds the 100 MiB limit");
    if (n > file_size - 8)
      throw bad("header length " + std::to_string(n) + " exceeds the file size " +
                std::to_string(file_size));
    std::string text(n, '\0');
    f.read(&text[0], n, "the header");
    const auto entries = HeaderParser(text, path).parse();

    // Validate every entry: dtype known, byte count = numel * element size, and the entries
    // tile the data section exactly (as the reference implementation requires).
    const uint64_t data_size = file_size - 8 - n;
    std::map<std::string, const Entry*> by_name;
    std::vector<const Entry*> sorted;
    for (const auto& [name, e] : entries) {
      const DType* d = dtype_by_name(e.dtype);
      if (d == nullptr) throw bad("tensor '" + name + "' has unknown dtype '" + e.dtype + "'");
      if (e.begin > e.end || e.end > data_size)
        throw bad("tensor '" + name + "' has data_offsets [" + std::to_string(e.begin) + ", " +
                  std::to_string(e.end) + "] outside the data section of " +
                  std::to_string(data_size) + " bytes");
      uint64_t bytes = d->size;
      for (const int64_t dim : e.shape) {
        if (dim != 0 && bytes > UINT64_MAX / static_cast<uint64_t>(dim))
          throw bad("tensor '" + name + "' shape " + shape_str(e.shape) + " overflows");
        bytes *= static_cast<uint64_t>(dim);
      }
      if (bytes != e.end - e.begin)
        throw bad("tensor '" + name + "' of dtype " + e.dtype + " and shape " + shape_str(e.shape) +
                  " needs " + std::to_string(bytes) + " bytes but data_offsets span " +
                  std::to_string(e.end - e.begin));
      by_name[name] = &e;
      sorted.push_back(&e);
    }
    std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
      return a->begin < b->begin || (a->begin == b->begin && a->end < b->end);
    });
    uint64_t cursor = 0;
    for (const Entry* e : sorted) {
      if (e->begin != cursor)
        throw bad("tensor data overlaps or leaves a gap at byte " + std::to_string(cursor));
      cursor = e->end;
    }
    if (cursor != data_size)
      throw bad("tensors cover " + std::to_string(cursor) + " of the " + std::to_string(data_size) +
                " data bytes");

    at::NoGradGuard no_grad;
    for (const auto& [name, target] : into) {
      auto it = by_name.find(name);
      if (it == by_name.end())
        throw std::runtime_error("'" + path + "' has no tensor '" + name +
                                 "' (was it saved by a different model?)");
      const Entry& e = *it->second;
      const DType* want = dtype_of(target.scalar_type());
      if (want == nullptr || e.dtype != want->name)
        throw std::runtime_error(
            "'" + path + "': tensor '" + name + "' is stored as " + e.dtype +
            " but the model expects " +
            (want ? want->name : std::string(at::toString(target.scalar_type()))) +
            " (was it saved with a different dtype setting?)");
      if (target.sizes().vec() != e.shape)
        throw std::runtime_error("'" + path + "': tensor '" + name + "' has shape " +
                                 shape_str(e.shape) + " but the model expects " +
                                 shape_str(target.sizes().vec()) +
                                 " (was it saved by a different model config?)");
      at::Tensor buf = at::empty(e.shape, at::TensorOptions().dtype(target.scalar_type()));
      f.seek(8 + n + e.begin);
      f.read(buf.data_ptr(), e.end - e.begin, "tensor data");
      target.copy_(buf);
    }
  }
};

const keel_component_desc kComponents[] = {
    keel::component<SafeTensors>("safetensors", "checkpoints in the safetensors format"),
};

}  // namespace

KEEL_PLUGIN("keel-safetensors", "0.1.0", "safetensors checkpoint backend", kComponents)
