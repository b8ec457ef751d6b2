// The safetensors header reader: everything the reference implementation (huggingface/safetensors,
// read_metadata and Metadata::validate) refuses is refused, one case per rule, each with a
// message that names the file and what is wrong.
#include <doctest/doctest.h>

#include <string>

// The unit under test is LibTorch-free and not part of the kernel library these tests link.
#include "../plugins/safetensors/safetensors_header.cpp"

namespace unit_safetensors {  // keel_units is one unity build: each file's names stay its own

namespace st = keel_safetensors;
using namespace std::string_literals;

namespace {

const std::string kFile = "ckpt/model.safetensors";

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[k] = static_cast<char>(n >> (8 * k));
  return s;
}

// A file: the header length, `header`, then `data_size` data bytes.
std::string file(const std::string& header, size_t data_size) {
  return le64(header.size()) + header + std::string(data_size, '\0');
}

// One tensor entry.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

// The message parse_file throws for `bytes`, or "<no error>".
std::string error_of(const std::string& bytes) {
  try {
    st::parse_file(bytes, kFile);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "<no error>";
}

// Checks that `bytes` is refused with a message holding `what`.
#define CHECK_REFUSED(bytes, what)                                       \
  do {                                                                   \
    const std::string err_ = error_of(bytes);                            \
    CHECK_MESSAGE(err_.find(what) != std::string::npos, err_);           \
    CHECK(err_.rfind("'" + kFile + "': ", 0) == 0);                      \
    CHECK(err_.find('\n') == std::string::npos);                         \
  } while (0)

}  // namespace

TEST_CASE("a valid file: entries in header order, metadata, padding, empty tensors") {
  const std::string header = "{" + entry("b", "F32", "[2, 2]", "[8, 24]") + "," +
                             entry("a", "I64", "[1]", "[0, 8]") + "," +
                             entry("empty", "BF16", "[0, 3]", "[24, 24]") + "," +
                             entry("f4", "F4", "[4]", "[24, 26]") +
                             ",\"__metadata__\":{\"format\":\"pt\"}}   ";
  const st::Header h = st::parse_file(file(header, 26), kFile);
  REQUIRE(h.tensors.size() == 4);
  CHECK(h.tensors[0].name == "b");
  CHECK(std::string(h.tensors[0].dtype->name) == "F32");
  CHECK(h.tensors[0].shape == std::vector<int64_t>{2, 2});
  CHECK(h.tensors[0].begin == 8);
  CHECK(h.tensors[0].end == 24);
  CHECK(h.tensors[1].name == "a");
  CHECK(h.tensors[2].shape == std::vector<int64_t>{0, 3});
  CHECK(h.metadata == std::map<std::string, std::string>{{"format", "pt"}});
  CHECK(h.data_start() == 8 + header.size());
  // No tensors at all, and a null __metadata__ (the reference reads it as an Option).
  CHECK(st::parse_file(file("{}", 0), kFile).tensors.empty());
  CHECK(st::parse_file(file("{\"__metadata__\":null}", 0), kFile).metadata.empty());
}

TEST_CASE("the 8-byte header length must be there") {
  CHECK_REFUSED(std::string("\x02\0\0", 3), "file is 3 bytes, shorter than the 8-byte header length");
  CHECK_REFUSED("", "file is 0 bytes");
}

TEST_CASE("header length over 100 MB") {
  CHECK_REFUSED(le64(100000001) + "{}", "header length 100000001 exceeds the limit of 100000000 bytes");
  CHECK_REFUSED(le64(UINT64_MAX) + "{}", "header length 18446744073709551615 exceeds the limit");
}

TEST_CASE("header length beyond the file") {
  CHECK_REFUSED(le64(10) + "{}", "header length 10 runs past the end of the file (10 bytes)");
}

TEST_CASE("header that is not UTF-8") {
  CHECK_REFUSED(file("{\"a\xff\":1}", 0), "header is not valid JSON");
  CHECK_REFUSED(file("{\"a\xff\":1}", 0), "ill-formed UTF-8");
  CHECK_REFUSED(file("{\"\xed\xa0\x80\":1}", 0), "ill-formed UTF-8");  // a UTF-16 surrogate
  CHECK_REFUSED(file("{}\xc3\xa9", 0), "header is not valid JSON");     // outside any string
}

TEST_CASE("header that is not JSON") {
  CHECK_REFUSED(file("{\"a\":", 0), "header is not valid JSON: parse error");
  CHECK_REFUSED(file("{} {}", 0), "expected end of input");
  CHECK_REFUSED(file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e999],\"data_offsets\":[0,4]}}", 4),
                "header is not valid JSON: number overflow parsing '1e999'");  // found by fuzzing
  CHECK_REFUSED(file("{\"a\":{\"dtype\":'F32'}}", 0), "header is not valid JSON");
  CHECK_REFUSED(file("{}\0\0\0\0"s, 0), "header is not valid JSON: NUL byte at header byte 2");
  CHECK_REFUSED(file("{\"a\0\":1}"s, 0), "NUL byte at header byte 3");
}

