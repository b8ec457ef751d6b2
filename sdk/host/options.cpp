#include "options.hpp"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "error.hpp"
#include "source.hpp"
#include "text/text.hpp"

namespace keel {
namespace {

const char* type_name(keel_option_type t) {
  switch (t) {
    case KEEL_OPT_BOOL: return "bool";
    case KEEL_OPT_INT: return "integer";
    case KEEL_OPT_FLOAT: return "float";
    case KEEL_OPT_STRING: return "string";
    case KEEL_OPT_INT_LIST: return "list of integers";
    case KEEL_OPT_FLOAT_LIST: return "list of floats";
    case KEEL_OPT_PATH: return "path";
  }
  return "?";
}

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

bool bounded(const keel_option_desc& o) { return o.min <= o.max; }

// A bound as shown: a float option's bound that is the next double inside a shorter number
// (keel::below(1.0), 0.9999999999999999) is that number, exclusive ("1" and open): in doubles
// the two ranges are the same.
struct Shown {
  double value;
  bool open;
};
Shown shown(const keel_option_desc& o, double bound, double outward) {
  const bool floats = o.type == KEEL_OPT_FLOAT || o.type == KEEL_OPT_FLOAT_LIST;
  if (floats && std::isfinite(bound)) {
    const double next = std::nextafter(bound, outward);
    if (std::isfinite(next) && text::number(next).size() < text::number(bound).size())
      return {next, true};
  }
  return {bound, false};
}

// ">= 0", "> 0", "in [0, 1]" or "in [0, 1)".
std::string bounds(const keel_option_desc& o) {
  const Shown lo = shown(o, o.min, -HUGE_VAL), hi = shown(o, o.max, HUGE_VAL);
  if (std::isinf(o.max)) return (lo.open ? "> " : ">= ") + fmt(lo.value);
  return std::string("in ") + (lo.open ? "(" : "[") + fmt(lo.value) + ", " + fmt(hi.value) +
         (hi.open ? ")" : "]");
}

std::string show(const toml::node& n) {
  std::ostringstream s;
  if (n.is_string()) s << '"' << n.as_string()->get() << '"';
  else if (n.is_table()) s << "a table";
  else if (n.is_array()) s << "an array";
  else n.visit([&](const auto& v) { s << v; });
  return s.str();
}

class Checker {
 public:
  // `docs`: "`keel plugins show adamw`", named in hints ("" for none).
  Checker(std::string key_path, const keel_option_desc& o, std::string docs = "")
      : path_(std::move(key_path)), o_(o), docs_(std::move(docs)) {}

  KeelOptionValue convert(const toml::node& n) const {
    switch (o_.type) {
      case KEEL_OPT_BOOL:
        if (auto* b = n.as_boolean()) return b->get();
        break;
      case KEEL_OPT_INT:
        if (auto* i = n.as_integer()) return range(n, i->get());
        break;
      case KEEL_OPT_FLOAT:
        if (n.is_number()) return range(n, *n.value<double>());
        break;
      case KEEL_OPT_STRING:
        if (auto* s = n.as_string()) return choice(n, s->get());
        break;
      case KEEL_OPT_PATH:
        if (auto* s = n.as_string()) return absolute_path(n, s->get());
        break;
      case KEEL_OPT_INT_LIST:
      case KEEL_OPT_FLOAT_LIST: {
        auto* a = n.as_array();
        if (!a) break;
        std::vector<int64_t> ints;
        std::vector<double> floats;
        for (const auto& e : *a) {
          if (o_.type == KEEL_OPT_INT_LIST && e.is_integer()) {
            ints.push_back(range(e, e.as_integer()->get()));
          } else if (o_.type == KEEL_OPT_FLOAT_LIST && e.is_number()) {
            floats.push_back(range(e, *e.value<double>()));
          } else {
            fail(e, std::string("expected ") + describe(o_) + ", got element " + show(e),
                 example());
          }
        }
        if (o_.type == KEEL_OPT_INT_LIST) return ints;
        return floats;
      }
    }
    fail(n, std::string("expected ") + describe(o_) + ", got " + show(n), example());
  }

