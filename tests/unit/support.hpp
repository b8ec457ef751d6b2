// Shared helpers for the kernel tests: temporary directories, manifest files, error capture.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include <vector>

#include "components.hpp"
#include "error.hpp"
#include "host.hpp"
#include "loader/registry.hpp"
#include "options.hpp"
#include "manifest.hpp"
#include "run/trainer.hpp"
#include "run_config.hpp"

namespace keel_test {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "keel-test-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    const fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
};

inline std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The keel::Error message `f` throws, or "<no error>".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const keel::Error& e) {
    return e.what();
  }
  return "<no error>";
}

// A small but complete run on the first samples of Fashion-MNIST (fast: a second or two).
inline std::string small_run(const fs::path& run_dir) {
  return "[run]\nname = \"t\"\noutput_dir = \"" + run_dir.string() +
         "\"\nseed = 7\n"
         "[train]\nepochs = 2\nlog_every = 4\n"
         "[model]\ntype = \"mlp\"\nhidden = [32]\n"
         "[data.train]\ntype = \"fashion_mnist\"\nsplit = \"train\"\nbatch_size = 32\nlimit = 256\n"
         "[data.test]\ntype = \"fashion_mnist\"\nsplit = \"test\"\nbatch_size = 100\nlimit = 200\n"
         "shuffle = false\n"
         "[optimizer]\ntype = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n"
         "[loss]\ntype = \"cross_entropy\"\n";
}

// The plugins keel finds by default (the build tree's plugins/), discovered once per test binary.
inline const keel::Registry& default_registry() {
  static const keel::Registry r = [] {
    keel::Registry out;
    out.discover(keel::plugin_search_path({}));
    return out;
  }();
  return r;
}

// An instance of component `desc` (a component defined in the test), created as the kernel would
// create it in `section`, without options; labelled "[section] kind 'name' (test)".
template <class Abi>
keel::Instance<Abi> instance(const keel_component_desc& desc, const std::string& section,
                             const std::string& kind) {
  keel_create_context ctx{};
  ctx.struct_size = sizeof ctx;
  ctx.host = keel::host();
  ctx.section = section.c_str();
  ctx.world_size = 1;
  void* out = nullptr;
  keel_error err{};
  REQUIRE(desc.create(&ctx, &out, &err) == KEEL_OK);
  return keel::Instance<Abi>(static_cast<Abi*>(out),
                             "[" + section + "] " + kind + " '" + desc.name + "' (test)");
}

// A first-party component `type` of kind `kind` of the built plugins with `options` (TOML), as
// the kernel creates it in `section` (seed `seed`, one rank); `values` must outlive the instance.
template <class Abi>
keel::Instance<Abi> first_party(keel_kind kind, const std::string& type,
                                const std::string& section, const std::string& options,
                                keel_options& values, uint64_t seed = 5) {
  const keel::Component* c = default_registry().find(kind, type);
  REQUIRE(c != nullptr);
  values = keel::validate_options(toml::parse(options), section, "keel plugins show " + type,
                                  c->options);
  keel_create_context ctx{};
  ctx.host = keel::host();
  ctx.options = &values;
  ctx.section = section.c_str();
  ctx.world_size = 1;
  ctx.seed = seed;
  return keel::create_instance<Abi>(*c, ctx);
}

// Trains (or resumes) the run of `manifest` with --set `sets`, in this process; its summary.
inline keel::RunSummary train(const fs::path& manifest, const std::vector<std::string>& sets = {},
                              bool resume = false) {
  keel::Registry registry;
  keel::RunConfig rc = keel::resolve(keel::load_manifest(manifest.string(), sets), registry);
  if (resume) rc.resume = keel::RunConfig::Resume::kLatest;
  keel::apply_process_settings(rc);
  keel::Trainer trainer(rc);
  return trainer.train();
}

// The records of a JSON-lines file (metrics.jsonl), in file order; Json = nlohmann::ordered_json
// keeps each record's key order.
template <class Json = nlohmann::json>
std::vector<Json> jsonl(const fs::path& path) {
  std::vector<Json> out;
  std::stringstream s(read(path));
  for (std::string l; std::getline(s, l);)
    if (!l.empty()) out.push_back(Json::parse(l));
  return out;
}

}  // namespace keel_test
