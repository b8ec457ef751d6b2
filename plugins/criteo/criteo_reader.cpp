// The producer thread of one window and the parsing helpers (criteo_reader.hpp).
//
// A window's records are cut into global groups of batch_size * world records in file order;
// rank r's batch is records [r * batch_size, (r + 1) * batch_size) of each group. The final
// group of n < batch_size * world records: with n >= world, rank r takes records
// [r * n / world, (r + 1) * n / world) (integer division: blocks of floor or ceil of n / world,
// each >= 1), so every rank yields one more batch and no record is dropped; with n < world
// (only possible when world > 1) the n records are dropped and counted (Item::dropped), since
// a batch needs >= 1 sample and every rank must end the window after the same batch count.
#include "criteo_reader.hpp"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "criteo_format.hpp"

namespace criteo {
namespace {

constexpr size_t kBlock = size_t{1} << 20;  // bytes read per block (whole lines parsed)

// The parse of one part of a block: each line's outcome in order.
struct Part {
  const char* begin = nullptr;
  const char* end = nullptr;
  std::vector<double> values;  // kColumns per good line
  std::vector<float> labels;
  std::vector<uint32_t> ends;  // each line's end (after its '\n'), from the part's begin
  std::vector<int32_t> bad;    // per line: -1 good, else index into errors
  std::vector<std::string> errors;
  size_t max_line = 0;
  bool too_long = false;  // the line after the last in `ends` is longer than max_line

  void parse() {
    values.clear(), labels.clear(), ends.clear(), bad.clear(), errors.clear();
    too_long = false;
    double row[kColumns];
    std::string error;
    for (const char* b = begin; b < end;) {
      const char* nl = static_cast<const char*>(std::memchr(b, '\n', static_cast<size_t>(end - b)));
      const char* e = nl ? nl : end;
      if (static_cast<size_t>(e - b) > max_line) {  // not parsed: the read stops there
        too_long = true;
        return;
      }
      float label = 0;
      if (parse_record(b, e, row, &label, &error)) {
        values.insert(values.end(), row, row + kColumns);
        labels.push_back(label);
        bad.push_back(-1);
      } else {
        bad.push_back(static_cast<int32_t>(errors.size()));
        errors.push_back(error);
      }
      b = nl ? nl + 1 : end;
      ends.push_back(static_cast<uint32_t>(b - begin));
    }
  }
};

}  // namespace

// The records of the global group being filled, and where it ends.
struct WindowReader::Group {
  std::vector<double> values;
  std::vector<float> labels;
  Position end;  // after the group's last record
  size_t size() const { return labels.size(); }
};

WindowReader::WindowReader(const ReaderOptions& options, ParsePool* pool, Resolver resolve,
                           Position start, int64_t skip_batches)
    : o_(options), pool_(pool), resolve_(std::move(resolve)), start_(start), skip_(skip_batches) {
  thread_ = std::thread([this] { run(); });
}

WindowReader::~WindowReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Item WindowReader::pop() {
  Item item;
  while (!pop_for(3600, &item)) {
  }
  return item;
}

bool WindowReader::pop_for(double seconds, Item* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_) {
    *out = last_;
    return true;
  }
  if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return !queue_.empty(); }))
    return false;
  Item item = std::move(queue_.front());
  queue_.pop_front();
  cv_.notify_all();
  if (item.kind != Item::kBatch) {
    finished_ = true;
    last_ = item;
  }
  *out = std::move(item);
  return true;
}

bool WindowReader::wait(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  waiting_ = true;
  cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return stop_; });
  waiting_ = false;
  return !stop_;
}

bool WindowReader::waiting_for_file() {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

bool WindowReader::push(Item item) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool wait_room = item.kind == Item::kBatch;  // an end or error always fits
  cv_.wait(lock, [&] { return stop_ || !wait_room || queue_.size() < o_.prefetch; });
  if (stop_) return false;
  queue_.push_back(std::move(item));
  cv_.notify_all();
  return true;
}

void WindowReader::run() {
  try {
    read_all();
  } catch (const std::exception& e) {
    Item error;
    error.kind = Item::kError;
    error.message = e.what();
    push(std::move(error));
  }
}

// Queues this rank's block of group `g` (the window's final group when `last`); false when
// stopped.
bool WindowReader::emit(Group& g, bool last) {
  const int64_t n = static_cast<int64_t>(g.size());
  int64_t lo = o_.rank * o_.batch_size, hi = lo + o_.batch_size;
  if (last) {
    lo = o_.rank * n / o_.world;
    hi = (o_.rank + 1) * n / o_.world;
  }
  if (skip_ > 0) {
    --skip_;
  } else {
    Item item;
    item.samples = hi - lo;
    item.inputs = at::empty({item.samples, kColumns}, at::TensorOptions().dtype(at::kDouble));
    item.targets = at::empty({item.samples}, at::TensorOptions().dtype(at::kFloat));
    std::memcpy(item.inputs.data_ptr<double>(), g.values.data() + lo * kColumns,
                static_cast<size_t>(item.samples * kColumns) * sizeof(double));
    std::memcpy(item.targets.data_ptr<float>(), g.labels.data() + lo,
                static_cast<size_t>(item.samples) * sizeof(float));
    item.after = g.end;
    item.path = path_;
    if (!push(std::move(item))) return false;
  }
  g.values.clear();
  g.labels.clear();
  return true;
}

