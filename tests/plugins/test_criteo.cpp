// The `criteo` dataset (plugins/criteo) through keel/testing.hpp, loading the built plugin
// (its path in $KEEL_CRITEO_PLUGIN): the parser's values and bad-input errors, exact resume
// counting every record over kills at many points (plain and .zst, threads 1 and 2, 1 and 2
// ranks), the ranks' rule, a truncated .zst, follow = true picking up a file published while
// reading, and clean stops (destroy while the reader waits on a full queue or polls). Issue 43:
// the line cap (max_line_bytes, a one-line .zst bomb), windows replaced by a FIFO or a link after
// listing, the IO state's window relative to path and required to be listed, messages quoting
// data bytes printably, INT64_MIN, a .zst frame over the zstd window limit.
#include "keel/testing.hpp"  // before doctest.h (glog's CHECK macros)

#include <ATen/ops/empty.h>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "probe.hpp"

namespace fs = std::filesystem;
using keel::testing::Options;
using keel::testing::Setup;
using Dataset = keel::testing::Instance<keel_dataset>;

namespace {

const keel::testing::Plugin& plugin() {
  static const keel::testing::Plugin p([] {
    const char* path = std::getenv("KEEL_CRITEO_PLUGIN");
    if (path == nullptr) throw std::runtime_error("set KEEL_CRITEO_PLUGIN to libkeel-criteo.so");
    return probe::open_plugin(path);
  }());
  return p;
}

struct TempDir {
  fs::path path = keel::testing::detail::temporary_directory();
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  REQUIRE(!ZSTD_isError(n));
  out.resize(n);
  return out;
}

// Record i of window w: I1 = w * 100000 + i + 1 (so every record is told apart), some missing
// fields, hex categoricals.
std::string line(int w, int i) {
  std::string s = std::to_string((i * 7 + w) % 3 == 0 ? 1 : 0);
  s += "\t" + std::to_string(w * 100000 + i + 1);
  for (int k = 2; k <= 13; ++k) s += "\t" + ((i + k) % 5 == 0 ? "" : std::to_string((i * k) % 50 - 3));
  for (int k = 1; k <= 26; ++k) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%x", (i * 31 + k * 7 + w) % 997);
    s += "\t" + ((i + k) % 7 == 0 ? std::string() : std::string(hex));
  }
  return s + "\n";
}

// Windows of the given sizes as day_000.tsv[.zst], ...
void write_windows(const fs::path& dir, const std::vector<int>& sizes, bool compressed) {
  for (size_t w = 0; w < sizes.size(); ++w) {
    std::string text;
    for (int i = 0; i < sizes[w]; ++i) text += line(static_cast<int>(w), i);
    char name[32];
    std::snprintf(name, sizeof name, "day_%03zu.tsv", w);
    write(dir / (std::string(name) + (compressed ? ".zst" : "")), compressed ? zstd(text) : text);
  }
}

using Row = std::vector<double>;  // label, then the 39 inputs

Dataset make(const Options& o, int rank = 0, int world = 1) {
  Setup s;
  s.section = "data.train";
  s.rank = rank;
  s.world_size = world;
  return plugin().create<keel_dataset>("criteo", o, s);
}

// Appends the next batch's rows to `rows` (with `ids_only`, each row as {label, I1 column},
// which tells the records of write_windows apart); false at the window's end.
bool next_rows(const Dataset& d, std::vector<Row>* rows, int64_t* samples = nullptr,
               bool ids_only = false) {
  keel_batch b{};
  int has = 0;
  d.call(d->next, &b, &has);
  if (!has) return false;
  const at::Tensor in = keel::adopt(b.inputs), tg = keel::adopt(b.targets);
  REQUIRE((in.scalar_type() == at::kDouble));
  REQUIRE((tg.scalar_type() == at::kFloat));
  REQUIRE(in.dim() == 2);
  REQUIRE(in.size(1) == 39);
  REQUIRE(tg.size(0) == in.size(0));
  REQUIRE(b.samples == in.size(0));
  if (samples) *samples = b.samples;
  const at::Tensor inc = in.contiguous(), tgc = tg.contiguous();
  const double* x = inc.data_ptr<double>();
  const float* y = tgc.data_ptr<float>();
  for (int64_t r = 0; r < in.size(0); ++r) {
    Row row{y[r]};
    row.insert(row.end(), x + r * 39, x + (ids_only ? r * 39 + 1 : (r + 1) * 39));
    rows->push_back(row);
  }
  return true;
}

