// The command line's flags: which command takes which (command_flags), and their parse into
// Parsed (commands.hpp), program_options' errors made usage errors.
#include <spdlog/spdlog.h>

#include <boost/program_options.hpp>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "log.hpp"
#include "text/text.hpp"

namespace keel::cli {
namespace {

std::vector<std::string> flag_names(const po::options_description& d) {
  std::vector<std::string> names;
  for (const auto& o : d.options()) {
    names.push_back("--" + o->long_name());
    const std::string s = o->canonical_display_name(po::command_line_style::allow_dash_for_short);
    if (s.size() == 2 && s[0] == '-') names.push_back(s);
  }
  return names;
}

}  // namespace

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
  add_log_level_flag(d);
  d.add_options()("help,h", "show this help; `keel COMMAND --help` shows a command's")(
      "version", "print keel's version, its plugin ABI and LibTorch version");
  return d;
}

void add_train_flags(po::options_description& d) {
  add_set_flag(d);
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
}

void add_plugins_flags(po::options_description& d) {
  d.add_options()("kind", po::value<std::string>()->value_name("KIND"),
                  "new: the kind of the component to write (model, dataset, optimizer, "
                  "lr_scheduler, loss, grad_clipper, mfu, profiler, checkpoint, hook)")(
      "lang", po::value<std::string>()->value_name("LANG"), "new: c or cpp (default cpp)")(
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
}

void add_report_flags(po::options_description& d) {
  d.add_options()("output,o", po::value<std::string>()->value_name("FILE"),
                  "the HTML file to write (default RUN_DIR/report.html)");
}

void add_prepare_flags(po::options_description& d) {
  d.add_options()("output,o", po::value<std::string>()->value_name("DIR"),
                  "the directory to write tokens.bin and vocab.json into (created when "
                  "missing)")(
      "level", po::value<std::string>()->value_name("LEVEL"),
      "char: one token per UTF-8 character (the default); byte: one per byte")(
      "documents", po::value<std::string>()->value_name("SEP"),
      "INPUT holds documents separated by the text SEP (\\n, \\t and \\\\ read as a newline, a "
      "tab and a backslash): each document is written followed by one separator id, a token "
      "of its own that vocab.json names (for the tokens dataset's pack_documents)");
}

void add_export_flags(po::options_description& d) {
  d.add_options()("format", po::value<std::string>()->value_name("FORMAT"),
                  "safetensors (the only one, and required): DIR/model.safetensors, floating-point "
                  "tensors as float32")(
      "output,o", po::value<std::string>()->value_name("DIR"),
      "the directory to create (it must not exist; default RUN/exports/<checkpoint>)")(
      "since", po::value<std::string>()->value_name("CHECKPOINT"),
      "sparse tables: write only the rows changed since this older checkpoint "
      "(tables.delta.safetensors) instead of every row (tables.safetensors)")(
      "since-any-run",
      "--since may name a checkpoint of another run (its tables must still be the same)")(
      "weights-from", po::value<std::string>()->value_name("LABEL"),
      "export the copy of the model's weights that the hook labelled LABEL keeps in the "
      "checkpoint (the ema hook's average: --weights-from ema) instead of the model's own")(
      "plugins", po::value<std::vector<std::string>>()->value_name("DIR"),
      "also search DIR for plugins (repeatable; the checkpoint's own [plugins] paths are never "
      "searched)");
}

po::options_description command_flags(const Command& c) {
  po::options_description d("flags", kHelpWidth);
  if (c.add_flags) c.add_flags(d);
  add_log_level_flag(d);
  d.add_options()("help,h", "show this help");
  return d;
}

po::variables_map parse_flags(const std::vector<std::string>& args, const std::string& command,
                              const po::options_description& visible,
                              std::vector<std::string>& positional) {
  po::options_description all;
  all.add(visible);
  all.add_options()("positional", po::value<std::vector<std::string>>());
  po::positional_options_description pos;
  pos.add("positional", -1);
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
    std::string hint = text::did_you_mean(flag, flag_names(visible));
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
                     command);
  } catch (const po::invalid_command_line_syntax& e) {
    const std::string flag = e.get_option_name();
    if (e.kind() == po::invalid_syntax::missing_parameter) {
      std::string shape = flag + " VALUE (" + help + ")";
      if (flag == "--set") shape = "--set KEY=VALUE, e.g. --set optimizer.lr=3e-4";
      else if (flag == "--log-level") shape = flag + " LEVEL, LEVEL one of " + log_level_names();
      else if (const po::option_description* o = visible.find_nothrow(flag.substr(2), false))
        shape = flag + " " + o->semantic()->name() + " (" + help + ")";
      throw UsageError(flag + ": needs a value; hint: " + shape, command);
    }
    if (e.kind() == po::invalid_syntax::extra_parameter)
      throw UsageError(flag + ": takes no value; hint: " + help, command);
    throw UsageError(flag + ": malformed flag; hint: " + help, command);
  } catch (const po::multiple_occurrences& e) {
    throw UsageError(e.get_option_name() + ": given more than once; hint: give it once", command);
  } catch (const po::error& e) {
    throw UsageError(keel_command + ": " + e.what() + "; hint: " + help, command);
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
  if (const auto level = parse_log_level(value)) return *level;
  throw UsageError(where + ": not a log level; hint: " + text::did_you_mean(value, names) +
                       "use one of " + log_level_names(),
                   command);
}

Parsed parse_command(const Command& c, const std::vector<std::string>& args) {
  const std::string command = c.name;
  Parsed p;
  const po::variables_map vm = parse_flags(args, command, command_flags(c), p.positional);
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
                     command);
  if (p.resume_changed && !p.resume)
    throw UsageError("--resume-changed: only applies with --resume; hint: keel train MANIFEST "
                     "--resume --resume-changed", command);
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
  if (vm.count("documents")) p.prepare.documents = vm["documents"].as<std::string>();
  p.exporting.positional = p.positional;
  p.exporting.output = p.plugins.output;
  if (vm.count("format")) p.exporting.format = vm["format"].as<std::string>();
  if (vm.count("since")) p.exporting.since = vm["since"].as<std::string>();
  p.exporting.since_any_run = vm.count("since-any-run") > 0;
  if (vm.count("weights-from")) p.exporting.weights_from = vm["weights-from"].as<std::string>();
  if (vm.count("plugins"))
    p.exporting.plugin_dirs = vm["plugins"].as<std::vector<std::string>>();
  if (!p.positional.empty()) {
    p.plugins.subcommand = p.positional[0];
    p.plugins.positional.assign(p.positional.begin() + 1, p.positional.end());
  }
  return p;
}

}  // namespace keel::cli
