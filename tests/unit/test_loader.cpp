// The loader against real .so fixtures: good plugins load, broken ones are refused with the
// file and the reason, and nothing of a refused file is registered.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "components.hpp"
#include "host.hpp"
#include "loader/digest.hpp"
#include "loader/lock.hpp"
#include "loader/registry.hpp"
#include "loader/dependencies.hpp"
#include "loader/safe_path.hpp"
#include "loader/sealed_copy.hpp"
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

// Before any case that loads dep_plugin.so (doctest runs a file's cases in order): once a
// process has loaded a copy of the helper, the dynamic loader gives that one to every plugin
// that needs it, and this file is never looked at.
TEST_CASE("a plugin's own library that others can write is refused with the plugin") {
  keel_test::TempDir dir;
  for (const char* f : {"dep_plugin.so", "libkeel_dep_helper.so"})
    fs::copy_file(kFixtures + "/" + f, dir.path / f);
  const std::string plugin = (dir.path / "dep_plugin.so").string();
  const std::string helper = (dir.path / "libkeel_dep_helper.so").string();
  fs::permissions(helper, fs::perms::others_write, fs::perm_options::add);
  // meson test puts the fixture directory (with a good copy of the helper) on LD_LIBRARY_PATH,
  // which is searched before RUNPATH.
  const char* llp = std::getenv("LD_LIBRARY_PATH");
  const std::string saved = llp ? llp : "";
  unsetenv("LD_LIBRARY_PATH");
  struct Restore {
    std::string value;
    bool set;
    ~Restore() {
      if (set) setenv("LD_LIBRARY_PATH", value.c_str(), 1);
    }
  } restore{saved, llp != nullptr};
  keel::Registry r;
  if (keel::preloaded_dependency("libkeel_dep_helper.so")) {
    MESSAGE("skipped: a copy of the helper is loaded already (cases run out of order)");
    return;
  }
  CHECK_FALSE(r.load(plugin));
  REQUIRE(r.refusals().size() == 1);
  CHECK(contains(r.refusals()[0].reason,
                 "not loaded: its library libkeel_dep_helper.so (" + helper +
                     ") is not loaded: the file is writable by every user (mode 0757)"));
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
  CHECK(refused == std::vector<std::string>{
                       "constructor_lib.so", "constructor_plugin_v2.so", "dep_escape.so",
                       "dep_helper_v2.so", "dep_missing.so", "dep_relative.so",
                       "fingerprint_mismatch.so", "libkeel_dep_helper.so", "newer_minor.so",
                       "no_entry.so", "not_a_library.so", "unterminated_name.so",
                       "wrong_abi.so"});
  CHECK(r.find(KEEL_KIND_HOOK, "dep_hook") != nullptr);  // its helper beside it, in $ORIGIN
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
  // A copy whose bytes no earlier test loaded (the directory's name appended, which the dynamic
  // loader ignores): an admitted plugin stays loaded to the end of the process, once per content
  // (registry.hpp), so only new bytes run their constructor again.
  std::string copy_fresh(const std::string& fixture) const {
    const std::string to = copy(fixture);
    std::ofstream(to, std::ios::binary | std::ios::app) << path.string();
    return to;
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
  const std::string plugin = dir.copy_fresh("constructor_plugin.so");
  keel::Registry r;
  r.discover({dir.path.string()});
  CHECK(refusal_at(r, lib) ==
        "not a keel plugin: its dynamic symbol table does not define keel_plugin_entry");
  // The plugin beside it loads, and its constructor's mark shows that the mark works.
  CHECK(r.find(KEEL_KIND_HOOK, "marked") != nullptr);
  CHECK(mark.text() == "constructor_plugin\n");
}

TEST_CASE("an admitted plugin stays loaded for the process: a later registry finds it loaded") {
  TempDir dir;
  Mark mark(dir.path);
  const std::string plugin = dir.copy_fresh("constructor_plugin.so");
  {
    keel::Registry first;
    REQUIRE(first.load(plugin));
  }
  CHECK(mark.text() == "constructor_plugin\n");
  fs::remove(mark.file);
  // The first registry is gone; the second loads the same bytes without running them again
  // (no mapping and relocation either: kernel/loader/registry.cpp, pin_library).
  keel::Registry second;
  REQUIRE(second.load(plugin));
  CHECK(second.find(KEEL_KIND_HOOK, "marked") != nullptr);
  CHECK(mark.text().empty());
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
    INFO(refusal_at(r, file));
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
  lock.entries.push_back({"test-c-hook", "0", hook, keel::sha256_file(hook), {}, {}});
  // The lock names marked's path with another file's hash: marked "changed" since locking.
  lock.entries.push_back({"constructor-plugin", "1.0.0", marked, keel::sha256_file(hook), {}, {}});
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

TEST_CASE("relocking: a changed locked file loads only when its plugin is named") {
  TempDir dir;
  Mark mark(dir.path);
  const std::string marked = dir.copy_fresh("constructor_plugin.so");
  const std::string hook = kFixtures + "/c_hook.so";
  keel::Lock lock;
  lock.file = (dir.path / "m.toml.lock").string();
  lock.manifest = (dir.path / "m.toml").string();
  // marked's path, locked with another file's hash: "changed" since locking.
  lock.entries.push_back({"constructor-plugin", "1.0.0", marked, keel::sha256_file(hook), {}, {}});
  {
    keel::Registry r;
    r.use_lock_for_relock(lock, {});
    CHECK_FALSE(r.load(marked));
    REQUIRE(r.refusals().size() == 1);
    CHECK(r.refusals()[0].changed_from_lock == "constructor-plugin");
    CHECK(contains(r.refusals()[0].reason, "keel plugins lock " + lock.manifest +
                                                " --update constructor-plugin"));
    CHECK(mark.text().empty());  // refused before its code ran
    // A file at a path the lock does not name loads (a plugin new to the search path).
    CHECK(r.load(dir.copy("c_hook.so", "other.so")));
  }
  keel::Registry named;
  named.use_lock_for_relock(lock, {"constructor-plugin"});
  CHECK(named.load(marked));
  CHECK(mark.text() == "constructor_plugin\n");
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

// ---------------------------------------------------------------------------------------------
// Every directory on a plugin's path (issue 21, hole 7), a plugin's own libraries (hole 1), the
// bytes hashed are the bytes loaded (hole 2), and second copies of a plugin.

namespace {

// Whether this process can act as the other user (uid 65534) with setpriv: it runs as root.
bool can_be_nobody() {
  return getuid() == 0 && std::system("command -v setpriv >/dev/null 2>&1") == 0;
}

// Runs `command` (sh) as uid/gid 65534; true when it exits 0.
bool as_nobody(const std::string& command) {
  const std::string quoted = "'" + command + "'";
  return std::system(("setpriv --reuid=65534 --regid=65534 --clear-groups sh -c " + quoted)
                         .c_str()) == 0;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

constexpr auto k0755 = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                       fs::perms::others_read | fs::perms::others_exec;

// The loaded objects' names (dl_iterate_phdr).
std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name ? info->dlpi_name
                                                                                : "");
        return 0;
      },
      &names);
  return names;
}

}  // namespace

