#include "distributed/launch.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

#include "error.hpp"

namespace keel {
namespace {

struct Reader {
  GetEnv env;
  const char* launcher;
  const char* hint;

  const char* raw(const char* name) const { return env(name); }

  // An integer variable in [lo, hi]; `fallback` when unset (nullopt: required).
  int number(const char* name, int lo, int hi, std::optional<int> fallback = std::nullopt) const {
    const char* v = env(name);
    if (v == nullptr || *v == '\0') {
      if (fallback) return *fallback;
      throw Error(std::string(name) + " is not set, but " + launcher + " variables are; hint: " +
                  hint);
    }
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < lo || n > hi)
      throw Error(fmt::format("{}='{}' (set by {}): expected an integer from {} to {}; hint: {}",
                              name, std::string(v).substr(0, 40), launcher, lo, hi, hint));
    return static_cast<int>(n);
  }
};

constexpr int kMaxRanks = 1 << 20;

void master(const Reader& r, Launch& l) {
  const char* addr = r.raw("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0')
    throw Error(std::string("MASTER_ADDR is not set, but ") + r.launcher + " variables are " +
                "(the rendezvous needs rank 0's host in MASTER_ADDR and a free port there in "
                "MASTER_PORT); hint: " + r.hint);
  l.master_addr = addr;
  l.master_port = r.number("MASTER_PORT", 1, 65535);
}

}  // namespace

std::optional<Launch> detect_launch(const GetEnv& given) {
  const GetEnv env = given ? given : GetEnv([](const char* n) { return std::getenv(n); });
  const auto set = [&](const char* n) { return env(n) != nullptr; };
  Launch l;
  if (set("RANK") || set("WORLD_SIZE")) {
    const Reader r{env, "torchrun",
                   "launch with torchrun (docs/distributed.md), or unset "
                   "RANK and WORLD_SIZE to run one process"};
    l.launcher = "torchrun";
    l.world_size = r.number("WORLD_SIZE", 1, kMaxRanks);
    l.rank = r.number("RANK", 0, l.world_size - 1);
    l.local_world_size = r.number("LOCAL_WORLD_SIZE", 1, l.world_size, 1);
    l.local_rank = r.number("LOCAL_RANK", 0, l.local_world_size - 1, 0);
    master(r, l);
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    l.agent_store = agent != nullptr && std::string(agent) == "True";
    l.restart_count = r.number("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, 0);
  } else if (set("SLURM_PROCID") && set("SLURM_NTASKS")) {
    const Reader r{env, "Slurm",
                   "start every task with srun, and export MASTER_ADDR and MASTER_PORT"};
    l.launcher = "slurm";
    l.world_size = r.number("SLURM_NTASKS", 1, kMaxRanks);
    l.rank = r.number("SLURM_PROCID", 0, l.world_size - 1);
    // SLURM_NTASKS_PER_NODE may read "2(x3)" on uneven allocations: only a plain number counts.
    int per_node = 1;
    if (const char* v = env("SLURM_NTASKS_PER_NODE")) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && n >= 1 && n <= l.world_size) per_node = static_cast<int>(n);
    }
    l.local_world_size = per_node;
    l.local_rank = r.number("SLURM_LOCALID", 0, kMaxRanks - 1, 0);
    if (l.local_rank >= l.local_world_size) l.local_world_size = l.local_rank + 1;
    master(r, l);
  } else if (set("OMPI_COMM_WORLD_RANK") || set("OMPI_COMM_WORLD_SIZE")) {
    const Reader r{env, "Open MPI",
                   "start the processes with mpirun, and export MASTER_ADDR and MASTER_PORT "
                   "(mpirun -x MASTER_ADDR -x MASTER_PORT)"};
    l.launcher = "openmpi";
    l.world_size = r.number("OMPI_COMM_WORLD_SIZE", 1, kMaxRanks);
    l.rank = r.number("OMPI_COMM_WORLD_RANK", 0, l.world_size - 1);
    l.local_world_size = r.number("OMPI_COMM_WORLD_LOCAL_SIZE", 1, l.world_size, 1);
    l.local_rank = r.number("OMPI_COMM_WORLD_LOCAL_RANK", 0, l.local_world_size - 1, 0);
    master(r, l);
  } else {
    return std::nullopt;
  }
  return l;
}

}  // namespace keel