TEST_CASE("header that does not start with '{'") {
  CHECK_REFUSED(file(" {}", 0), "header does not start with '{'");
  CHECK_REFUSED(file("[]", 0), "header does not start with '{'");
  CHECK_REFUSED(file("", 0), "header does not start with '{'");
}

TEST_CASE("tensor entry that is not an object") {
  CHECK_REFUSED(file("{\"w\":[1, 2]}", 0), "tensor \"w\" must be an object with dtype, shape and data_offsets, got [1,2]");
}

TEST_CASE("__metadata__ that is not a map of strings to strings") {
  CHECK_REFUSED(file("{\"__metadata__\":{\"epoch\":3}}", 0),
                "__metadata__ must be a map of strings to strings, but \"epoch\" holds 3");
  CHECK_REFUSED(file("{\"__metadata__\":[\"pt\"]}", 0),
                "__metadata__ must be a map of strings to strings, got [\"pt\"]");
}

TEST_CASE("duplicate keys, at any depth") {
  const std::string w = entry("w", "F32", "[1]", "[0, 4]");
  CHECK_REFUSED(file("{" + w + "," + w + "}", 4), "header has the key \"w\" twice in one object");
  CHECK_REFUSED(file("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                "header has the key \"dtype\" twice");
  CHECK_REFUSED(file("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0), "header has the key \"a\" twice");
}

TEST_CASE("tensor entry with a field missing or unknown") {
  CHECK_REFUSED(file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4), "tensor \"w\" has no data_offsets");
  CHECK_REFUSED(file("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4), "tensor \"w\" has no dtype");
  CHECK_REFUSED(file("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4), "tensor \"w\" has no shape");
  CHECK_REFUSED(file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4),
                "tensor \"w\" has an unknown field \"x\"");
}

TEST_CASE("unknown dtype") {
  CHECK_REFUSED(file("{" + entry("w", "F17", "[1]", "[0, 4]") + "}", 4),
                "tensor \"w\" has unknown dtype \"F17\" (known: BOOL F4");
  CHECK_REFUSED(file("{" + entry("w", "f32", "[1]", "[0, 4]") + "}", 4), "unknown dtype \"f32\"");
  CHECK_REFUSED(file("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                "tensor \"w\" has unknown dtype 32");
}

TEST_CASE("shape that is not a list of non-negative integers") {
  const std::string msg = "tensor \"w\": shape must be a list of non-negative integers, got ";
  CHECK_REFUSED(file("{" + entry("w", "F32", "[-1]", "[0, 4]") + "}", 4), msg + "[-1]");
  CHECK_REFUSED(file("{" + entry("w", "F32", "[1.0]", "[0, 4]") + "}", 4), msg + "[1.0]");
  CHECK_REFUSED(file("{" + entry("w", "F32", "[1e0]", "[0, 4]") + "}", 4), msg + "[1.0]");
  CHECK_REFUSED(file("{" + entry("w", "F32", "[\"1\"]", "[0, 4]") + "}", 4), msg + "[\"1\"]");
  CHECK_REFUSED(file("{" + entry("w", "F32", "1", "[0, 4]") + "}", 4), msg + "1");
  CHECK_REFUSED(file("{" + entry("w", "F32", "[18446744073709551616]", "[0, 4]") + "}", 4), msg);
  CHECK_REFUSED(file("{" + entry("w", "F32", "[9223372036854775808, 0]", "[0, 0]") + "}", 0),
                "tensor \"w\": dimension 9223372036854775808 is too large");
}

TEST_CASE("data_offsets that are not 2 non-negative integers") {
  const std::string msg = "tensor \"w\": data_offsets must be 2 non-negative integers [begin, end], got ";
  CHECK_REFUSED(file("{" + entry("w", "F32", "[1]", "[4]") + "}", 4), msg + "[4]");
  CHECK_REFUSED(file("{" + entry("w", "F32", "[1]", "[0, 4, 8]") + "}", 4), msg + "[0,4,8]");
  CHECK_REFUSED(file("{" + entry("w", "F32", "[1]", "[-4, 0]") + "}", 4), msg + "[-4,0]");
  CHECK_REFUSED(file("{" + entry("w", "F32", "[1]", "[0, 4.5]") + "}", 4), msg + "[0,4.5]");
  CHECK_REFUSED(file("{" + entry("w", "F32", "[1]", "{\"begin\":0}") + "}", 4), msg);
}

TEST_CASE("data_offsets that begin after they end") {
  CHECK_REFUSED(file("{" + entry("w", "F32", "[0]", "[4, 0]") + "}", 4),
                "tensor \"w\": data_offsets [4, 0] begin after they end");
}

TEST_CASE("byte count that does not match numel * dtype size") {
  CHECK_REFUSED(file("{" + entry("w", "F32", "[2, 3]", "[0, 20]") + "}", 20),
                "tensor \"w\" of dtype F32 and shape [2, 3] needs 24 bytes but data_offsets [0, 20] span 20");
  CHECK_REFUSED(file("{" + entry("w", "F6_E2M3", "[4]", "[0, 4]") + "}", 4), "needs 3 bytes");
}

TEST_CASE("element or bit count beyond 64 bits") {
  CHECK_REFUSED(file("{" + entry("w", "U8", "[4294967296, 4294967296]", "[0, 0]") + "}", 0),
                "tensor \"w\": shape [4294967296, 4294967296] has more than 2^64 elements");
  CHECK_REFUSED(file("{" + entry("w", "F64", "[4611686018427387904]", "[0, 0]") + "}", 0),
                "shape [4611686018427387904] of dtype F64 has more than 2^64 bits");
}

TEST_CASE("sub-byte dtypes must fill whole bytes") {
  CHECK_REFUSED(file("{" + entry("w", "F4", "[3]", "[0, 2]") + "}", 2),
                "tensor \"w\": shape [3] of dtype F4 is 12 bits, not a whole number of bytes");
}

TEST_CASE("tensors that do not tile the data section from byte 0") {
  CHECK_REFUSED(file("{" + entry("w", "F32", "[1]", "[4, 8]") + "}", 8),
                "tensor \"w\": data_offsets [4, 8] leave a gap at bytes [0, 4] of the data section");
  CHECK_REFUSED(file("{" + entry("a", "F32", "[1]", "[0, 4]") + "," +
                     entry("b", "F32", "[1]", "[8, 12]") + "}", 12),
                "tensor \"b\": data_offsets [8, 12] leave a gap at bytes [4, 8]");
  CHECK_REFUSED(file("{" + entry("a", "F32", "[2]", "[0, 8]") + "," +
                     entry("b", "F32", "[1]", "[4, 8]") + "}", 8),
                "tensor \"b\": data_offsets [4, 8] overlap the previous tensor, which ends at byte 8");
  CHECK_REFUSED(file("{" + entry("a", "F32", "[1]", "[0, 4]") + "," +
                     entry("b", "F32", "[1]", "[0, 4]") + "}", 4),
                "overlap the previous tensor, which ends at byte 4");
}

TEST_CASE("data section longer or shorter than the tensors") {
  const std::string header = "{" + entry("w", "F32", "[2]", "[0, 8]") + "}";
  CHECK_REFUSED(file(header, 12), "the tensors end at byte 8 but the data section holds 12 bytes");
  CHECK_REFUSED(file(header, 4), "the tensors end at byte 8 but the data section holds 4 bytes");
  CHECK_REFUSED(file("{}", 1), "the tensors end at byte 0 but the data section holds 1 bytes");
}

TEST_CASE("names in messages are escaped: one line whatever the header holds") {
  CHECK_REFUSED(file("{\"a\\nb\":1}", 0), "tensor \"a\\nb\" must be an object");
}

}  // namespace unit_safetensors
