#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <thread>

struct Row {
  long long calls = 0;
  double seconds = 0;
};

// The rows of a file the profiler wrote, by phase, after checking its header line.
std::map<std::string, Row> read_rows(const std::string& path) {
  std::ifstream file(path);
  REQUIRE_MESSAGE(file.is_open(), path << " was not written");
  std::string header;
  std::getline(file, header);
  CHECK(header == "phase\tcalls\tseconds");
  std::map<std::string, Row> rows;
  std::string phase;
  Row row;
  while (file >> phase >> row.calls >> row.seconds) rows[phase] = row;
  return rows;
}

TEST_CASE("@{component}: flush writes each phase's calls and seconds to `path`") {
  auto profiler = keel::testing::Plugin(keel_plugin_entry())
                      .create<keel_profiler>("@{component}", {{"path", "timings.tsv"}});
  for (int64_t step = 1; step <= 3; ++step) {
    profiler.call(profiler->begin, "forward", step);
    profiler.call(profiler->end, "forward", step);
    if (step == 3) continue;
    profiler.call(profiler->begin, "data", step);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    profiler.call(profiler->end, "data", step);
  }
  profiler.call(profiler->end, "backward", 3);  // an end without its begin is not counted
  profiler.call(profiler->flush);

  const std::map<std::string, Row> rows = read_rows(profiler.run_dir() + "/timings.tsv");
  REQUIRE(rows.size() == 2);
  CHECK(rows.at("forward").calls == 3);
  CHECK(rows.at("forward").seconds >= 0.0);
  CHECK(rows.at("data").calls == 2);
  CHECK(rows.at("data").seconds >= 0.040);  // two sleeps of 20 ms
}

TEST_CASE("@{component}: rank 1 of 2 writes PATH.rank1") {
  keel::testing::Setup setup;
  setup.rank = 1;
  setup.world_size = 2;
  auto profiler = keel::testing::Plugin(keel_plugin_entry())
                      .create<keel_profiler>("@{component}", {}, setup);
  profiler.call(profiler->begin, "forward", 1);
  profiler.call(profiler->end, "forward", 1);
  profiler.call(profiler->flush);
  CHECK(read_rows(profiler.run_dir() + "/phases.tsv.rank1").at("forward").calls == 1);
  CHECK_FALSE(std::ifstream(profiler.run_dir() + "/phases.tsv"));
}