 private:
  template <class T>
  T range(const toml::node& n, T v) const {
    if (bounded(o_) && (static_cast<double>(v) < o_.min || static_cast<double>(v) > o_.max))
      fail(n, "must be " + bounds(o_) + ", got " + fmt(double(v)),
           "use a value " + bounds(o_) + (o_.help ? std::string(" (") + o_.help + ")" : ""));
    if constexpr (std::is_same_v<T, double>) {
      if (!std::isfinite(v)) fail(n, "must be finite, got " + fmt(v), example());
    }
    return v;
  }
  std::string choice(const toml::node& n, const std::string& v) const {
    if (!o_.choices) return v;
    std::string all = o_.choices;
    std::istringstream in(all);
    std::string item;
    std::vector<std::string> options;
    while (std::getline(in, item, '|')) {
      if (item == v) return v;
      options.push_back(item);
    }
    fail(n, "expected one of " + all + ", got \"" + v + "\"",
         text::did_you_mean_or(v, options, "use one of " + all, '"'));
  }
  // "e.g. lr = 0.001 (the default)", plus where the option is documented.
  std::string example() const {
    const std::string key = path_.substr(path_.rfind('.') + 1);
    std::string h = o_.default_toml ? "e.g. " + key + " = " + o_.default_toml + " (the default)"
                                    : "write " + key + " as " + type_name(o_.type);
    return docs_.empty() ? h : h + "; " + docs_ + " describes it";
  }
  [[noreturn]] void fail(const toml::node& n, const std::string& what,
                         const std::string& hint) const {
    throw Error(where(n.source()) + ": " + path_ + ": " + what + "; hint: " + hint);
  }

  std::string path_;
  const keel_option_desc& o_;
  std::string docs_;
};

toml::table parse_default(const keel_option_desc& o) {
  return toml::parse(std::string("v = ") + o.default_toml, std::string_view("<default>"));
}

}  // namespace

std::string absolute_path(const toml::node& n, const std::string& v) {
  namespace fs = std::filesystem;
  if (v.empty()) return v;
  fs::path p = v;
  if (p.is_relative()) {
    const std::string file = n.source().path ? *n.source().path : std::string();
    const bool from_file = !file.empty() && file.rfind(kSetPrefix, 0) != 0 && file[0] != '<';
    p = (from_file ? fs::path(file).parent_path() : fs::path()) / p;
  }
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  return (ec ? p : abs).lexically_normal().string();
}

std::string describe(const keel_option_desc& o) {
  std::string s = type_name(o.type);
  if (bounded(o)) s += " " + bounds(o);
  if (o.type == KEEL_OPT_STRING && o.choices) s += std::string(" (one of ") + o.choices + ")";
  return s;
}

keel_options validate_options(const toml::table& table, const std::string& section,
                              const std::string& show_command, const Schema& schema,
                              const std::set<std::string>& reserved) {
  keel_options out;
  std::vector<std::string> keys;  // every valid key of the table, for "did you mean"
  for (const auto& o : schema) keys.emplace_back(o.key);
  for (const auto& r : reserved) keys.push_back(r);
  const std::string docs = "`" + show_command + "`";

  for (const auto& [k, v] : table) {
    const std::string key(k.str());
    if (reserved.count(key)) continue;
    const keel_option_desc* desc = nullptr;
    for (const auto& o : schema)
      if (key == o.key) desc = &o;
    if (!desc) {
      throw Error(where(k.source()) + ": unknown key '" + key + "' in [" + section + "]; hint: " +
                  text::did_you_mean(key, keys) + docs + " lists every option");
    }
    out.values[key] = Checker(section + "." + key, *desc, docs).convert(v);
  }
  for (const auto& o : schema) {
    if (out.values.count(o.key)) continue;
    if (!o.default_toml) {
      throw Error(where(table.source()) + ": [" + section + "] needs '" + o.key + "' (" +
                  describe(o) + (o.help ? std::string(": ") + o.help : std::string()) +
                  "); hint: add " + o.key + " = <" + type_name(o.type) + "> to [" + section +
                  "]");
    }
    const toml::table parsed = parse_default(o);
    out.values[o.key] = Checker(section + "." + o.key, o).convert(*parsed.get("v"));
  }
  return out;
}

std::string check_schema(const Schema& schema) {
  for (const auto& o : schema) {
    if (!o.key || !*o.key) return "an option has no key";
    if (o.type < KEEL_OPT_BOOL || o.type > KEEL_OPT_PATH)
      return std::string("option '") + o.key + "' has unknown type " + std::to_string(o.type);
    if (!o.default_toml) continue;
    try {
      const toml::table parsed = parse_default(o);
      Checker(o.key, o).convert(*parsed.get("v"));
    } catch (const std::exception& e) {
      return std::string("default of option '") + o.key + "' (" + o.default_toml +
             ") is invalid: " + e.what();
    }
  }
  return "";
}

toml::table to_toml(const keel_options& options) {
  toml::table t;
  for (const auto& kv : options.values) {
    const std::string& k = kv.first;  // a structured binding cannot be captured in C++17
    const KeelOptionValue& v = kv.second;
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                        std::is_same_v<T, std::vector<double>>) {
            toml::array a;
            for (auto e : x) a.push_back(e);
            t.insert(k, std::move(a));
          } else {
            t.insert(k, x);
          }
        },
        v);
  }
  return t;
}

}  // namespace keel
