// keel command line: train, evaluate, validate, plugins [show NAME], options [TABLE], prepare,
// report,
// --version, --help (Boost.Program_options), as the function keel::cli_main (cli_main.hpp).
//
// Exit status: 0 success; 1 bad input or a failed run ("keel: error: ..."); 2 command-line
// usage (an unknown command or flag, a missing argument, a bad --log-level); 70 (EX_SOFTWARE)
// an internal error, i.e. a bug in keel ("keel: internal error: ...").
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <sstream>
#include <unistd.h>

#include "blas.hpp"
#include "cli/cli_main.hpp"
#include "distributed/launch.hpp"
#include "error.hpp"
#include "log.hpp"
#include "manifest.hpp"
#include "options.hpp"
#include "cli/plugins_commands.hpp"
#include "cli/prepare.hpp"
#include "report/report.hpp"
#include "loader/registry.hpp"
#include "package/package.hpp"
#include "run_config.hpp"
#include "trainer.hpp"

namespace po = boost::program_options;

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 70;  // EX_SOFTWARE (sysexits.h)

// What keel is doing, for the internal-error message ("while training configs/x.toml").
std::string g_activity = "while starting";
// "rank N: " in front of the error line of one process of several.
std::string g_rank_prefix;
// LibTorch's and OpenBLAS's thread counts before apply_process_settings changed them (-1: not
// changed, or OpenBLAS absent): cli_main puts them back.
int g_torch_threads_before = -1;
int g_blas_threads_before = -1;

// A command-line usage error: printed as "keel: error: <message>" plus one usage line; exit 2.
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& message, std::string usage)
      : std::runtime_error(message), usage(std::move(usage)) {}
  std::string usage;
};

struct CommandInfo {
  const char* name;
  const char* args;     // after the name, in usage lines
  const char* summary;  // one line
};

const CommandInfo kCommands[] = {
    {"train", "MANIFEST [--resume [PATH]] [--resume-changed] [--overwrite] [--set KEY=VALUE]... [--log-level LEVEL]",
     "train the run a manifest describes, or continue it from a checkpoint"},
    {"evaluate", "MANIFEST [--set KEY=VALUE]... [--log-level LEVEL]",
     "evaluate [data.test] with the weights of [checkpoint] init_from"},
    {"validate", "MANIFEST [--set KEY=VALUE]... [--log-level LEVEL]",
     "everything train checks (options, plugins, data), without training"},
    {"plugins",
     "[show NAME] [--manifest MANIFEST] | new NAME --kind KIND [--lang c|cpp] DIR | install "
     "PACKAGE [--prefix DIR] [--force] | remove NAME[@VERSION] [--prefix DIR] | pack BUILD_DIR "
     "[--output FILE] | lock MANIFEST [--update NAME]... | reference] [--log-level LEVEL]",
     "the plugins found and refused, one component's options, or make, pack, install, remove "
     "and lock plugin packages"},
    {"options", "[TABLE] [--log-level LEVEL]",
     "every key of the kernel's own tables ([run], [train], ...), or of one"},
    {"prepare", "INPUT --output DIR [--level char|byte] [--log-level LEVEL]",
     "tokenize a text file into DIR/tokens.bin and DIR/vocab.json for the tokens dataset"},
    {"report", "RUN_DIR [--output FILE] [--log-level LEVEL]",
     "write one self-contained HTML page of a run's metrics, phases, manifest and plugins"},
    {"help", "[COMMAND]", "this help, or a command's"},
};

