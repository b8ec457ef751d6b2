// libFuzzer target: commit.json of a checkpoint (kernel/checkpoint/commit.cpp).
//
// Input: the file's text. keel::Error is the expected refusal; anything else escaping, a
// message that is not one line starting with "commit.json: invalid commit record: ", or an
// accepted record (version 1 or 2) that does not survive write_commit_record ->
// read_commit_record (which writes version 2, chunk index included) aborts. keel::coverage_gap
// runs on every accepted tensor (it must not crash on any chunk list the parser accepts).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

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