// Reads the rest of window `epoch` (started or sought), then windows epoch + 1, ... to the
// first window without a batch (the stream's end).
void read_rest(const Dataset& d, int64_t epoch, std::vector<Row>* rows) {
  while (next_rows(d, rows, nullptr, true)) {
  }
  for (int64_t e = epoch + 1;; ++e) {
    d.call(d->start_epoch, e);
    bool any = false;
    while (next_rows(d, rows, nullptr, true)) any = true;
    if (!any) return;
  }
}

}  // namespace

TEST_CASE("criteo: values of a line in the batch layout") {
  TempDir t;
  write(t.path / "a.tsv",
        "1\t0\t\t5\t-3\t1\t1\t1\t1\t1\t1\t1\t1\t1\t"
        "0\tff\t\t1F\t1fffffffffffff\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t"
        "0\tabc\r\n");
  Dataset d = make({{"path", (t.path / "a.tsv").string()}});
  d.call(d->start_epoch, int64_t{0});
  std::vector<Row> rows;
  REQUIRE(next_rows(d, &rows));
  REQUIRE(rows.size() == 1);
  const Row& r = rows[0];
  CHECK(r[0] == 1.0);                       // label
  CHECK(r[1] == 0.0);                       // I1 = 0 -> log1p(0)
  CHECK(r[2] == 0.0);                       // I2 missing
  CHECK(r[3] == doctest::Approx(std::log1p(5.0)).epsilon(1e-15));
  CHECK(r[4] == 0.0);                       // I4 = -3 -> log1p(max(-3, 0))
  CHECK(r[14] == 0.0);                      // C1 "0"
  CHECK(r[15] == 255.0);                    // C2 "ff"
  CHECK(r[16] == -1.0);                     // C3 missing
  CHECK(r[17] == 31.0);                     // C4 "1F"
  CHECK(r[18] == 9007199254740991.0);       // C5 2^53 - 1
  CHECK(r[39] == 0xabc);                    // C26, the '\r' dropped
  CHECK(!next_rows(d, &rows));
  CHECK(d.call(d->batches_per_epoch) == -1);
  CHECK(d.call(d->size) == -1);
}