const CommandInfo* find_command(const std::string& name) {
  for (const auto& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

std::string usage_line(const std::string& command) {
  if (const CommandInfo* c = find_command(command))
    return std::string("keel ") + c->name + " " + c->args + "  (`keel " + c->name +
           " --help` for more)";
  return "keel COMMAND [ARGS] [FLAGS], COMMAND one of train, evaluate, validate, plugins, "
         "options, prepare, report  (`keel --help` for more)";
}

// One line: newlines and tabs of a message (a plugin's, LibTorch's) become spaces.
std::string one_line(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == '\n' || c == '\r' || c == '\t') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string near = keel::closest(word, candidates);
  return near.empty() ? "" : "did you mean '" + near + "'? ";
}

// ---------------------------------------------------------------------------------------------
// Flags

constexpr unsigned kHelpWidth = 100;

void add_set_flag(po::options_description& d) {
  d.add_options()("set",
                  po::value<std::vector<std::string>>()->value_name("KEY=VALUE")->composing(),
                  "override a manifest key (repeatable): --set optimizer.lr=3e-4, --set "
                  "hooks[1].path=m.jsonl; VALUE is parsed as TOML, else taken as a string");
}

void add_log_level_flag(po::options_description& d) {
  d.add_options()("log-level", po::value<std::string>()->value_name("LEVEL"),
                  "console log level: trace, debug, info, warn, error or off (default: "
                  "$KEEL_LOG_LEVEL, else info); run.log in the run directory always gets debug "
                  "detail");
}

po::options_description global_flags() {
  po::options_description d("flags", kHelpWidth);
  add_set_flag(d);
  add_log_level_flag(d);
  d.add_options()("help,h", "show this help; `keel COMMAND --help` shows a command's")(
      "version", "print keel's version, its plugin ABI and LibTorch version");
  return d;
}

po::options_description command_flags(const std::string& command) {
  po::options_description d("flags", kHelpWidth);
  if (command == "train" || command == "evaluate" || command == "validate") add_set_flag(d);
  if (command == "train")
    d.add_options()("resume", po::value<std::string>()->value_name("PATH")->implicit_value(""),
                    "continue from the newest complete checkpoint in the run's output directory "
                    "(a fresh run when there is none), or from checkpoint directory PATH")(
        "resume-changed",
        "with --resume: accept manifest changes that break an exact continuation (model, "
        "optimizer, data, seed, ...) instead of refusing them")(
        "overwrite",
        "start a new run in a run directory that holds an earlier run's records (refused "
        "otherwise): its manifest.resolved.toml, plugins.json and metrics files are replaced, "
        "run.log is appended to, its checkpoints stay");
  if (command == "plugins")
    d.add_options()("kind", po::value<std::string>()->value_name("KIND"),
                    "new: the kind of the component to write (model, dataset, optimizer, "
                    "lr_scheduler, loss, grad_clipper, mfu, profiler, checkpoint, hook)")(
        "lang", po::value<std::string>()->value_name("LANG"),
        "new: c or cpp (default cpp)")(
        "prefix", po::value<std::string>()->value_name("DIR"),
        "install, remove, listing: the plugin directory (default $XDG_DATA_HOME/keel/plugins, "
        "else ~/.local/share/keel/plugins)")(
        "output,o", po::value<std::string>()->value_name("FILE"),
        "pack: the package to write (default NAME-VERSION.tar.gz in the working directory; a path "
        "not ending in .tar.gz writes a package directory)")(
        "force", "install: replace an installed package of the same name and version")(
        "update", po::value<std::vector<std::string>>()->value_name("NAME"),
        "lock: pin plugin NAME although its file changed since the last lock (repeatable; "
        "review the new file first)")(
        "manifest", po::value<std::string>()->value_name("MANIFEST"),
        "listing, show: search where MANIFEST's run does ([plugins] paths and require) and load "
        "only what its lock allows");
  if (command == "report")
    d.add_options()("output,o", po::value<std::string>()->value_name("FILE"),
                    "the HTML file to write (default RUN_DIR/report.html)");
  if (command == "prepare")
    d.add_options()("output,o", po::value<std::string>()->value_name("DIR"),
                    "the directory to write tokens.bin and vocab.json into (created when "
                    "missing)")(
        "level", po::value<std::string>()->value_name("LEVEL"),
        "char: one token per UTF-8 character (the default); byte: one per byte");
  add_log_level_flag(d);
  d.add_options()("help,h", "show this help");
  return d;
}

std::vector<std::string> flag_names(const po::options_description& d) {
  std::vector<std::string> names;
  for (const auto& o : d.options()) {
    names.push_back("--" + o->long_name());
    const std::string s = o->canonical_display_name(po::command_line_style::allow_dash_for_short);
    if (s.size() == 2 && s[0] == '-') names.push_back(s);
  }
  return names;
}

// The program_options parse of one command's arguments; every po::error becomes a UsageError
// naming the flag.
po::variables_map parse_flags(const std::vector<std::string>& args, const std::string& command,
                              const po::options_description& visible,
                              std::vector<std::string>& positional) {
  po::options_description all;
  all.add(visible);
  all.add_options()("positional", po::value<std::vector<std::string>>());
  po::positional_options_description pos;
  pos.add("positional", -1);
  const std::string usage = usage_line(command);
  const std::string keel_command = command.empty() ? "keel" : "keel " + command;
  const std::string help = "`" + keel_command + " --help` lists every flag";
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args)
                  .options(all)
                  .positional(pos)
                  .style(po::command_line_style::default_style &
                         ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    const std::string flag = e.get_option_name();
    std::string hint = did_you_mean(flag, flag_names(visible));
    if (flag.size() == 2 && flag[0] == '-') {  // -s: the long flag starting with s, if one
      std::vector<std::string> longs;
      for (const auto& c : flag_names(visible))
        if (c.size() > 3 && c[2] == flag[1]) longs.push_back(c);
      hint = longs.size() == 1 ? "did you mean '" + longs[0] + "'? " : "";
    }
    if (hint.empty() && flag == "--set") hint = "--set applies to train, evaluate and validate ";
    if (hint.empty() && flag == "--version") hint = "use `keel --version` ";
    throw UsageError(flag + ": unknown flag" +
                         (command.empty() ? std::string() : " for `keel " + command + "`") +
                         "; hint: " + (hint.empty() ? help : hint + "(" + help + ")"),
                     usage);
  } catch (const po::invalid_command_line_syntax& e) {
    const std::string flag = e.get_option_name();
    if (e.kind() == po::invalid_syntax::missing_parameter)
      throw UsageError(flag + ": needs a value; hint: " +
                           (flag == "--set" ? std::string("--set KEY=VALUE, e.g. --set optimizer.lr=3e-4")
                                            : flag + " LEVEL, LEVEL one of " +
                                                  keel::log_level_names()),
                       usage);
    if (e.kind() == po::invalid_syntax::extra_parameter)
      throw UsageError(flag + ": takes no value; hint: " + help, usage);
    throw UsageError(flag + ": malformed flag; hint: " + help, usage);
  } catch (const po::multiple_occurrences& e) {
    throw UsageError(e.get_option_name() + ": given more than once; hint: give it once", usage);
  } catch (const po::error& e) {
    throw UsageError(keel_command + ": " + e.what() + "; hint: " + help, usage);
  }
  if (vm.count("positional")) positional = vm["positional"].as<std::vector<std::string>>();
  return vm;
}

