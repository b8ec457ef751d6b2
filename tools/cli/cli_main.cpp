// keel command line: train, evaluate, export, validate, plugins [show NAME], options [TABLE],
// prepare, report, --version, --help (Boost.Program_options), as the function keel::cli_main
// (cli_main.hpp). The commands are rows of one table (commands.hpp); this file reads the
// command line, runs the command it names, and turns what it throws into one line and an exit
// status.
//
// Exit status: 0 success; 1 bad input or a failed run ("keel: error: ..."); 2 command-line
// usage (cli::UsageError: an unknown command or flag, a missing argument, a bad --log-level);
// 70 (EX_SOFTWARE) an internal error, i.e. a bug in keel ("keel: internal error: ...").
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <vector>
#include <unistd.h>

#include "accelerator.hpp"
#include "blas.hpp"
#include "cli/cli_main.hpp"
#include "cli/commands.hpp"
#include "error.hpp"
#include "keel/abi.h"
#include "loader/registry.hpp"
#include "log.hpp"
#include "text/text.hpp"

namespace keel::cli {

CallState& call_state() {
  static CallState state;
  return state;
}

// A command to run is "keel" at the start of a word, then a command's name, --help, --version
// or COMMAND: "keel options train", "`keel plugins show NAME`"; not "keel's" or "keel-sdk".
std::string with_program(const std::string& text, size_t from) {
  const std::string& program = call_state().program;
  if (program == "keel" || from >= text.size()) return text;
  std::vector<std::string> words = command_names();
  words.insert(words.end(), {"--help", "--version", "COMMAND"});
  std::string out = text.substr(0, from);
  size_t i = from;
  for (size_t at; (at = text.find("keel ", i)) != std::string::npos; i = at + 4) {
    out.append(text, i, at - i);
    const size_t start = at + 5;
    const size_t end = std::min(text.find_first_of(" `)'\",;", start), text.size());
    const bool word_start = at == 0 || std::string(" `('\"").find(text[at - 1]) != std::string::npos;
    const bool command =
        std::find(words.begin(), words.end(), text.substr(start, end - start)) != words.end();
    out += word_start && command ? program : "keel";
  }
  return out + text.substr(i);
}

void log_registry(const Registry& registry) {
  spdlog::debug("plugins: {} components found", registry.components().size());
  for (const auto& c : registry.components())
    spdlog::debug("  {} {} ({} {}, {})", kind_name(c->kind), c->name, c->plugin->name,
                  c->plugin->version, c->plugin->path);
  for (const auto& r : registry.refusals()) spdlog::debug("  refused {}: {}", r.path, r.reason);
}

}  // namespace keel::cli

namespace {

using namespace keel::cli;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 70;  // EX_SOFTWARE (sysexits.h)

void start_logging(const Parsed& p, const std::string& command,
                   const std::optional<std::string>& global_level,
                   const std::vector<std::string>& argv) {
  keel::init_logging(console_level(p.log_level ? p.log_level : global_level, command));
  const std::string line = keel::text::join(argv, " ");
  spdlog::debug("keel {} (plugin ABI {}.{}, LibTorch {}), pid {}", KEEL_VERSION, KEEL_ABI_MAJOR,
                KEEL_ABI_MINOR, keel::kernel_torch_version(), getpid());
  spdlog::debug("command line: {}", line);
}

[[noreturn]] void unknown_command(const std::string& command) {
  const std::string list = keel::text::join(command_names());
  throw UsageError("'" + command + "': unknown command; hint: " +
                       keel::text::did_you_mean(command, command_names()) + "commands: " + list,
                   "");
}

int run(int argc, char** argv) {
  // The one place that names the program for messages: argv[0] as the user typed it.
  if (argc > 0 && argv[0] != nullptr && argv[0][0] != '\0') {
    call_state().argv0 = argv[0];
    call_state().program = keel::text::shell_word(argv[0]);
  }
  const std::vector<std::string> argv_all(argv, argv + argc);
  const std::vector<std::string> args(argv + 1, argv + argc);
  call_state().activity = "while parsing the command line";

  // The flags before the command are keel's own (--help, --version, --log-level); everything
  // after it, flags included, belongs to the command's own parse.
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') break;
    if (a == "--log-level") ++i;  // its value
  }
  const std::vector<std::string> global_args(args.begin(), args.begin() + std::min(i, args.size()));
  const std::string command = i < args.size() ? args[i] : "";
  const std::vector<std::string> rest(args.begin() + std::min(i + 1, args.size()), args.end());

