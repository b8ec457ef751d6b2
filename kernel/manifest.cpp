#include "manifest.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>

#include "error.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

// A manifest is a small text file; anything larger is not one (and is not read into memory).
constexpr off_t kMaxManifestBytes = 16 << 20;

// ---------------------------------------------------------------------------------------------
// Reading files: regular files only, checked with stat before opening (a FIFO would block the
// open, a device could be endless), and once more on the open descriptor.

std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// `where`: the place that names the file ("" for the command line: then the path itself is the
// place). `what`: how that place names it, e.g. `extends = "base.toml"`.
[[noreturn]] void file_error(const std::string& where_, const std::string& what,
                             const fs::path& file, const std::string& problem,
                             const std::string& hint) {
  if (where_.empty()) throw Error(file.string() + ": " + problem + "; hint: " + hint);
  throw Error(where_ + ": " + what + ": " + file.string() + " " + problem + "; hint: " + hint);
}

std::string read_regular_file(const fs::path& file, const std::string& where_,
                              const std::string& what, const std::string& relative_to) {
  const std::string not_found_hint =
      where_.empty() ? "check the path (relative paths start from the working directory)"
                     : "the path is relative to the directory of " + relative_to;
  struct stat st{};
  if (::stat(file.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      if (where_.empty()) file_error("", "", file, "manifest not found", not_found_hint);
      file_error(where_, what, file, "not found", not_found_hint);
    }
    file_error(where_, what, file, std::string("cannot be read: ") + std::strerror(err),
               "check the path and its permissions");
  }
  if (!S_ISREG(st.st_mode))
    file_error(where_, what, file, "is " + file_kind(st.st_mode) + ", not a manifest file",
               "name a regular .toml file");
  if (st.st_size > kMaxManifestBytes)
    file_error(where_, what, file,
               fmt::format("is {} MiB, too large for a manifest", st.st_size / (1 << 20)),
               "a manifest is a small TOML file; check the path");
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    file_error(where_, what, file, std::string("cannot be read: ") + std::strerror(err),
               err == EACCES ? "make the file readable (chmod a+r) or run as its owner"
                             : "check the path and its permissions");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))  // replaced since the stat above
    file_error(where_, what, file, "is not a regular file", "name a regular .toml file");
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      file_error(where_, what, file, std::string("cannot be read: ") + std::strerror(err),
                 "check the file");
    }
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > static_cast<size_t>(kMaxManifestBytes))
      file_error(where_, what, file, "is too large for a manifest", "check the path");
  }
  return text;
}

std::string toml_hint(const std::string& description) {
  if (description.find("redefin") != std::string::npos ||
      description.find("already") != std::string::npos)
    return "each key and each [table] may appear once in a file; merge the two";
  if (description.find("UTF-8") != std::string::npos ||
      description.find("utf-8") != std::string::npos ||
      description.find("codepoint") != std::string::npos)
    return "a manifest is UTF-8 text; check that the path names the .toml file";
  return "fix the TOML syntax there: strings are quoted (name = \"x\"), lists are [1, 2], "
         "tables are [name] and arrays of tables [[name]] (see toml.io)";
}

// ---------------------------------------------------------------------------------------------
// extends

// A component table whose `type` the overlay changes is replaced whole: options of the
// base's plugin mean nothing to another plugin.
bool changes_type(const toml::table& base, const toml::table& overlay) {
  const toml::node* a = base.get("type");
  const toml::node* b = overlay.get("type");
  return a && b && a->is_string() && b->is_string() &&
         a->as_string()->get() != b->as_string()->get();
}

// "console, jsonl": the `type` of each table of `a` ("?" for a table without one).
std::string types_of(const toml::array& a) {
  std::string out;
  for (const toml::node& e : a) {
    const toml::node* type = e.is_table() ? e.as_table()->get("type") : nullptr;
    out += (out.empty() ? "" : ", ") +
           (type && type->is_string() ? type->as_string()->get() : std::string("?"));
  }
  return out;
}

