// The file each rank writes, shared by the plugins that write files (sinks, profiler).
#pragma once

#include <string>

namespace keel_plugins {

// `path` on rank 0 (and when empty); on rank r > 0, `path` with ".rank<r>" before the
// extension of its file name (metrics.jsonl -> metrics.rank1.jsonl, trace -> trace.rank1; a
// leading dot does not start an extension: .log -> .log.rank1).
inline std::string rank_path(const std::string& path, int rank) {
  if (rank == 0 || path.empty()) return path;
  const size_t name = path.find_last_of('/') + 1;  // 0 when there is no '/'
  const size_t dot = path.find_last_of('.');
  const size_t at = dot != std::string::npos && dot > name ? dot : path.size();
  return path.substr(0, at) + ".rank" + std::to_string(rank) + path.substr(at);
}

}  // namespace keel_plugins
