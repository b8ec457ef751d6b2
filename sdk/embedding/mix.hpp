// The hashes keel::EmbeddingTable draws from: a row's first values (counter-based, from
// (seed, table name, id, element) alone), the owner rank of an id, and shared_id. Fixed
// functions of their arguments (never a per-process seed), so every rank and every run agree.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace keel {
namespace embedding {

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijection of 64-bit values whose output
// bits each depend on every input bit.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a of a name (a table's), stable across processes and platforms.
inline uint64_t name_hash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// The key of one row's stream: (seed, table name, id).
inline uint64_t row_key(uint64_t seed, uint64_t table_hash, int64_t id) {
  return mix64(mix64(mix64(seed) ^ table_hash) ^ static_cast<uint64_t>(id));
}

// Fills row[0 .. dim) with N(0, std^2) values: element pair (2p, 2p + 1) is the Box-Muller
// transform of two uniforms hashed from (key, 2p) and (key, 2p + 1).
inline void init_row(uint64_t key, double std, float* row, int64_t dim) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double kUnit = 1.0 / 9007199254740992.0;  // 2^-53
  for (int64_t j = 0; j < dim; j += 2) {
    const uint64_t h1 = mix64(key + static_cast<uint64_t>(j));
    const uint64_t h2 = mix64(key + static_cast<uint64_t>(j) + 1);
    const double u1 = static_cast<double>((h1 >> 11) + 1) * kUnit;  // (0, 1]: log is finite
    const double u2 = static_cast<double>(h2 >> 11) * kUnit;        // [0, 1)
    const double r = std * std::sqrt(-2.0 * std::log(u1));
    row[j] = static_cast<float>(r * std::cos(kTwoPi * u2));
    if (j + 1 < dim) row[j + 1] = static_cast<float>(r * std::sin(kTwoPi * u2));
  }
}

// The rank owning `id` among `world` ranks (a hash unrelated to the tables' own).
inline int32_t owner_of(int64_t id, int32_t world) {
  if (world <= 1) return 0;
  return static_cast<int32_t>(mix64(static_cast<uint64_t>(id) ^ 0x5851f42d4c957f2dULL) %
                              static_cast<uint64_t>(world));
}

}  // namespace embedding
}  // namespace keel
