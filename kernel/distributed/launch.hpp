// Where this process stands in a multi-process job: its rank and the job's size, read from the
// environment its launcher set. Pure (no LibTorch): the process group (process_group.hpp) is
// built from it.
//
//   torchrun       RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//                  (and TORCHELASTIC_USE_AGENT_STORE / TORCHELASTIC_RESTART_COUNT: the
//                  agent's TCPStore is shared, its keys prefixed per restart)
//   Slurm (srun)   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (SLURM_NTASKS_PER_NODE for the
//                  local size, else 1 per node), with MASTER_ADDR and MASTER_PORT
//   Open MPI       OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, with MASTER_ADDR and
//                  MASTER_PORT
//
// torchrun's variables win over Slurm's and Open MPI's (torchrun inside an allocation).
// A process with none of them runs alone, with no process group.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace keel {

struct Launch {
  std::string launcher;  // "torchrun", "slurm", "openmpi"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  // torchrun: the elastic agent runs the TCPStore (connect as a client) and this is restart
  // number `restart_count` of the workers (keys of earlier attempts must not be seen).
  bool agent_store = false;
  int restart_count = 0;
};

using GetEnv = std::function<const char*(const char*)>;

// The launch described by `env` (default: the process environment), or nullopt when no
// launcher variable is set. Throws keel::Error naming the variable when one is malformed or
// missing (a rank outside [0, world size), MASTER_PORT not a port, ...), with a hint.
std::optional<Launch> detect_launch(const GetEnv& env = nullptr);

}  // namespace keel