TEST_CASE("every directory on a plugin's path is checked, through symbolic links too") {
  if (!can_be_nobody()) {
    MESSAGE("skipped: needs root and setpriv to act as another user");
    return;
  }
  TempDir dir;  // /tmp/keel-loader-XXXXXX: ours, under the sticky /tmp
  fs::permissions(dir.path, k0755);
  fs::create_directory(dir.path / "victim");
  const std::string victim = dir.copy("c_hook.so", "victim/c_hook.so");
  SUBCASE("our directory under the sticky /tmp is safe") {
    keel::Registry r;
    CHECK(r.load(victim));
  }
  SUBCASE("a link another user planted in a sticky world-writable search directory") {
    const fs::path shared = dir.path / "shared";
    fs::create_directory(shared);
    fs::permissions(shared, fs::perms::all | fs::perms::sticky_bit);
    REQUIRE(as_nobody("ln -s " + victim + " " + (shared / "evil.so").string()));
    keel::Registry r;
    r.discover({shared.string()});
    CHECK(r.plugins().empty());
    CHECK(contains(refusal_at(r, (shared / "evil.so").string()),
                   "not loaded: its directory " + shared.string() +
                       " is writable by every user (mode 1777): another user can add names"));
  }
  SUBCASE("a link of the other user's in a directory of ours") {
    const fs::path mine = dir.path / "mine";
    fs::create_directory(mine);
    fs::permissions(mine, fs::perms::all | fs::perms::sticky_bit);
    REQUIRE(as_nobody("ln -s " + victim + " " + (mine / "evil.so").string()));
    fs::permissions(mine, k0755);
    keel::Registry r;
    CHECK_FALSE(r.load((mine / "evil.so").string()));
    CHECK(contains(refusal_at(r, (mine / "evil.so").string()),
                   (mine / "evil.so").string() +
                       ", a symbolic link on its path, belongs to another user (uid 65534)"));
  }
  SUBCASE("a plugin directory reached through a world-writable parent") {
    const fs::path pub = dir.path / "pub";
    fs::create_directories(pub / "plugins");
    fs::permissions(pub, fs::perms::all);
    const std::string file = dir.copy("c_hook.so", "pub/plugins/c_hook.so");
    // The other user could swap pub/plugins for a directory of theirs at any time.
    CHECK(as_nobody("mv " + (pub / "plugins").string() + " " + (pub / "old").string() +
                    " && mv " + (pub / "old").string() + " " + (pub / "plugins").string()));
    keel::Registry r;
    CHECK_FALSE(r.load(file));
    CHECK(contains(refusal_at(r, file), "not loaded: " + pub.string() +
                                            ", a directory on its path, is writable by every "
                                            "user (mode 0777) without the sticky bit"));
  }
  SUBCASE("a sticky parent: our directory below it is safe, the other user's is not") {
    const fs::path pub = dir.path / "pub";
    fs::create_directories(pub / "mine");
    fs::permissions(pub, fs::perms::all | fs::perms::sticky_bit);
    const std::string ours = dir.copy("c_hook.so", "pub/mine/c_hook.so");
    REQUIRE(as_nobody("mkdir -m 755 " + (pub / "theirs").string()));
    const std::string theirs = dir.copy("c_hook.so", "pub/theirs/c_hook.so");
    keel::Registry r;
    CHECK(r.load(ours));
    keel::Registry r2;
    CHECK_FALSE(r2.load(theirs));
    CHECK(contains(refusal_at(r2, theirs), (pub / "theirs").string() +
                                               ", a directory on its path, belongs to another "
                                               "user (uid 65534)"));
  }
}

