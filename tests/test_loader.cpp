// The loader against real .so fixtures: good plugins load, broken ones are refused with the
// file and the reason, and nothing of a refused file is registered.
#include <algorithm>

#include "components.hpp"
#include "host.hpp"
#include "loader/registry.hpp"
#include "support.hpp"

namespace {

const std::string kFixtures = KEEL_FIXTURE_DIR;

std::string refusal_for(const keel::Registry& r, const std::string& file) {
  for (const auto& x : r.refusals())
    if (x.path == kFixtures + "/" + file) return x.reason;
  return "<not refused>";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("first-party plugins load: one component of every kind") {
  keel::Registry r;
  r.discover(keel::plugin_search_path({}));
  CHECK(r.refusals().empty());
  for (keel_kind k : {KEEL_KIND_MODEL, KEEL_KIND_DATASET, KEEL_KIND_OPTIMIZER,
                      KEEL_KIND_LR_SCHEDULER, KEEL_KIND_LOSS, KEEL_KIND_GRAD_CLIPPER, KEEL_KIND_MFU,
                      KEEL_KIND_PROFILER, KEEL_KIND_CHECKPOINT, KEEL_KIND_HOOK}) {
    CAPTURE(keel::kind_name(k));
    CHECK(!r.of_kind(k).empty());
  }
  REQUIRE(r.find(KEEL_KIND_OPTIMIZER, "adamw") != nullptr);
  CHECK(r.find(KEEL_KIND_OPTIMIZER, "adamw")->plugin->descriptor->abi_major == KEEL_ABI_MAJOR);
}

TEST_CASE("a plugin built for another ABI major is refused, naming both versions") {
  keel::Registry r;
  CHECK_FALSE(r.load(kFixtures + "/wrong_abi.so"));
  CHECK(contains(refusal_for(r, "wrong_abi.so"),
                 "built for plugin ABI " + std::to_string(KEEL_ABI_MAJOR + 1) + ".0, this keel "
                 "speaks " + std::to_string(KEEL_ABI_MAJOR) + "." + std::to_string(KEEL_ABI_MINOR)));
  CHECK(r.plugins().empty());
}

TEST_CASE("a library without the entry symbol is refused") {
  keel::Registry r;
  CHECK_FALSE(r.load(kFixtures + "/no_entry.so"));
  CHECK(contains(refusal_for(r, "no_entry.so"), "no entry symbol 'keel_plugin_entry'"));
}

TEST_CASE("a fingerprint mismatch is refused, naming both LibTorch versions") {
  keel::Registry r;
  CHECK_FALSE(r.load(kFixtures + "/fingerprint_mismatch.so"));
  const std::string why = refusal_for(r, "fingerprint_mismatch.so");
  CHECK(contains(why, "LibTorch 0.0.0-mismatch"));
  CHECK(contains(why, std::string("keel uses LibTorch ") + keel::kernel_torch_version()));
  CHECK(r.components().empty());
}

TEST_CASE("a file that is not a library is refused with the loader's reason") {
  keel::Registry r;
  CHECK_FALSE(r.load(kFixtures + "/not_a_library.so"));
  CHECK(contains(refusal_for(r, "not_a_library.so"), "not a loadable library"));
}

TEST_CASE("a duplicate component name is refused, naming the file that has it") {
  keel::Registry r;
  r.discover(keel::plugin_search_path({}));
  CHECK_FALSE(r.load(kFixtures + "/duplicate_component.so"));
  const std::string why = refusal_for(r, "duplicate_component.so");
  CHECK(contains(why, "lr_scheduler 'constant' is already provided by"));
  CHECK(contains(why, "libkeel-schedulers.so"));
}

TEST_CASE("a factory that throws fails creation with the plugin's name and message") {
  keel::Registry r;
  REQUIRE(r.load(kFixtures + "/throwing_factory.so"));
  const keel::Component* c = r.find(KEEL_KIND_HOOK, "throws_on_create");
  REQUIRE(c != nullptr);
  keel_options none;
  keel_create_context ctx{};
  ctx.host = keel::host();
  ctx.options = &none;
  ctx.section = "hooks[0]";
  const std::string err = keel_test::error_of([&] { keel::create_instance<keel_hook>(*c, ctx); });
  CHECK(err == "[hooks[0]] hook 'throws_on_create' (plugin " +
                   std::string(c->plugin->descriptor->name) +
                   "): creation failed: deliberate failure in constructor");
}

TEST_CASE("discovery reports every refused file and keeps the good ones") {
  keel::Registry r;
  r.discover({kFixtures});
  std::vector<std::string> refused;
  for (const auto& x : r.refusals()) refused.push_back(std::filesystem::path(x.path).filename());
  std::sort(refused.begin(), refused.end());
  CHECK(refused == std::vector<std::string>{"fingerprint_mismatch.so", "no_entry.so",
                                            "not_a_library.so", "wrong_abi.so"});
  CHECK(r.find(KEEL_KIND_HOOK, "c_event_log") != nullptr);
  CHECK(r.find(KEEL_KIND_HOOK, "throws_on_create") != nullptr);
}