// Console level: --log-level, else $KEEL_LOG_LEVEL, else info.
spdlog::level::level_enum console_level(const std::optional<std::string>& flag,
                                        const std::string& command) {
  const std::vector<std::string> names = {"trace", "debug", "info", "warn", "error", "off"};
  std::string where, value;
  if (flag) {
    where = "--log-level " + *flag;
    value = *flag;
  } else if (const char* env = std::getenv("KEEL_LOG_LEVEL"); env && *env) {
    where = std::string("KEEL_LOG_LEVEL=") + env;
    value = env;
  } else {
    return spdlog::level::info;
  }
  if (const auto level = keel::parse_log_level(value)) return *level;
  throw UsageError(where + ": not a log level; hint: " + did_you_mean(value, names) +
                       "use one of " + keel::log_level_names(),
                   usage_line(command));
}

// ---------------------------------------------------------------------------------------------
// Help

void print_main_help() {
  std::printf("keel %s: a C++ training runtime on LibTorch, built from plugins\n\n", KEEL_VERSION);
  std::printf("usage: keel COMMAND [ARGS] [FLAGS]\n\ncommands:\n");
  for (const auto& c : kCommands) {
    const std::string head = std::string(c.name) + " " +
                             std::string(c.args).substr(0, std::string(c.args).find(" [-"));
    std::printf("  %-22s %s\n", head.c_str(), c.summary);
  }
  std::ostringstream flags;
  flags << global_flags();
  std::printf("\n%s", flags.str().c_str());
  std::printf(
      "\nenvironment:\n"
      "  KEEL_LOG_LEVEL         default of --log-level\n"
      "  KEEL_PLUGIN_PATH       colon-separated directories searched for plugins first\n"
      "\nexit status: 0 success; 1 bad input or a failed run; 2 command-line usage; 70 an "
      "internal error (a bug in keel)\n");
}

void print_command_help(const std::string& command) {
  const CommandInfo* c = find_command(command);
  std::printf("usage: keel %s %s\n%s\n", c->name, c->args, c->summary);
  if (command == "train" || command == "evaluate" || command == "validate")
    std::printf("MANIFEST: a TOML file (README, \"Manifest\"); `keel options` and `keel plugins "
                "show NAME` list the keys of each table\n");
  if (command == "evaluate")
    std::printf("(the same as train with --set run.mode=evaluate)\n");
  if (command == "options")
    std::printf("TABLE: run, train, checkpoint, hooks, optimizer.groups, plugins (all when "
                "left out)\n");
  if (command == "plugins")
    std::printf("NAME: a component (adamw, mlp, ...) or a plugin (keel-optimizers, ...)\n");
  if (command == "prepare")
    std::printf("INPUT: a text file; the files' format: README, \"Preparing token files\"\n");
  if (command == "report")
    std::printf("RUN_DIR: the run directory of `keel train` ([run] output_dir); the page: README, "
                "\"Run report\"\n");
  if (command == "help") return;
  std::ostringstream flags;
  flags << command_flags(command);
  std::printf("\n%s", flags.str().c_str());
}

// ---------------------------------------------------------------------------------------------
// Commands

struct Parsed {
  std::vector<std::string> positional;
  std::vector<std::string> sets;
  std::optional<std::string> resume;  // --resume: "" = the newest checkpoint
  bool resume_changed = false;
  bool overwrite = false;  // --overwrite
  std::optional<std::string> log_level;
  bool help = false;
  keel::cli::PluginsArgs plugins;  // `keel plugins` flags
  keel::cli::PrepareArgs prepare;  // `keel prepare` arguments and flags
};

