// What the sinks share: how metric values become text, the files they write, and on which
// ranks they write.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "../rank_path.hpp"
#include "keel/plugin.hpp"

namespace sinks {

// Keys whose values are counts: written as integers.
inline bool is_integer_key(const char* key) {
  return std::strcmp(key, "step") == 0 || std::strcmp(key, "epoch") == 0 ||
         std::strcmp(key, "samples") == 0 || std::strcmp(key, "tokens") == 0;
}

inline std::string integer(double v) { return std::to_string(std::llround(v)); }

// Console: 4 significant digits, but large values (samples/s, tokens/s) in full.
inline std::string short_number(double v) {
  char buf[64];
  const bool large = std::fabs(v) >= 1e4 && std::fabs(v) < 1e15;
  std::snprintf(buf, sizeof buf, large ? "%.0f" : "%.4g", v);
  return buf;
}

// The shortest of %.15g..%.17g that reads back as the same double.
inline std::string exact_number(double v) {
  char buf[64];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// A finite metric value in a file: counts as integers, the rest exact (round trip).
inline std::string exact_value(const char* key, double v) {
  return is_integer_key(key) ? integer(v) : exact_number(v);
}

// `path` inside the run directory unless it is absolute.
inline std::string run_path(const keel::Context& ctx, const std::string& path) {
  return path.empty() || path[0] == '/' ? path : ctx.run_dir() + "/" + path;
}

// The file a sink writes for its option `path`: run_path, with ".rank<r>" before the extension
// on rank r > 0 (keel_plugins::rank_path).
inline std::string output_path(const keel::Context& ctx) {
  return keel_plugins::rank_path(run_path(ctx, ctx.get_string("path")), ctx.rank());
}

// The option of every sink that OnRank reads.
inline constexpr auto kEveryRank = keel::opt_bool(
    "every_rank", "false",
    "write on every rank, not only on rank 0 (rank r > 0: files get .rank<r> before the "
    "extension; the console's lines carry keel's \"[rank r] \" tag)");

// Sink S on this rank: S itself on rank 0, and on other ranks with every_rank = true; else a
// hook that does nothing (creates no file, prints nothing). Only on_event is forwarded: S keeps
// no hook state (named_state).
template <class S>
class OnRank : public keel::Hook {
 public:
  explicit OnRank(const keel::Context& ctx) {
    if (ctx.rank() == 0 || ctx.get(kEveryRank)) sink_ = std::make_unique<S>(ctx);
  }
  void on_event(keel_event& ev) override {
    if (sink_) sink_->on_event(ev);
  }

 private:
  std::unique_ptr<S> sink_;
};

// For a resumed run (resume_step > 0): rewrites the file at `path` keeping its lines up to the
// last one whose step (step_of(line); -1: not a record, kept) is at most resume_step, and returns
// true (append to it). Returns false for a fresh run or a missing file (start it afresh).
inline bool keep_records_until(const std::string& path, int64_t resume_step,
                               const std::function<int64_t(const std::string&)>& step_of) {
  if (resume_step <= 0) return false;
  std::FILE* in = std::fopen(path.c_str(), "r");
  if (in == nullptr) return false;
  std::string kept, line;
  char buf[4096];
  bool past = false;
  while (!past && std::fgets(buf, sizeof buf, in)) {
    line += buf;
    if (line.back() != '\n' && !std::feof(in)) continue;
    if (step_of(line) > resume_step) past = true;
    else kept += line;
    line.clear();
  }
  std::fclose(in);
  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "w");
  if (out == nullptr ||
      std::fwrite(kept.data(), 1, kept.size(), out) != kept.size() || std::fclose(out) != 0 ||
      std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rewrite '" + path + "' for the resumed run; check free "
                             "space and permissions");
  return true;
}

// A text file a sink writes; flush() reports a failed write. Opened (created when missing) when
// the sink is created, so that a path that cannot be written fails the run's start; a file that
// is not appended to is emptied only at the first write, so that a run whose start fails after
// its sinks were created (`--overwrite` over a run.log that is refused, say) leaves an earlier
// run's records as they were.
class OutputFile {
 public:
  OutputFile(std::string path, bool append) : path_(std::move(path)), start_afresh_(!append) {
    file_ = std::fopen(path_.c_str(), "a");
    if (file_ == nullptr)
      throw std::runtime_error("cannot open '" + path_ +
                               "' for writing; check that its directory exists and is writable");
  }
  ~OutputFile() { std::fclose(file_); }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& path() const { return path_; }
  void write(const std::string& text) {
    if (start_afresh_) {  // append mode: the writes after it start at offset 0
      start_afresh_ = false;
      if (std::fflush(file_) != 0 || ftruncate(fileno(file_), 0) != 0)
        throw std::runtime_error("cannot empty '" + path_ + "' for this run's records; check "
                                 "permissions");
    }
    std::fputs(text.c_str(), file_);
  }
  void flush() {
    if (std::fflush(file_) != 0 || std::ferror(file_))
      throw std::runtime_error("writing '" + path_ + "' failed; check free space and permissions");
  }

 private:
  std::string path_;
  bool start_afresh_;  // empty the file at the first write
  std::FILE* file_ = nullptr;
};

}  // namespace sinks
