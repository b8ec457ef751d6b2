#include "safetensors_header.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace keel_safetensors {
namespace {

using nlohmann::json;

// The reference's Dtype enum, with its bitsize().
const DType kDTypes[] = {
    {"BOOL", 8},         {"F4", 4},           {"F6_E2M3", 6},      {"F6_E3M2", 6},
    {"U8", 8},           {"I8", 8},           {"F8_E5M2", 8},      {"F8_E4M3", 8},
    {"F8_E8M0", 8},      {"F8_E4M3FNUZ", 8},  {"F8_E5M2FNUZ", 8},  {"I16", 16},
    {"U16", 16},         {"F16", 16},         {"BF16", 16},        {"I32", 32},
    {"U32", 32},         {"F32", 32},         {"C64", 64},         {"F64", 64},
    {"I64", 64},         {"U64", 64},
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error("'" + file + "': " + what +
                           " (file corrupt or not written in the safetensors format)");
}

// A JSON value as short, single-line, printable text for a message.
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}
std::string quoted(const std::string& name) { return show(json(name)); }

std::string show_offsets(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// A JSON number that is a non-negative integer within uint64 (JSON "1.0", "1e3", "-0" are not).
bool is_count(const json& v) { return v.is_number_unsigned(); }

// The text of nlohmann's error without its "[json.exception.parse_error.101] " tag, printable
// and bounded (the "last read" part quotes the input).
std::string parse_error_text(const json::exception& e) {
  std::string s = e.what();
  const auto tag = s.find("] ");
  if (s.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) s = s.substr(tag + 2);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  if (s.size() > 200) s = s.substr(0, 197) + "...";
  return s;
}

TensorEntry tensor_entry(const std::string& name, const json& v, const std::string& file) {
  const std::string tensor = "tensor " + quoted(name);
  if (!v.is_object())
    fail(file, tensor + " must be an object with dtype, shape and data_offsets, got " + show(v));
  TensorEntry e;
  e.name = name;
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      fail(file, tensor + " has an unknown field " + quoted(it.key()) +
                     " (expected dtype, shape and data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail(file, tensor + " has no " + key);

  const json& dtype = v["dtype"];
  if (dtype.is_string()) e.dtype = find_dtype(dtype.get_ref<const std::string&>());
  if (e.dtype == nullptr) {
    std::string known;
    for (const DType& d : kDTypes) known += (known.empty() ? "" : " ") + std::string(d.name);
    fail(file, tensor + " has unknown dtype " + show(dtype) + " (known: " + known + ")");
  }

  const json& shape = v["shape"];
  if (!shape.is_array())
    fail(file, tensor + ": shape must be a list of non-negative integers, got " + show(shape));
  for (const json& d : shape) {
    if (!is_count(d))
      fail(file, tensor + ": shape must be a list of non-negative integers, got " + show(shape));
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX))
      fail(file, tensor + ": dimension " + std::to_string(dim) + " is too large");
    e.shape.push_back(static_cast<int64_t>(dim));
  }

  const json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !is_count(offsets[0]) || !is_count(offsets[1]))
    fail(file, tensor + ": data_offsets must be 2 non-negative integers [begin, end], got " +
                   show(offsets));
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.begin > e.end)
    fail(file, tensor + ": data_offsets " + show_offsets(e.begin, e.end) + " begin after they end");

  // Bytes = numel * bits / 8, in 64 bits without overflow, a whole number of bytes.
  uint64_t numel = 1;
  for (const int64_t dim : e.shape) {
    const uint64_t d = static_cast<uint64_t>(dim);
    if (d != 0 && numel > UINT64_MAX / d)
      fail(file, tensor + ": shape " + shape_string(e.shape) + " has more than 2^64 elements");
    numel *= d;
  }
  if (numel > UINT64_MAX / e.dtype->bits)
    fail(file, tensor + ": shape " + shape_string(e.shape) + " of dtype " + e.dtype->name +
                   " has more than 2^64 bits");
  const uint64_t bits = numel * e.dtype->bits;
  if (bits % 8 != 0)
    fail(file, tensor + ": shape " + shape_string(e.shape) + " of dtype " + e.dtype->name + " is " +
                   std::to_string(bits) + " bits, not a whole number of bytes");
  if (bits / 8 != e.end - e.begin)
    fail(file, tensor + " of dtype " + e.dtype->name + " and shape " + shape_string(e.shape) +
                   " needs " + std::to_string(bits / 8) + " bytes but data_offsets " +
                   show_offsets(e.begin, e.end) + " span " + std::to_string(e.end - e.begin));
  return e;
}

}  // namespace