Parsed parse_command(const std::string& command, const std::vector<std::string>& args) {
  Parsed p;
  const po::variables_map vm = parse_flags(args, command, command_flags(command), p.positional);
  if (vm.count("set")) p.sets = vm["set"].as<std::vector<std::string>>();
  if (vm.count("log-level")) p.log_level = vm["log-level"].as<std::string>();
  if (vm.count("resume")) p.resume = vm["resume"].as<std::string>();
  p.resume_changed = vm.count("resume-changed") > 0;
  // `--resume PATH` (a separate word): program_options only binds `--resume=PATH` to the
  // flag, so a second positional after the MANIFEST is the PATH.
  if (p.resume && p.resume->empty() && p.positional.size() == 2) {
    p.resume = p.positional[1];
    p.positional.pop_back();
  }
  p.overwrite = vm.count("overwrite") > 0;
  if (p.overwrite && p.resume)
    throw UsageError("--overwrite and --resume: one or the other (--resume continues the run in "
                     "the directory, --overwrite starts a new one there); hint: drop one of them",
                     usage_line(command));
  if (p.resume_changed && !p.resume)
    throw UsageError("--resume-changed: only applies with --resume; hint: keel train MANIFEST "
                     "--resume --resume-changed", usage_line(command));
  p.help = vm.count("help") > 0;
  if (vm.count("kind")) p.plugins.kind = vm["kind"].as<std::string>();
  if (vm.count("lang")) p.plugins.lang = vm["lang"].as<std::string>();
  if (vm.count("prefix")) p.plugins.prefix = vm["prefix"].as<std::string>();
  if (vm.count("output")) p.plugins.output = vm["output"].as<std::string>();
  p.plugins.force = vm.count("force") > 0;
  if (vm.count("update")) p.plugins.update = vm["update"].as<std::vector<std::string>>();
  if (vm.count("manifest")) p.plugins.manifest = vm["manifest"].as<std::string>();
  p.prepare.positional = p.positional;
  p.prepare.output = p.plugins.output;
  if (vm.count("level")) p.prepare.level = vm["level"].as<std::string>();
  if (!p.positional.empty()) {
    p.plugins.subcommand = p.positional[0];
    p.plugins.positional.assign(p.positional.begin() + 1, p.positional.end());
  }
  return p;
}

void start_logging(const Parsed& p, const std::string& command,
                   const std::optional<std::string>& global_level,
                   const std::vector<std::string>& argv) {
  keel::init_logging(console_level(p.log_level ? p.log_level : global_level, command));
  std::string line;
  for (const auto& a : argv) line += (line.empty() ? "" : " ") + a;
  spdlog::debug("keel {} (plugin ABI {}.{}, LibTorch {}), pid {}", KEEL_VERSION, KEEL_ABI_MAJOR,
                KEEL_ABI_MINOR, keel::kernel_torch_version(), getpid());
  spdlog::debug("command line: {}", line);
}

void log_registry(const keel::Registry& registry) {
  spdlog::debug("plugins: {} components found", registry.components().size());
  for (const auto& c : registry.components())
    spdlog::debug("  {} {} ({} {}, {})", keel::kind_name(c->kind), c->name,
                  c->plugin->name, c->plugin->version,
                  c->plugin->path);
  for (const auto& r : registry.refusals())
    spdlog::debug("  refused {}: {}", r.path, r.reason);
}

