// libFuzzer target: the Criteo line parser (plugins/criteo/criteo_format.cpp, parse_record).
//
// Input: the text of a window; it is cut at '\n' into lines the way the reader does
// (criteo_reader.cpp) and each line is parsed. A refusal must be one error that starts with what
// is wrong ("has N tab-separated fields", "label: ", "I<k>: ", "C<k>: ") and holds no control
// byte (field bytes are quoted with keel::text::printable, a NUL among them); an accepted line
// must have exactly 40 fields and values in the batch layout's ranges (criteo_format.hpp). Any
// other outcome, an exception or a sanitizer report aborts.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "criteo_format.hpp"

namespace {

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_criteo_line: %s: %s\n", what, detail.c_str());
  std::abort();
}

bool starts_with(const std::string& s, const std::string& head) {
  return s.compare(0, head.size(), head) == 0;
}

// The error names the field (or the field count) first.
bool names_what(const std::string& e) {
  if (starts_with(e, "has ") || starts_with(e, "label: ")) return true;
  if (e.empty() || (e[0] != 'I' && e[0] != 'C')) return false;
  size_t i = 1;
  int k = 0;
  while (i < e.size() && e[i] >= '0' && e[i] <= '9') k = k * 10 + (e[i++] - '0');
  const int most = e[0] == 'I' ? criteo::kNumeric : criteo::kCategorical;
  return i > 1 && k >= 1 && k <= most && e.compare(i, 2, ": ") == 0;
}

void check_line(const char* b, const char* e) {
  double out[criteo::kColumns];
  float label = -1;
  std::string error;
  const bool ok = criteo::parse_record(b, e, out, &label, &error);
  if (!ok) {
    if (!names_what(error)) die("an error that does not name the field first", error);
    for (const char c : error)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        die("a control byte in an error", error);
    return;
  }
  const char* end = e > b && e[-1] == '\r' ? e - 1 : e;
  size_t tabs = 0;
  for (const char* p = b; p < end; ++p) tabs += *p == '\t';
  if (tabs != criteo::kFields - 1) die("a line accepted without 40 fields", std::string(b, e));
  if (label != 0.f && label != 1.f) die("a label neither 0 nor 1", std::to_string(label));
  for (int i = 0; i < criteo::kNumeric; ++i)
    if (!(out[i] >= 0) || !std::isfinite(out[i]))  // log1p(max(I, 0)) of an int64
      die("a numeric column out of range", std::to_string(out[i]));
  for (int i = criteo::kNumeric; i < criteo::kColumns; ++i)
    if (!(out[i] == -1 || (out[i] >= 0 && out[i] < 9007199254740992.0 &&
                           out[i] == std::floor(out[i]))))
      die("a categorical column out of range", std::to_string(out[i]));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* b = reinterpret_cast<const char*>(data);
  const char* const end = b + size;
  while (b < end) {
    const char* nl = static_cast<const char*>(std::memchr(b, '\n', static_cast<size_t>(end - b)));
    const char* e = nl ? nl : end;
    check_line(b, e);
    b = nl ? nl + 1 : end;
  }
  return 0;
}
