// keel prepare INPUT --output DIR [--level char|byte] [--documents SEP] (the format:
// prepare.hpp).
#include "prepare.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/usage.hpp"
#include "files/files.hpp"
#include "files/owned_dir.hpp"

namespace fs = std::filesystem;

namespace keel::cli {
namespace {

constexpr uint32_t kCodePoints = 0x110000;

// UTF-8 of one code point (the caller passes a valid one).
std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// The code points of `text`, which must be UTF-8 as RFC 3629 defines it (no overlong forms,
// no surrogates, nothing above U+10FFFF); the first bad byte is an error naming its offset.
std::vector<uint32_t> decode_utf8(const std::string& text, const std::string& path) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned b = s[i];
    size_t len = 0;
    uint32_t cp = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the second byte's range
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2, cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3, cp = b & 0x0F;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4, cp = b & 0x07;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    }
    size_t bad = i;  // the offending byte's offset
    bool ok = len > 0;
    for (size_t k = 1; ok && k < len; ++k) {
      bad = i + k;
      const unsigned c = bad < n ? s[bad] : 0;
      ok = bad < n && c >= (k == 1 ? lo : 0x80u) && c <= (k == 1 ? hi : 0xBFu);
      cp = cp << 6 | (c & 0x3F);
    }
    if (!ok) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02X", bad < n ? s[bad] : 0u);
      throw Error(path + ": invalid UTF-8 at byte offset " + std::to_string(bad) +
                  (bad < n ? std::string(" (byte ") + byte + ")" : " (the text ends inside a "
                                                                   "character)") +
                  "; hint: use --level byte for text that is not UTF-8");
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_id(std::string& out, uint32_t id, int bytes) {
  out += static_cast<char>(id & 0xFF);
  out += static_cast<char>((id >> 8) & 0xFF);
  if (bytes == 4) {
    out += static_cast<char>((id >> 16) & 0xFF);
    out += static_cast<char>((id >> 24) & 0xFF);
  }
}

// The level --level names ("char" when not given), after checking the arguments.
std::string checked_level(const PrepareArgs& args) {
  const std::string example = "keel prepare input.txt --output data/";
  if (args.positional.empty())
    throw UsageError("keel prepare: needs an INPUT text file; hint: " + example, "prepare");
  if (args.positional.size() > 1)
    throw UsageError(args.positional[1] + ": unexpected argument (`keel prepare` takes one INPUT); "
                     "hint: " + example, "prepare");
  if (!args.output || args.output->empty())
    throw UsageError("keel prepare: needs --output DIR (where tokens.bin and vocab.json go); "
                     "hint: " + example, "prepare");
  const std::string level = args.level ? *args.level : "char";
  if (level != "char" && level != "byte")
    throw UsageError("--level " + level + ": not a level; hint: use --level char (one token per "
                     "UTF-8 character) or --level byte (one per byte)", "prepare");
  return level;
}

// --documents' SEP with its escapes read (\n, \t, \\); empty or a bad escape: UsageError.
std::string separator_of(const std::string& given) {
  std::string out;
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i] != '\\') {
      out += given[i];
      continue;
    }
    const char next = i + 1 < given.size() ? given[i + 1] : '\0';
    if (next != 'n' && next != 't' && next != '\\')
      throw UsageError("--documents: a backslash at offset " + std::to_string(i) + " is not \\n, "
                       "\\t or \\\\; hint: write a newline as \\n (e.g. --documents '\\n%\\n')",
                       "prepare");
    out += next == 'n' ? '\n' : next == 't' ? '\t' : '\\';
    ++i;
  }
  if (out.empty())
    throw UsageError("--documents: the separator is empty; hint: give the text between "
                     "documents, e.g. --documents '\\n%\\n'", "prepare");
  return out;
}

// `text` cut at every `sep`; the empty pieces left out.
std::vector<std::string> documents_of(const std::string& text, const std::string& sep) {
  std::vector<std::string> out;
  for (size_t at = 0;;) {
    const size_t next = text.find(sep, at);
    const std::string piece = text.substr(at, next == std::string::npos ? next : next - at);
    if (!piece.empty()) out.push_back(piece);
    if (next == std::string::npos) break;
    at = next + sep.size();
  }
  return out;
}

