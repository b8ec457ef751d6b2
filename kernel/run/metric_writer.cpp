#include "run/metric_writer.hpp"

#include <fmt/format.h>

#include <cstring>
#include <exception>

namespace keel {

namespace {

bool key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '.' || c == '-';
}

}  // namespace

MetricWriter::MetricWriter(std::vector<std::string> taken, std::string record, std::string why)
    : taken_(taken.begin(), taken.end()), record_(std::move(record)), why_(std::move(why)) {
  abi.struct_size = sizeof(abi);
  abi.host_data = this;
  abi.put = &put;
}

int MetricWriter::put(keel_metric_writer* w, const char* key, double value) noexcept {
  auto* self = static_cast<MetricWriter*>(w->host_data);
  try {
    return self->add(key, value);
  } catch (const std::exception& e) {
    return self->refuse(std::string("metric could not be kept: ") + e.what());
  }
}

int MetricWriter::add(const char* key, double value) {
  const size_t n = key ? strnlen(key, KEEL_NAME_CAPACITY) : 0;
  const std::string shown = n ? std::string(key, n) : std::string();
  if (n == 0) return refuse("a metric with a NULL or empty key");
  if (n == KEEL_NAME_CAPACITY)
    return refuse(fmt::format("metric '{}...': the key is longer than {} bytes",
                              shown.substr(0, 40), KEEL_NAME_CAPACITY - 1));
  for (const char c : shown)
    if (!key_char(c))
      return refuse("metric '" + shown + "': a key holds only letters, digits, '_', '.' "
                    "and '-'");
  if (taken_.count(shown))
    return refuse("metric '" + shown + "': " + record_ + " has its own '" + shown + "'" + why_);
  if (!keys_.insert(shown).second) return refuse("metric '" + shown + "' was put twice");
  metrics.emplace_back(shown, value);
  return 1;
}

int MetricWriter::refuse(std::string why) {
  if (refusal.empty()) refusal = std::move(why);
  return 0;
}

}  // namespace keel
