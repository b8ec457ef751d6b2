// What the test probes share (gpt_probe, lm_losses_probe, torch_profiler_probe, tokens_dump):
// each loads a built plugin with dlopen, drives it through keel/testing.hpp and prints what the
// Python test compares. Include after keel/testing.hpp.
//
// A probe runs one case per process (`PROBE ARGS...`: the case's output on stdout, or its error
// on stderr and exit status 1) or many (`PROBE --batch`), which saves a LibTorch start-up per
// case (about 0.9 CPU-s, 2.8 under AddressSanitizer). In batch mode each line of stdin is one
// case: the ARGS of a one-case command line separated by tabs. For each, stdout gets one JSON
// line, written and flushed before the next case is read: {"ok": true, "output": TEXT} with
// what the case would have printed, or {"ok": false, "error": TEXT} with the message of the
// exception it threw; the batch goes on with the next line. Anything else written to stdout
// while a case runs goes to stderr instead, so it cannot be taken for a reply.
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cstdarg>
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

// printf's formatting into a string.
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string format(const char* fmt, ...) {
  std::va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

// A case: argv[1..argc) are its arguments (argv[0] the program); returns what it prints.
using Case = std::string (*)(int argc, char** argv);

// Whether this process runs cases in batch mode (a case that needs a fresh process, such as one
// that measures the process's peak memory, refuses to run in it).
inline bool& batch_mode() {
  static bool batch = false;
  return batch;
}

// `text` as a JSON string (quoted, escaped).
inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04x", u);
      out += escape;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Batch mode: each stdin line a case's tab-separated arguments, each reply one JSON line on
// what was stdout (see the top of this file).
inline int run_batch(Case run, const char* program) {
  batch_mode() = true;
  std::fflush(stdout);
  const int reply_fd = ::dup(STDOUT_FILENO);
  if (reply_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    std::fprintf(stderr, "cannot set up the reply stream\n");
    return 1;
  }
  std::FILE* replies = ::fdopen(reply_fd, "w");
  if (replies == nullptr) return 1;
  std::string line;
  for (int c; (c = std::getchar()) != EOF;) {
    if (c != '\n') {
      line += static_cast<char>(c);
      continue;
    }
    std::vector<std::string> args{program};
    std::stringstream s(line);
    for (std::string a; std::getline(s, a, '\t');) args.push_back(a);
    line.clear();
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string reply;
    try {
      reply = "{\"ok\": true, \"output\": " +
              json_string(run(static_cast<int>(args.size()), argv.data())) + "}";
    } catch (const std::exception& e) {
      reply = "{\"ok\": false, \"error\": " + json_string(e.what()) + "}";
    }
    std::fflush(stdout);  // what the case printed itself, to stderr
    std::fprintf(replies, "%s\n", reply.c_str());
    if (std::fflush(replies) != 0) return 1;
  }
  return 0;
}

// main's body: batch mode for `PROBE --batch`, else one case: its output on stdout, or its
// message as one line on stderr and exit status 1 when it throws.
inline int main_guard(Case run, int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--batch") return run_batch(run, argv[0]);
  try {
    const std::string out = run(argc, argv);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return std::fflush(stdout) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace probe