// The text of the file `input`, which must be a regular file and not empty.
std::string read_input(const std::string& input) {
  struct stat st {};
  if (::stat(input.c_str(), &st) != 0)
    throw Error(input + ": cannot open the text file (" + std::strerror(errno) +
                "); hint: check the path");
  if (!S_ISREG(st.st_mode))
    throw Error(input + ": is " + (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file") +
                "; hint: name a text file");
  std::string text =
      add_hint([&] { return read_file(input); }, [](int) { return "check its permissions"; });
  if (text.empty())
    throw Error(input + ": is empty, so there are no tokens to write; hint: name a non-empty "
                "text file");
  return text;
}

struct Tokens {
  std::vector<uint32_t> ids;
  nlohmann::ordered_json vocab = nlohmann::ordered_json::array();  // the text of each id
};

// `text` (read from `input`) as ids: one per byte (a vocabulary of all 256), or one per
// character (a vocabulary of the characters it holds, by code point).
Tokens tokenize(const std::string& text, const std::string& level, const std::string& input) {
  Tokens t;
  if (level == "byte") {
    t.ids.assign(reinterpret_cast<const unsigned char*>(text.data()),
                 reinterpret_cast<const unsigned char*>(text.data()) + text.size());
    for (uint32_t b = 0; b < 256; ++b) t.vocab.push_back(utf8(b));
    return t;
  }
  t.ids = decode_utf8(text, input);
  std::vector<uint32_t> id_of(kCodePoints, 0);
  std::vector<char> seen(kCodePoints, 0);
  for (const uint32_t cp : t.ids) seen[cp] = 1;
  uint32_t next = 0;
  for (uint32_t cp = 0; cp < kCodePoints; ++cp)
    if (seen[cp]) {
      id_of[cp] = next++;
      t.vocab.push_back(utf8(cp));
    }
  for (uint32_t& id : t.ids) id = id_of[id];
  return t;
}

}  // namespace

int prepare(const PrepareArgs& args) {
  const std::string level = checked_level(args);
  const std::optional<std::string> sep =
      args.documents ? std::optional<std::string>(separator_of(*args.documents)) : std::nullopt;
  const std::string& input = args.positional[0];
  const std::string& dir = *args.output;
  const std::string text = read_input(input);

  // Ids and vocabulary; with --documents, of the documents' text, each then ended by the
  // separator's own id.
  std::vector<std::string> documents;
  if (sep) {
    documents = documents_of(text, *sep);
    if (documents.empty())
      throw Error(input + ": holds no document between the separators given with --documents; "
                  "hint: check the separator (escapes: \\n, \\t, \\\\)");
  }
  std::string joined;
  for (const std::string& d : documents) joined += d;
  Tokens tokens = tokenize(sep ? joined : text, level, input);
  if (sep) {
    const auto separator = static_cast<uint32_t>(tokens.vocab.size());
    tokens.vocab.push_back(*sep);
    std::vector<uint32_t> ended;
    ended.reserve(tokens.ids.size() + documents.size());
    size_t at = 0;
    for (const std::string& d : documents) {
      // Its ids: one per byte, or per character (the bytes that do not continue one: the text
      // was decoded, and so checked, whole by tokenize).
      const size_t n = level == "byte" ? d.size()
                                       : static_cast<size_t>(std::count_if(
                                             d.begin(), d.end(), [](char c) {
                                               return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
                                             }));
      ended.insert(ended.end(), tokens.ids.begin() + static_cast<std::ptrdiff_t>(at),
                   tokens.ids.begin() + static_cast<std::ptrdiff_t>(at + n));
      ended.push_back(separator);
      at += n;
    }
    tokens.ids = std::move(ended);
  }
  const std::vector<uint32_t>& ids = tokens.ids;
  const size_t size = tokens.vocab.size();
  const int bytes = size <= 65536 ? 2 : 4;
  const std::string dtype = bytes == 2 ? "uint16" : "uint32";
  std::string data;
  data.reserve(ids.size() * static_cast<size_t>(bytes));
  for (const uint32_t id : ids) append_id(data, id, bytes);

  nlohmann::ordered_json meta;
  meta["format"] = "keel-tokens";
  meta["version"] = 1;
  meta["level"] = level;
  meta["dtype"] = dtype;
  meta["size"] = size;
  meta["tokens"] = ids.size();
  meta["vocab"] = std::move(tokens.vocab);
  if (sep) {
    meta["documents"] = documents.size();
    meta["separator"] = size - 1;
  }

  // The output directory under a run directory's rules (files/owned_dir.hpp): created when missing,
  // not a symlink, yours, and others cannot write it (or it is sticky) nor a directory on the
  // way to it; each file is written into a new temporary file there (O_EXCL, O_NOFOLLOW),
  // fsync'd and renamed over its name (a symlink of that name is replaced, not followed). A
  // failure removes the directories it created.
  DirUse use;
  use.what = "output directory";
  use.flag = "--output";
  use.sticky_ok = true;
  CreatedEntries created;
  std::string tokens_path, vocab_path;
  try {
    const OwnedDir out =
        OwnedDir::open(fs::absolute(dir).lexically_normal().string(), created, use);
    tokens_path = out.path_of("tokens.bin");
    vocab_path = out.path_of("vocab.json");
    out.write_file("tokens.bin", data, created);
    out.write_file("vocab.json", meta.dump(1) + "\n", created);
  } catch (const Error&) {
    created.remove_all();
    throw;
  }
  const std::string in_documents =
      sep ? " in " + std::to_string(documents.size()) + " documents (separator id " +
                std::to_string(size - 1) + ")"
          : "";
  std::printf("%s: %zu tokens%s, vocabulary of %zu (%s level), %s -> %s, %s\n", input.c_str(),
              ids.size(), in_documents.c_str(), size, level.c_str(), dtype.c_str(),
              tokens_path.c_str(), vocab_path.c_str());
  return 0;
}

}  // namespace keel::cli
