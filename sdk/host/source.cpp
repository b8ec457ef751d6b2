#include "source.hpp"

#include "text/text.hpp"

namespace keel {

std::string where(const toml::source_region& source) {
  if (!source.path) return "<manifest>";
  const std::string& path = *source.path;
  if (path.rfind(kSetPrefix, 0) == 0) return path;
  return text::located(path, source);
}

}  // namespace keel