// Moves `overlay` into `base`: tables merge key by key, anything else replaces (an array too,
// an array of tables included: each replaced array of tables is recorded in `replaced`).
// `prefix`: the dotted key of `base` ("" for the root, else ending with '.').
void merge(toml::table& base, toml::table& overlay, const std::string& prefix,
           std::vector<Manifest::Replaced>& replaced) {
  for (auto&& [k, v] : overlay) {
    toml::node* existing = base.get(k.str());
    if (existing && existing->is_table() && v.is_table() &&
        !changes_type(*existing->as_table(), *v.as_table())) {
      merge(*existing->as_table(), *v.as_table(), prefix + std::string(k.str()) + ".", replaced);
      continue;
    }
    if (existing && existing->is_array() && existing->as_array()->is_array_of_tables() &&
        !existing->as_array()->empty())
      replaced.push_back({prefix + std::string(k.str()), where(v.source()),
                          where(existing->source()), types_of(*existing->as_array())});
    toml::key key(k.str(), k.source());
    base.erase(k.str());
    base.insert(std::move(key), std::move(v));
  }
}

struct Include {
  fs::path file;       // as named (joined to the including file's directory)
  fs::path canonical;  // for cycle detection
};

// `where_`/`what`: the `extends` key that names `file` ("" for the command line).
// `read` gets the canonical path of every file read, the including file before its base.
toml::table parse_file(const fs::path& file, std::vector<Include>& chain,
                       std::vector<std::string>& read,
                       std::vector<Manifest::Replaced>& replaced, const std::string& where_ = "",
                       const std::string& what = "") {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(file, ec);
  if (ec) canonical = fs::absolute(file, ec).lexically_normal();
  const auto seen = std::find_if(chain.begin(), chain.end(),
                                 [&](const Include& i) { return i.canonical == canonical; });
  if (seen != chain.end()) {
    std::string loop;
    for (auto it = seen; it != chain.end(); ++it) loop += it->file.string() + " -> ";
    loop += file.string();
    throw Error(where_ + ": " + what + " makes an `extends` cycle (" + loop +
                "); hint: a manifest may extend a base, but bases cannot extend each other in "
                "a loop: remove one of the `extends`");
  }
  const std::string text = read_regular_file(
      file, where_, what, chain.empty() ? std::string() : chain.back().file.string());
  chain.push_back({file, canonical});
  read.push_back(canonical.string());

  toml::table table;
  try {
    table = toml::parse(text, file.string());
  } catch (const toml::parse_error& e) {
    const std::string description(e.description());
    throw Error(where(e.source()) + ": invalid TOML: " + description + "; hint: " +
                toml_hint(description));
  }

  const toml::key* ext_key = nullptr;
  for (auto&& [k, v] : table)
    if (k.str() == "extends") ext_key = &k;
  if (ext_key) {
    const toml::node* ext = table.get("extends");
    const std::string ext_where = where(ext_key->source());
    const auto* base_name = ext->as_string();
    if (!base_name)
      throw Error(where(ext->source()) + ": `extends` must be a string (a path to the "
                  "base manifest, relative to this file); hint: extends = \"base.toml\"");
    if (base_name->get().empty())
      throw Error(where(ext->source()) + ": `extends` is empty; hint: name the base manifest, "
                  "relative to this file: extends = \"base.toml\", or remove the key");
    const fs::path base_path = file.parent_path() / base_name->get();
    toml::table base = parse_file(base_path, chain, read, replaced, ext_where,
                                  "extends = \"" + base_name->get() + "\"");
    table.erase("extends");
    merge(base, table, "", replaced);
    table = std::move(base);
  }
  chain.pop_back();
  return table;
}

// ---------------------------------------------------------------------------------------------
// --set KEY=VALUE

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool bare_key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-';
}