TEST_CASE("a plugin's own libraries: RUNPATH entries that could name another user's files") {
  TempDir dir;
  Mark mark(dir.path);
  dir.copy("libkeel_dep_helper.so");
  REQUIRE_FALSE(fs::exists("/tmp/keel-fixture-missing-runpath"));
  const std::string at = fs::canonical(dir.path).string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"dep_relative.so", "RUNPATH entry 'lib' is relative (the dynamic loader reads it "
                          "against the working directory)"},
      {"dep_escape.so", "RUNPATH entry '$ORIGIN/../lib' leaves its directory " + at + " (" +
                            fs::path(at).parent_path().string() + "/lib)"},
      {"dep_missing.so", "RUNPATH directory /tmp/keel-fixture-missing-runpath does not exist "
                         "(another user could create it later)"},
  };
  for (const auto& case_ : cases) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& file = case_.first;
    const auto& why = case_.second;
    CAPTURE(file);
    const std::string path = dir.copy(file);
    for (const bool allow : {false, true}) {  // KEEL_ALLOW_WRITABLE_PLUGINS changes nothing
      if (allow) setenv("KEEL_ALLOW_WRITABLE_PLUGINS", "1", 1);
      keel::Registry r;
      unsetenv("KEEL_ALLOW_WRITABLE_PLUGINS");
      CHECK_FALSE(r.load(path));
      CHECK(contains(refusal_at(r, path), "not loaded: " + why + "; hint: "));
    }
  }
  CHECK(mark.text().empty());  // neither a plugin's constructor nor the helper's ran
}

