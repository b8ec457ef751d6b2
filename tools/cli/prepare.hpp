// keel prepare INPUT --output DIR [--level char|byte]: tokenizes a text file for the `tokens`
// dataset (plugins/tokens/tokens.cpp).
//
// It writes two files into DIR (created when missing; existing files of these names are
// replaced):
//   tokens.bin  the token ids, one per character (char level) or byte (byte level) of INPUT,
//               in order: raw little-endian uint16 when the vocabulary has at most 65536 ids,
//               else uint32; no header (nanoGPT's train.bin layout).
//   vocab.json  {"format": "keel-tokens", "version": 1,
//                "level": "char" | "byte",
//                "dtype": "uint16" | "uint32",       the ids' type in tokens.bin
//                "size": V,                          ids are 0 .. V - 1
//                "tokens": N,                        ids in tokens.bin (its size / 2 or / 4)
//                "vocab": [V strings],               id i stands for vocab[i]
//                "documents": D, "separator": S}     with --documents only (below)
//   Char level: vocab holds the distinct Unicode code points of INPUT, one per string, sorted by
//   code point; INPUT must be valid UTF-8 (else an error names the first bad byte's offset).
//   Byte level: V = 256 and id i is byte value i; vocab[i] is the one-character string of code
//   point i (its Latin-1 reading), so that at either level the code point of vocab[i] decodes
//   id i: the character itself, or the byte's value.
// --documents SEP: INPUT is documents separated by the text SEP ("\n", "\t" and "\\" in SEP read
//   as a newline, a tab and a backslash; any other backslash is an error). The documents are
//   the text between separators (empty ones, such as before a leading SEP, are left out), and
//   tokens.bin holds each document's ids followed by the separator id S = V - 1, an id of its
//   own after the documents' vocabulary, whose vocab string is SEP itself (at byte level too,
//   where it is SEP's text, not one byte), so decoding every id gives back the documents, each
//   followed by SEP. The tokens dataset's pack_documents reads
//   S from "separator" when its own separator option is not set.
// DIR gets a run directory's rules (files/owned_dir.hpp, OwnedDir::open with DirUse::sticky_ok):
// created when missing, not a symlink, yours, and neither it nor a directory on the way is writable by
// others unless sticky. Each file is written under a new temporary name in DIR (O_EXCL,
// O_NOFOLLOW), fsync'd, and renamed over its final name (OwnedDir::write_file: a symlink of that
// name is replaced, not followed); tokens.bin comes first, vocab.json last. A failure removes the
// temporary file and the directories prepare created, and leaves earlier files as they were. On success it prints one line: tokens,
// vocabulary size, dtype and the two paths.
//
// A missing INPUT or --output, an extra argument, a --level other than char or byte, or an empty
// or badly escaped --documents throws UsageError (usage.hpp: exit 2 with prepare's usage line);
// an unreadable or empty INPUT, invalid UTF-8 at char level, INPUT without a document, or a
// failed write throws keel::Error (exit 1).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace keel::cli {

struct PrepareArgs {
  std::vector<std::string> positional;  // INPUT
  std::optional<std::string> output;    // --output, -o
  std::optional<std::string> level;     // --level (default char)
  std::optional<std::string> documents;  // --documents SEP, as given (escapes not yet read)
};

int prepare(const PrepareArgs& args);

}  // namespace keel::cli
