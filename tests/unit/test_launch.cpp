// Launcher variables -> rank layout (kernel/distributed/launch.hpp), without starting processes.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "distributed/launch.hpp"
#include "error.hpp"

namespace unit_launch {  // keel_units is one unity build: each file's names stay its own

namespace {

keel::GetEnv env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    keel::detect_launch(env_of(vars));
  } catch (const keel::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("no launcher variables: one process, no process group") {
  CHECK_FALSE(keel::detect_launch(env_of({{"HOME", "/root"}})).has_value());
}

TEST_CASE("torchrun: ranks, master, and the agent's store per restart") {
  const auto l = keel::detect_launch(env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"},
                                             {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  REQUIRE(l.has_value());
  CHECK(l->launcher == "torchrun");
  CHECK(l->rank == 3);
  CHECK(l->world_size == 4);
  CHECK(l->local_rank == 1);
  CHECK(l->local_world_size == 2);
  CHECK(l->master_addr == "10.0.0.1");
  CHECK(l->master_port == 29500);
  CHECK(l->agent_store);
  CHECK(l->restart_count == 2);
}

TEST_CASE("torchrun's variables win over Slurm's (torchrun inside an allocation)") {
  const auto l = keel::detect_launch(
      env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
              {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}}));
  REQUIRE(l.has_value());
  CHECK(l->launcher == "torchrun");
  CHECK(l->rank == 1);
  CHECK_FALSE(l->agent_store);
  CHECK(l->local_world_size == 1);  // LOCAL_* absent: one process on this machine
}

TEST_CASE("Slurm: tasks per node is the local size when it is a plain number") {
  auto vars = std::map<std::string, std::string>{
      {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
      {"SLURM_NTASKS_PER_NODE", "4"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29400"}};
  auto l = keel::detect_launch(env_of(vars));
  REQUIRE(l.has_value());
  CHECK(l->launcher == "slurm");
  CHECK(l->rank == 5);
  CHECK(l->world_size == 8);
  CHECK(l->local_rank == 1);
  CHECK(l->local_world_size == 4);
  vars["SLURM_NTASKS_PER_NODE"] = "4(x2)";  // uneven allocations: not a plain number
  l = keel::detect_launch(env_of(vars));
  CHECK(l->local_world_size == 2);  // at least local rank + 1
}

TEST_CASE("Open MPI") {
  const auto l = keel::detect_launch(
      env_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
              {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
              {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29501"}}));
  REQUIRE(l.has_value());
  CHECK(l->launcher == "openmpi");
  CHECK(l->world_size == 2);
  CHECK(l->local_world_size == 2);
}

TEST_CASE("malformed variables are errors naming the variable") {
  CHECK(error_of({{"RANK", "1"}, {"WORLD_SIZE", "1"}}).rfind("RANK='1' (set by torchrun): "
                                                              "expected an integer from 0 to 0",
                                                              0) == 0);
  CHECK(error_of({{"WORLD_SIZE", "2"}}).rfind("RANK is not set, but torchrun variables are", 0) ==
        0);
  CHECK(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2x"}}).rfind("WORLD_SIZE='2x'", 0) == 0);
  CHECK(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                  {"MASTER_PORT", "0"}})
            .rfind("MASTER_PORT='0' (set by torchrun): expected an integer from 1 to 65535", 0) ==
        0);
  CHECK(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                  {"MASTER_PORT", "1"}})
            .find("mpirun -x MASTER_ADDR") != std::string::npos);
}

}  // namespace unit_launch