int cmd_run(const std::string& command, const Parsed& p) {
  if (p.positional.empty()) {
    for (const auto& set : p.sets)
      if (set.find('=') == std::string::npos)  // `keel train --set m.toml`
        throw UsageError("--set " + set + ": --set took '" + set + "' as its KEY=VALUE, and "
                         "`keel " + command + "` has no MANIFEST; hint: keel " + command +
                         " MANIFEST --set KEY=VALUE",
                         usage_line(command));
    throw UsageError("keel " + command + ": needs a MANIFEST (a .toml file); hint: keel " +
                         command + " configs/quickstart.toml",
                     usage_line(command));
  }
  if (p.positional.size() > 1)
    throw UsageError(p.positional[1] + ": unexpected argument (`keel " + command +
                         "` takes one MANIFEST); hint: overrides go after --set, e.g. --set "
                         "optimizer.lr=3e-4",
                     usage_line(command));
  const std::string& manifest = p.positional[0];
  if (manifest.empty())
    throw UsageError("keel " + command + ": MANIFEST is an empty string; hint: name a .toml "
                     "file, e.g. keel " + command + " configs/quickstart.toml",
                     usage_line(command));
  std::vector<std::string> sets = p.sets;
  if (command == "evaluate") sets.push_back("run.mode=evaluate");
  const char* verb = command == "train" ? "training" : command == "evaluate" ? "evaluating"
                                                                               : "validating";
  g_activity = std::string("while ") + verb + " " + manifest;

  keel::Registry registry;  // declared first: libraries outlive every instance
  const keel::Manifest m = keel::load_manifest(manifest, sets);
  spdlog::debug("manifest {} read ({} --set override{})", manifest, sets.size(),
                sets.size() == 1 ? "" : "s");
  keel::RunConfig cfg = keel::resolve(m, registry);
  if (p.resume) {
    cfg.resume = p.resume->empty() ? keel::RunConfig::Resume::kLatest : keel::RunConfig::Resume::kPath;
    cfg.resume_path = *p.resume;
    cfg.resume_changed = p.resume_changed;
  }
  cfg.overwrite = p.overwrite;
  log_registry(registry);
  spdlog::debug("run '{}' -> {}", cfg.name, cfg.output_dir);
  if (command != "validate")
    if (const auto launch = keel::detect_launch(); launch && launch->world_size > 1) {
      keel::set_log_rank(launch->rank);
      g_rank_prefix = "rank " + std::to_string(launch->rank) + ": ";
    }

  if (command == "validate") {
    keel::check_run(cfg);
    std::printf("%s: ok (run '%s' -> %s)\n", cfg.manifest_path.c_str(), cfg.name.c_str(),
                cfg.output_dir.c_str());
    return 0;
  }
  g_torch_threads_before = at::get_num_threads();
  g_blas_threads_before = keel::blas_threads();
  keel::apply_process_settings(cfg);
  keel::Trainer trainer(cfg);
  keel::RunSummary s;
  try {
    s = trainer.train();
  } catch (const std::exception& e) {
    // run.log ends with why the run ended (main prints it on stderr itself).
    const auto* c10 = dynamic_cast<const c10::Error*>(&e);
    keel::run_log_only(spdlog::level::err,
                       "run failed: " + one_line(c10 ? c10->what_without_backtrace() : e.what()));
    throw;
  }
  if (cfg.mode == keel::RunMode::kEvaluate)
    spdlog::info("done: evaluation loss {:.4f}{}, run directory {}", s.eval_loss,
                 s.eval_accuracy >= 0 ? fmt::format(", accuracy {:.4f}", s.eval_accuracy) : "",
                 s.run_dir);
  else
    spdlog::info("done: {} steps, {} samples, run directory {}", s.steps, s.samples, s.run_dir);
  if (s.stop_signal) {
    // Documented in the README ("Checkpoints"): 128 + the signal, as a shell reports a process
    // the signal ended, after the checkpoint of the last step was committed.
    spdlog::warn("stopped by {}; continue with: keel train {} --resume",
                 s.stop_signal == SIGTERM ? "SIGTERM" : "SIGINT", manifest);
    return 128 + s.stop_signal;
  }
  return 0;
}

void print_options(const std::string& title, const std::string& description,
                   const keel::Schema& schema) {
  std::printf("%s  (kernel)\n  %s\n", title.c_str(), description.c_str());
  if (schema.empty()) std::printf("  (no keys)\n");
  for (const auto& o : schema)
    std::printf("  %-16s %-34s default %-12s %s\n", o.key, keel::describe(o).c_str(),
                o.default_toml ? o.default_toml : "(required)", o.help ? o.help : "");
}

// Component sections: their keys are the options of the plugin their `type` names.
const std::vector<std::pair<std::string, keel_kind>> kComponentSections = {
    {"model", KEEL_KIND_MODEL},
    {"data", KEEL_KIND_DATASET},
    {"data.train", KEEL_KIND_DATASET},
    {"data.test", KEEL_KIND_DATASET},
    {"optimizer", KEEL_KIND_OPTIMIZER},
    {"lr_scheduler", KEEL_KIND_LR_SCHEDULER},
    {"loss", KEEL_KIND_LOSS},
    {"grad_clipper", KEEL_KIND_GRAD_CLIPPER},
    {"mfu", KEEL_KIND_MFU},
    {"profiler", KEEL_KIND_PROFILER},
    {"checkpoint", KEEL_KIND_CHECKPOINT},
    {"hooks", KEEL_KIND_HOOK},
};

std::string components_of_kind(keel_kind kind) {
  keel::Registry registry;
  registry.discover(keel::plugin_search_path({}));
  std::string names;
  for (const keel::Component* c : registry.of_kind(kind))
    names += (names.empty() ? "" : ", ") + c->name;
  return names.empty() ? "none found" : names;
}

// "[train]" or "[[hooks]]" -> "train" / "hooks".
std::string table_name(std::string s) {
  while (!s.empty() && s.front() == '[') s.erase(0, 1);
  while (!s.empty() && s.back() == ']') s.pop_back();
  return s;
}

