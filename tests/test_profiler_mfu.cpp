// The chrome_trace profiler records each phase of the steps in its range as a Chrome trace
// (each rank its own file), and the peak_flops MFU plugin turns the model's FLOPs per sample
// into a utilisation.
#include <regex>

#include "components.hpp"
#include "host.hpp"
#include "manifest.hpp"
#include "options.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "trainer.hpp"

using keel_test::TempDir;

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("chrome_trace records the phases of steps start_step..end_step") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[profiler]\ntype = \"chrome_trace\"\nstart_step = 2\n"
                                       "end_step = 5\n");
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  keel::apply_process_settings(rc);
  keel::Trainer(rc).train();
  const std::string trace = keel_test::read(d.path / "run/trace.json");
  REQUIRE(trace.rfind("{\"traceEvents\":[", 0) == 0);
  CHECK(trace.find("\"displayTimeUnit\":\"ms\"}") != std::string::npos);
  // Steps 2..5 (as numbered when the phase starts: the step count before the update).
  for (const char* phase : {"data", "forward", "backward", "optimizer"})
    CHECK_MESSAGE(count(trace, std::string("{\"name\":\"") + phase + "\"") == 4, phase);
  CHECK(count(trace, "\"step\":1}") == 0);
  CHECK(count(trace, "\"step\":6}") == 0);
  // Durations are non-negative numbers.
  CHECK(std::regex_search(trace, std::regex("\"dur\":[0-9]+\\.[0-9]+")));
  CHECK_FALSE(std::regex_search(trace, std::regex("\"dur\":-")));
}

TEST_CASE("chrome_trace: rank 0 writes trace.json, rank r > 0 trace.rank<r>.json") {
  const keel::Component* c = keel_test::default_registry().find(KEEL_KIND_PROFILER, "chrome_trace");
  REQUIRE(c != nullptr);
  const keel_options options = keel::validate_options(toml::table{}, "profiler",
                                                      "keel plugins show chrome_trace", c->options);
  for (const int rank : {0, 1, 3}) {
    CAPTURE(rank);
    TempDir d;
    keel_create_context ctx{};
    ctx.host = keel::host();
    ctx.options = &options;
    ctx.section = "profiler";
    ctx.run_dir = d.path.c_str();
    ctx.rank = rank;
    ctx.world_size = 4;
    const auto profiler = keel::create_instance<keel_profiler>(*c, ctx);
    profiler->begin(profiler.self(), "forward", 0);
    profiler->end(profiler.self(), "forward", 0);
    profiler.call("flush", profiler->flush);
    const std::string name =
        rank == 0 ? "trace.json" : "trace.rank" + std::to_string(rank) + ".json";
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(d.path))
      files.push_back(e.path().filename());
    CHECK(files == std::vector<std::string>{name});
    CHECK(count(keel_test::read(d.path / name), "{\"name\":\"forward\"") == 1);
  }
}

TEST_CASE("peak_flops reports MFU from the model's FLOPs per sample") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[mfu]\ntype = \"peak_flops\"\npeak_tflops = 0.001\n");
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  keel::apply_process_settings(rc);
  keel::Trainer(rc).train();
  std::stringstream s(keel_test::read(d.path / "run/metrics.jsonl"));
  int records = 0;
  for (std::string line; std::getline(s, line);) {
    if (line.find("\"split\": \"train\"") == std::string::npos) continue;
    std::smatch m, sps;
    REQUIRE(std::regex_search(line, m, std::regex("\"mfu\": ([-0-9.eE+]+)")));
    REQUIRE(std::regex_search(line, sps, std::regex("\"samples_per_s\": ([-0-9.eE+]+)")));
    // mlp 784 -> 32 -> 10: forward 2*(784*32 + 32*10) FLOPs, training 3x that.
    const double flops = 3.0 * 2.0 * (784 * 32 + 32 * 10);
    CHECK(std::stod(m[1]) == doctest::Approx(flops * std::stod(sps[1]) / 1e9).epsilon(1e-9));
    ++records;
  }
  CHECK(records == 4);
}
