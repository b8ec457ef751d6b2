// What the test probes share (gpt_probe, lm_losses_probe, torch_profiler_probe, tokens_dump):
// each loads a built plugin with dlopen, drives it through keel/testing.hpp and prints what the
// Python test compares. Include after keel/testing.hpp.
#pragma once

#include <dlfcn.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace probe {

// The plugin's descriptor. The library stays loaded to the end of the process (no dlclose
// while LibTorch may hold pointers into it).
inline const keel_plugin_descriptor* open_plugin(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) throw std::runtime_error(std::string("dlopen: ") + ::dlerror());
  using Entry = const keel_plugin_descriptor* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(lib, "keel_plugin_entry"));
  if (entry == nullptr) throw std::runtime_error("no keel_plugin_entry in " + path);
  return entry();
}

inline std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// "2,3,4" -> {2, 3, 4}
inline std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream s(text);
  for (std::string e; std::getline(s, e, ',');) out.push_back(std::stoll(e));
  return out;
}

// argv[first..] as KEY=VALUE options: true/false as bools, values that start with a letter as
// strings, values with a '.' as floats, the rest as integers.
inline keel::testing::Options parse_options(int argc, char** argv, int first) {
  keel::testing::Options options;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos) throw std::runtime_error("expected KEY=VALUE, got " + a);
    const std::string key = a.substr(0, eq), value = a.substr(eq + 1);
    if (value == "true" || value == "false")
      options.emplace_back(key, value == "true");
    else if (!value.empty() && std::isalpha(static_cast<unsigned char>(value[0])))
      options.emplace_back(key, value);
    else if (value.find('.') != std::string::npos)
      options.emplace_back(key, std::stod(value));
    else
      options.emplace_back(key, static_cast<int64_t>(std::stoll(value)));
  }
  return options;
}

// main's body: run(argc, argv), or one line on stderr and exit status 1 when it throws.
inline int main_guard(int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace probe