TEST_CASE("a plugin's own library is loaded from its checked copy, and locked with the plugin") {
  TempDir dir;
  const std::string plugin = dir.copy("dep_plugin.so");
  const std::string helper = dir.copy("libkeel_dep_helper.so");
  const std::string helper_sha = keel::sha256_file(helper);
  keel::Registry r;
  INFO(refusal_at(r, plugin));
  REQUIRE(r.load(plugin));
  const keel::LoadedPlugin& p = *r.plugins().at(0);
  REQUIRE(p.dependencies.size() == 1);
  CHECK(p.dependencies[0].name == "libkeel_dep_helper.so");
  CHECK(p.dependencies[0].sha256 == helper_sha);
  // The plugin is bound to the helper the loader loaded from a sealed copy: the symbol's object
  // is a /proc/self/fd name whose descriptor is a memfd, and no object has the helper's path.
  using Fn = int (*)();
  auto value = reinterpret_cast<Fn>(dlsym(p.library.native(), "keel_dep_plugin_value"));
  auto helper_fn = reinterpret_cast<Fn>(dlsym(p.library.native(), "keel_dep_helper_value"));
  REQUIRE(reinterpret_cast<void*>(value) != nullptr);
  REQUIRE(reinterpret_cast<void*>(helper_fn) != nullptr);
  CHECK(value() == 1);
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(helper_fn), &info) != 0);
  const std::string object = info.dli_fname;
  CHECK(object.rfind("/proc/self/fd/", 0) == 0);
  std::error_code ec;
  CHECK(contains(fs::read_symlink(object, ec).string(), "/memfd:libkeel_dep_helper.so"));
  for (const std::string& name : loaded_objects()) {
    CAPTURE(name);
    CHECK(fs::path(name).filename() != "libkeel_dep_helper.so");
  }

  keel::Lock lock;
  lock.file = (dir.path / "m.toml.lock").string();
  keel::LockEntry entry{"test-dep-plugin", "1.0.0", plugin, keel::sha256_file(plugin), {}, {}};
  SUBCASE("a lock that lists the helper with its hash loads the plugin") {
    entry.dependencies.push_back({"libkeel_dep_helper.so", helper, helper_sha});
    lock.entries.push_back(entry);
    keel::Registry locked;
    locked.use_lock(lock);
    CHECK(locked.load(plugin));
  }
  SUBCASE("a lock that does not list the helper refuses the plugin") {
    lock.entries.push_back(entry);
    keel::Registry locked;
    locked.use_lock(lock);
    CHECK_FALSE(locked.load(plugin));
    CHECK(contains(refusal_at(locked, plugin),
                   "not loaded: its library libkeel_dep_helper.so (") );
    CHECK(contains(refusal_at(locked, plugin),
                   "is not listed with plugin test-dep-plugin 1.0.0 in " + lock.file));
  }
  SUBCASE("a lock that lists another hash for the helper refuses the plugin") {
    const std::string other = keel::sha256_file(kFixtures + "/dep_helper_v2.so");
    entry.dependencies.push_back({"libkeel_dep_helper.so", helper, other});
    lock.entries.push_back(entry);
    keel::Registry locked;
    locked.use_lock(lock);
    CHECK_FALSE(locked.load(plugin));
    CHECK(contains(refusal_at(locked, plugin),
                   "differs from " + other.substr(0, 16) + "... that " + lock.file));
  }
  SUBCASE("the dependencies survive writing and reading the lock") {
    entry.dependencies.push_back({"libkeel_dep_helper.so", helper, helper_sha});
    lock.file = (dir.path / "m.toml.lock").string();
    lock.entries.push_back(entry);
    keel::write_lock(lock, (dir.path / "m.toml").string());
    const auto back = keel::read_lock((dir.path / "m.toml").string());
    REQUIRE(back);
    REQUIRE(back->entries.size() == 1);
    REQUIRE(back->entries[0].dependencies.size() == 1);
    CHECK(back->entries[0].dependencies[0].name == "libkeel_dep_helper.so");
    CHECK(back->entries[0].dependencies[0].path == helper);
    CHECK(back->entries[0].dependencies[0].sha256 == helper_sha);
  }
}