// A short rendering of a node for messages: 0.001, "adamw", a table, [256, 128].
std::string brief(const toml::node& n) {
  std::ostringstream s;
  if (n.is_string()) {
    s << '"' << n.as_string()->get() << '"';
  } else if (n.is_table()) {
    s << "a table";
  } else if (n.is_array()) {
    const toml::array& a = *n.as_array();
    if (a.is_array_of_tables() && !a.empty()) {
      s << "an array of " << a.size() << (a.size() == 1 ? " table" : " tables");
    } else {
      s << '[';
      for (size_t i = 0; i < a.size() && i < 8; ++i) s << (i ? ", " : "") << brief(a[i]);
      if (a.size() > 8) s << ", ...";
      s << ']';
    }
  } else if (n.is_floating_point()) {
    s << n.as_floating_point()->get();  // 0.1, not toml++'s 0.10000000000000001
  } else {
    n.visit([&](const auto& v) { s << v; });
  }
  return s.str();
}

struct KeyPart {
  std::string name;
  bool has_index = false;
  std::string index_text;  // between the brackets, as written
};

class Override {
 public:
  Override(toml::table& root, const std::string& arg) : root_(root), arg_(arg) {}

  // Applies the override to root; throws keel::Error naming the argument and the key.
  void run() {
    const auto eq = arg_.find('=');
    if (eq == std::string::npos)
      fail("expected KEY=VALUE, found no '='",
           "write --set optimizer.lr=3e-4 (a dotted key, '=', a value)");
    key_ = trim(arg_.substr(0, eq));
    if (key_.empty())
      fail("expected KEY=VALUE, the key before '=' is empty",
           "write --set optimizer.lr=3e-4 (a dotted key, '=', a value)");
    const std::vector<KeyPart> parts = parse_key();
    parse_value(arg_.substr(eq + 1));
    walk(parts);
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& hint) const {
    throw Error(kSetPrefix + arg_ + ": " + (key_.empty() ? "" : "key '" + key_ + "': ") + what +
                "; hint: " + hint);
  }

  std::vector<KeyPart> parse_key() const {
    const std::string syntax = "keys are dotted names of letters, digits, '_' and '-', with [N] "
                               "for an array entry, e.g. data.train.batch_size or hooks[1].path";
    std::vector<KeyPart> parts;
    size_t i = 0;
    while (true) {
      KeyPart p;
      while (i < key_.size() && bare_key_char(key_[i])) p.name += key_[i++];
      if (p.name.empty()) {
        if (i == key_.size())
          fail(parts.empty() ? "the key is empty" : "the key ends with '.'", syntax);
        if (key_[i] == '.') fail("empty name between dots", syntax);
        if (key_[i] == '[') fail("'[' must follow a name, as in hooks[0]", syntax);
        fail(std::string("'") + key_[i] + "' cannot appear in a key", syntax);
      }
      if (i < key_.size() && key_[i] == '[') {
        const size_t close = key_.find(']', i);
        if (close == std::string::npos)
          fail("'[' without a closing ']'", "write an array index as " + p.name + "[0]");
        p.has_index = true;
        p.index_text = key_.substr(i + 1, close - i - 1);
        i = close + 1;
        if (i < key_.size() && key_[i] == '[')
          fail("one index per name is supported (" + p.name + "[" + p.index_text + "][...])",
               "set an entry of a nested array by replacing the whole array: --set '" +
                   p.name + "=[...]'");
      }
      parts.push_back(std::move(p));
      if (i == key_.size()) return parts;
      if (key_[i] != '.') {
        if (key_[i] == ']') fail("']' without an opening '['", syntax);
        fail(std::string("'") + key_[i] + "' cannot appear in a key", syntax);
      }
      ++i;  // '.'
      if (i == key_.size()) fail("the key ends with '.'", syntax);
    }
  }

  toml::source_region region() const {
    toml::source_region r;
    r.path = source_name_;
    r.begin = r.end = {1, 1};
    return r;
  }

  // A new, empty table whose source is this --set argument.
  toml::table new_table() const {
    toml::table t = toml::parse("t = {}", std::string_view(*source_name_));
    return std::move(*t.get("t")->as_table());
  }