TEST_CASE("criteo: bad records name FILE:LINE and the field; skip counts them") {
  const std::string good = line(0, 0);
  std::string fields = good.substr(0, good.size() - 1);
  auto with = [&](int field, const std::string& v) {  // the good line with one field replaced
    std::vector<std::string> f;
    size_t at = 0;
    for (size_t tab; (tab = fields.find('\t', at)) != std::string::npos; at = tab + 1)
      f.push_back(fields.substr(at, tab - at));
    f.push_back(fields.substr(at));
    f[static_cast<size_t>(field)] = v;
    std::string s;
    for (size_t i = 0; i < f.size(); ++i) s += (i ? "\t" : "") + f[i];
    return s + "\n";
  };
  struct Case {
    std::string bad, message;
  };
  const std::vector<Case> cases = {
      {with(20, "zz"), "C7: 'zz' is not hexadecimal"},
      {with(14, "0x1f"), "C1: '0x1f' is not hexadecimal"},
      {with(39, "20000000000000"), "C26: '20000000000000' is 2^53 or more"},
      {with(0, "2"), "label: '2' is not 0 or 1"},
      {with(0, ""), "label: '' is not 0 or 1"},
      {with(3, "1.5"), "I3: '1.5' is not an integer"},
      {with(13, "99999999999999999999"), "I13: '99999999999999999999' is not an integer"},
      {fields + "\t1\n", "has 41 tab-separated fields, not 40"},
      {"1\t2\t3\n", "has 3 tab-separated fields, not 40"},
      {"\n", "has 1 tab-separated fields, not 40"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.message);
    TempDir t;
    const fs::path file = t.path / "w.tsv";
    write(file, good + good + c.bad + good);
    {
      Dataset d = make({{"path", file.string()}, {"batch_size", 2}});
      d.call(d->start_epoch, int64_t{0});
      std::vector<Row> rows;
      CHECK(next_rows(d, &rows));  // records 1 and 2
      try {
        next_rows(d, &rows);
        FAIL("no error");
      } catch (const std::runtime_error& e) {
        const std::string m = e.what();
        CHECK(m.find(file.string() + ":3: " + c.message) != std::string::npos);
        CHECK(m.find("on_bad_record = \"skip\"") != std::string::npos);
        CHECK(m.find('\n') == std::string::npos);
      }
      CHECK_THROWS(next_rows(d, &rows));  // stays failed, no hang
    }
    keel::testing::clear_log_lines();
    Dataset d = make({{"path", file.string()}, {"batch_size", 2}, {"on_bad_record", "skip"}});
    d.call(d->start_epoch, int64_t{0});
    std::vector<Row> rows;
    while (next_rows(d, &rows)) {
    }
    CHECK(rows.size() == 3);
    const auto state = keel::testing::save_state(d);
    for (const auto& [name, tensor] : state)
      if (name == "skipped_before") CHECK(tensor[0].item<int64_t>() == 1);
    bool logged = false;
    for (const std::string& l : keel::testing::log_lines())
      logged = logged || (l.find("1 bad records skipped") != std::string::npos &&
                          l.find(file.string() + ":3: " + c.message) != std::string::npos);
    CHECK(logged);
  }
}

TEST_CASE("criteo: a truncated .zst is an error naming the file") {
  TempDir t;
  std::string text;
  for (int i = 0; i < 2000; ++i) text += line(0, i);
  const std::string z = zstd(text);
  const fs::path file = t.path / "day_000.tsv.zst";
  write(file, z.substr(0, z.size() / 2));
  for (const int threads : {1, 2}) {
    Dataset d = make({{"path", file.string()}, {"batch_size", 64}, {"threads", threads}});
    d.call(d->start_epoch, int64_t{0});
    std::vector<Row> rows;
    std::string message;
    try {
      while (next_rows(d, &rows)) {
      }
    } catch (const std::runtime_error& e) {
      message = e.what();
    }
    CHECK(message.find(file.string() + ": truncated zstd file") != std::string::npos);
  }
}

namespace {

// Where a read stops before the kill, at a window's end: right after its last batch, after
// next() said the window ended, or after start_epoch of the next window.
enum class Stop { kAfterBatch, kAfterEnd, kAfterStart };

// Reads `kill` batches (then `stop`), saves the state, destroys the dataset, resumes a new one
// from the state and reads to the stream's end: all the rows, in order.
std::vector<Row> killed_and_resumed(const Options& o, int rank, int world, int64_t kill,
                                    Stop stop) {
  std::vector<Row> rows;
  keel::testing::NamedTensors state;
  int64_t epoch = 0, batch = 0;
  {
    Dataset a = make(o, rank, world);
    a.call(a->start_epoch, epoch);
    for (int64_t k = 0; k < kill;) {
      if (next_rows(a, &rows, nullptr, true)) {
        ++k, ++batch;
      } else {
        a.call(a->start_epoch, ++epoch);
        batch = 0;
      }
    }
    if (stop != Stop::kAfterBatch) {
      std::vector<Row> none;
      if (!next_rows(a, &none, nullptr, true)) {
        epoch += 1, batch = 0;  // the kernel goes on with the next window
        if (stop == Stop::kAfterStart) a.call(a->start_epoch, epoch);
      } else {
        rows.insert(rows.end(), none.begin(), none.end());  // not at a window's end after all
        ++batch;
      }
    }
    state = keel::testing::save_state(a);
  }  // "killed": the reader may hold prefetched batches, which must not count
  Dataset b = make(o, rank, world);
  keel::testing::load_state(b, state);
  b.call(b->seek, epoch, batch);
  read_rest(b, epoch, &rows);
  return rows;
}

}  // namespace