TEST_CASE("a malformed dependency in a lock is an error at its file:line:col") {
  TempDir dir;
  const std::string manifest = (dir.path / "m.toml").string();
  const std::string head = "[[plugin]]\nname = \"p\"\nversion = \"1\"\npath = \"/p.so\"\n"
                           "sha256 = \"" + std::string(64, 'a') + "\"\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"dependencies = 3\n", ":6:16: [[plugin]] dependencies must be an array of tables"},
      {"[[plugin.dependencies]]\nname = \"libx.so\"\npath = \"/x\"\n",
       ":6:1: [[plugin.dependencies]] needs sha256 = \"...\""},
      {"[[plugin.dependencies]]\nname = \"libx.so\"\npath = \"/x\"\nsha256 = \"00\"\n",
       ":9:10: sha256 must be 64 lowercase hex digits"},
      {"[[plugin.dependencies]]\nname = \"libx.so\"\npath = \"/x\"\nsha256 = \"" +
           std::string(64, '0') + "\"\nsize = 3\n",
       ":10:1: unknown key 'size' in [[plugin.dependencies]]"},
  };
  for (const auto& case_ : cases) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& text = case_.first;
    const auto& want = case_.second;
    CAPTURE(text);
    write_bytes(manifest + ".lock", head + text);
    const std::string err = keel_test::error_of([&] { keel::read_lock(manifest); });
    CHECK(contains(err, manifest + ".lock" + want));
    CHECK(contains(err, "; hint: regenerate it with `keel plugins lock"));
  }
}

TEST_CASE("a plugin file rewritten while it loads: the code loaded is the code hashed") {
  if (!can_be_nobody()) {
    MESSAGE("skipped: needs root to act as another user");
    return;
  }
  // The other user rewrites a writable plugin file in place, in a loop, between two versions
  // (KEEL_ALLOW_WRITABLE_PLUGINS=1 lets such a file load; a network file system is the same).
  TempDir dir;
  fs::permissions(dir.path, k0755);
  std::string v1 = read_bytes(kFixtures + "/constructor_plugin.so");
  std::string v2 = read_bytes(kFixtures + "/constructor_plugin_v2.so");
  const size_t size = std::max(v1.size(), v2.size());  // same size: a rewrite needs no truncate
  v1.resize(size, '\0');
  v2.resize(size, '\0');
  const std::string file = (dir.path / "constructor_plugin.so").string();
  write_bytes(file, v1);
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                            fs::perms::group_write | fs::perms::others_read |
                            fs::perms::others_write);
  keel::Lock lock;
  lock.file = (dir.path / "m.toml.lock").string();
  const std::string sha1 = keel::sha256_file(file);
  write_bytes(file, v2);
  const std::string sha2 = keel::sha256_file(file);
  REQUIRE(sha1 != sha2);
  lock.entries.push_back({"constructor-plugin", "1.0.0", file, sha1, {}, {}});
  lock.entries.push_back({"constructor-plugin", "2.0.0", file, sha2, {}, {}});

  const pid_t writer = fork();
  REQUIRE(writer >= 0);
  if (writer == 0) {  // the other user: only async-signal-safe calls from here
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int fd = open(file.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) _exit(3);
    alarm(30);
    for (;;)
      for (const std::string* v : {&v1, &v2}) {
        if (pwrite(fd, v->data(), v->size(), 0) != static_cast<ssize_t>(v->size())) _exit(4);
        usleep(300);
      }
  }
  int loaded = 0, mismatched = 0;
  setenv("KEEL_ALLOW_WRITABLE_PLUGINS", "1", 1);
  for (int i = 0; i < 40; ++i) {
    keel::Registry r;
    r.use_lock(lock);
    if (!r.load(file)) continue;  // a torn read: its hash is in no lock entry
    ++loaded;
    const keel::LoadedPlugin& p = *r.plugins().at(0);
    const keel::LockEntry* e = lock.by_sha256(p.sha256);
    REQUIRE(e != nullptr);
    if (e->version != p.version) ++mismatched;
  }
  unsetenv("KEEL_ALLOW_WRITABLE_PLUGINS");
  kill(writer, SIGKILL);
  int status = 0;
  waitpid(writer, &status, 0);
  CHECK(WIFSIGNALED(status));  // the writer was still writing: it did not fail
  MESSAGE(loaded << " of 40 loads passed the lock");
  CHECK(loaded > 0);
  CHECK(mismatched == 0);
}