  // Parses the value into parsed_["v"] (its source: this --set argument). TOML when it is
  // valid TOML, else the text as a string (so --set run.name=foo works unquoted).
  void parse_value(const std::string& raw) {
    const std::string text = trim(raw);
    if (text.empty())
      fail("the value after '=' is empty",
           "give a value, e.g. --set " + key_ + "=VALUE; for an empty string write --set '" +
               key_ + "=\"\"'");
    if (text.find_first_of("\n\r") == std::string::npos) {
      try {
        parsed_ = toml::parse("v = " + text, std::string_view(*source_name_));
        if (parsed_.size() == 1 && parsed_.get("v")) return;
      } catch (const toml::parse_error& e) {
        const char c = text[0];
        if (c == '[' || c == '{' || c == '"' || c == '\'')
          fail("the value " + text + " is not valid TOML (" + std::string(e.description()) + ")",
               std::string(c == '[' || c == '{'
                               ? "quote strings inside it, e.g. [\"a\", \"b\"], and quote the "
                                 "whole argument for the shell: --set '" +
                                     key_ + "=[256, 128]'"
                               : "close the quote, and quote the whole argument for the shell: "
                                 "--set '" +
                                     key_ + "=\"text\"'"));
      }
    }
    parsed_ = toml::parse("v = \"\"", std::string_view(*source_name_));
    *parsed_.get("v")->as_string() = text;
  }

  toml::node& value() { return *parsed_.get("v"); }

  // "hooks[0] (type console), hooks[1] (type jsonl)" or "model.hidden[0] = 256, ...".
  static std::string entries(const std::string& path, const toml::array& a) {
    if (a.empty()) return path + " is empty";
    std::string s =
        fmt::format("{} holds {} {}: ", path, a.size(), a.size() == 1 ? "entry" : "entries");
    for (size_t i = 0; i < a.size() && i < 8; ++i) {
      s += (i ? ", " : "") + path + "[" + std::to_string(i) + "]";
      if (const toml::table* t = a[i].as_table()) {
        const toml::node* type = t->get("type");
        if (type && type->is_string()) s += " (type " + type->as_string()->get() + ")";
      } else {
        s += " = " + brief(a[i]);
      }
    }
    if (a.size() > 8) s += ", ...";
    return s;
  }

