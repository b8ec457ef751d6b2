// The loader against real .so fixtures: good plugins load, broken ones are refused with the
// file and the reason, and nothing of a refused file is registered.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "components.hpp"
#include "host.hpp"
#include "loader/digest.hpp"
#include "loader/lock.hpp"
#include "loader/registry.hpp"
#include "support.hpp"

namespace unit_loader {  // keel_units is one unity build: each file's names stay its own

namespace fs = std::filesystem;

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

TEST_CASE("a library without the entry symbol is skipped as not a plugin") {
  keel::Registry r;
  CHECK_FALSE(r.load(kFixtures + "/no_entry.so"));
  CHECK(contains(refusal_for(r, "no_entry.so"),
                 "not a keel plugin: its dynamic symbol table does not define keel_plugin_entry"));
  CHECK_FALSE(r.refusals().at(0).is_plugin);
}

TEST_CASE("a fingerprint mismatch is refused, naming both LibTorch versions") {
  keel::Registry r;
  CHECK_FALSE(r.load(kFixtures + "/fingerprint_mismatch.so"));
  const std::string why = refusal_for(r, "fingerprint_mismatch.so");
  CHECK(contains(why, "LibTorch 0.0.0-mismatch"));
  CHECK(contains(why, std::string("keel uses LibTorch ") + keel::kernel_torch_version()));
  CHECK(r.components().empty());
}

TEST_CASE("a file that is not a library is skipped as not a plugin") {
  keel::Registry r;
  CHECK_FALSE(r.load(kFixtures + "/not_a_library.so"));
  CHECK(refusal_for(r, "not_a_library.so") == "not a keel plugin: not an ELF file");
}

TEST_CASE("two plugins with the same component: both load, the bare name is ambiguous") {
  keel::Registry r;
  r.discover(keel::plugin_search_path({}));
  REQUIRE(r.load(kFixtures + "/duplicate_component.so"));
  const auto both = r.matches(KEEL_KIND_LR_SCHEDULER, "constant");
  REQUIRE(both.size() == 2);
  CHECK(r.find(KEEL_KIND_LR_SCHEDULER, "constant") == nullptr);
  // "plugin:component" picks one.
  const keel::Component* mine = r.find(KEEL_KIND_LR_SCHEDULER, "test-duplicate-component:constant");
  REQUIRE(mine != nullptr);
  CHECK(mine->plugin->path == kFixtures + "/duplicate_component.so");
  const keel::Component* first = r.find(KEEL_KIND_LR_SCHEDULER, "keel-schedulers:constant");
  REQUIRE(first != nullptr);
  CHECK(contains(first->plugin->path, "libkeel-schedulers.so"));
  CHECK(r.matches(KEEL_KIND_LR_SCHEDULER, "nobody:constant").empty());
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
  CHECK(refused == std::vector<std::string>{"constructor_lib.so", "fingerprint_mismatch.so",
                                            "newer_minor.so", "no_entry.so", "not_a_library.so",
                                            "unterminated_name.so", "wrong_abi.so"});
  CHECK(r.find(KEEL_KIND_HOOK, "c_event_log") != nullptr);
  CHECK(r.find(KEEL_KIND_HOOK, "throws_on_create") != nullptr);
}

// ---------------------------------------------------------------------------------------------
// Before dlopen: permissions, the ELF check, the lock. Each test works on copies in a fresh
// directory (mode 0700).

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/keel-loader-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
  std::string copy(const std::string& fixture, const std::string& as = "") const {
    const fs::path to = path / (as.empty() ? fixture : as);
    fs::copy_file(kFixtures + "/" + fixture, to, fs::copy_options::overwrite_existing);
    fs::permissions(to, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                            fs::perms::others_read);
    return to.string();
  }
};

// Sets KEEL_TEST_CONSTRUCTOR_MARK to a file in `dir` for the test's duration.
struct Mark {
  fs::path file;
  explicit Mark(const fs::path& dir) : file(dir / "mark") {
    setenv("KEEL_TEST_CONSTRUCTOR_MARK", file.c_str(), 1);
  }
  ~Mark() { unsetenv("KEEL_TEST_CONSTRUCTOR_MARK"); }
  std::string text() const { return fs::exists(file) ? keel_test::read(file) : ""; }
};

std::string refusal_at(const keel::Registry& r, const std::string& path) {
  for (const auto& x : r.refusals())
    if (x.path == path) return x.reason;
  return "<not refused>";
}

}  // namespace

TEST_CASE("a plain library in a plugin directory is never opened: its constructor does not run") {
  TempDir dir;
  Mark mark(dir.path);
  const std::string lib = dir.copy("constructor_lib.so");
  const std::string plugin = dir.copy("constructor_plugin.so");
  keel::Registry r;
  r.discover({dir.path.string()});
  CHECK(refusal_at(r, lib) ==
        "not a keel plugin: its dynamic symbol table does not define keel_plugin_entry");
  // The plugin beside it loads, and its constructor's mark shows that the mark works.
  CHECK(r.find(KEEL_KIND_HOOK, "marked") != nullptr);
  CHECK(mark.text() == "constructor_plugin\n");
}

