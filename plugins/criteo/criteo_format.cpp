// The Criteo line parser and the window file source (criteo_format.hpp).
#include "criteo_format.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace criteo {
namespace {

// The field's text for a message, cut to 32 bytes.
std::string shown(const char* b, const char* e) {
  const size_t n = static_cast<size_t>(e - b);
  return "'" + std::string(b, n > 32 ? 32 : n) + (n > 32 ? "...'" : "'");
}

std::string field_name(int i) {  // i: 0 label, 1..13 I, 14..39 C
  if (i == 0) return "label";
  return i <= kNumeric ? "I" + std::to_string(i) : "C" + std::to_string(i - kNumeric);
}

bool parse_int(const char* b, const char* e, int64_t* v) {
  bool neg = false;
  if (b < e && (*b == '-' || *b == '+')) neg = *b++ == '-';
  if (b == e) return false;
  uint64_t x = 0;
  for (; b < e; ++b) {
    if (*b < '0' || *b > '9') return false;
    if (x > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(*b - '0')) / 10) return false;
    x = x * 10 + static_cast<uint64_t>(*b - '0');
  }
  *v = neg ? -static_cast<int64_t>(x) : static_cast<int64_t>(x);
  return true;
}

// 0: ok, 1: not hexadecimal, 2: 2^53 or more.
int parse_hex(const char* b, const char* e, double* v) {
  if (e - b > 16) {  // leading zeros aside, more than 16 digits cannot be below 2^53
    while (b < e && *b == '0') ++b;
    if (e - b > 16) {
      for (const char* p = b; p < e; ++p)
        if (!std::isxdigit(static_cast<unsigned char>(*p))) return 1;
      return 2;
    }
  }
  uint64_t x = 0;
  for (; b < e; ++b) {
    const char c = *b;
    unsigned d;
    if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
    else return 1;
    x = x << 4 | d;
  }
  if (x >= (uint64_t{1} << 53)) return 2;
  *v = static_cast<double>(x);
  return 0;
}

}  // namespace

bool parse_record(const char* begin, const char* end, double* out, float* label,
                  std::string* error) {
  if (end > begin && end[-1] == '\r') --end;
  const char* b = begin;
  for (int i = 0; i < kFields; ++i) {
    const char* e = static_cast<const char*>(std::memchr(b, '\t', static_cast<size_t>(end - b)));
    if (e == nullptr) e = end;
    if (i < kFields - 1 && e == end) {
      *error = "has " + std::to_string(i + 1) + " tab-separated fields, not " +
               std::to_string(kFields) + " (label, I1..I13, C1..C26)";
      return false;
    }
    if (i == kFields - 1 && e != end) {
      int n = kFields;
      for (const char* p = e; p < end; ++p) n += *p == '\t';
      *error = "has " + std::to_string(n) + " tab-separated fields, not " +
               std::to_string(kFields) + " (label, I1..I13, C1..C26)";
      return false;
    }
    if (i == 0) {
      if (e - b != 1 || (*b != '0' && *b != '1')) {
        *error = "label: " + shown(b, e) + " is not 0 or 1";
        return false;
      }
      *label = *b == '1' ? 1.f : 0.f;
    } else if (i <= kNumeric) {
      int64_t v = 0;
      if (b == e) {
        out[i - 1] = 0;
      } else if (!parse_int(b, e, &v)) {
        *error = field_name(i) + ": " + shown(b, e) + " is not an integer";
        return false;
      } else {
        out[i - 1] = v > 0 ? std::log1p(static_cast<double>(v)) : 0.0;
      }
    } else {
      double v = -1;
      const int r = b == e ? 0 : parse_hex(b, e, &v);
      if (r != 0) {
        *error = field_name(i) + ": " + shown(b, e) +
                 (r == 1 ? " is not hexadecimal" : " is 2^53 or more (not exact in float64)");
        return false;
      }
      out[i - 1] = v;
    }
    b = e + 1;
  }
  return true;
}

Source::Source(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw std::runtime_error(path_ + ": cannot open (" + std::strerror(errno) +
                             "); hint: check that the window file exists and is readable");
  const std::string ext = ".zst";
  if (path_.size() > ext.size() && path_.compare(path_.size() - ext.size(), ext.size(), ext) == 0) {
    zstd_ = ZSTD_createDStream();
    if (zstd_ == nullptr || ZSTD_isError(ZSTD_initDStream(static_cast<ZSTD_DStream*>(zstd_)))) {
      ::close(fd_);
      if (zstd_) ZSTD_freeDStream(static_cast<ZSTD_DStream*>(zstd_));
      throw std::runtime_error(path_ + ": cannot start a zstd decompressor");
    }
  }
}

Source::~Source() {
  if (zstd_ != nullptr) ZSTD_freeDStream(static_cast<ZSTD_DStream*>(zstd_));
  if (fd_ >= 0) ::close(fd_);
}

size_t Source::read_raw(char* buf, size_t n) {
  for (;;) {
    const ssize_t r = ::read(fd_, buf, n);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno != EINTR)
      throw std::runtime_error(path_ + ": read failed (" + std::strerror(errno) + ")");
  }
}

size_t Source::read(char* buf, size_t n) {
  if (zstd_ == nullptr) return read_raw(buf, n);
  auto* ds = static_cast<ZSTD_DStream*>(zstd_);
  ZSTD_outBuffer out{buf, n, 0};
  while (out.pos == 0) {
    if (in_pos_ == in_.size()) {
      if (raw_eof_) break;
      in_.resize(ZSTD_DStreamInSize());
      const size_t got = read_raw(in_.data(), in_.size());
      in_.resize(got);
      in_pos_ = 0;
      if (got == 0) {
        raw_eof_ = true;
        break;
      }
    }
    ZSTD_inBuffer in{in_.data(), in_.size(), in_pos_};
    const size_t r = ZSTD_decompressStream(ds, &out, &in);
    in_pos_ = in.pos;
    if (ZSTD_isError(r))
      throw std::runtime_error(path_ + ": corrupt zstd data (" + ZSTD_getErrorName(r) +
                               "); hint: write the file again");
    last_hint_ = r;
  }
  if (out.pos == 0 && last_hint_ != 0)
    throw std::runtime_error(path_ + ": truncated zstd file (it ends inside a frame); hint: the "
                             "file is incomplete: write it again, and publish window files by "
                             "rename");
  return out.pos;
}

void Source::skip_to(uint64_t offset) {
  if (offset == 0) return;
  if (zstd_ == nullptr) {
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) < offset)
      throw std::runtime_error(path_ + ": has " + std::to_string(st.st_size) +
                               " bytes, fewer than the resume offset " + std::to_string(offset) +
                               "; hint: the window file changed since the checkpoint");
    if (::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0)
      throw std::runtime_error(path_ + ": cannot seek to byte " + std::to_string(offset) + " (" +
                               std::strerror(errno) + ")");
    return;
  }
  std::string scratch(1 << 16, '\0');
  uint64_t left = offset;
  while (left > 0) {
    const size_t got = read(scratch.data(), left < scratch.size() ? left : scratch.size());
    if (got == 0)
      throw std::runtime_error(path_ + ": has " + std::to_string(offset - left) +
                               " bytes, fewer than the resume offset " + std::to_string(offset) +
                               "; hint: the window file changed since the checkpoint");
    left -= got;
  }
}

}  // namespace criteo
