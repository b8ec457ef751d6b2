// What an evaluation set's name may be. The name is the split of its records (METRICS events,
// metrics.jsonl, the csv sink's metrics_NAME.csv, keep_best's "<split>.<key>"), so it is kept
// to characters that are safe in a file name and free of the '.' that separates the key.
#pragma once

#include <string>

namespace keel {

// The rule, as messages state it.
inline constexpr const char* kSplitNameRule =
    "a letter, then letters, digits, '_' or '-', at most 64 bytes";

// Whether `name` follows kSplitNameRule.
inline bool valid_split_name(const std::string& name) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (name.empty() || name.size() > 64 || !letter(name[0])) return false;
  for (char c : name)
    if (!letter(c) && !(c >= '0' && c <= '9') && c != '_' && c != '-') return false;
  return true;
}

}  // namespace keel
