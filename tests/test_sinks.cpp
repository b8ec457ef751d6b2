// Metric sinks in real runs: csv files hold what metrics.jsonl holds, and the console's
// progress bar appears on stdout only when asked for (or on a terminal).
#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <regex>

#include "../plugins/sinks/progress.hpp"
#include "manifest.hpp"
#include "registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "trainer.hpp"

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

// Trains small_run with `hooks` appended; returns the run directory.
fs::path train(const TempDir& d, const std::string& hooks) {
  const fs::path p = d.write("m.toml", keel_test::small_run(d.path / "run") + hooks);
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  keel::apply_process_settings(rc);
  keel::Trainer trainer(rc);
  trainer.train();
  return d.path / "run";
}

std::vector<std::string> split_on(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string part; std::getline(s, part, sep);) out.push_back(part);
  return out;
}

// The records of one split in metrics.jsonl, each as (key, value text) in file order.
using Record = std::vector<std::pair<std::string, std::string>>;
std::vector<Record> jsonl_records(const fs::path& file, const std::string& split) {
  static const std::regex field("\"([a-z_]+)\": ([^,}]+)");
  std::vector<Record> out;
  for (const std::string& line : split_on(keel_test::read(file), '\n')) {
    if (line.find("\"split\": \"" + split + "\"") == std::string::npos) continue;
    Record r;
    for (std::sregex_iterator m(line.begin(), line.end(), field), end; m != end; ++m)
      if ((*m)[1] != "split") r.emplace_back((*m)[1], (*m)[2]);
    out.push_back(r);
  }
  return out;
}

// What `body` writes to stdout (file descriptor 1, so the kernel's log lines too).
template <class F>
std::string captured_stdout(const fs::path& file, F&& body) {
  std::fflush(stdout);
  const int saved = dup(1);
  const int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  dup2(fd, 1);
  close(fd);
  body();
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  return keel_test::read(file);
}

std::string console_run(const std::string& progress) {
  TempDir d;
  return captured_stdout(d.path / "stdout.txt", [&] {
    train(d, "[[hooks]]\ntype = \"console\"\nprogress = \"" + progress + "\"\n");
  });
}

}  // namespace

TEST_CASE("csv: one file per split, the jsonl's values in the first record's columns") {
  TempDir d;
  const fs::path run = train(d, "[[hooks]]\ntype = \"jsonl\"\n[[hooks]]\ntype = \"csv\"\n");
  for (const std::string split : {"train", "test"}) {
    CAPTURE(split);
    const std::vector<Record> expected = jsonl_records(run / "metrics.jsonl", split);
    const std::vector<std::string> lines =
        split_on(keel_test::read(run / ("metrics_" + split + ".csv")), '\n');
    REQUIRE(!expected.empty());
    REQUIRE(lines.size() == expected.size() + 1);
    std::string header = "split";
    for (const auto& kv : expected[0]) header += "," + kv.first;
    CHECK(lines[0] == header);
    for (size_t i = 0; i < expected.size(); ++i) {
      const std::vector<std::string> cells = split_on(lines[i + 1], ',');
      REQUIRE(cells.size() == expected[i].size() + 1);
      CHECK(cells[0] == split);
      for (size_t k = 0; k < expected[i].size(); ++k) CHECK(cells[k + 1] == expected[i][k].second);
    }
  }
  // Counts are integers: the second train record is at step 8, epoch 0.
  const std::string second = split_on(keel_test::read(run / "metrics_train.csv"), '\n')[2];
  CHECK(second.rfind("train,8,0,256,256,", 0) == 0);
}

TEST_CASE("csv: a path without {split} fails at creation with a hint") {
  TempDir d;
  const std::string err = keel_test::error_of(
      [&] { train(d, "[[hooks]]\ntype = \"csv\"\npath = \"metrics.csv\"\n"); });
  CHECK(err.find("[hooks[0]] hook 'csv'") != std::string::npos);
  CHECK(err.find("has no {split}; hint: each split gets its own file") != std::string::npos);
}

TEST_CASE("console: progress bar frames only with progress = always") {
  const std::string always = console_run("always");
  CHECK(always.find("\r\033[K[") != std::string::npos);
  CHECK(always.find("] 16/16 100% | ") != std::string::npos);  // the last step is always drawn
  CHECK(always.find("step 4/16") != std::string::npos);         // log lines still printed
  for (const std::string& quiet : {console_run("never"), console_run("auto")}) {  // not a tty
    CHECK(quiet.find('\r') == std::string::npos);
    CHECK(quiet.find('\033') == std::string::npos);
    CHECK(quiet.find("step 4/16") != std::string::npos);
  }
}

TEST_CASE("console: the progress bar's text") {
  CHECK(sinks::progress_text(1234, 4690, 850, 0.312) ==
        "[#####...............] 1234/4690 26% | 850 it/s | ETA 0:04 | loss 0.3120");
  CHECK(sinks::progress_text(0, 10, 0, NAN) == "[....................] 0/10 0% | ? it/s");
  CHECK(sinks::progress_text(7, 0, 2.5, 1.0) == "7 steps | 2.5 it/s | loss 1.0000");
  CHECK(sinks::rate_text(0.25) == "4.0 s/it");
  CHECK(sinks::clock_text(59.6) == "1:00");
  CHECK(sinks::clock_text(3723) == "1:02:03");
}
