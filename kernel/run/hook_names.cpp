#include "run/hook_names.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "host.hpp"

namespace keel {
namespace {

std::mutex names_mutex;
std::map<std::string, std::string> names;  // section -> label, for the hooks named by label

// keel_host.log for hooks: a hook's section as the origin becomes its label.
void hook_log(keel_log_level level, const char* origin, const char* message) {
  std::string name;
  if (origin) {
    std::lock_guard<std::mutex> lock(names_mutex);
    const auto it = names.find(std::string(origin, ::strnlen(origin, KEEL_NAME_CAPACITY)));
    if (it != names.end()) name = it->second;
  }
  host()->log(level, name.empty() ? origin : name.c_str(), message);
}

}  // namespace

const keel_host* hook_host(const std::vector<ComponentSpec>& hooks) {
  static const keel_host wrapped = [] {
    keel_host h = *host();
    h.log = &hook_log;
    return h;
  }();
  std::map<std::string, int> uses;
  for (const ComponentSpec& h : hooks) ++uses[h.label];
  std::lock_guard<std::mutex> lock(names_mutex);
  names.clear();
  for (const ComponentSpec& h : hooks)
    if (uses[h.label] == 1) names[h.section] = h.label;
  return &wrapped;
}

}  // namespace keel
