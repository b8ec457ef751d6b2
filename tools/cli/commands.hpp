// keel's commands, as the command line's files share them: the one table of commands
// (commands.cpp), the flags and their parse (flags.cpp), the help (help.cpp) and each
// command's function (run_command.cpp, options_command.cpp, plugins_list.cpp, commands.cpp,
// export.cpp).
// cli_main.cpp reads the command line, finds the command in the table and runs it.
#pragma once

#include <spdlog/common.h>

#include <boost/program_options/options_description.hpp>
#include <boost/program_options/variables_map.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/export.hpp"
#include "cli/plugins_commands.hpp"
#include "cli/prepare.hpp"
#include "cli/usage.hpp"
#include "keel/abi.h"
#include "options.hpp"

namespace keel {
class Registry;
}

namespace keel::cli {

namespace po = boost::program_options;

// One command's arguments and flags, parsed.
struct Parsed {
  std::vector<std::string> positional;
  std::vector<std::string> sets;
  std::optional<std::string> resume;  // --resume: "" = the newest checkpoint
  bool resume_changed = false;
  bool overwrite = false;  // --overwrite
  std::optional<std::string> log_level;
  bool help = false;
  PluginsArgs plugins;  // `keel plugins` flags
  PrepareArgs prepare;  // `keel prepare` arguments and flags
  ExportArgs exporting;  // `keel export` arguments and flags
};

// A row of the table of commands.
struct Command {
  const char* name;
  const char* args;      // after the name, in usage lines
  const char* summary;   // one sentence
  const char* operands;  // lines `keel COMMAND --help` prints under the usage ("" for none)
  // Adds the command's own flags (--log-level and --help come with every command).
  void (*add_flags)(po::options_description& d);
  // Runs it (with its name, as train, evaluate and validate share one function); returns the
  // exit status. nullptr for `help`, which cli_main answers itself.
  int (*run)(const std::string& name, const Parsed& p);
};

// Every command, in the order `keel --help` lists them.
const std::vector<Command>& commands();
// The command named `name`, or nullptr.
const Command* find_command(const std::string& name);
std::vector<std::string> command_names();

// ---- flags (flags.cpp) ----
inline constexpr unsigned kHelpWidth = 100;
void add_set_flag(po::options_description& d);
void add_train_flags(po::options_description& d);
void add_plugins_flags(po::options_description& d);
void add_report_flags(po::options_description& d);
void add_prepare_flags(po::options_description& d);
void add_export_flags(po::options_description& d);
void add_log_level_flag(po::options_description& d);
// keel's own flags, before the command (`keel --help` lists them after train's); those of one
// command.
po::options_description global_flags();
po::options_description command_flags(const Command& c);
// The program_options parse of `args` against `visible` (positional arguments into
// `positional`); every po::error becomes a UsageError naming the flag. `command`: "" for the
// flags before the command.
po::variables_map parse_flags(const std::vector<std::string>& args, const std::string& command,
                              const po::options_description& visible,
                              std::vector<std::string>& positional);
Parsed parse_command(const Command& c, const std::vector<std::string>& args);
// Console level: --log-level, else $KEEL_LOG_LEVEL, else info. Throws UsageError.
spdlog::level::level_enum console_level(const std::optional<std::string>& flag,
                                        const std::string& command);

// ---- help (help.cpp) ----
void print_main_help();
void print_command_help(const Command& c);
// `rows` as text, one line each, every column as wide as its widest cell and two spaces from
// the next (the last column unpadded), each line starting with `indent`.
std::string columns(const std::vector<std::vector<std::string>>& rows,
                    const std::string& indent = "");

// ---- the commands ----
// train, evaluate, validate (run_command.cpp).
int run_manifest_command(const std::string& name, const Parsed& p);
// options (options_command.cpp).
int options_command(const std::string& name, const Parsed& p);
// plugins: the listing, `show` and the subcommands of plugins_commands.hpp (plugins_list.cpp).
int plugins_command(const std::string& name, const Parsed& p);
// report, prepare, export (commands.cpp).
int report_command(const std::string& name, const Parsed& p);
int prepare_command(const std::string& name, const Parsed& p);
int export_command(const std::string& name, const Parsed& p);

// ---- shared by the commands ----
// What one cli_main call is doing and what it changed in the process (cli_main.cpp).
struct CallState {
  // keel as the user ran it, one shell word (argv[0] as typed: "build/kernel/keel", or "keel"
  // when the shell found it on PATH): every message that names a keel command to run names it
  // so (the usage line, the help, hints of error lines, the continue line of a stopped run).
  std::string program = "keel";
  std::string argv0;  // argv[0] itself ("" when none)
  std::string activity = "while starting";  // for the internal-error message
  std::string rank_prefix;                  // "rank N: " in front of one process's error line
  // LibTorch's and OpenBLAS's thread counts before apply_process_settings changed them (-1: not
  // changed, or OpenBLAS absent): cli_main puts them back.
  int torch_threads_before = -1;
  int blas_threads_before = -1;
};
CallState& call_state();

// `text` with each keel command it names to run ("keel train M", "`keel plugins show NAME`",
// "keel --help") naming call_state().program instead of "keel", from byte `from` on (cli_main.cpp).
std::string with_program(const std::string& text, size_t from = 0);

// The registry's components and refusals, at debug level.
void log_registry(const Registry& registry);

// Component sections: their keys are the options of the plugin their `type` names
// (options_command.cpp).
const std::vector<std::pair<std::string, keel_kind>>& component_sections();
// Whether `table` ("data.eval.valid") is `section` of component_sections() ("data.eval" holds
// every [data.eval.NAME]).
bool in_component_section(const std::string& table, const std::string& section);
// The names of the components of `kind` found on the default search path ("none found").
std::string components_of_kind(keel_kind kind);
// "[train]" or "[[hooks]]" -> "train" / "hooks".
std::string table_name(std::string s);
// The rows of an option table (keel options, keel plugins show), indented by two spaces;
// `none` when it has none.
void print_option_rows(const Schema& schema, const char* none);

}  // namespace keel::cli