const DType* find_dtype(std::string_view name) {
  for (const DType& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  constexpr size_t kShown = 16;  // a message stays short whatever the header holds
  std::string s = "[";
  for (size_t i = 0; i < shape.size() && i < kShown; ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() > kShown) s += ", ... (" + std::to_string(shape.size()) + " dimensions)";
  return s + "]";
}

uint64_t read_header_size(std::string_view prefix, uint64_t file_size, const std::string& file) {
  if (file_size < kLengthBytes || prefix.size() < kLengthBytes)
    fail(file, "file is " + std::to_string(file_size) +
                   " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<unsigned char>(prefix[k]);
  if (n > kMaxHeaderSize)
    fail(file, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderSize) + " bytes");
  if (n > file_size - kLengthBytes)
    fail(file, "header length " + std::to_string(n) + " runs past the end of the file (" +
                   std::to_string(file_size) + " bytes)");
  return n;
}

Header parse_header(std::string_view text, uint64_t file_size, const std::string& file) {
  Header h;
  h.header_size = text.size();
  if (h.header_size > kMaxHeaderSize || h.header_size > file_size ||
      file_size - h.header_size < kLengthBytes)
    fail(file, "header length " + std::to_string(h.header_size) + " does not fit the file (" +
                   std::to_string(file_size) + " bytes)");
  if (text.empty() || text[0] != '{') fail(file, "header does not start with '{'");
  // nlohmann's lexer takes a NUL byte for the end of the input: "{}\0junk" would pass. JSON has
  // no place for a raw NUL (in a string it must be escaped), so any is an error.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail(file, "header is not valid JSON: NUL byte at header byte " + std::to_string(nul));

  // Parse, refusing duplicate keys (at any depth) and noting the order of the top-level keys.
  std::vector<std::set<std::string>> open_objects;
  std::vector<std::string> order;
  json root;
  try {
    root = json::parse(text.data(), text.data() + text.size(),
                       [&](int, json::parse_event_t event, json& parsed) {
                         switch (event) {
                           case json::parse_event_t::object_start:
                             open_objects.emplace_back();
                             break;
                           case json::parse_event_t::object_end:
                             open_objects.pop_back();
                             break;
                           case json::parse_event_t::key: {
                             const auto& key = parsed.get_ref<const std::string&>();
                             if (!open_objects.back().insert(key).second)
                               fail(file, "header has the key " + quoted(key) +
                                              " twice in one object");
                             if (open_objects.size() == 1) order.push_back(key);
                             break;
                           }
                           default:
                             break;
                         }
                         return true;
                       });
  } catch (const json::exception& e) {  // parse_error; out_of_range for a number like 1e999
    fail(file, "header is not valid JSON: " + parse_error_text(e));
  }
  if (!root.is_object()) fail(file, "header is not a JSON object");

  for (const std::string& name : order) {
    const json& v = root.at(name);
    if (name == "__metadata__") {
      if (v.is_null()) continue;  // the reference reads it as an Option
      if (!v.is_object())
        fail(file, "__metadata__ must be a map of strings to strings, got " + show(v));
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!it->is_string())
          fail(file, "__metadata__ must be a map of strings to strings, but " + quoted(it.key()) +
                         " holds " + show(*it));
        h.metadata[it.key()] = it->get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(tensor_entry(name, v, file));
  }

  // In offset order, the tensors tile the data section from byte 0 to its end.
  std::vector<const TensorEntry*> sorted;
  for (const TensorEntry& e : h.tensors) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin < b->begin || (a->begin == b->begin && a->end < b->end);
  });
  uint64_t cursor = 0;
  for (const TensorEntry* e : sorted) {
    if (e->begin > cursor)
      fail(file, "tensor " + quoted(e->name) + ": data_offsets " + show_offsets(e->begin, e->end) +
                     " leave a gap at bytes " + show_offsets(cursor, e->begin) +
                     " of the data section");
    if (e->begin < cursor)
      fail(file, "tensor " + quoted(e->name) + ": data_offsets " + show_offsets(e->begin, e->end) +
                     " overlap the previous tensor, which ends at byte " + std::to_string(cursor));
    cursor = e->end;
  }
  const uint64_t data_size = file_size - kLengthBytes - h.header_size;
  if (cursor != data_size)
    fail(file, "the tensors end at byte " + std::to_string(cursor) + " but the data section holds " +
                   std::to_string(data_size) + " bytes");
  return h;
}

Header parse_file(std::string_view bytes, const std::string& file) {
  const uint64_t n = read_header_size(bytes, bytes.size(), file);
  return parse_header(bytes.substr(kLengthBytes, n), bytes.size(), file);
}

}  // namespace keel_safetensors
