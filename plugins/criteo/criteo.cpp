// dataset component: criteo, Criteo-format click logs read as a stream of windows
// (docs/recommendation.md, "Data", says the same for users).
//
// Windows: a window is one file. `path` is a directory (its regular files whose names match the
// glob `pattern`) or a glob; names starting with '.' or ending in ".tmp" are never windows
// (files in the making), nor are symbolic links (a window is opened without following one). Windows are taken in name order (the full path's byte order) and each
// is one epoch of the keel loop: start_epoch(e) starts window e, next() returns false at its
// end. batches_per_epoch() and size() are -1 (a stream, ABI 1.9). With follow = false the
// stream ends after the last file (start_epoch past it gives an empty window); with
// follow = true a window past the last file waits, polling every poll_s seconds, for a file
// whose name sorts after the last window's; a stop requested meanwhile (a SIGTERM, ABI 1.10)
// ends next()'s wait within kStopPollS with keel::StoppedWhileWaiting. A file is taken as complete when it is seen, so a
// writer must publish window files whole: write a dotfile or a *.tmp file and rename it (the
// generator does). A file that appears later but sorts before the current window is not read.
//
// Format, batch layout and the ranks' rule for a window's last records: criteo_format.hpp and
// criteo_reader.cpp. With layout = "named", next_batch (keel.dataset.batch/1) gives the same
// values as dense (columns 0..12, float32), sparse_ids (columns 13..38, int64), sparse_offsets
// (0..26 in every row: one id per bag) and targets. Reading and parsing run on background threads (criteo_reader.hpp): the
// queue holds up to `prefetch` batches.
//
// IO state (state_save/state_load, int64 tensors): the window index, its file (as bytes: its
// path relative to `path`, below; loading requires it to be one of the windows listed now), the
// byte offset of the next record not yet handed to the loop (after the last batch next()
// returned; batches prefetched but not returned do not count; for a .zst file the offset is in
// the decompressed stream, and resuming decompresses the file from its start and discards the
// bytes before it), the lines before it (so errors keep naming FILE:LINE), the window's records
// before it, the batches returned in the window, whether the window ended, and the bad records
// skipped and records dropped. seek(epoch, batch) after state_load continues at exactly that
// record when (epoch, batch) is the saved position, and at the start of the window after it
// for (window + 1, 0); without a loaded state it reads and drops `batch` batches of window
// `epoch` (exact while the files are unchanged).
//
// The saved file is relative to `path` (relative_name): a directory `path`'s window is its
// name; a glob's is its path after the glob's leading directories without a wildcard. A
// checkpoint holds no path out of the data, and resuming after the data directory moved finds
// the window under the new `path`. A checkpoint of the keel before (which saved the listed
// path, absolute) is read when that path is one of the windows listed now (the data not moved).
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <fnmatch.h>
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "criteo_format.hpp"
#include "criteo_reader.hpp"
#include "keel/plugin.hpp"
#include "text/text.hpp"

namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kPath = keel::opt_path(
    "path", nullptr,
    "a directory of window files (those matching `pattern`) or a glob; windows "
    "are taken in name order, one per epoch; dotfiles and *.tmp files are skipped");
constexpr auto kPattern = keel::opt_string(
    "pattern", "\"*\"", "with a directory `path`: the glob the window files' names match");
constexpr auto kBatchSize = keel::opt_int(
    "batch_size", "256",
    "records per batch on each rank (a global batch is batch_size * world_size "
    "records; a window's last batch may be smaller)",
    1, 1e7);
constexpr auto kFollow = keel::opt_bool(
    "follow", "false",
    "true: after the last file, wait for new files (published by rename) that "
    "sort after it; false: the stream ends after the last file");
constexpr auto kPollS = keel::opt_float(
    "poll_s", "1.0", "follow = true: seconds between looks for a new file", 0.001, 3600);
constexpr auto kOnBadRecord = keel::opt_string(
    "on_bad_record", "\"error\"",
    "error: a malformed line stops the run naming FILE:LINE and the field; "
    "skip: skip it, count it in the IO state and log the count at the "
    "window's end",
    "error|skip");
constexpr auto kThreads = keel::opt_int(
    "threads", "1", "background threads that parse lines (one of them also reads)", 1, 64);
constexpr auto kPrefetch = keel::opt_int(
    "prefetch", "4", "batches parsed ahead of the step (the queue's bound)", 1, 4096);
