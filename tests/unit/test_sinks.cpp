// Metric sinks in real runs: csv files hold what metrics.jsonl holds, and the console's
// progress bar appears on stdout only when asked for (or on a terminal). Sinks created by hand
// as rank r of several: only rank 0 writes unless every_rank, and other ranks' files and lines
// carry their rank.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>

#include "../plugins/rank_path.hpp"
#include "../plugins/sinks/progress.hpp"
#include "components.hpp"
#include "host.hpp"
#include "log.hpp"
#include "manifest.hpp"
#include "options.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "run/trainer.hpp"

namespace unit_sinks {  // keel_units is one unity build: each file's names stay its own

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

// Sink `type` with `options` created as rank `rank` of `world_size` writing into `run_dir`, as
// the kernel creates it, sent one record of `split` (step 3 of 10; by default a train record
// with loss 0.5) and TRAIN_END.
void record_on_rank(const fs::path& run_dir, const std::string& type, const std::string& options,
                    int rank, int world_size, const char* split = "train",
                    std::vector<keel_metric> record = {{"step", 3}, {"loss", 0.5}}) {
  const keel::Component* c = keel_test::default_registry().find(KEEL_KIND_HOOK, type);
  REQUIRE(c != nullptr);
  const keel_options values = keel::validate_options(toml::parse(options), "hooks[0]",
                                                     "keel plugins show " + type, c->options);
  keel_create_context ctx{};
  ctx.host = keel::host();
  ctx.options = &values;
  ctx.section = "hooks[0]";
  ctx.run_dir = run_dir.c_str();
  ctx.rank = rank;
  ctx.world_size = world_size;
  const auto hook = keel::create_instance<keel_hook>(*c, ctx);
  keel_trainer_state state{};
  state.struct_size = sizeof state;
  state.step = 3;
  state.max_steps = 10;
  keel_event ev{};
  ev.struct_size = sizeof ev;
  ev.state = &state;
  for (const keel_event_kind kind :
       {KEEL_EVENT_TRAIN_START, KEEL_EVENT_METRICS, KEEL_EVENT_TRAIN_END}) {
    ev.kind = kind;
    ev.split = kind == KEEL_EVENT_METRICS ? split : nullptr;
    ev.metrics = kind == KEEL_EVENT_METRICS ? record.data() : nullptr;
    ev.metric_count = kind == KEEL_EVENT_METRICS ? record.size() : 0;
    hook.call("on_event", hook->on_event, &ev);
  }
}

// The names of the files in `dir`, sorted.
std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("rank_path: rank r > 0 gets .rank<r> before the file name's extension") {
  using keel_plugins::rank_path;
  CHECK(rank_path("/run/metrics.jsonl", 0) == "/run/metrics.jsonl");
  CHECK(rank_path("/run/metrics.jsonl", 1) == "/run/metrics.rank1.jsonl");
  CHECK(rank_path("/run/metrics_{split}.csv", 12) == "/run/metrics_{split}.rank12.csv");
  CHECK(rank_path("/run/a.tar.gz", 2) == "/run/a.tar.rank2.gz");
  CHECK(rank_path("/run.d/trace", 1) == "/run.d/trace.rank1");
  CHECK(rank_path("/run/.log", 1) == "/run/.log.rank1");
  CHECK(rank_path("trace.json", 3) == "trace.rank3.json");
  CHECK(rank_path("", 1) == "");  // no file name to mark: the sink's own error for ""
}

TEST_CASE("jsonl and csv: rank 0 writes its usual file; rank r > 0 only with every_rank, to "
          "<name>.rank<r>.<ext>") {
  const std::map<std::string, std::pair<std::string, std::string>> sinks = {
      {"jsonl", {"metrics.jsonl", "metrics.rank2.jsonl"}},
      {"csv", {"metrics_train.csv", "metrics_train.rank2.csv"}}};
  for (const auto& case_ : sinks) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& type = case_.first;
    const auto& names = case_.second;
    CAPTURE(type);
    TempDir rank0, quiet, every;
    record_on_rank(rank0.path, type, "every_rank = true", 0, 3);
    record_on_rank(quiet.path, type, "", 2, 3);
    record_on_rank(every.path, type, "every_rank = true", 2, 3);
    CHECK(files_in(rank0.path) == std::vector<std::string>{names.first});
    CHECK(files_in(quiet.path).empty());
    REQUIRE(files_in(every.path) == std::vector<std::string>{names.second});
    const std::string text = keel_test::read(rank0.path / names.first);
    CHECK(text.find("0.5") != std::string::npos);
    CHECK(keel_test::read(every.path / names.second) == text);
  }
  // A path of the sink's own: the rank goes before its extension too.
  TempDir d;
  record_on_rank(d.path, "csv", "every_rank = true\npath = \"m-{split}.txt\"", 1, 2);
  CHECK(files_in(d.path) == std::vector<std::string>{"m-train.rank1.txt"});
}

