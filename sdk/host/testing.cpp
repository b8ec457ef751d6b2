// keel::testing's out-of-line part (keel/testing.hpp): its host and its option checks are the
// kernel's own (host_services.cpp, options.cpp), with log lines kept instead of printed.
#include "keel/testing.hpp"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <set>

#include <toml++/toml.h>

#include "bounded.hpp"
#include "host_services.hpp"
#include "options.hpp"

namespace keel::testing {
namespace {

struct LogStore {
  std::mutex mutex;
  std::vector<std::string> lines;
};
LogStore& log_store() {
  static LogStore store;
  return store;
}

void log(keel_log_level level, const char* origin, const char* message) {
  static const char* const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  const char* name = level >= KEEL_LOG_DEBUG && level <= KEEL_LOG_ERROR ? names[level] : "?";
  // As the kernel's log: "[origin] " before the message, none for an empty origin (1.6).
  const std::string o = origin ? bounded(origin, KEEL_NAME_CAPACITY) : "plugin";
  const std::string line = std::string(name) + " " + (o.empty() ? "" : "[" + o + "] ") +
                           bounded(message, KEEL_STRING_CAPACITY);
  std::lock_guard<std::mutex> lock(log_store().mutex);
  log_store().lines.push_back(line);
}

// `s` as a TOML basic string.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string toml_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);  // round-trips
  std::string s = text;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";  // a float, not an integer
  return s;
}

// A test's option value as TOML text, as a manifest would write it.
std::string toml_value(const Value::Storage& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return toml_number(*d);
  if (const auto* s = std::get_if<std::string>(&v)) return toml_string(*s);
  std::string out = "[";
  if (const auto* l = std::get_if<std::vector<int64_t>>(&v))
    for (const int64_t x : *l) out += (out.size() > 1 ? ", " : "") + std::to_string(x);
  if (const auto* l = std::get_if<std::vector<double>>(&v))
    for (const double x : *l) out += (out.size() > 1 ? ", " : "") + toml_number(x);
  return out + "]";
}

}  // namespace

std::vector<std::string> log_lines() {
  std::lock_guard<std::mutex> lock(log_store().mutex);
  return log_store().lines;
}

void clear_log_lines() {
  std::lock_guard<std::mutex> lock(log_store().mutex);
  log_store().lines.clear();
}

namespace detail {

const keel_host* host() {
  static const keel_host table = keel::host_table(log);
  return &table;
}

std::string take_reported_error() { return keel::take_reported_error(); }

std::shared_ptr<const keel_options> check_options(const keel_component_desc& c,
                                                  const Options& given,
                                                  const std::string& section) {
  Schema schema;
  const char* p = reinterpret_cast<const char*>(c.options);
  for (uint32_t i = 0; i < c.option_count; ++i)
    schema.push_back(*reinterpret_cast<const keel_option_desc*>(p + size_t(i) * c.option_size));
  // What the kernel refuses a plugin for at load.
  if (const std::string bad = check_schema(schema); !bad.empty())
    fail("the component's option schema is invalid: " + bad);
  // The given options as the lines of a manifest section, checked as keel checks one.
  std::string text;
  std::set<std::string> seen;
  for (const auto& [key, value] : given) {
    if (!seen.insert(key).second) fail("option '" + key + "' given twice");
    text += toml_string(key) + " = " + toml_value(value.storage()) + "\n";
  }
  const toml::table table = toml::parse(text, std::string_view("<create() options>"));
  return std::make_shared<const keel_options>(
      validate_options(table, section, "keel plugins show " + std::string(c.name), schema));
}

}  // namespace detail
}  // namespace keel::testing