void WindowReader::read_all() {
  path_ = resolve_(*this);
  if (path_.empty()) {
    Item end;
    end.kind = Item::kEnd;
    push(std::move(end));
    return;
  }
  Source source(path_);
  source.skip_to(start_.offset);
  // A line of more than max_line bytes, line `line` of the file.
  const auto too_long = [&](int64_t line) {
    return std::runtime_error(
        source.shown() + ":" + std::to_string(line) + ": the line is longer than max_line_bytes = " +
        std::to_string(o_.max_line) + " bytes; hint: a Criteo-format line is a few hundred "
        "bytes: check that this is a Criteo-format file (a .zst one compressed), or raise " +
        o_.section + " max_line_bytes");
  };
  const int64_t group_size = o_.batch_size * o_.world;
  Group g;
  g.end = start_;
  Position pos = start_;  // after the last line handled
  std::string first_skipped;
  std::string data;
  std::vector<Part> parts(static_cast<size_t>(pool_ ? pool_->threads() : 1));
  for (Part& part : parts) part.max_line = o_.max_line;
  bool eof = false;
  while (!eof) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    const size_t kept = data.size();
    data.resize(kept + kBlock);
    const size_t got = source.read(data.data() + kept, kBlock);
    data.resize(kept + got);
    eof = got == 0;
    // The whole lines in data (all of it at the end: a last line without '\n'). Only the new
    // bytes are searched: the kept ones hold no '\n' (they are what followed the last one).
    const void* nl = got ? ::memrchr(data.data() + kept, '\n', got) : nullptr;
    const size_t whole = eof ? data.size()
                         : nl ? static_cast<size_t>(static_cast<const char*>(nl) - data.data()) + 1
                              : 0;
    if (whole == 0) {
      if (data.size() > o_.max_line) throw too_long(pos.line + 1);
      continue;
    }
    // Cut [0, whole) into parts at line ends, parse them (in parallel with a pool).
    const size_t k = parts.size();
    size_t at = 0;
    for (size_t i = 0; i < k; ++i) {
      size_t cut = i + 1 == k ? whole : std::max(at, whole * (i + 1) / k);
      if (cut < whole && cut > 0) {
        const void* p = std::memchr(data.data() + cut - 1, '\n', whole - cut + 1);
        cut = p ? static_cast<const char*>(p) - data.data() + 1 : whole;
      }
      parts[i].begin = data.data() + at;
      parts[i].end = data.data() + cut;
      at = cut;
    }
    if (pool_ != nullptr && k > 1) pool_->run([&](int i) { parts[static_cast<size_t>(i)].parse(); });
    else parts[0].parse();
    // Records in file order into groups.
    for (Part& part : parts) {
      size_t good = 0;
      for (size_t l = 0; l < part.bad.size(); ++l) {
        const uint64_t end = pos.offset + (part.begin - data.data()) + part.ends[l];
        const int64_t line = pos.line + 1;
        if (part.bad[l] >= 0) {
          const std::string where = source.shown() + ":" + std::to_string(line) + ": " +
                                    part.errors[static_cast<size_t>(part.bad[l])];
          if (!o_.skip_bad)
            throw std::runtime_error(where + "; hint: fix or remove the line, or set " +
                                     o_.section + " on_bad_record = \"skip\" to skip and count "
                                     "bad records");
          if (first_skipped.empty()) first_skipped = where;
          ++pos.skipped;
        } else {
          g.values.insert(g.values.end(), part.values.begin() + good * kColumns,
                          part.values.begin() + (good + 1) * kColumns);
          g.labels.push_back(part.labels[good]);
          ++good;
          ++pos.records;
        }
        ++pos.line;
        // The position counts lines and bytes up to the record's end (a skipped line after
        // the group's last record is read again on resume, and counted again then).
        if (part.bad[l] < 0) {
          g.end = pos;
          g.end.offset = end;
          if (static_cast<int64_t>(g.size()) == group_size && !emit(g, false)) return;
        }
      }
      if (part.too_long) throw too_long(pos.line + 1);
    }
    pos.offset += whole;
    data.erase(0, whole);
    if (data.size() > o_.max_line) throw too_long(pos.line + 1);
  }
  Item end;
  end.kind = Item::kEnd;
  end.after = pos;
  end.message = first_skipped;
  end.path = path_;
  if (g.size() > 0) {
    if (static_cast<int64_t>(g.size()) >= o_.world) {
      if (!emit(g, true)) return;
    } else {
      end.dropped = static_cast<int64_t>(g.size());
    }
  }
  push(std::move(end));
}

ParsePool::ParsePool(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this, i] { loop(i); });
}

ParsePool::~ParsePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ParsePool::dispatch(Job& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    pending_ = static_cast<int>(helpers_.size());
    ++generation_;
  }
  cv_.notify_all();
  job(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ParsePool::loop(int i) {
  uint64_t seen = 0;
  for (;;) {
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    (*job)(i);  // Part::parse does not throw but for bad_alloc, which ends the process
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace criteo