TEST_CASE("criteo: kill and resume continue at exactly the next record") {
  const std::vector<int> sizes = {37, 12001, 23};  // 12001 records span several 1 MiB blocks
  struct Config {
    bool compressed;
    int threads, world;
  };
  const Config configs[] = {{false, 1, 1}, {false, 2, 1}, {true, 1, 1}, {true, 2, 1},
                            {false, 2, 2}, {true, 1, 2}};
  for (const Config& config : configs) {
    // (Not structured bindings: clang rejects one captured by a lambda, CAPTURE's included,
    // before C++20.)
    const bool compressed = config.compressed;
    const int threads = config.threads, world = config.world;
        TempDir t;
        write_windows(t.path, sizes, compressed);
        const Options o = {{"path", t.path.string()},
                           {"batch_size", 32},
                           {"threads", threads},
                           {"prefetch", 3}};
        for (int rank = 0; rank < world; ++rank) {
          CAPTURE(compressed);
          CAPTURE(threads);
          CAPTURE(world);
          CAPTURE(rank);
          // The uninterrupted read, and its batches per window.
          std::vector<Row> all;
          std::vector<int64_t> ends;  // cumulative batches at each window's end
          {
            Dataset d = make(o, rank, world);
            int64_t n = 0;
            for (int64_t e = 0;; ++e) {
              d.call(d->start_epoch, e);
              int64_t in_window = 0;
              while (next_rows(d, &all, nullptr, true)) ++n, ++in_window;
              if (in_window == 0) break;
              ends.push_back(n);
            }
          }
          REQUIRE(ends.size() == 3);
          int64_t records = 0;  // every record is seen once, by one rank
          for (const int s : sizes) records += s;
          if (world == 1) REQUIRE(static_cast<int64_t>(all.size()) == records);
          std::vector<std::pair<int64_t, Stop>> kills = {{0, Stop::kAfterBatch},
                                                         {1, Stop::kAfterBatch},
                                                         {(ends[0] + ends[1]) / 2, Stop::kAfterBatch},
                                                         {ends[1] - 1, Stop::kAfterBatch},
                                                         {ends[2] - 1, Stop::kAfterBatch},
                                                         {ends[2], Stop::kAfterBatch},
                                                         {ends[2], Stop::kAfterEnd}};
          for (const int64_t at : {ends[0], ends[1]})
            for (const Stop s : {Stop::kAfterBatch, Stop::kAfterEnd, Stop::kAfterStart})
              kills.emplace_back(at, s);
          for (const auto& case_ : kills) {
            // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
            // included, before C++20.)
            const auto& kill = case_.first;
            const auto& stop = case_.second;
            CAPTURE(kill);
            CAPTURE(static_cast<int>(stop));
            const std::vector<Row> got = killed_and_resumed(o, rank, world, kill, stop);
            CHECK(got.size() == all.size());
            CHECK(got == all);  // none twice, none skipped, same order
          }
        }
      }
}

