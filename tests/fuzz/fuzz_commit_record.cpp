// libFuzzer target: commit.json of a checkpoint (kernel/checkpoint/commit.cpp).
//
// Input: the file's text. keel::Error is the expected refusal; anything else escaping, a
// message that is not one line starting with "commit.json: invalid commit record: ", or an
// accepted record (version 1 or 2) that does not survive write_commit_record ->
// read_commit_record (which writes version 2, chunk index included) aborts. keel::coverage_gap
// runs on every accepted tensor (it must not crash on any chunk list the parser accepts).
//
// The chunk list (issue 43): every object and file an accepted record names is a plain name
// (keel::plain_name: the loaders build "<dir>/<object>.<ext>" from it); check_record_claims
// (verify_checkpoint's bounds on what the chunks and tensors claim against the listed files)
// throws nothing but a one-line keel::Error naming commit.json with a hint, and when it accepts
// a record, every chunk's object has a listed file and its size's byte count fits 64 bits; the
// record merged with itself
// (two ranks' identical parts) keeps each tensor's coverage; commit.json.xxh3's text is one
// line of 22 bytes.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/commit.hpp"
#include "error.hpp"

namespace {

const std::string kPath = "commit.json";

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_commit_record: %s: %s\n", what, detail.c_str());
  std::abort();
}

bool same(const keel::CommitRecord& a, const keel::CommitRecord& b) {
  if (a.run_id != b.run_id || a.step != b.step || a.committed_unix_ns != b.committed_unix_ns ||
      a.files.size() != b.files.size() || a.tensors.size() != b.tensors.size())
    return false;
  for (size_t i = 0; i < a.files.size(); ++i)
    if (a.files[i].name != b.files[i].name || a.files[i].size != b.files[i].size ||
        a.files[i].xxh3 != b.files[i].xxh3)
      return false;
  for (const auto& [object, list] : a.tensors) {
    auto it = b.tensors.find(object);
    if (it == b.tensors.end() || it->second.size() != list.size()) return false;
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].name != it->second[i].name || list[i].dtype != it->second[i].dtype ||
          list[i].shape != it->second[i].shape)
        return false;
  }
  // The chunk index round-trips whole (a version 1 record's synthesised one too).
  if (a.chunks != b.chunks) return false;
  // Finite metrics round-trip; write_commit_record drops NaN and infinities (JSON has none).
  size_t finite = 0;
  for (const auto& [k, v] : a.metrics) {
    if (!std::isfinite(v)) continue;
    ++finite;
    auto it = b.metrics.find(k);
    if (it == b.metrics.end() || it->second != v) return false;
  }
  return finite == b.metrics.size();
}

// Bytes of a chunk of `size` with `element` bytes an element, or UINT64_MAX on overflow.
uint64_t bytes_of(const std::vector<int64_t>& size, uint64_t element) {
  uint64_t n = element;
  for (const int64_t d : size)
    if (d == 0) return 0;
  for (const int64_t d : size)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return UINT64_MAX;
  return n;
}

void check_chunks(const keel::CommitRecord& r) {
  for (const auto& f : r.files)
    if (!keel::plain_name(f.name)) die("accepted a file name that is not plain", f.name);
  for (const auto& [object, list] : r.tensors)
    if (!keel::plain_name(object)) die("accepted an object that is not plain", object);
  for (const auto& [group, tensors] : r.chunks)
    for (const auto& [name, t] : tensors)
      for (const auto& c : t.chunks)
        if (!keel::plain_name(c.object) || (!c.file.empty() && !keel::plain_name(c.file)))
          die("accepted a chunk whose object or file is not plain", c.object + " " + c.file);
  bool accepted = true;
  try {
    keel::check_record_claims(r, kPath);
  } catch (const keel::Error& e) {
    const std::string msg = e.what();
    if (msg.rfind(kPath + ": ", 0) != 0 || msg.find('\n') != std::string::npos ||
        msg.find("; hint: ") == std::string::npos)
      die("claims error is not one line naming the file with a hint", msg);
    accepted = false;
  }
  if (accepted) {
    // Every chunk's object has a listed file, and no chunk's size overflows.
    for (const auto& [group, tensors] : r.chunks)
      for (const auto& [name, t] : tensors)
        for (const auto& c : t.chunks) {
          bool filed = false;
          for (const auto& f : r.files)
            filed = filed || f.name.rfind(c.object + ".", 0) == 0;
          if (!filed || bytes_of(c.size, 1) == UINT64_MAX)
            die("claims accepted a chunk without a file or overflowing", name + " in " + c.object);
        }
  }
  // Two ranks' identical parts merge into a record whose tensors are covered as before.
  keel::CommitRecord twice;
  try {
    keel::merge_part(twice, r);
    keel::merge_part(twice, r);
  } catch (const keel::Error& e) {
    die("a record does not merge with itself", e.what());
  }
  for (const auto& [group, tensors] : r.chunks)
    for (const auto& [name, t] : tensors)
      if (keel::coverage_gap(t).empty() != keel::coverage_gap(twice.chunks[group][name]).empty())
        die("merging a record with itself changed a tensor's coverage", name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  keel::CommitRecord r;
  try {
    r = keel::read_commit_record(text, kPath);
  } catch (const keel::Error& e) {
    const std::string msg = e.what();
    if (msg.rfind(kPath + ": invalid commit record: ", 0) != 0 ||
        msg.find('\n') != std::string::npos)
      die("message is not one line naming the file", msg);
    return 0;
  }
  for (const auto& [group, tensors] : r.chunks)
    for (const auto& [name, t] : tensors) (void)keel::coverage_gap(t);
  check_chunks(r);
  const std::string sum = keel::record_checksum_text(text);
  if (sum.size() != 22 || sum.rfind("xxh3:", 0) != 0 || sum.back() != '\n')
    die("commit.json.xxh3 text is not one line of 22 bytes", sum);
  const std::string written = keel::write_commit_record(r);
  keel::CommitRecord again;
  try {
    again = keel::read_commit_record(written, kPath);
  } catch (const keel::Error& e) {
    die("written record does not read back", std::string(e.what()) + "\n" + written);
  }
  if (!same(r, again)) die("round trip changed the record", written);
  return 0;
}
