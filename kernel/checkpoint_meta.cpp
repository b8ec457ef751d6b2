#include "checkpoint_meta.hpp"

#include <sstream>

#include <toml++/toml.h>

#include "error.hpp"

namespace keel {
namespace {

constexpr const char* kKeys = "step, epoch, samples, tokens, objects";

std::string at(const std::string& path, const toml::source_region& r) {
  return path + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  std::string line = where + ": invalid checkpoint metadata: " + what;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  throw Error(line);
}

int64_t count(const toml::table& t, const char* key, const std::string& path) {
  const toml::node* n = t.get(key);
  if (n == nullptr)
    fail(at(path, t.source()), std::string("no '") + key + "' (expected " + kKeys + ")");
  const auto* i = n->as_integer();
  if (i == nullptr || i->get() < 0)
    fail(at(path, n->source()), std::string("'") + key + "' must be an integer >= 0");
  return i->get();
}

// A TOML basic string ("..." with escapes).
std::string quoted(const std::string& s) {
  std::ostringstream out;
  out << toml::toml_formatter{toml::value<std::string>(s), toml::format_flags::none};
  return out.str();
}

}  // namespace

CheckpointMeta read_checkpoint_meta(std::string_view text, const std::string& path) {
  toml::table t;
  try {
    t = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    fail(at(path, e.source()), "not valid TOML: " + std::string(e.description()));
  }
  for (const auto& [k, v] : t) {
    const std::string_view key = k.str();
    if (key != "step" && key != "epoch" && key != "samples" && key != "tokens" && key != "objects")
      fail(at(path, k.source()), "unknown key " + quoted(std::string(key)) + " (expected " +
                                     kKeys + ")");
  }
  CheckpointMeta m;
  m.step = count(t, "step", path);
  m.epoch = count(t, "epoch", path);
  m.samples = count(t, "samples", path);
  m.tokens = count(t, "tokens", path);
  const toml::node* objects = t.get("objects");
  if (objects == nullptr) fail(at(path, t.source()), std::string("no 'objects' (expected ") + kKeys + ")");
  const toml::array* list = objects->as_array();
  if (list == nullptr) fail(at(path, objects->source()), "'objects' must be a list of strings");
  for (const toml::node& o : *list) {
    const auto* s = o.as_string();
    if (s == nullptr) fail(at(path, o.source()), "'objects' must be a list of strings");
    m.objects.push_back(s->get());
  }
  return m;
}

std::string write_checkpoint_meta(const CheckpointMeta& meta) {
  std::string out = "step = " + std::to_string(meta.step) +
                    "\nepoch = " + std::to_string(meta.epoch) +
                    "\nsamples = " + std::to_string(meta.samples) +
                    "\ntokens = " + std::to_string(meta.tokens) + "\nobjects = [";
  for (size_t i = 0; i < meta.objects.size(); ++i)
    out += (i ? ", " : "") + quoted(meta.objects[i]);
  return out + "]\n";
}

}  // namespace keel