int cmd_options(const Parsed& p) {
  if (p.positional.size() > 1)
    throw UsageError(p.positional[1] + ": unexpected argument (`keel options` takes one "
                                       "TABLE); hint: keel options train",
                     usage_line("options"));
  g_activity = "while listing the kernel's options";
  const std::string want = p.positional.empty() ? "" : table_name(p.positional[0]);
  bool found = false;
  bool plugins_table = false;
  for (const auto& t : keel::kernel_tables()) {
    if (std::string(t.name) == "plugins") plugins_table = true;
    if (!want.empty() && want != t.name) continue;
    found = true;
    const std::string name = t.name;
    const std::string title = (name == "hooks" || name == "optimizer.groups")
                                  ? "[[" + name + "]]" : "[" + name + "]";
    print_options(title, t.description, *t.schema);
    if (name == "checkpoint" || name == "hooks")
      std::printf("  (beside these, the options of the plugin `type` names: `keel plugins "
                  "show %s`)\n", name == "checkpoint" ? "safetensors" : "console");
    std::printf("\n");
  }
  if (!plugins_table && (want.empty() || want == "plugins")) {
    found = true;
    std::printf("[plugins]  (kernel)\n  where plugins are searched first, and the versions the "
                "run needs\n");
    std::printf("  %-16s %-34s default %-12s %s\n", "paths", "list of strings", "[]",
                "directories (relative to the manifest; each must exist) searched before "
                "KEEL_PLUGIN_PATH");
    std::printf("  %-16s %-34s default %-12s %s\n", "require", "table of strings", "{}",
                "plugin name = version requirement, e.g. { \"acme-losses\" = \">=1.2, <2\" }: "
                "a missing plugin or another version is an error");
    std::printf("  %-16s %-34s default %-12s %s\n\n", "locked", "bool", "false",
                "true: running without a lock (`keel plugins lock MANIFEST`, here or along the "
                "extends chain) is an error");
  }
  if (found) return 0;
  for (const auto& [section, kind] : kComponentSections)
    if (want == section)
      throw keel::Error(
          "keel options " + want + ": [" + want + "] takes the options of the plugin its " +
          "`type` names, not kernel keys; hint: `keel plugins show NAME` lists them (" +
          keel::kind_name(kind) + "s found: " + components_of_kind(kind) + ")");
  std::vector<std::string> names;
  for (const auto& t : keel::kernel_tables()) names.emplace_back(t.name);
  if (!plugins_table) names.emplace_back("plugins");
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  throw keel::Error("keel options " + p.positional[0] + ": no kernel table named '" + want +
                    "'; hint: " + did_you_mean(want, names) + "tables: " + all +
                    " (`keel options` lists them all)");
}

// keel report RUN_DIR [--output FILE].
int cmd_report(const Parsed& p) {
  g_activity = "while writing the report";
  if (p.positional.size() != 1)
    throw UsageError(p.positional.empty()
                         ? "keel report: needs RUN_DIR (a run directory); hint: keel report "
                           "runs/quickstart"
                         : "keel report: takes one RUN_DIR, got " +
                               std::to_string(p.positional.size()) +
                               " arguments; hint: one run directory per call, --output FILE "
                               "for the page",
                     usage_line("report"));
  const std::string out = keel::report::write_report(p.positional[0], p.plugins.output.value_or(""));
  std::printf("keel report: wrote %s\n", out.c_str());
  return 0;
}

// keel prepare: its argument errors (ArgError) are usage errors with prepare's usage line.
int cmd_prepare(const Parsed& p) {
  g_activity = "while preparing token files";
  try {
    return keel::cli::prepare(p.prepare);
  } catch (const keel::cli::ArgError& e) {
    throw UsageError(e.what(), usage_line("prepare"));
  }
}

using PluginsCommand = int (*)(const keel::cli::PluginsArgs&);
const std::pair<const char*, PluginsCommand> kPluginsCommands[] = {
    {"new", keel::cli::plugins_new},         {"install", keel::cli::plugins_install},
    {"remove", keel::cli::plugins_remove},   {"pack", keel::cli::plugins_pack},
    {"lock", keel::cli::plugins_lock},       {"reference", keel::cli::plugins_reference},
};

