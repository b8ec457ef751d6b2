// libFuzzer target: manifest loading (kernel/manifest.cpp: files, `extends`, --set) and option
// validation (sdk/host/options.cpp) against the kernel's own schemas and one that holds every
// option type.
//
// Input: parts separated by a line "---" (the bytes "\n---\n"):
//   part 0  main.toml, the manifest named on the command line
//   part 1  base.toml, a manifest main.toml (or base.toml itself) may extend
//   part 2+ --set overrides, one per part (at most 8)
// The files go to a per-process directory under $TMPDIR (else /dev/shm, else /tmp). An
// `extends` that is not a plain file name of that directory skips the input: it could name
// /dev/stdin or a FIFO, and the fuzzer must not read the machine's files. Inputs that hit a
// known toml++ bug (toml_known_bugs.hpp) are skipped too.
//
// keel::Error is the expected failure; any other exception escaping (std::stol's
// std::invalid_argument, toml::parse_error, std::bad_variant_access, ...) reaches
// std::terminate, and libFuzzer records the input as a crash.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "error.hpp"
#include "keel/schema.hpp"
#include "manifest.hpp"
#include "options.hpp"
#include "run_config.hpp"
#include "toml_known_bugs.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kSeparator = "\n---\n";
constexpr size_t kMaxOverrides = 8;

// Every option type, with bounds, choices, lists, paths, defaults and one required key.
const keel::Schema kAllTypes = {
    keel::opt_bool("flag", "false", "a bool"),
    keel::opt_int("count", "3", "an int in [0, 10]", 0, 10),
    keel::opt_int("any_int", "-1", "an unbounded int"),
    keel::opt_float("rate", "1e-3", "a float >= 0", 0, keel::kInf),
    keel::opt_float("ratio", "0.5", "a float in [0, 1]", 0, 1),
    keel::opt_string("mode", "\"mean\"", "a choice", "mean|sum|none"),
    keel::opt_string("name", "\"\"", "any string"),
    keel::opt_path("path", "\"out/file.txt\"", "a path"),
    keel::opt_int_list("hidden", "[256, 128]", "ints >= 1", 1, keel::kInf),
    keel::opt_float_list("betas", "[0.9, 0.999]", "floats in [0, 1)", 0, 0.999999),
    keel::opt_int("required", nullptr, "no default"),
};

fs::path work_dir() {
  static const fs::path dir = [] {
    const char* env = std::getenv("TMPDIR");
    std::string base = env && *env ? env : (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    std::string tmpl = base + "/keel-fuzz-manifest-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("fuzz_manifest: mkdtemp");
      std::abort();
    }
    static const fs::path made = tmpl;
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(made, ec);
    });
    return made;
  }();
  return dir;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t sep = s.find(kSeparator, start);
    parts.push_back(s.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
    if (sep == std::string::npos) return parts;
    start = sep + kSeparator.size();
  }
}

// False when `text` parses as TOML with an `extends` that is not a plain name in the directory.
bool extends_stays_inside(const std::string& text) {
  toml::table t;
  try {
    t = toml::parse(text);
  } catch (const toml::parse_error&) {
    return true;  // load_manifest fails on it before following anything
  }
  const toml::node* ext = t.get("extends");
  if (ext == nullptr || !ext->is_string()) return true;
  const std::string& name = ext->as_string()->get();
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
         name.find('\0') == std::string::npos;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// Runs `f`; a keel::Error is an expected outcome, and validation goes on with the next table.
template <class F>
void expect_keel_errors(F&& f) {
  try {
    f();
  } catch (const keel::Error&) {
  }
}

void validate(const toml::table& t, const std::string& section, const keel::Schema& schema) {
  expect_keel_errors([&] {
    const keel_options o = keel::validate_options(t, section, "keel options " + section, schema,
                                                  {"type"});
    (void)keel::to_toml(o);
  });
}

void validate_all(const toml::table& root) {
  for (const keel::KernelTable& kt : keel::kernel_tables()) {
    const std::string name = kt.name;
    if (name == "hooks" || name == "optimizer.groups") {
      const toml::node* n = name == "hooks" ? root.get("hooks")
                                            : root.at_path("optimizer.groups").node();
      if (const toml::array* a = n ? n->as_array() : nullptr)
        for (size_t i = 0; i < a->size(); ++i)
          if (const toml::table* t = (*a)[i].as_table())
            validate(*t, name + "[" + std::to_string(i) + "]", *kt.schema);
    } else if (const toml::table* t = root.get_as<toml::table>(name)) {
      validate(*t, name, *kt.schema);
    }
  }
  // Every other table as a component's options.
  for (const auto& [k, v] : root)
    if (const toml::table* t = v.as_table()) validate(*t, std::string(k.str()), kAllTypes);
  for (const auto& [k, v] : root)
    if (k.str() == "data")
      if (const toml::table* data = v.as_table())
        for (const auto& [split_name, split] : *data)
          if (const toml::table* t = split.as_table())
            validate(*t, "data." + std::string(split_name.str()), kAllTypes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  if (keel_fuzz::hits_toml_whitespace_bug(input)) return 0;
  const std::vector<std::string> parts = split(input);
  if (!extends_stays_inside(parts[0]) || (parts.size() > 1 && !extends_stays_inside(parts[1])))
    return 0;
  const fs::path dir = work_dir();
  const fs::path main_path = dir / "main.toml", base_path = dir / "base.toml";
  write(main_path, parts[0]);
  std::error_code ec;
  if (parts.size() > 1)
    write(base_path, parts[1]);
  else
    fs::remove(base_path, ec);
  std::vector<std::string> overrides;
  for (size_t i = 2; i < parts.size() && overrides.size() < kMaxOverrides; ++i)
    overrides.push_back(parts[i]);

  expect_keel_errors([&] {
    const keel::Manifest m = keel::load_manifest(main_path.string(), overrides);
    validate_all(m.root);
  });
  return 0;
}