TEST_CASE("under a file size limit below a plugin's size: loaded from the checked file, or refused") {
  // A sealed copy is written, so `ulimit -f` counts; where the limit cannot be raised (no
  // CAP_SYS_RESOURCE and a hard limit below the file), a plugin whose path passed the checks
  // loads from the file itself; with KEEL_ALLOW_WRITABLE_PLUGINS=1 it is refused, naming the
  // limit. In a child process: the limit stays there.
  TempDir dir;
  const std::string file = dir.copy("constructor_plugin.so");
  REQUIRE(fs::file_size(file) > 4096);
  for (const bool allow_writable : {false, true}) {
    CAPTURE(allow_writable);
    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      close(pipe_fds[0]);
      signal(SIGXFSZ, SIG_IGN);
      const struct rlimit small = {4096, 4096};
      if (setrlimit(RLIMIT_FSIZE, &small) != 0) _exit(2);
      if (allow_writable) setenv("KEEL_ALLOW_WRITABLE_PLUGINS", "1", 1);
      keel::Registry r;
      const bool ok = r.load(file);
      const std::string why = ok ? "loaded" : refusal_at(r, file);
      struct rlimit now = {0, 0};
      getrlimit(RLIMIT_FSIZE, &now);  // put back after the copy
      const std::string out =
          why + (now.rlim_cur == 4096 && now.rlim_max == 4096 ? "" : " [limit changed]");
      (void)!write(pipe_fds[1], out.data(), out.size());
      _exit(0);
    }
    close(pipe_fds[1]);
    std::string got;
    char buf[512];
    for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) got.append(buf, n);
    close(pipe_fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    if (allow_writable)
      CHECK(contains(got, "over the file size limit of 4 KiB (ulimit -f), which this process may "
                          "not raise; hint: raise `ulimit -f`"));
    else
      CHECK(got == "loaded");
  }
}

TEST_CASE("a second copy of a loaded plugin is refused and kept, naming both versions") {
  TempDir dir;
  fs::create_directories(dir.path / "a");
  fs::create_directories(dir.path / "b");
  const std::string first = dir.copy("constructor_plugin.so", "a/constructor_plugin.so");
  const std::string second = dir.copy("constructor_plugin_v2.so", "b/constructor_plugin_v2.so");
  keel::Registry r;
  r.discover({(dir.path / "a").string(), (dir.path / "b").string()});
  REQUIRE(r.plugins().size() == 1);
  CHECK(r.plugins()[0]->version == "1.0.0");
  REQUIRE(r.shadowed().size() == 1);
  CHECK(r.shadowed()[0].name == "constructor-plugin");
  CHECK(r.shadowed()[0].version == "2.0.0");
  CHECK(r.shadowed()[0].path == second);
  CHECK(r.shadowed()[0].used == r.plugins()[0].get());
  CHECK(contains(refusal_at(r, second), "plugin 'constructor-plugin' 2.0.0 is already loaded from " +
                                            first + " (version 1.0.0); hint: "));
}

}  // namespace unit_loader
