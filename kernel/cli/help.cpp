// `keel --help` and `keel COMMAND --help`, and the column layout of the command line's tables.
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

// A row of the help's two-column lists: the head (a command and its operands, or a variable)
// and what it is.
struct HelpRow {
  std::string head, text;
};

// The rows under each other, the texts in one column two spaces after the widest head,
// wrapped to kHelpWidth.
void print_help_rows(const std::vector<HelpRow>& rows) {
  size_t head = 0;
  for (const auto& r : rows) head = std::max(head, r.head.size());
  const size_t column = 2 + head + 2;
  for (const auto& r : rows)
    std::printf("  %-*s  %s\n", static_cast<int>(head), r.head.c_str(),
                wrapped(r.text, column, kHelpWidth).c_str());
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

void print_main_help() {
  std::printf("keel %s: a C++ training runtime on LibTorch, built from plugins\n\n", KEEL_VERSION);
  std::printf("usage: keel COMMAND [ARGS] [FLAGS]\n\ncommands:\n");
  std::vector<HelpRow> rows;
  for (const Command& c : commands()) {
    const std::string args = c.args;
    rows.push_back({std::string(c.name) + " " + args.substr(0, args.find(" [-")), c.summary});
  }
  print_help_rows(rows);
  std::ostringstream flags;
  flags << global_flags();
  std::printf("\n%s", flags.str().c_str());
  std::printf("\nenvironment:\n");
  print_help_rows({{"KEEL_LOG_LEVEL", "default of --log-level"},
                   {"KEEL_PLUGIN_PATH", "colon-separated directories searched for plugins after a "
                                       "manifest's [plugins] paths, before the installed packages"}});
  std::printf("\n%s\n",
              wrapped("exit status: 0 success; 1 bad input or a failed run; 2 command-line usage; "
                      "70 an internal error (a bug in keel)",
                      0, kHelpWidth)
                  .c_str());
}

void print_command_help(const Command& c) {
  std::printf("usage: keel %s %s\n%s\n", c.name, c.args,
              wrapped(c.summary, 0, kHelpWidth).c_str());
  std::istringstream operands(c.operands);
  for (std::string line; std::getline(operands, line);)
    std::printf("%s\n", wrapped(line, 0, kHelpWidth).c_str());
  if (!c.run) return;  // `help` has no flags
  std::ostringstream flags;
  flags << command_flags(c);
  std::printf("\n%s", flags.str().c_str());
}

}  // namespace keel::cli