int cmd_plugins(const Parsed& p) {
  for (const auto& [name, fn] : kPluginsCommands)
    if (p.plugins.subcommand == name) {
      g_activity = std::string("in keel plugins ") + name;
      return fn(p.plugins);
    }
  p.plugins.only_flags({"prefix", "manifest"});
  g_activity = "while listing plugins";
  const std::vector<std::string>& args = p.positional;
  keel::Registry registry;
  // With --manifest: the run's search path and lock, so that nothing the lock refuses runs.
  std::vector<std::string> searched;
  if (p.plugins.manifest) {
    const keel::Manifest m = keel::load_manifest(*p.plugins.manifest, {});
    const keel::PluginsTable plugins = keel::manifest_plugins(m);
    if (std::optional<keel::Lock> lock = keel::manifest_lock(m, plugins)) {
      std::printf("lock: %s\n", lock->file.c_str());
      registry.use_lock(std::move(*lock));
    }
    searched = keel::plugin_search_path(plugins.dirs, plugins.require);
  } else {
    searched = keel::plugin_search_path({});
  }
  registry.discover(searched);
  log_registry(registry);
  if (!args.empty() && args[0] == "show") {
    if (args.size() == 1)
      throw UsageError("keel plugins show: needs a NAME (a component or plugin); hint: keel "
                       "plugins show adamw",
                       usage_line("plugins"));
    if (args.size() > 2)
      throw UsageError(args[2] + ": unexpected argument (`keel plugins show` takes one NAME); "
                                 "hint: keel plugins show adamw",
                       usage_line("plugins"));
    const std::string& name = args[1];
    g_activity = "while showing plugin " + name;
    bool found = false;
    for (const auto& c : registry.components()) {
      if (c->name != name && c->plugin->name != name && c->qualified_name() != name) continue;
      found = true;
      std::printf("%s %s  (plugin %s %s, %s)\n  %s\n", keel::kind_name(c->kind), c->name.c_str(),
                  c->plugin->name.c_str(), c->plugin->version.c_str(),
                  c->plugin->path.c_str(), c->description.c_str());
      if (c->options.empty()) std::printf("  (no options)\n");
      for (const auto& o : c->options)
        std::printf("  %-16s %-34s default %-12s %s\n", o.key, keel::describe(o).c_str(),
                    o.default_toml ? o.default_toml : "(required)", o.help ? o.help : "");
      std::printf("\n");
    }
    if (found) return 0;
    const std::string table = table_name(name);
    for (const auto& t : keel::kernel_tables())
      if (table == t.name)
        throw keel::Error("keel plugins show " + name + ": no plugin or component named '" +
                          name + "'; hint: [" + table + "] is a kernel table: `keel options " +
                          table + "` lists its keys");
    if (table == "plugins")
      throw keel::Error("keel plugins show " + name + ": no plugin or component named '" + name +
                        "'; hint: [plugins] is a kernel table: `keel options plugins` lists "
                        "its keys");
    for (const auto& [section, kind] : kComponentSections)
      if (table == section)
        throw keel::Error("keel plugins show " + name + ": no plugin or component named '" +
                          name + "'; hint: [" + section + "] names its " + keel::kind_name(kind) +
                          " with `type`: `keel plugins show TYPE` (" + keel::kind_name(kind) +
                          "s found: " + components_of_kind(kind) + ")");
    std::vector<std::string> names;
    for (const auto& c : registry.components()) {
      names.push_back(c->name);
      names.emplace_back(c->plugin->name);
    }
    const std::string refused = registry.refusal_summary();
    throw keel::Error("keel plugins show " + name + ": no plugin or component named '" + name +
                      "'" + (refused.empty() ? "" : " (" + refused + ")") + "; hint: " +
                      did_you_mean(name, names) + "(`keel plugins` lists everything found)");
  }
  if (!args.empty())
    throw UsageError(args[0] + ": unexpected argument to `keel plugins`; hint: " +
                         did_you_mean(args[0], {"show", "new", "install", "remove", "pack", "lock",
                                              "reference"}) +
                         "keel plugins, keel plugins show NAME, or a subcommand (keel plugins "
                         "--help)",
                     usage_line("plugins"));
  std::printf("%-13s %-16s %-18s %-8s %-5s %s\n", "KIND", "NAME", "PLUGIN", "VERSION", "ABI",
              "PATH");
  for (const auto& c : registry.components()) {
    const keel_plugin_descriptor* d = c->plugin->descriptor;
    const std::string abi = std::to_string(d->abi_major) + "." + std::to_string(d->abi_minor);
    std::printf("%-13s %-16s %-18s %-8s %-5s %s\n", keel::kind_name(c->kind), c->name.c_str(),
                c->plugin->name.c_str(), c->plugin->version.c_str(), abi.c_str(),
                c->plugin->path.c_str());
  }
  for (const bool plugins : {true, false}) {
    bool header = false;
    for (const auto& r : registry.refusals()) {
      if (r.is_plugin != plugins) continue;
      if (!header)
        std::printf(plugins ? "\nrefused:\n" : "\nnot plugins (skipped, never loaded):\n");
      header = true;
      std::printf("  %s: %s\n", r.path.c_str(), r.reason.c_str());
    }
  }
  std::printf("\nsearched: ");
  for (const auto& d : searched) std::printf("%s  ", d.c_str());
  std::printf("\n");
  // Installed packages (keel plugins install), every version; the one searched is marked.
  const std::string root = p.plugins.prefix ? *p.plugins.prefix : keel::default_install_root();
  const std::vector<keel::InstalledPackage> installed = keel::list_installed(root);
  std::printf("\ninstalled packages (%s):%s\n", root.c_str(), installed.empty() ? " none" : "");
  for (const auto& pkg : installed) {
    const bool searched_dir =
        std::find(searched.begin(), searched.end(), pkg.dir) != searched.end();
    std::printf("  %-22s %-10s %s  from %s, %s%s\n", pkg.info.name.c_str(),
                pkg.info.version.c_str(), searched_dir ? "(searched)" : "          ",
                pkg.source.empty() ? "?" : pkg.source.c_str(),
                pkg.installed_at.empty() ? "?" : pkg.installed_at.c_str(),
                pkg.problem.empty() ? "" : ("; unusable: " + pkg.problem).c_str());
  }
  return 0;
}