TEST_CASE("criteo: 2 ranks see the global batches of 1 rank with twice batch_size") {
  const std::vector<int> sizes = {37, 50, 23, 1};  // final groups of 5, 2, 7 and 1 records
  TempDir t;
  write_windows(t.path, sizes, false);
  const Options one = {{"path", t.path.string()}, {"batch_size", 8}};
  const Options half = {{"path", t.path.string()}, {"batch_size", 4}};
  Dataset single = make(one);
  Dataset r0 = make(half, 0, 2), r1 = make(half, 1, 2);
  int64_t dropped_windows = 0;
  for (int64_t e = 0; e < 5; ++e) {
    CAPTURE(e);
    for (const Dataset* d : {&single, &r0, &r1}) d->call((*d)->start_epoch, e);
    for (;;) {
      std::vector<Row> g, a, b;
      int64_t na = 0, nb = 0;
      const bool hs = next_rows(single, &g), ha = next_rows(r0, &a, &na),
                 hb = next_rows(r1, &b, &nb);
      REQUIRE(ha == hb);  // every rank ends the window after the same batch count
      if (!ha) {
        // Only a final group smaller than the world (the 1-record window) is left out.
        if (hs) {
          CHECK(g.size() == 1);
          ++dropped_windows;
          CHECK(!next_rows(single, &g));
        }
        break;
      }
      REQUIRE(hs);
      CHECK(na >= 1);
      CHECK(nb >= 1);
      CHECK(std::abs(na - nb) <= 1);
      a.insert(a.end(), b.begin(), b.end());
      CHECK(a == g);
    }
  }
  CHECK(dropped_windows == 1);
  const auto state = keel::testing::save_state(r0);
  for (const auto& [name, tensor] : state)
    if (name == "dropped_before") CHECK(tensor[0].item<int64_t>() == 1);
}

TEST_CASE("criteo: follow = true picks up a file published while reading") {
  TempDir t;
  write_windows(t.path, {30}, false);
  write(t.path / "day_001.tsv.tmp", line(1, 0));  // in the making: never a window
  write(t.path / ".day_001.tsv", line(1, 0));
  Dataset d = make({{"path", t.path.string()},
                    {"pattern", "day_*.tsv"},
                    {"batch_size", 8},
                    {"follow", true},
                    {"poll_s", 0.02}});
  std::vector<Row> rows;
  d.call(d->start_epoch, int64_t{0});
  while (next_rows(d, &rows)) {
  }
  CHECK(rows.size() == 30);
  d.call(d->start_epoch, int64_t{1});
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    std::string text;
    for (int i = 0; i < 20; ++i) text += line(1, i);
    write(t.path / ".day_001.tsv", text);
    fs::rename(t.path / ".day_001.tsv", t.path / "day_001.tsv");
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Row> second;
  while (next_rows(d, &second)) {
  }
  writer.join();
  CHECK(second.size() == 20);
  CHECK(second[0][1] == doctest::Approx(std::log1p(100001.0)));
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(100));
  // Waiting for a third window: destroying the dataset stops the polling reader at once.
  d.call(d->start_epoch, int64_t{2});
}

TEST_CASE("criteo: follow = false ends after the last file; stops are clean") {
  TempDir t;
  write_windows(t.path, {5000}, true);
  {
    Dataset d = make({{"path", t.path.string()}, {"batch_size", 16}, {"prefetch", 1},
                      {"threads", 2}});
    d.call(d->start_epoch, int64_t{0});
    std::vector<Row> rows;
    CHECK(next_rows(d, &rows));  // the reader now waits on a full queue: destroy stops it
  }
  Dataset d = make({{"path", t.path.string()}, {"batch_size", 16}, {"max_windows", 1}});
  d.call(d->start_epoch, int64_t{1});
  std::vector<Row> rows;
  CHECK(!next_rows(d, &rows));
  CHECK_THROWS_WITH(make({{"path", (t.path / "none*").string()}}),
                    doctest::Contains("no window files"));
}

TEST_CASE("criteo: no window file: the hint names the option that is wrong") {
  TempDir t;
  write_windows(t.path, {10, 10}, false);  // day_000.tsv, day_001.tsv
  write(t.path / ".day_002.tsv", "");      // never a window
  const fs::path empty = t.path / "empty";
  fs::create_directories(empty);
  struct Case {
    std::string path, pattern;
    const char* says;  // the error holds this
  };
  const std::vector<Case> cases = {
      // Files the pattern matches none of: `pattern` is wrong.
      {t.path.string(), "day_00[3-6].tsv*",
       "no file matches pattern 'day_00[3-6].tsv*' (the directory holds 2 other files: "
       "day_000.tsv, day_001.tsv); hint: set [data.train] pattern to a glob"},
      // No file at all (dotfiles are none): `path` is.
      {empty.string(), "*", "no window files in the directory"},
      {empty.string(), "day_*", "hint: set [data.train] path to a directory"},
      {(t.path / "nothing*").string(), "*", "no window files match this glob"},
      {(t.path / "nothing*").string(), "*", "hint: set [data.train] path to a directory"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.path);
    CAPTURE(c.pattern);
    CHECK_THROWS_WITH(make({{"path", c.path}, {"pattern", c.pattern}}), doctest::Contains(c.says));
  }
}