constexpr auto kMaxWindows = keel::opt_int(
    "max_windows", "0", "end the stream after this many windows (0: no limit)", 0, 1e12);
constexpr auto kLayout = keel::opt_string(
    "layout", "\"columns\"",
    "the batch's tensors: columns (inputs float64 [B, 39] and targets) or named (dense "
    "float32 [B, 13], sparse_ids int64 [B, 26], sparse_offsets int64 [B, 27] and targets: "
    "one id per feature's bag)",
    "columns|named");
constexpr auto kMaxLineBytes = keel::opt_int(
    "max_line_bytes", "1048576",
    "the longest line (bytes before its newline): a longer one, or that many bytes "
    "without a newline, stops the run naming FILE:LINE (the reader's memory bound)",
    64, 1e9);

using criteo::Item;
using criteo::Position;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A file name that may be a window: not a dotfile, not a *.tmp file.
bool candidate(const std::string& name) {
  return !name.empty() && name[0] != '.' && !ends_with(name, ".tmp");
}

// A regular file, not a symbolic link to one (lstat): what may be a window.
bool regular_file(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The leading directories of glob `pattern` that hold no wildcard, with their '/' ("data/" of
// "data/day_*.tsv" and of "data/day.tsv", "" of "day_*"): the start every path the glob lists
// shares (glob(3) returns them as the pattern spells them).
std::string glob_directory(const std::string& pattern) {
  const size_t wild = pattern.find_first_of("*?[\\");
  const size_t slash = pattern.rfind('/', wild == std::string::npos ? std::string::npos : wild);
  return slash == std::string::npos ? std::string() : pattern.substr(0, slash + 1);
}

at::Tensor int64s(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t;
}

class Criteo : public keel::Dataset {
 public:
  explicit Criteo(const keel::Context& ctx)
      : path_(ctx.get(kPath)),
        pattern_(ctx.get(kPattern)),
        follow_(ctx.get(kFollow)),
        poll_s_(ctx.get(kPollS)),
        max_windows_(ctx.get(kMaxWindows)),
        named_(ctx.get(kLayout) == "named"),
        log_(ctx),
        stop_requested_(ctx) {
    o_.batch_size = ctx.get(kBatchSize);
    o_.rank = ctx.rank();
    o_.world = ctx.world_size();
    o_.threads = static_cast<int>(ctx.get(kThreads));
    o_.prefetch = static_cast<size_t>(ctx.get(kPrefetch));
    o_.skip_bad = ctx.get(kOnBadRecord) == "skip";
    o_.max_line = static_cast<size_t>(ctx.get(kMaxLineBytes));
    o_.section = "[" + ctx.section() + "]";
    if (o_.world < 1 || o_.rank < 0 || o_.rank >= o_.world)
      throw std::runtime_error("criteo: rank " + std::to_string(o_.rank) + " of world_size " +
                               std::to_string(o_.world) + " is out of range; hint: the kernel "
                               "must pass 0 <= rank < world_size");
    struct stat st {};
    dir_mode_ = ::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    glob_dir_ = dir_mode_ ? std::string() : glob_directory(path_);
    windows_ = list();
    if (windows_.empty() && !follow_) no_windows();
    if (o_.threads > 1) pool_ = std::make_unique<criteo::ParsePool>(o_.threads);
  }
  ~Criteo() override { reader_.reset(); }  // stops the reader before the pool goes
  Criteo(const Criteo&) = delete;
  Criteo& operator=(const Criteo&) = delete;

  int64_t size() override { return -1; }
  int64_t batches_per_epoch() override { return -1; }
  void start_epoch(int64_t epoch) override { open(epoch, Position{}, 0, ""); }

  void seek(int64_t epoch, int64_t batch) override {
    if (!loaded_) return open(epoch, Position{}, batch, "");
    const Saved s = *loaded_;
    loaded_.reset();
    if (epoch < s.window || (epoch == s.window && batch != s.batches))
      throw std::runtime_error(
          "criteo: the checkpoint's IO state is at window " + std::to_string(s.window) +
          " after batch " + std::to_string(s.batches) + ", but the run resumes at epoch " +
          std::to_string(epoch) + " batch " + std::to_string(batch) +
          "; hint: resume from a checkpoint saved by this manifest's data");
    if (epoch > s.window) return open(epoch, Position{}, batch, "");
    open(epoch, s.pos, 0, s.file);
    batches_ = s.batches;
    if (s.done) {  // the window had ended: nothing more in it
      reader_.reset();
      done_ = true;
    }
  }

  bool next(keel::Batch& out) override {
    if (done_ || !reader_) return false;
    Item item;
    // A followed stream's next window may be long in coming: while the reader waits for its
    // file, a stop request ends the wait (no batch; the position stays after the last one).
    while (!reader_->pop_for(kStopPollS, &item))
      if (reader_->waiting_for_file() && stop_requested_()) throw keel::StoppedWhileWaiting{};
    if (item.kind == Item::kError) throw std::runtime_error("criteo: " + item.message);
    file_ = item.path;
    if (item.kind == Item::kEnd) {
      finish(item);
      return false;
    }
    pos_ = item.after;
    ++batches_;
    out.inputs = std::move(item.inputs);
    out.targets = std::move(item.targets);
    out.samples = item.samples;
    out.tokens = item.samples;
    return true;
  }

  // layout = "named": the columns as dense, sparse_ids and sparse_offsets (bag f of every
  // sample is its one id of feature f); "columns": inputs and targets, as next.
  bool next_batch(keel::NamedBatch& out) override {
    keel::Batch b;
    if (!next(b)) return false;
    out.samples = b.samples;
    out.tokens = b.tokens;
    if (!named_) {
      out.tensors = {{"inputs", b.inputs}, {"targets", b.targets}};
      return true;
    }
    const int64_t n = b.inputs.size(0);
    out.tensors = {{"dense", b.inputs.slice(1, 0, criteo::kNumeric).to(at::kFloat)},
                   {"sparse_ids", b.inputs.slice(1, criteo::kNumeric).to(at::kLong)},
                   {"sparse_offsets", at::arange(criteo::kCategorical + 1, at::kLong)
                                          .expand({n, criteo::kCategorical + 1})
                                          .contiguous()},
                   {"targets", b.targets}};
    return true;
  }

  keel::NamedTensors state_save() override {
    const std::string name = file_.empty() ? std::string() : relative_name(file_);
    std::vector<int64_t> file{static_cast<int64_t>(name.size())};
    for (const unsigned char c : name) file.push_back(c);
    return {{"window", int64s({window_})},
            {"batches", int64s({batches_})},
            {"done", int64s({done_ ? 1 : 0})},
            {"file", int64s(file)},
            {"offset", int64s({static_cast<int64_t>(pos_.offset)})},
            {"line", int64s({pos_.line})},
            {"records", int64s({pos_.records})},
            {"skipped", int64s({pos_.skipped})},
            {"skipped_before", int64s({skipped_done_})},
            {"dropped_before", int64s({dropped_done_})}};
  }

  void state_load(const keel::NamedTensors& state) override;

 private:
  struct Saved {
    int64_t window = 0, batches = 0;
    bool done = false;
    std::string file;
    Position pos;
  };

  std::vector<std::string> list() const;
  // A listed window's path relative to `path`, as the IO state holds it.
  std::string relative_name(const std::string& window) const {
    if (dir_mode_) return std::filesystem::path(window).filename().string();
    return window.compare(0, glob_dir_.size(), glob_dir_) == 0 ? window.substr(glob_dir_.size())
                                                               : window;
  }
  // The listed window a loaded IO state's file names, or an error.
  std::string listed_window(const std::string& saved) const;
  std::string resolve(int64_t window, criteo::WindowReader& reader);
  void finish(const Item& end);

  // Starts reading window `window` at `start` (the file `file`, or the window's file when "").
  void open(int64_t window, Position start, int64_t skip, const std::string& file) {
    reader_.reset();
    window_ = window;
    batches_ = 0;
    done_ = false;
    pos_ = start;
    file_ = file;
    if (window < 0) throw std::runtime_error("criteo: epoch " + std::to_string(window) + " < 0");
    criteo::Resolver resolver = [this, window, file](criteo::WindowReader& r) {
      return file.empty() ? resolve(window, r) : file;
    };
    reader_ = std::make_unique<criteo::WindowReader>(o_, pool_.get(), std::move(resolver), start,
                                                     skip);
  }

  std::string path_, pattern_;
  bool follow_;
  double poll_s_;
  int64_t max_windows_;
  bool named_;  // layout = "named"
  keel::Logger log_;
  keel::StopRequest stop_requested_;
  // Seconds between looks at stop_requested_ while next() waits for a window's file.
  static constexpr double kStopPollS = 0.05;
  criteo::ReaderOptions o_;
  bool dir_mode_ = false;
  std::string glob_dir_;  // a glob `path`: glob_directory(path_)
  // Why no file is a window, naming the option that is wrong: `pattern` when the directory
  // holds files that it matches none of, else `path`.
  [[noreturn]] void no_windows() const;

  std::mutex windows_mu_;              // windows_ and base_ (the reader's thread resolves)
  std::vector<std::string> windows_;   // windows_[i] is window base_ + i
  int64_t base_ = 0;
  std::unique_ptr<criteo::ParsePool> pool_;
  std::unique_ptr<criteo::WindowReader> reader_;
  // The loop's position: window_, its file_, pos_ after the batches_ returned.
  int64_t window_ = 0, batches_ = 0;
  bool done_ = false;
  std::string file_;
  Position pos_;
  int64_t skipped_done_ = 0, dropped_done_ = 0;  // over the windows that ended
  std::unique_ptr<Saved> loaded_;
};

void Criteo::no_windows() const {
  std::vector<std::string> others;  // the directory's files that could be windows
  if (dir_mode_) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(path_, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (candidate(name) && regular_file(it->path().string())) others.push_back(name);
    }
    std::sort(others.begin(), others.end());
  }
  if (!others.empty()) {
    std::string names;
    for (size_t i = 0; i < others.size() && i < 3; ++i)
      names += (i ? ", " : "") + keel::text::printable(others[i]);
    if (others.size() > 3) names += ", ...";
    throw std::runtime_error(
        "criteo: " + keel::text::printable(path_) + ": no file matches pattern '" +
        keel::text::printable(pattern_) + "' (the directory " +
        "holds " + std::to_string(others.size()) + " other file" +
        (others.size() > 1 ? "s: " : ": ") + names + "); hint: set " + o_.section +
        " pattern to a glob that matches the window files' names (e.g. \"day_*.tsv*\")");
  }
  throw std::runtime_error(
      "criteo: " + keel::text::printable(path_) + ": no window files" +
      (dir_mode_ ? std::string(" in the directory") : std::string(" match this glob")) +
      " (dotfiles and *.tmp files are never windows); hint: set " + o_.section +
      " path to a directory of Criteo-format files or a glob (keel-criteo-generate --output "
      "DIR writes one), or follow = true to wait for files");
}

// The window files now, in name order.
std::vector<std::string> Criteo::list() const {
  std::vector<std::string> out;
  if (dir_mode_) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(path_, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (candidate(name) && ::fnmatch(pattern_.c_str(), name.c_str(), 0) == 0 &&
          regular_file(it->path().string()))
        out.push_back(it->path().string());
    }
    if (ec)
      throw std::runtime_error("criteo: " + keel::text::printable(path_) +
                               ": cannot list the directory (" +
                               ec.message() + "); hint: check that it exists and is readable");
  } else {
    glob_t g{};
    if (::glob(path_.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        const std::string p = g.gl_pathv[i];
        if (candidate(std::filesystem::path(p).filename().string()) && regular_file(p))
          out.push_back(p);
      }
    ::globfree(&g);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The file of window `window` ("" when the stream has no such window), on the reader's thread.
std::string Criteo::resolve(int64_t window, criteo::WindowReader& reader) {
  if (max_windows_ > 0 && window >= max_windows_) return "";
  for (bool first = true;; first = false) {
    {
      std::lock_guard<std::mutex> lock(windows_mu_);
      if (window < base_)
        throw std::runtime_error("window " + std::to_string(window) +
                                 " comes before the checkpoint's window " +
                                 std::to_string(base_) + ", which is all the IO state knows");
      if (!first || window - base_ >= static_cast<int64_t>(windows_.size())) {
        for (const std::string& p : list())  // files that sort after the last window are new
          if (windows_.empty() ? base_ == 0 : p > windows_.back()) windows_.push_back(p);
      }
      if (window - base_ < static_cast<int64_t>(windows_.size()))
        return windows_[static_cast<size_t>(window - base_)];
    }
    if (!follow_ || !reader.wait(poll_s_)) return "";
  }
}

void Criteo::finish(const Item& end) {
  done_ = true;
  pos_ = end.after;
  const int64_t skipped = pos_.skipped, dropped = end.dropped;
  skipped_done_ += skipped;
  dropped_done_ += dropped;
  if (end.path.empty()) return;  // an empty window: the stream is over
  std::string line = "window " + std::to_string(window_) + " (" +
                     keel::text::printable(end.path) + ") ended: " +
                     std::to_string(pos_.records) + " records";
  if (skipped > 0)
    line += ", " + std::to_string(skipped) + " bad records skipped (the first: " + end.message +
            ")";
  if (dropped > 0)
    line += ", " + std::to_string(dropped) + " records dropped (a final group of fewer records "
            "than world_size " + std::to_string(o_.world) + ")";
  log_(skipped > 0 || dropped > 0 ? KEEL_LOG_WARN : KEEL_LOG_INFO, line);
}

void Criteo::state_load(const keel::NamedTensors& state) {
  auto get = [&](const std::string& name) -> at::Tensor {
    for (const auto& [n, t] : state)
      if (n == name) {
        if (t.scalar_type() != at::kLong || t.dim() != 1 || t.numel() < 1)
          throw std::runtime_error("criteo: state entry '" + name + "' is not int64 [n >= 1]");
        return t.contiguous();
      }
    throw std::runtime_error("criteo: the checkpoint's dataset state has no entry '" + name +
                             "'; hint: resume with the dataset that saved it");
  };
  auto one = [&](const std::string& name) { return get(name).data_ptr<int64_t>()[0]; };
  Saved s;
  s.window = one("window");
  s.batches = one("batches");
  s.done = one("done") != 0;
  const at::Tensor file = get("file");
  const int64_t* f = file.data_ptr<int64_t>();
  if (f[0] < 0 || f[0] + 1 != file.numel())
    throw std::runtime_error("criteo: state entry 'file' is malformed");
  for (int64_t i = 1; i <= f[0]; ++i) s.file.push_back(static_cast<char>(f[i]));
  s.pos.offset = static_cast<uint64_t>(one("offset"));
  s.pos.line = one("line");
  s.pos.records = one("records");
  s.pos.skipped = one("skipped");
  skipped_done_ = one("skipped_before");
  dropped_done_ = one("dropped_before");
  if (!s.file.empty()) s.file = listed_window(s.file);
  reader_.reset();
  {
    std::lock_guard<std::mutex> lock(windows_mu_);
    if (!s.file.empty()) {  // window s.window is that file, the next ones sort after it
      base_ = s.window;
      windows_ = {s.file};
    }
  }
  loaded_ = std::make_unique<Saved>(s);
}

std::string Criteo::listed_window(const std::string& saved) const {
  const std::vector<std::string> windows = list();
  for (const std::string& w : windows)
    if (relative_name(w) == saved) return w;
  // A checkpoint of the keel before: the listed path itself (absolute, as `path` is).
  if (!saved.empty() && saved[0] == '/')
    for (const std::string& w : windows)
      if (w == saved) return w;
  throw std::runtime_error(
      "criteo: the checkpoint's IO state names the window file '" + keel::text::printable(saved) +
      "', which is not one of " + o_.section + " path's windows (" +
      std::to_string(windows.size()) + " files listed under " + keel::text::printable(path_) +
      (!saved.empty() && saved[0] == '/'
           ? "); hint: an earlier keel saved the window's absolute path: resume with the data "
             "the checkpoint was saved from, at that path"
           : "); hint: resume with the data the checkpoint was saved from, under any path: the "
             "window is found by its name relative to path"));
}

const keel_option_desc kOptions[] = {
    kPath, kPattern, kBatchSize, kFollow, kPollS, kOnBadRecord, kThreads, kPrefetch, kMaxWindows,
    kMaxLineBytes, kLayout,
};
const keel_component_desc kComponents[] = {
    keel::component<Criteo>(
        "criteo",
        "Criteo-format click logs (label, 13 integers, 26 hex categoricals; plain or .zst) as "
        "a stream of windows, one file per epoch, with exact-resume IO state",
        kOptions),
};

}  // namespace

KEEL_PLUGIN("keel-criteo", "0.1.0", "Criteo-format click-log windows for recommendation models",
            kComponents)