  // (--set is listed by `keel --help` but belongs to the commands.)
  po::options_description global("flags", kHelpWidth);
  add_log_level_flag(global);
  global.add_options()("help,h", "")("version", "");
  for (const auto& a : global_args)
    if (a == "--set" || a.rfind("--set=", 0) == 0)
      throw UsageError("--set: goes after the command and its MANIFEST; hint: keel train "
                       "MANIFEST --set KEY=VALUE",
                       "train");
  std::vector<std::string> stray;
  const po::variables_map gvm = parse_flags(global_args, "", global, stray);
  if (!stray.empty())
    throw UsageError(stray[0] + ": unexpected argument before the command; hint: keel COMMAND "
                     "[ARGS] [FLAGS]",
                     "");
  const bool help = gvm.count("help") > 0;
  const bool version = gvm.count("version") > 0;
  std::optional<std::string> global_level;
  if (gvm.count("log-level")) global_level = gvm["log-level"].as<std::string>();

  if (version) {
    std::printf("keel %s (plugin ABI %d.%d, LibTorch %s)\n", KEEL_VERSION, KEEL_ABI_MAJOR,
                KEEL_ABI_MINOR, keel::kernel_torch_version());
    std::printf("BLAS: %s\n", keel::blas_default_line().c_str());
    std::printf("CUDA: %s\n", keel::accelerator_line(/*count_gpus=*/true).c_str());
    return 0;
  }
  if (help && command.empty()) {
    print_main_help();
    return 0;
  }
  if (command.empty())
    throw UsageError("no command given; hint: keel train MANIFEST, e.g. keel train "
                     "configs/quickstart.toml (`keel --help` lists the commands)",
                     "");
  if (command == "help") {
    if (rest.empty()) {
      print_main_help();
      return 0;
    }
    const Command* c = find_command(rest[0]);
    if (!c) unknown_command(rest[0]);
    print_command_help(*c);
    return 0;
  }
  const Command* c = find_command(command);
  if (!c) unknown_command(command);

  const Parsed p = parse_command(*c, rest);
  if (help || p.help) {
    print_command_help(*c);
    return 0;
  }
  start_logging(p, command, global_level, argv_all);
  return c->run(command, p);
}

// An error's message on one line, its control bytes and invalid UTF-8 as \xNN
// (keel::text::printable: bytes from data cannot drive the terminal), the commands its hint
// names to run naming the program as it was run (with_program; the message's start names what
// failed: "keel report: needs RUN_DIR").
std::string error_text(const keel::Error& e) {
  const std::string line = keel::text::printable(keel::text::one_line(e.what()));
  return with_program(line, std::min(line.find("hint: "), line.size()));
}

[[noreturn]] void internal_error(const std::string& what) {
  std::fprintf(stderr,
               "keel: internal error: %s: %s; this is a bug in keel, please report it with the "
               "command line\n",
               call_state().activity.c_str(),
               keel::text::printable(keel::text::one_line(what)).c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  // No cleanup that could wait on a lock the failing thread holds: exit now.
  std::_Exit(kExitInternal);
}

// An exception escaping a thread, or thrown through noexcept: report it like main does,
// without abort() and its core dump.
[[noreturn]] void on_terminate() {
  std::string what = "std::terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const keel::Error& x) {
      what = std::string("uncaught keel::Error: ") + x.what();
    } catch (const c10::Error& x) {
      what = x.what_without_backtrace();
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
      what = "an exception of unknown type";
    }
  }
  internal_error(what);
}

// Puts back what a call changed in the process (cli_main.hpp lists it), after the run log was
// detached and stdout flushed.
void restore_process_state() {
  CallState& call = call_state();
  if (call.torch_threads_before > 0 && at::get_num_threads() != call.torch_threads_before)
    at::set_num_threads(call.torch_threads_before);
  if (call.blas_threads_before > 0) keel::set_blas_threads(call.blas_threads_before);
  keel::reset_logging();
  call = CallState();
}

}  // namespace

int keel::cli_main(int argc, char** argv) {
  call_state() = CallState();
  const std::terminate_handler old_terminate = std::set_terminate(on_terminate);
  // A file size limit (ulimit -f) makes write() fail with EFBIG, reported like a full disk,
  // instead of killing the process in the middle of a checkpoint.
  struct sigaction ignore {}, old_xfsz {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGXFSZ, &ignore, &old_xfsz);
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "keel: error: %s\nusage: %s\n", error_text(e).c_str(),
                 usage_line(e.command()).c_str());
    status = kExitUsage;
  } catch (const keel::Error& e) {
    std::fprintf(stderr, "keel: error: %s%s\n", call_state().rank_prefix.c_str(),
                 error_text(e).c_str());
    status = kExitError;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "keel: error: out of memory %s; hint: lower batch_size or the model "
                 "size, or free memory\n", call_state().activity.c_str());
    status = kExitError;
  } catch (const c10::Error& e) {
    internal_error(std::string("LibTorch: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    internal_error(e.what());
  } catch (...) {
    internal_error("an exception of unknown type");
  }
  keel::detach_run_log();
  std::fflush(stdout);
  std::fflush(stderr);
  restore_process_state();
  sigaction(SIGXFSZ, &old_xfsz, nullptr);
  std::set_terminate(old_terminate);
  return status;
}