namespace {

// The error of reading window `epoch` of `d` to its end ("" when there is none).
std::string read_error(const Dataset& d, int64_t epoch = 0) {
  d.call(d->start_epoch, epoch);
  std::vector<Row> rows;
  try {
    while (next_rows(d, &rows)) {
    }
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// A zstd stream of `text` whose frame header asks for a window of 2^window_log bytes (streamed
// with no pledged size, so the header holds the window, not the content size).
std::string zstd_window(const std::string& text, int window_log) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  REQUIRE(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, window_log)));
  std::string out(ZSTD_compressBound(text.size()) + 64, '\0');
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  ZSTD_inBuffer i{text.data(), text.size(), 0};
  REQUIRE(!ZSTD_isError(ZSTD_compressStream2(c, &o, &i, ZSTD_e_continue)));  // size unknown
  REQUIRE(i.pos == i.size);
  size_t r;
  do {
    r = ZSTD_compressStream2(c, &o, &i, ZSTD_e_end);
    REQUIRE(!ZSTD_isError(r));
  } while (r != 0);
  ZSTD_freeCCtx(c);
  out.resize(o.pos);
  return out;
}

// The IO state `state` with its entry 'file' holding `file`.
keel::testing::NamedTensors with_file(keel::testing::NamedTensors state, const std::string& file) {
  std::vector<int64_t> v{static_cast<int64_t>(file.size())};
  for (const unsigned char c : file) v.push_back(c);
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  for (auto& entry : state)
    if (entry.first == "file") entry.second = t;
  return state;
}

std::string saved_file(const keel::testing::NamedTensors& state) {
  std::string s;
  for (const auto& entry : state)
    if (entry.first == "file") {
      const at::Tensor t = entry.second;
      for (int64_t i = 1; i < t.numel(); ++i) s.push_back(static_cast<char>(t[i].item<int64_t>()));
    }
  return s;
}

}  // namespace

TEST_CASE("criteo: a line longer than max_line_bytes stops the read (issue 43, finding 4)") {
  TempDir t;
  const std::string good = line(0, 0);
  const std::string x(3000, 'x');
  for (const std::string& text : {good + x, good + x + "\n" + good}) {
    const fs::path file = t.path / "w.tsv";
    write(file, text);
    for (const int threads : {1, 2}) {
      CAPTURE(threads);
      Dataset d = make({{"path", file.string()}, {"max_line_bytes", 1000}, {"threads", threads},
                        {"on_bad_record", "skip"}});  // not skippable: no record is that long
      const std::string m = read_error(d);
      CHECK(m.find(file.string() + ":2: ") != std::string::npos);
      CHECK(m.find("longer than max_line_bytes = 1000 bytes") != std::string::npos);
      CHECK(m.find("[data.train] max_line_bytes") != std::string::npos);
      CHECK(m.find('\n') == std::string::npos);
    }
  }
  // A .zst bomb: 64 MiB of one line from a few KB, stopped at the default cap (1 MiB).
  const fs::path bomb = t.path / "bomb.tsv.zst";
  write(bomb, zstd(std::string(size_t{64} << 20, 'a')));
  REQUIRE(fs::file_size(bomb) < 65536);
  Dataset d = make({{"path", bomb.string()}});
  const std::string m = read_error(d);
  CHECK(m.find(bomb.string() + ":1: ") != std::string::npos);
  CHECK(m.find("longer than max_line_bytes = 1048576 bytes") != std::string::npos);
  // A line of exactly the cap is read.
  const fs::path exact = t.path / "exact.tsv";
  write(exact, good);
  Dataset e = make({{"path", exact.string()}, {"max_line_bytes", static_cast<int64_t>(good.size() - 1)}});
  CHECK(read_error(e).empty());
}