std::vector<std::string> command_names() {
  std::vector<std::string> names;
  for (const auto& c : kCommands) names.emplace_back(c.name);
  return names;
}

[[noreturn]] void unknown_command(const std::string& command) {
  std::string list;
  for (const auto& c : kCommands) list += (list.empty() ? "" : ", ") + std::string(c.name);
  throw UsageError("'" + command + "': unknown command; hint: " +
                       did_you_mean(command, command_names()) + "commands: " + list,
                   usage_line(""));
}

int run(int argc, char** argv) {
  const std::vector<std::string> argv_all(argv, argv + argc);
  const std::vector<std::string> args(argv + 1, argv + argc);
  g_activity = "while parsing the command line";

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
                       usage_line("train"));
  std::vector<std::string> stray;
  const po::variables_map gvm = parse_flags(global_args, "", global, stray);
  if (!stray.empty())
    throw UsageError(stray[0] + ": unexpected argument before the command; hint: keel COMMAND "
                     "[ARGS] [FLAGS]",
                     usage_line(""));
  const bool help = gvm.count("help") > 0;
  const bool version = gvm.count("version") > 0;
  std::optional<std::string> global_level;
  if (gvm.count("log-level")) global_level = gvm["log-level"].as<std::string>();

  if (version) {
    std::printf("keel %s (plugin ABI %d.%d, LibTorch %s)\n", KEEL_VERSION, KEEL_ABI_MAJOR,
                KEEL_ABI_MINOR, keel::kernel_torch_version());
    std::printf("BLAS: %s\n", keel::blas_default_line().c_str());
    return 0;
  }
  if (help && command.empty()) {
    print_main_help();
    return 0;
  }
  if (command.empty())
    throw UsageError("no command given; hint: keel train MANIFEST, e.g. keel train "
                     "configs/quickstart.toml (`keel --help` lists the commands)",
                     usage_line(""));
  if (command == "help") {
    if (rest.empty()) {
      print_main_help();
      return 0;
    }
    if (!find_command(rest[0])) unknown_command(rest[0]);
    print_command_help(rest[0]);
    return 0;
  }
  if (!find_command(command)) unknown_command(command);

  const Parsed p = parse_command(command, rest);
  if (help || p.help) {
    print_command_help(command);
    return 0;
  }
  start_logging(p, command, global_level, argv_all);
  if (command == "plugins") return cmd_plugins(p);
  if (command == "options") return cmd_options(p);
  if (command == "prepare") return cmd_prepare(p);
  if (command == "report") return cmd_report(p);
  return cmd_run(command, p);
}

[[noreturn]] void internal_error(const std::string& what) {
  std::fprintf(stderr,
               "keel: internal error: %s: %s; this is a bug in keel, please report it with the "
               "command line\n",
               g_activity.c_str(), one_line(what).c_str());
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
  if (g_torch_threads_before > 0 && at::get_num_threads() != g_torch_threads_before)
    at::set_num_threads(g_torch_threads_before);
  g_torch_threads_before = -1;
  if (g_blas_threads_before > 0) keel::set_blas_threads(g_blas_threads_before);
  g_blas_threads_before = -1;
  keel::reset_logging();
  g_activity = "while starting";
  g_rank_prefix.clear();
}

}  // namespace

int keel::cli_main(int argc, char** argv) {
  g_activity = "while starting";
  g_rank_prefix.clear();
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
    std::fprintf(stderr, "keel: error: %s\nusage: %s\n", one_line(e.what()).c_str(),
                 e.usage.c_str());
    status = kExitUsage;
  } catch (const keel::cli::ArgError& e) {
    std::fprintf(stderr, "keel: error: %s\nusage: %s\n", one_line(e.what()).c_str(),
                 usage_line("plugins").c_str());
    status = kExitUsage;
  } catch (const keel::Error& e) {
    std::fprintf(stderr, "keel: error: %s%s\n", g_rank_prefix.c_str(), one_line(e.what()).c_str());
    status = kExitError;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "keel: error: out of memory %s; hint: lower batch_size or the model "
                 "size, or free memory\n", g_activity.c_str());
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
