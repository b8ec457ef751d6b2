// `keel --help` and `keel COMMAND --help`, and the column layout of the command line's tables.
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"

namespace keel::cli {
namespace {

// `text` word-wrapped to lines of at most `width` characters, every line after the first
// indented by `indent` spaces (a word longer than a line stands alone).
std::string wrapped(const std::string& text, size_t indent, size_t width) {
  std::istringstream words(text);
  std::string out, line, word;
  const size_t room = width > indent + 20 ? width - indent : 20;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > room) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

// A row of the help's two-column lists: the head (a command and its operands, a flag, or a
// variable) and what it is.
struct HelpRow {
  std::string head, text;
};

// The rows under each other, the texts in one column two spaces after the widest head (at
// least `head` wide, so that several lists can share the column), wrapped to kHelpWidth after
// the commands they name to run name keel as it was run.
std::string help_rows(const std::vector<HelpRow>& rows, size_t head = 0) {
  for (const auto& r : rows) head = std::max(head, r.head.size());
  const size_t column = 2 + head + 2;
  std::string out;
  for (const auto& r : rows)
    out += "  " + r.head + std::string(head - r.head.size() + 2, ' ') +
           wrapped(with_program(r.text), column, kHelpWidth) + "\n";
  return out;
}

// The flags of `d` as help rows, written as the command line takes them: "-h, --help",
// "--set KEY=VALUE", "--resume [PATH]" (a value that may be left out), "--overwrite".
std::vector<HelpRow> flag_rows(const po::options_description& d) {
  std::vector<HelpRow> rows;
  for (const auto& o : d.options()) {
    std::string head;
    const std::string shorter = o->canonical_display_name(po::command_line_style::allow_dash_for_short);
    if (shorter.size() == 2 && shorter[0] == '-') head = shorter + ", ";
    head += "--" + o->long_name();
    const po::value_semantic& value = *o->semantic();
    if (value.max_tokens() > 0)  // name(): the value_name (flags.cpp gives none a default)
      head += value.min_tokens() == 0 ? " [" + value.name() + "]" : " " + value.name();
    rows.push_back({head, o->description()});
  }
  return rows;
}

size_t widest_head(const std::vector<HelpRow>& rows) {
  size_t head = 0;
  for (const auto& r : rows) head = std::max(head, r.head.size());
  return head;
}

}  // namespace

std::string columns(const std::vector<std::vector<std::string>>& rows, const std::string& indent) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (row.size() > width.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// The commands the help names to run name keel as it was run (call_state().program).
void print_main_help() {
  const std::string& keel = call_state().program;
  std::string out = std::string("keel ") + KEEL_VERSION + ": a C++ training runtime on LibTorch, "
                    "built from plugins\n\nusage: " + keel + " COMMAND [ARGS] [FLAGS]\n\n"
                    "commands:\n";
  std::vector<HelpRow> rows;
  for (const Command& c : commands()) {
    const std::string args = c.args;
    rows.push_back({std::string(c.name) + " " + args.substr(0, args.find(" [-")), c.summary});
  }
  out += help_rows(rows);
  // train's own flags (the flags of its table, add_train_flags), then keel's, in one column.
  po::options_description train("train");
  add_train_flags(train);
  const std::vector<HelpRow> train_rows = flag_rows(train);
  const std::vector<HelpRow> own_rows = flag_rows(global_flags());
  const size_t head = std::max(widest_head(train_rows), widest_head(own_rows));
  out += "\nflags of train (`" + keel + " COMMAND --help` lists each command's):\n" +
         help_rows(train_rows, head) +
         "\nflags of keel itself (--log-level and --help also after any command):\n" +
         help_rows(own_rows, head);
  out += "\nenvironment:\n" +
         help_rows({{"KEEL_LOG_LEVEL", "default of --log-level"},
                    {"KEEL_PLUGIN_PATH", "colon-separated directories searched for plugins after "
                                         "a manifest's [plugins] paths, before the installed "
                                         "packages"}});
  out += "\n" + wrapped("exit status: 0 success; 1 bad input or a failed run; 2 command-line "
                        "usage; 70 an internal error (a bug in keel)", 0, kHelpWidth) + "\n";
  std::fputs(out.c_str(), stdout);
}

void print_command_help(const Command& c) {
  std::string out = "usage: " + call_state().program + " " + c.name + " " + c.args + "\n" +
                    wrapped(with_program(c.summary), 0, kHelpWidth) + "\n";
  std::istringstream operands(c.operands);
  for (std::string line; std::getline(operands, line);)
    out += wrapped(with_program(line), 0, kHelpWidth) + "\n";
  if (c.run)  // `help` has no flags
    out += "\nflags:\n" + help_rows(flag_rows(command_flags(c)));
  std::fputs(out.c_str(), stdout);
}

}  // namespace keel::cli
