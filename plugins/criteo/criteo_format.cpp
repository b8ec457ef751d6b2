// The Criteo line parser and the window file source (criteo_format.hpp).
#include "criteo_format.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "text/text.hpp"

namespace criteo {
namespace {

// The field's text for a message, cut to 32 bytes, control bytes (a NUL among them) and bytes
// that are not UTF-8 as \xNN: one line that a terminal shows as it is.
std::string shown(const char* b, const char* e) {
  const size_t n = static_cast<size_t>(e - b);
  return "'" + keel::text::printable(std::string(b, n > 32 ? 32 : n)) + (n > 32 ? "...'" : "'");
}

std::string field_name(int i) {  // i: 0 label, 1..13 I, 14..39 C
  if (i == 0) return "label";
  return i <= kNumeric ? "I" + std::to_string(i) : "C" + std::to_string(i - kNumeric);
}

// Any int64: up to INT64_MAX, down to INT64_MIN (whose magnitude is INT64_MAX + 1).
bool parse_int(const char* b, const char* e, int64_t* v) {
  bool neg = false;
  if (b < e && (*b == '-' || *b == '+')) neg = *b++ == '-';
  if (b == e) return false;
  const uint64_t limit = static_cast<uint64_t>(INT64_MAX) + (neg ? 1 : 0);
  uint64_t x = 0;
  for (; b < e; ++b) {
    if (*b < '0' || *b > '9') return false;
    if (x > (limit - static_cast<uint64_t>(*b - '0')) / 10) return false;
    x = x * 10 + static_cast<uint64_t>(*b - '0');
  }
  if (neg) *v = x == limit ? INT64_MIN : -static_cast<int64_t>(x);
  else *v = static_cast<int64_t>(x);
  return true;
}

// The window size a zstd frame header asks for (its first bytes in `h`), 0 when `h` does not
// hold enough of it: the Window_Descriptor, or the content size of a single-segment frame
// (RFC 8878, 3.1.1.1).
uint64_t frame_window(const std::string& h) {
  if (h.size() < 6) return 0;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(h[i]); };
  if ((byte(0) | byte(1) << 8 | byte(2) << 16 | static_cast<uint32_t>(byte(3)) << 24) !=
      ZSTD_MAGICNUMBER)
    return 0;
  if ((byte(4) & 0x20) == 0) {  // Single_Segment_flag unset: a Window_Descriptor follows
    const unsigned exponent = byte(5) >> 3, mantissa = byte(5) & 7;
    const uint64_t base = uint64_t{1} << (10 + exponent);
    return base + base / 8 * mantissa;
  }
  const unsigned long long size = ZSTD_getFrameContentSize(h.data(), h.size());
  return size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR ? 0 : size;
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

Source::Source(std::string path)
    : path_(std::move(path)), shown_(keel::text::printable(path_)) {
  // Not following a link (O_NOFOLLOW: a link as the last component fails with ELOOP), not
  // blocking on a FIFO's open (O_NONBLOCK, cleared once the file is known to be regular).
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd_ < 0 && errno == ELOOP)
    throw std::runtime_error(shown_ + ": is a symbolic link, and window files are opened "
                             "without following links; hint: put the file itself in the data "
                             "directory (a link to the directory is followed)");
  if (fd_ < 0)
    throw std::runtime_error(shown_ + ": cannot open (" + std::strerror(errno) +
                             "); hint: check that the window file exists and is readable");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error(shown_ + ": is not a regular file (" +
                             (S_ISFIFO(st.st_mode) ? std::string("a FIFO")
                              : S_ISDIR(st.st_mode) ? std::string("a directory")
                              : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? std::string("a device")
                              : st.st_mode != 0 ? std::string("a socket or other special file")
                                                : std::string("fstat: ") + std::strerror(err)) +
                             "); hint: a window must be a regular file: publish window files "
                             "by renaming a finished file into the data directory");
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) < 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error(shown_ + ": cannot set blocking reads (" + std::strerror(err) + ")");
  }
  const std::string ext = ".zst";
  if (path_.size() > ext.size() && path_.compare(path_.size() - ext.size(), ext.size(), ext) == 0) {
    zstd_ = ZSTD_createDStream();
    if (zstd_ == nullptr || ZSTD_isError(ZSTD_initDStream(static_cast<ZSTD_DStream*>(zstd_))) ||
        ZSTD_isError(ZSTD_DCtx_setParameter(static_cast<ZSTD_DStream*>(zstd_),
                                            ZSTD_d_windowLogMax, kZstdWindowLogMax))) {
      ::close(fd_);
      fd_ = -1;
      if (zstd_) ZSTD_freeDStream(static_cast<ZSTD_DStream*>(zstd_));
      zstd_ = nullptr;
      throw std::runtime_error(shown_ + ": cannot start a zstd decompressor");
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
      throw std::runtime_error(shown_ + ": read failed (" + std::strerror(errno) + ")");
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
    // The first bytes consumed of a frame (18: the longest frame header), kept for a message.
    if (last_hint_ == 0) header_.clear();
    const size_t have = header_.size();
    if (have < 18) header_.append(in_, in_pos_, 18 - have);
    ZSTD_inBuffer in{in_.data(), in_.size(), in_pos_};
    const size_t r = ZSTD_decompressStream(ds, &out, &in);
    // (On an error the bytes offered stay: in.pos does not tell how many were read.)
    if (have < 18 && !ZSTD_isError(r))
      header_.resize(std::min(header_.size(), have + (in.pos - in_pos_)));
    in_pos_ = in.pos;
    if (ZSTD_isError(r) && ZSTD_getErrorCode(r) == ZSTD_error_frameParameter_windowTooLarge) {
      const uint64_t window = frame_window(header_);
      const uint64_t limit_mib = (uint64_t{1} << kZstdWindowLogMax) >> 20;
      throw std::runtime_error(
          shown_ + ": needs a zstd window" +
          (window ? " of " + std::to_string((window + (1 << 20) - 1) >> 20) + " MiB," : "") +
          " over keel's limit of " + std::to_string(limit_mib) + " MiB (the memory one reader "
          "may take); hint: compress it again with a window of at most " +
          std::to_string(limit_mib) + " MiB (zstd --long=" + std::to_string(kZstdWindowLogMax) +
          " or less, or without --long)");
    }
    if (ZSTD_isError(r))
      throw std::runtime_error(shown_ + ": corrupt zstd data (" + ZSTD_getErrorName(r) +
                               "); hint: write the file again");
    last_hint_ = r;
  }
  if (out.pos == 0 && last_hint_ != 0)
    throw std::runtime_error(shown_ + ": truncated zstd file (it ends inside a frame); hint: the "
                             "file is incomplete: write it again, and publish window files by "
                             "rename");
  return out.pos;
}

void Source::skip_to(uint64_t offset) {
  if (offset == 0) return;
  if (zstd_ == nullptr) {
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) < offset)
      throw std::runtime_error(shown_ + ": has " + std::to_string(st.st_size) +
                               " bytes, fewer than the resume offset " + std::to_string(offset) +
                               "; hint: the window file changed since the checkpoint");
    if (::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0)
      throw std::runtime_error(shown_ + ": cannot seek to byte " + std::to_string(offset) + " (" +
                               std::strerror(errno) + ")");
    return;
  }
  std::string scratch(1 << 16, '\0');
  uint64_t left = offset;
  while (left > 0) {
    const size_t got = read(scratch.data(), left < scratch.size() ? left : scratch.size());
    if (got == 0)
      throw std::runtime_error(shown_ + ": has " + std::to_string(offset - left) +
                               " bytes, fewer than the resume offset " + std::to_string(offset) +
                               "; hint: the window file changed since the checkpoint");
    left -= got;
  }
}

}  // namespace criteo
