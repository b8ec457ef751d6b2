// The background reading of one window (plugins/criteo): a producer thread reads the window
// file (criteo_format.hpp's Source), parses its lines on `threads` threads, groups the records
// into global batches of batch_size * world records and queues this rank's block of each
// (bounded by `prefetch` batches). The dataset (criteo.cpp) pops the queue in next().
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace criteo {

// Where the next record not yet handed to the loop is, inside a window.
struct Position {
  uint64_t offset = 0;  // byte offset in the (decompressed) file
  int64_t line = 0;     // lines before it (so the next line is line + 1)
  int64_t records = 0;  // records of the window before it (all ranks' records of its groups)
  int64_t skipped = 0;  // bad records skipped before it (on_bad_record = "skip")
};

struct Item {
  enum Kind { kBatch, kEnd, kError } kind = kBatch;
  at::Tensor inputs, targets;  // kBatch
  int64_t samples = 0;
  Position after;             // kBatch: after the batch's global group; kEnd: the window's end
  int64_t dropped = 0;        // kEnd: records of a final group too small to share (see below)
  std::string message;        // kError: the error; kEnd: the first skipped record's error
  std::string path;           // kBatch, kEnd: the window's file ("" for an empty window), as
                              // listed (for a message: keel::text::printable)
};

struct ReaderOptions {
  int64_t batch_size = 1;
  int rank = 0, world = 1;
  int threads = 1;
  size_t prefetch = 4;
  bool skip_bad = false;
  // The longest line read (bytes before its '\n'): a longer one, or that many bytes without a
  // '\n', is an error, skipped or not, so that the reader holds at most max_line + 1 MiB of a
  // window's text.
  size_t max_line = size_t{1} << 20;
  std::string section;  // for hints: "[data.train]"
};

class ParsePool;

class WindowReader;
// Finds the window's file on the reader's thread (polling with WindowReader::wait when it must
// wait for one); "" when there is none (the stream is over, or the reader was stopped).
using Resolver = std::function<std::string(WindowReader&)>;

// Reads one window on its own thread from `start` on; `skip_batches` batches of this rank are
// read and dropped first (a seek without a byte offset). Destroying it stops the thread.
class WindowReader {
 public:
  WindowReader(const ReaderOptions& options, ParsePool* pool, Resolver resolve, Position start,
               int64_t skip_batches);
  ~WindowReader();
  WindowReader(const WindowReader&) = delete;
  WindowReader& operator=(const WindowReader&) = delete;
  Item pop();  // blocks until the next item; after kEnd or kError returns it again
  // As pop, but gives up after `seconds` without an item: false then (*out untouched).
  bool pop_for(double seconds, Item* out);
  // Sleeps `seconds` unless stopped first; false when stopped.
  bool wait(double seconds);
  // Whether the thread is waiting for the window's file to appear (in wait, called by the
  // resolver of a followed stream).
  bool waiting_for_file();

 private:
  void run();
  void read_all();
  bool push(Item item);  // false when stopped
  struct Group;
  bool emit(Group& g, bool last);

  ReaderOptions o_;
  ParsePool* pool_;
  Resolver resolve_;
  std::string path_;
  Position start_;
  int64_t skip_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  bool finished_ = false;
  bool waiting_ = false;  // in wait()
  Item last_;
  std::thread thread_;
};

// threads - 1 helper threads that parse parts of a block beside the producer.
class ParsePool {
 public:
  explicit ParsePool(int threads);
  ~ParsePool();
  ParsePool(const ParsePool&) = delete;
  ParsePool& operator=(const ParsePool&) = delete;
  int threads() const { return static_cast<int>(helpers_.size()) + 1; }
  // Runs job(i) for i in 0..threads()-1: i = 0 on the calling thread, the others on the helpers.
  template <class F>
  void run(F job) {
    run_impl([&](int i) { job(i); });
  }

 private:
  struct Job {
    virtual ~Job() = default;
    virtual void operator()(int i) = 0;
  };
  template <class F>
  struct JobOf : Job {
    explicit JobOf(F f) : f(std::move(f)) {}
    void operator()(int i) override { f(i); }
    F f;
  };
  template <class F>
  void run_impl(F f) {
    JobOf<F> job(std::move(f));
    dispatch(job);
  }
  void dispatch(Job& job);
  void loop(int i);
  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace criteo
