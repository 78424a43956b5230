// Where this process sits in a distributed job, from the environment the launcher left:
//   torchrun / mm launch   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Slurm (srun)           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE,
//                          MASTER_ADDR or the first host of SLURM_JOB_NODELIST, MASTER_PORT
//   neither                one process (rank 0 of 1)
// torchrun's variables win when both are set (torchrun inside an allocation).
#pragma once

#include <functional>
#include <string>

namespace mm::parallel {

struct DistEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // "torchrun" | "slurm" | "single"

  bool distributed() const { return world_size > 1; }
  // mm::ConfigError naming the variable for a non-number, a rank outside [0, world), and so on.
  static DistEnv from_environment();
  // The same from any lookup (tests): name -> value, "" when unset.
  static DistEnv from_lookup(const std::function<std::string(const char*)>& get);
};

// The first host of a Slurm node list: "node[03-05,07],gpu1" -> "node03"; "a,b" -> "a".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace mm::parallel
