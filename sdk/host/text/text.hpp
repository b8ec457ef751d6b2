// Text for messages, in one place: the closest match and "did you mean", lists joined, one
// line, a place in a TOML file, a number, a shell word. (A tensor's shape as text is keel::text::shape in the
// SDK's keel/tensor.hpp, for the plugins too.) LibTorch-free.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

namespace keel::text {

// The candidate closest to `word`, case aside: one equal to it but for case ("adamW":
// adamw); else one that is its initials or whose initials it is, the parts of a name being
// separated by '_' or '-' ("learning_rate": lr, "wd": weight_decay); else the closest by optimal
// string alignment distance (insertions, deletions, substitutions and transpositions of two
// adjacent characters cost 1 each: "mpl" is 1 from "mlp", 2 from "gpt"), or "" when none is
// within max(2, size of word / 3) edits. The first candidate wins a tie.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// "did you mean 'x'? " naming the closest candidate, with a trailing space to go before the
// rest of a hint; "" when none is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// "did you mean 'x'?" naming the closest candidate (between two `quote` characters), or
// `otherwise` when none is close.
std::string did_you_mean_or(const std::string& word, const std::vector<std::string>& candidates,
                            const std::string& otherwise, char quote = '\'');

// The items of `range`, each formatted with "{}", with `sep` between them.
template <class Range>
std::string join(const Range& range, fmt::string_view sep = ", ") {
  return fmt::format("{}", fmt::join(range, sep));
}

// `s` on one line (a message of a plugin's, LibTorch's): each run of line breaks and tabs
// becomes one space, none at the start or the end.
std::string one_line(const std::string& s);

// `s` safe to show on a terminal, one line: each byte that is a control character (below 0x20,
// 0x7f), each C1 control written in UTF-8 (U+0080 to U+009F) and each byte that does not belong
// to a valid UTF-8 sequence becomes "\xNN" (a NUL too, so that nothing cuts the line); a
// backslash stays as it is. For bytes from data (a field, a file name) in a message.
std::string printable(const std::string& s);

// "path:line:col" of a place in a TOML file (a toml::source_region, or anything with
// begin.line and begin.column), or `path` alone when the place has no line.
template <class Region>
std::string located(const std::string& path, const Region& region) {
  if (region.begin.line == 0) return path;
  return path + ":" + std::to_string(region.begin.line) + ":" +
         std::to_string(region.begin.column);
}

// A number as the shortest text that reads back the same ("0.1", "3", "1e-08"), and "nan".
std::string number(double v);

// `word` as one shell word in a command a message tells the user to run: as it is when it is
// not empty and holds only characters no shell treats specially (letters, digits and
// `_-.,/:=+@%`), else in single quotes, a ' inside written '\''.
std::string shell_word(const std::string& word);

}  // namespace keel::text