  // The index written in `part` for `array` (named `path`), checked against its size.
  size_t index(const KeyPart& part, const std::string& path, const toml::array& array) const {
    const std::string& t = part.index_text;
    const std::string written = path + "[" + t + "]";
    const std::string holds =
        array.empty() ? path + " is empty"
                      : "use 0" + (array.size() > 1 ? " to " + std::to_string(array.size() - 1)
                                                    : std::string()) +
                            " (" + entries(path, array) + ")";
    if (t.empty()) fail("empty index in '" + written + "'", holds);
    const bool negative = t[0] == '-' && t.size() > 1 &&
                          std::all_of(t.begin() + 1, t.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (negative) fail("negative index in '" + written + "': indices count from 0", holds);
    if (!std::all_of(t.begin(), t.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      fail("'" + t + "' in '" + written + "' is not an index (a whole number from 0)", holds);
    const std::string digits = t.substr(std::min(t.find_first_not_of('0'), t.size() - 1));
    if (digits.size() > 9 || std::stoul(digits) >= array.size())
      fail("index " + t + " is out of range: " + entries(path, array),
           "only existing entries can be overridden; add the entry to the manifest, or set "
           "the whole array: --set '" + path + "=[...]'");
    return std::stoul(digits);
  }

  // Puts value() at `name` in `table` (a key of `path`).
  void assign(toml::table& table, const std::string& name, const std::string& path) {
    if (&table == &root_ && name == "extends")
      fail("`extends` cannot be set with --set (it is resolved when the file is read)",
           "write extends = \"base.toml\" in a manifest, or name the other manifest on the "
           "command line");
    const toml::node* existing = table.get(name);
    if (existing && existing->is_table() && !value().is_table()) {
      const toml::table& t = *existing->as_table();
      std::string example = t.get("type") ? "type" : (t.empty() ? "KEY" : std::string(t.begin()->first.str()));
      fail("'" + path + "' is a table; a value cannot replace it",
           "set one of its keys, e.g. --set " + path + "." + example + "=VALUE");
    }
    if (existing && existing->is_array() && existing->as_array()->is_array_of_tables() &&
        !existing->as_array()->empty() && !value().is_array())
      fail("'" + path + "' is an array of tables; a value cannot replace it",
           "set a key of one entry, e.g. --set " + path + "[0].type=VALUE (" +
               entries(path, *existing->as_array()) + "), or --set " + path + "=[] for none");
    table.erase(name);
    table.insert(toml::key(name, region()), std::move(value()));
  }

  void walk(const std::vector<KeyPart>& parts) {
    toml::table* table = &root_;
    std::string path;  // the dotted key so far
    for (size_t i = 0; i < parts.size(); ++i) {
      const KeyPart& part = parts[i];
      const bool last = i + 1 == parts.size();
      const std::string here = path.empty() ? part.name : path + "." + part.name;
      const std::string next = last ? "" : parts[i + 1].name;
      toml::node* node = table->get(part.name);
      if (!part.has_index) {
        if (last) return assign(*table, part.name, here);
        if (!node) {
          node = &table->insert(toml::key(part.name, region()), new_table()).first->second;
        } else if (const toml::array* a = node->as_array()) {
          fail("'" + here + "' is an array, not a table, so it has no key '" + next + "'",
               a->empty() ? here + " is empty; add entries to the manifest"
                          : "pick an entry, e.g. --set " + here + "[0]." + next +
                                "=VALUE (" + entries(here, *a) + ")");
        } else if (!node->is_table()) {
          fail("'" + here + "' is a value (" + brief(*node) + "), not a table, so it has no key '" +
                   next + "'",
               "set the value itself: --set " + here + "=VALUE");
        }
        table = node->as_table();
        path = here;
        continue;
      }
      const std::string indexed = here + "[" + part.index_text + "]";
      if (!node)
        fail("'" + here + "' is not in the manifest, so '" + indexed + "' does not exist",
             "only existing array entries can be overridden: add the entries to the manifest "
             "(e.g. [[" + here + "]] tables), or set the whole array: --set '" + here +
                 "=[...]'");
      toml::array* array = node->as_array();
      if (!array)
        fail("'" + here + "' is " + (node->is_table() ? "a table" : "a value (" + brief(*node) + ")") +
                 ", not an array, so it has no entry [" + part.index_text + "]",
             node->is_table() ? "name a key of the table: --set " + here + "." +
                                    (last ? std::string("KEY") : next) + "=VALUE"
                              : "set the value itself: --set " + here + "=VALUE");
      const size_t idx = index(part, here, *array);
      const std::string entry = here + "[" + std::to_string(idx) + "]";
      toml::node& element = (*array)[idx];
      if (last) {
        if (element.is_table())
          fail("cannot replace the whole entry '" + entry + "'",
               "set one of its keys, e.g. --set " + entry + ".type=VALUE");
        array->replace(array->cbegin() + static_cast<std::ptrdiff_t>(idx), std::move(value()));
        return;
      }
      if (!element.is_table())
        fail("'" + entry + "' is a value (" + brief(element) + "), not a table, so it has no key '" +
                 next + "'",
             "set the entry itself: --set " + entry + "=VALUE");
      table = element.as_table();
      path = entry;
    }
  }

  toml::table& root_;
  const std::string arg_;
  const std::shared_ptr<const std::string> source_name_ =
      std::make_shared<const std::string>(kSetPrefix + arg_);
  std::string key_;
  toml::table parsed_;

};

}  // namespace

Manifest load_manifest(const std::string& path, const std::vector<std::string>& overrides) {
  Manifest m;
  m.path = path;
  if (path.empty())
    throw Error("'': the manifest path is empty; hint: name a .toml file, e.g. "
                "configs/quickstart.toml");
  std::vector<Include> chain;
  m.root = parse_file(path, chain, m.files, m.replaced);
  for (const auto& o : overrides) Override(m.root, o).run();
  return m;
}

}  // namespace keel