TEST_CASE("criteo: a window replaced by a FIFO or a symlink is refused when opened (finding 5)") {
  TempDir t;
  write_windows(t.path, {10, 10}, false);  // day_000.tsv, day_001.tsv
  const fs::path secret = t.path / "secret";
  fs::create_directories(secret);
  write(secret / "key", "TOPSECRET\tline\n");
  // A symlink at listing time is not a window.
  fs::create_symlink(secret / "key", t.path / "day_002.tsv");
  {
    Dataset d = make({{"path", t.path.string()}, {"pattern", "day_*"}});
    CHECK(read_error(d, 2).empty());
    std::vector<Row> rows;
    CHECK(!next_rows(d, &rows));  // window 2 is the stream's end
  }
  struct Case {
    std::string kind;
    const char* says;
  };
  for (const Case& c : {Case{"fifo", "is not a regular file"},
                        Case{"secret", "is a symbolic link"},
                        Case{"zero", "is a symbolic link"}}) {
    CAPTURE(c.kind);
    for (const std::string zst : {"", ".zst"}) {
      CAPTURE(zst);
      TempDir u;
      write_windows(u.path, {10, 10}, !zst.empty());
      Dataset d = make({{"path", u.path.string()}});  // lists both windows
      const fs::path window = u.path / ("day_001.tsv" + zst), swap = u.path / ".swap";
      if (c.kind == "fifo") REQUIRE(::mkfifo(swap.c_str(), 0600) == 0);
      if (c.kind == "secret") fs::create_symlink(secret / "key", swap);
      if (c.kind == "zero") fs::create_symlink("/dev/zero", swap);
      fs::rename(swap, window);
      const std::string m = read_error(d, 1);
      CHECK(m.find(window.string() + ": ") != std::string::npos);
      CHECK(m.find(c.says) != std::string::npos);
      CHECK(m.find("TOPSECRET") == std::string::npos);
      CHECK(m.find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("criteo: the IO state's file is a listed window, saved relative to path (finding 6)") {
  TempDir t;
  const fs::path a = t.path / "a", b = t.path / "b";
  fs::create_directories(a);
  write_windows(a, {50, 50}, false);
  write(t.path / "outside.tsv", line(7, 0) + line(7, 1));
  const Options o = {{"path", a.string()}, {"batch_size", 8}};
  keel::testing::NamedTensors state;
  std::vector<Row> all, first;
  {
    Dataset d = make(o);
    d.call(d->start_epoch, int64_t{0});
    REQUIRE(next_rows(d, &first, nullptr, true));
    state = keel::testing::save_state(d);
    all = first;
    read_rest(d, 0, &all);
  }
  CHECK(saved_file(state) == "day_000.tsv");
  auto resumed = [&](const Options& opts, const keel::testing::NamedTensors& s) {
    Dataset d = make(opts);
    keel::testing::load_state(d, s);
    d.call(d->seek, int64_t{0}, int64_t{1});
    std::vector<Row> rows = first;
    read_rest(d, 0, &rows);
    return rows;
  };
  CHECK(resumed(o, state) == all);
  // A checkpoint of the keel before (the absolute path saved): read when it names a listed
  // window by its path under `path`.
  CHECK(resumed(o, with_file(state, (a / "day_000.tsv").string())) == all);
  // Anything else is refused before a byte is read.
  const std::string bad[] = {"/dev/zero", (t.path / "outside.tsv").string(), "../outside.tsv",
                             "day_000.tsv/", "day_009.tsv", "./day_000.tsv"};
  for (const std::string& file : bad) {
    CAPTURE(file);
    std::string m;
    try {
      resumed(o, with_file(state, file));
    } catch (const std::runtime_error& e) {
      m = e.what();
    }
    CHECK(m.find("is not one of [data.train] path's windows") != std::string::npos);
    CHECK(m.find(file[0] == '/' ? "an earlier keel saved the window's absolute path"
                                : "the window is found by its name relative to path") !=
          std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
  // The data directory moved: the window is found under the new path.
  fs::rename(a, b);
  CHECK(resumed({{"path", b.string()}, {"batch_size", 8}}, state) == all);
  // A glob `path`: the window relative to the glob's leading directories without a wildcard.
  const fs::path sub = b / "sub";
  fs::create_directories(sub);
  write_windows(sub, {50}, false);
  const Options glob = {{"path", (b / "s*" / "day_*.tsv").string()}, {"batch_size", 8}};
  Dataset g = make(glob);
  g.call(g->start_epoch, int64_t{0});
  std::vector<Row> none;
  REQUIRE(next_rows(g, &none, nullptr, true));
  const keel::testing::NamedTensors globbed = keel::testing::save_state(g);
  CHECK(saved_file(globbed) == "sub/day_000.tsv");
  Dataset h = make(glob);
  keel::testing::load_state(h, globbed);
  CHECK_NOTHROW(h.call(h->seek, int64_t{0}, int64_t{1}));
}

TEST_CASE("criteo: messages quote data bytes printably; INT64_MIN; a large zstd window (12)") {
  TempDir t;
  const std::string good = line(0, 0);
  const std::string tail = good.substr(1);  // the good line without its label
  struct Case {
    std::string bad, message;
  };
  const std::vector<Case> cases = {
      {"\x1b[2J" + tail, "label: '\\x1b[2J' is not 0 or 1"},
      {std::string("1\0x", 3) + tail, "label: '1\\x00x' is not 0 or 1"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.message);
    const fs::path file = t.path / "w.tsv";
    write(file, good + c.bad);
    Dataset d = make({{"path", file.string()}});
    const std::string m = read_error(d);
    CHECK(m.find(file.string() + ":2: " + c.message) != std::string::npos);
    CHECK(m.find("hint: fix or remove the line") != std::string::npos);
  }
  // A window's file name with control bytes.
  const fs::path dir = t.path / "dir";
  fs::create_directories(dir);
  write(dir / "day\x1b]0;x\a.tsv", "2" + tail);
  {
    Dataset d = make({{"path", dir.string()}});
    const std::string m = read_error(d);
    CHECK(m.find("day\\x1b]0;x\\x07.tsv:1: label") != std::string::npos);
    for (const char ch : m) CHECK(static_cast<unsigned char>(ch) >= 0x20);
  }
  // INT64_MIN is an integer; one below it is not.
  {
    std::string f = good.substr(0, good.find('\t', 2));  // label and I1
    const fs::path file = t.path / "min.tsv";
    write(file, "1\t-9223372036854775808" + good.substr(f.size()));
    Dataset d = make({{"path", file.string()}});
    CHECK(read_error(d).empty());
    write(file, "1\t-9223372036854775809" + good.substr(f.size()));
    Dataset e = make({{"path", file.string()}});
    CHECK(read_error(e).find("I1: '-9223372036854775809' is not an integer") != std::string::npos);
  }
  // A .zst whose frame asks for a window of 2^27 bytes is read; 2^28 is over keel's limit.
  std::string text;
  for (int i = 0; i < 100; ++i) text += line(0, i);
  write(t.path / "w27.tsv.zst", zstd_window(text, 27));
  Dataset ok = make({{"path", (t.path / "w27.tsv.zst").string()}});
  CHECK(read_error(ok).empty());
  write(t.path / "w28.tsv.zst", zstd_window(text, 28));
  Dataset big = make({{"path", (t.path / "w28.tsv.zst").string()}});
  const std::string m = read_error(big);
  CHECK(m.find("w28.tsv.zst: needs a zstd window of 256 MiB, over keel's limit of 128 MiB") !=
        std::string::npos);
  CHECK(m.find("corrupt") == std::string::npos);
}