TEST_CASE("plugin files and directories other users can write to are refused") {
  TempDir dir;
  const std::string file = dir.copy("c_hook.so");
  SUBCASE("a file writable by every user") {
    fs::permissions(file, fs::perms::others_write, fs::perm_options::add);
    keel::Registry r;
    CHECK_FALSE(r.load(file));
    CHECK(contains(refusal_at(r, file), "not loaded: the file is writable by every user (mode "
                                        "0646); hint: chmod go-w it"));
  }
  SUBCASE("a file writable by its group") {
    fs::permissions(file, fs::perms::group_write, fs::perm_options::add);
    keel::Registry r;
    CHECK_FALSE(r.load(file));
    CHECK(contains(refusal_at(r, file), "the file is writable by its group (mode 0664)"));
  }
  SUBCASE("a directory writable by every user") {
    fs::permissions(dir.path, fs::perms::all);
    keel::Registry r;
    CHECK_FALSE(r.load(file));
    CHECK(contains(refusal_at(r, file), "its directory " + dir.path.string() +
                                            " is writable by every user (mode 0777)"));
    SUBCASE("unless KEEL_ALLOW_WRITABLE_PLUGINS=1") {
      setenv("KEEL_ALLOW_WRITABLE_PLUGINS", "1", 1);
      keel::Registry allowed;
      unsetenv("KEEL_ALLOW_WRITABLE_PLUGINS");
      CHECK(allowed.load(file));
    }
  }
}

TEST_CASE("with a lock, only files of the locked hashes load; a changed file's code never runs") {
  TempDir dir;
  Mark mark(dir.path);
  const std::string hook = dir.copy("c_hook.so");
  const std::string marked = dir.copy("constructor_plugin.so");
  keel::Lock lock;
  lock.file = (dir.path / "m.toml.lock").string();
  lock.entries.push_back({"test-c-hook", "0", hook, keel::sha256_file(hook), {}});
  // The lock names marked's path with another file's hash: marked "changed" since locking.
  lock.entries.push_back({"constructor-plugin", "1.0.0", marked, keel::sha256_file(hook), {}});
  keel::Registry r;
  r.use_lock(lock);
  r.discover({dir.path.string()});
  CHECK(r.find(KEEL_KIND_HOOK, "c_event_log") != nullptr);
  CHECK(r.find(KEEL_KIND_HOOK, "marked") == nullptr);
  const std::string why = refusal_at(r, marked);
  CHECK(contains(why, "not loaded: its sha256 " + keel::sha256_file(marked).substr(0, 16) +
                          "... differs from " + keel::sha256_file(hook).substr(0, 16) + "... that " +
                          lock.file + " holds for plugin constructor-plugin 1.0.0"));
  CHECK(mark.text().empty());  // refused before dlopen: its constructor never ran
  SUBCASE("a file the lock does not list is not loaded either") {
    const std::string other = dir.copy("duplicate_component.so");
    keel::Registry r2;
    r2.use_lock(lock);
    r2.discover({dir.path.string()});
    CHECK(contains(refusal_at(r2, other), "not loaded: " + lock.file + " does not list this file"));
  }
}

TEST_CASE("strings from a plugin are read within their bounds") {
  SUBCASE("an unterminated plugin name refuses the plugin") {
    keel::Registry r;
    CHECK_FALSE(r.load(kFixtures + "/unterminated_name.so"));
    CHECK(refusal_for(r, "unterminated_name.so") ==
          "descriptor's plugin name does not end within " +
              std::to_string(KEEL_NAME_CAPACITY - 1) + " bytes");
  }
  SUBCASE("an unterminated description is cut; an unterminated error message too") {
    keel::Registry r;
    REQUIRE(r.load(kFixtures + "/unterminated.so"));
    CHECK(r.plugins().at(0)->description == std::string(KEEL_STRING_CAPACITY - 1, 'd'));
    const keel::Component* c = r.find(KEEL_KIND_HOOK, "unterminated");
    REQUIRE(c != nullptr);
    keel_options none;
    keel_create_context ctx{};
    ctx.host = keel::host();
    ctx.options = &none;
    ctx.section = "hooks[0]";
    auto hook = keel::create_instance<keel_hook>(*c, ctx);
    keel_trainer_state state{};
    state.struct_size = sizeof state;
    keel_event ev{};
    ev.struct_size = sizeof ev;
    ev.kind = KEEL_EVENT_TRAIN_START;
    ev.state = &state;
    const std::string err =
        keel_test::error_of([&] { hook.call("on_event", hook->on_event, &ev); });
    CHECK(err == "[hooks[0]] hook 'unterminated' (plugin unterminated): on_event failed: " +
                     std::string(KEEL_ERROR_CAPACITY - 1, 'e'));
  }
}

TEST_CASE("a plugin built for a newer ABI minor is refused, naming the file and both versions") {
  keel::Registry r;
  CHECK_FALSE(r.load(kFixtures + "/newer_minor.so"));
  REQUIRE(r.refusals().size() == 1);
  CHECK(r.refusals()[0].is_plugin);
  const std::string major = std::to_string(KEEL_ABI_MAJOR);
  const std::string why = "built for plugin ABI " + major + "." +
                          std::to_string(KEEL_ABI_MINOR + 1) + ", newer than this keel's " +
                          major + "." + std::to_string(KEEL_ABI_MINOR);
  CHECK(contains(refusal_for(r, "newer_minor.so"), why + "; hint: "));
  // What a run that names one of its components reports: the file, then the reason.
  CHECK(contains(r.refusal_summary(), kFixtures + "/newer_minor.so (" + why));
  CHECK(r.plugins().empty());
  CHECK(r.find(KEEL_KIND_HOOK, "newer_minor") == nullptr);
}

}  // namespace unit_loader
