// The table of keel's commands (commands.hpp), and the small ones: report, prepare and export's
// call of export.cpp.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "report/report.hpp"
#include "text/text.hpp"

namespace keel::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"train",
       "MANIFEST [--resume [PATH]] [--resume-changed] [--overwrite] [--set KEY=VALUE]... "
       "[--log-level LEVEL]",
       "train the run a manifest describes, or continue it from a checkpoint",
       "MANIFEST: a TOML file (docs/manifest.md); `keel options` and `keel plugins show "
       "NAME` list the keys of each table",
       add_train_flags, run_manifest_command},
      {"evaluate", "MANIFEST [--set KEY=VALUE]... [--log-level LEVEL]",
       "evaluate [data.test] and each [data.eval.NAME] with the weights of [checkpoint] "
       "init_from, else of the run's newest "
       "verified checkpoint",
       "MANIFEST: a TOML file (docs/manifest.md); `keel options` and `keel plugins show "
       "NAME` list the keys of each table\n(the same as train with --set run.mode=evaluate; "
       "without init_from it evaluates the newest checkpoint of [run] output_dir that verifies, "
       "and refuses when there is none)",
       add_set_flag, run_manifest_command},
      // --format after --output: `keel --help` shows the arguments before the first " [-".
      {"export",
       "RUN_DIR|CHECKPOINT [--output DIR] [--since CHECKPOINT] --format safetensors "
       "[--since-any-run] [--weights-from LABEL] [--plugins DIR]... [--log-level LEVEL]",
       "write a checkpoint's model weights (--format safetensors) as one float32 "
       "model.safetensors, under Hugging Face names with a config.json when the model offers "
       "them (gpt: GPT2LMHeadModel)",
       "RUN_DIR|CHECKPOINT: a run directory (its newest verified checkpoint) or a checkpoint "
       "directory (runs/<name>/checkpoints/step-<N>)\nDIR: a new directory (default "
       "RUN/exports/<checkpoint>, or <checkpoint>-export outside a run's checkpoints/); an "
       "existing one is refused; docs/checkpoints.md, \"Export\"",
       add_export_flags, export_command},
      // validate takes train's flags: it checks what `keel train` with the same flags would
      // do before step 1 (a run directory with an earlier run's records is refused without
      // --resume or --overwrite, a --resume checkpoint is read and checked).
      {"validate",
       "MANIFEST [--resume [PATH]] [--resume-changed] [--overwrite] [--set KEY=VALUE]... "
       "[--log-level LEVEL]",
       "everything train checks before step 1 (options, plugins, data, the run directory, the "
       "checkpoint it starts from), without training",
       "MANIFEST: a TOML file (docs/manifest.md); `keel options` and `keel plugins show "
       "NAME` list the keys of each table\n(--resume and --overwrite: what `keel train` with "
       "them would check; nothing is written)",
       add_train_flags, run_manifest_command},
      {"plugins",
       "[show NAME] [--manifest MANIFEST] | new NAME --kind KIND [--lang c|cpp] DIR | install "
       "PACKAGE [--prefix DIR] [--force] | remove NAME[@VERSION] [--prefix DIR] | pack BUILD_DIR "
       "[--output FILE] | lock MANIFEST [--update NAME]... | reference] [--log-level LEVEL]",
       "the plugins found and refused, one component's options, or make, pack, install, remove "
       "and lock plugin packages",
       "NAME: a component (adamw, mlp, ...) or a plugin (keel-optimizers, ...)",
       add_plugins_flags, plugins_command},
      {"options", "[TABLE] [--log-level LEVEL]",
       "every key of the kernel's own tables ([run], [train], ...), or of one",
       "TABLE: run, train, distributed, checkpoint, hooks, optimizer.groups, plugins (all when "
       "left out)",
       nullptr, options_command},
      {"prepare", "INPUT --output DIR [--level char|byte] [--documents SEP] [--log-level LEVEL]",
       "tokenize a text file into DIR/tokens.bin and DIR/vocab.json for the tokens dataset",
       "INPUT: a text file; the files' format: docs/language-model.md, \"Preparing token files\"",
       add_prepare_flags, prepare_command},
      {"report", "RUN_DIR [--output FILE] [--log-level LEVEL]",
       "write one self-contained HTML page of a run's summary, metrics, phases, manifest and "
       "plugins",
       "RUN_DIR: the run directory of `keel train` ([run] output_dir); the page: docs/cli.md, \"Run "
       "report\"",
       add_report_flags, report_command},
      {"help", "[COMMAND]", "this help, or a command's", "", nullptr, nullptr},
  };
  return table;
}

const Command* find_command(const std::string& name) {
  for (const Command& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

std::vector<std::string> command_names() {
  std::vector<std::string> names;
  for (const Command& c : commands()) names.emplace_back(c.name);
  return names;
}

std::string usage_line(const std::string& command) {
  const std::string& keel = call_state().program;
  if (const Command* c = find_command(command))
    return keel + " " + c->name + " " + c->args + "  (`" + keel + " " + c->name +
           " --help` for more)";
  return keel + " COMMAND [ARGS] [FLAGS], COMMAND one of " + text::join(command_names()) +
         "  (`" + keel + " --help` for more)";
}

// keel report RUN_DIR [--output FILE].
int report_command(const std::string& name, const Parsed& p) {
  call_state().activity = "while writing the report";
  if (p.positional.size() != 1)
    throw UsageError(p.positional.empty()
                         ? "keel report: needs RUN_DIR (a run directory); hint: keel report "
                           "runs/quickstart"
                         : "keel report: takes one RUN_DIR, got " +
                               std::to_string(p.positional.size()) +
                               " arguments; hint: one run directory per call, --output FILE "
                               "for the page",
                     name);
  const std::string out = report::write_report(p.positional[0], p.plugins.output.value_or(""));
  std::printf("keel report: wrote %s\n", out.c_str());
  return 0;
}

// keel export RUN_DIR|CHECKPOINT --format safetensors [--output DIR] [--since CHECKPOINT] (export.hpp).
int export_command(const std::string&, const Parsed& p) {
  call_state().activity = "while exporting " + (p.positional.empty() ? "" : p.positional[0]);
  return export_checkpoint(p.exporting);
}

// keel prepare INPUT --output DIR (prepare.hpp).
int prepare_command(const std::string&, const Parsed& p) {
  call_state().activity = "while preparing token files";
  return prepare(p.prepare);
}

}  // namespace keel::cli