// The "[rank r] " tag of a process of several is the kernel's console pattern (set_log_rank),
// not the sink's: the sink prints the same line on every rank.
TEST_CASE("console: rank r > 0 prints only with every_rank") {
  keel::init_logging(spdlog::level::info);  // the kernel's console: "[%T] [origin] message"
  TempDir d;
  const auto printed = [&](int rank, const std::string& options) {
    return captured_stdout(d.path / "stdout.txt", [&] {
      record_on_rank(d.path, "console", "progress = \"never\"\n" + options, rank, 2);
    });
  };
  // The record's line, without an origin prefix (not the hook's position, "[hooks[0]]"), nor an
  // ETA: TRAIN_START came at step 3 too, so no pace is known.
  const std::regex line(R"(\[[0-9:]{8}\] step 3/10 loss 0\.5\n)");
  const std::string rank0 = printed(0, "every_rank = true");
  CHECK(std::regex_search(rank0, line));
  CHECK(rank0.find("[hooks[0]]") == std::string::npos);
  CHECK(rank0.find("[rank") == std::string::npos);
  CHECK(printed(1, "") == "");
  CHECK(std::regex_search(printed(1, "every_rank = true"), line));
}

// Bytes from data in a log line (a file name, a field, a plugin's text) reach neither the
// console nor run.log as control bytes: an escape sequence is shown as \x1b, a line break as a
// space.
TEST_CASE("log lines: control bytes from data are shown as \\xNN on the console and in run.log") {
  keel::init_logging(spdlog::level::info);
  TempDir d;
  const std::string log_path = (d.path / "run.log").string();
  keel::attach_run_log(log_path);
  const std::string out = captured_stdout(d.path / "stdout.txt", [&] {
    keel::host()->log(KEEL_LOG_WARN, "criteo", "window 'a\x1b[2Jb\nc\x07' skipped");
  });
  keel::detach_run_log();
  const std::string expected = "[criteo] window 'a\\x1b[2Jb c\\x07' skipped";
  CHECK(out.find(expected) != std::string::npos);
  CHECK(out.find('\x1b') == std::string::npos);
  std::ifstream f(log_path);
  const std::string logged((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(logged.find(expected) != std::string::npos);
  CHECK(logged.find('\x1b') == std::string::npos);
}

TEST_CASE("console: an eval line leaves out a task metric that repeats the loss (bce's logloss)") {
  keel::init_logging(spdlog::level::info);
  TempDir d;
  const auto eval_line = [&](double logloss) {
    return captured_stdout(d.path / "stdout.txt", [&] {
      record_on_rank(d.path, "console", "progress = \"never\"\n", 0, 1, "test",
                     {{"step", 3}, {"epoch", 0}, {"loss", 0.65761}, {"auc", 0.753},
                      {"logloss", logloss}, {"samples", 100}});
    });
  };
  CHECK(std::regex_search(eval_line(0.657612),
                          std::regex(R"(\] eval test step 3: loss 0\.6576 auc 0\.753\n)")));
  // Another value (its own reduction, say) is the metric's own: shown.
  CHECK(std::regex_search(
      eval_line(0.7), std::regex(R"(\] eval test step 3: loss 0\.6576 auc 0\.753 logloss 0\.7\n)")));
}

TEST_CASE("console: a concise line per record on the console, the whole record in run.log") {
  keel::init_logging(spdlog::level::info);
  TempDir d;
  const std::string out = captured_stdout(d.path / "stdout.txt", [&] {
    train(d, "[[hooks]]\ntype = \"console\"\nprogress = \"never\"\n");
  });
  // small_run: 16 steps, a train record every 4, an evaluation after each epoch (steps 8, 16).
  const std::regex train_line(
      R"(^\[[0-9:]{8}\] step (4|8|12|16)/16 epoch [01] loss \S+ lr \S+ \S+ samples/s( ETA \d+:\d\d)?$)");
  const std::regex eval_line(R"(^\[[0-9:]{8}\] eval test step (8|16): loss \S+ accuracy \S+$)");
  int trains = 0, evals = 0;
  for (const std::string& l : split_on(out, '\n')) {
    trains += std::regex_match(l, train_line);
    evals += std::regex_match(l, eval_line);
  }
  CHECK(trains == 4);
  CHECK(evals == 2);
  CHECK(out.find("ETA") != std::string::npos);     // steps 4, 8, 12 have time left
  CHECK(out.find("loss_last") == std::string::npos);  // the rest of the record: run.log only
  CHECK(out.find("[hooks[") == std::string::npos);
  const std::string log = keel_test::read(d.path / "run" / "run.log");
  for (const std::string key :
       {" epoch 0 samples 128 tokens 128 loss ", " loss_last ", " lr ", " samples_per_s ",
        " tokens_per_s ", " step_time_ms ", " data_time_ms ", " eval_time_s "}) {
    CAPTURE(key);
    const size_t at = log.find("] [debug] record train step 4:");
    REQUIRE(at != std::string::npos);
    CHECK(log.substr(at, log.find('\n', at) - at).find(key) != std::string::npos);
  }
  CHECK(std::regex_search(
      log, std::regex(R"(\] \[debug\] record test step 8: epoch 0 loss \S+ accuracy \S+ samples 200\n)")));
  CHECK(std::regex_search(log, std::regex(R"(\] \[info\] eval test step 8: loss \S+ accuracy \S+\n)")));
}

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
  sinks::Progress p;
  p.step = 1234, p.max_steps = 4690, p.elapsed_s = 62, p.steps_per_s = 850, p.loss = 0.312;
  CHECK(sinks::progress_text(p) ==
        "[#####...............] 1234/4690 26% | 1:02 elapsed | 850 it/s | ETA 0:04 | loss 0.3120");
  p.note = "evaluating";
  CHECK(sinks::progress_text(p).rfind(" | loss 0.3120 | evaluating") != std::string::npos);
  sinks::Progress start;  // before the first step
  start.max_steps = 10;
  CHECK(sinks::progress_text(start) == "[....................] 0/10 0% | 0:00 elapsed | ? it/s");
  // A stream without max_steps: no bar; with planned epochs, an ETA at the pace of the epochs
  // that ended: 2 of 7 done in 60 s, 10 s into the third: 5 x 30 s - 10 s = 2:20.
  sinks::Progress stream;
  stream.step = 7, stream.steps_per_s = 2.5, stream.loss = 1.0, stream.elapsed_s = 3;
  CHECK(sinks::progress_text(stream) ==
        "7 steps | 0 epochs done | 0:03 elapsed | 2.5 it/s | loss 1.0000");
  stream.epoch = 2, stream.epochs = 7, stream.epochs_done = 2, stream.epochs_done_s = 60;
  stream.elapsed_s = 70;
  CHECK(sinks::progress_text(stream) ==
        "7 steps | 2/7 epochs done | 1:10 elapsed | 2.5 it/s | ETA 2:20 | loss 1.0000");
  CHECK(sinks::rate_text(0.25) == "4.0 s/it");
  CHECK(sinks::clock_text(59.6) == "1:00");
  CHECK(sinks::clock_text(3723) == "1:02:03");
}

}  // namespace unit_sinks
