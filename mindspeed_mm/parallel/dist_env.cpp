// Distributed environment variables -> DistEnv.
#include "mindspeed_mm/parallel/dist_env.h"

#include <cstdlib>

#include "mindspeed_mm/core/errors.h"

namespace mm::parallel {

namespace {

int parse_int(const std::function<std::string(const char*)>& get, const char* name, int fallback) {
  const std::string v = get(name);
  if (v.empty()) return fallback;
  // Slurm writes per-node counts as "2(x3)": the first number is this node's.
  size_t end = 0;
  int out = 0;
  try {
    out = std::stoi(v, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end == 0 || (end != v.size() && v[end] != '(' && v[end] != ','))
    throw ConfigError(cat("distributed: environment variable ", name, "='", v, "' is not an integer"));
  return out;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  const size_t comma = nodelist.find(','), bracket = nodelist.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return nodelist.substr(0, comma);
  const std::string prefix = nodelist.substr(0, bracket);
  size_t i = bracket + 1;
  std::string first;
  while (i < nodelist.size() && nodelist[i] != '-' && nodelist[i] != ',' && nodelist[i] != ']') first += nodelist[i++];
  return prefix + first;
}

DistEnv DistEnv::from_lookup(const std::function<std::string(const char*)>& get) {
  DistEnv e;
  const bool torchrun = !get("RANK").empty() || !get("WORLD_SIZE").empty();
  const bool slurm = !torchrun && !get("SLURM_PROCID").empty() && !get("SLURM_NTASKS").empty();
  if (torchrun) {
    e.source = "torchrun";
    e.rank = parse_int(get, "RANK", 0);
    e.world_size = parse_int(get, "WORLD_SIZE", 1);
    e.local_rank = parse_int(get, "LOCAL_RANK", e.rank);
    e.local_world_size = parse_int(get, "LOCAL_WORLD_SIZE", e.world_size);
  } else if (slurm) {
    e.source = "slurm";
    e.rank = parse_int(get, "SLURM_PROCID", 0);
    e.world_size = parse_int(get, "SLURM_NTASKS", 1);
    e.local_rank = parse_int(get, "SLURM_LOCALID", 0);
    e.local_world_size = parse_int(get, "SLURM_NTASKS_PER_NODE", parse_int(get, "SLURM_TASKS_PER_NODE", 1));
    if (get("MASTER_ADDR").empty() && !get("SLURM_JOB_NODELIST").empty())
      e.master_addr = first_slurm_host(get("SLURM_JOB_NODELIST"));
  }
  if (!get("MASTER_ADDR").empty()) e.master_addr = get("MASTER_ADDR");
  e.master_port = parse_int(get, "MASTER_PORT", e.master_port);
  const char* rank_var = slurm ? "SLURM_PROCID" : "RANK";
  const char* world_var = slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
  if (e.world_size < 1) throw ConfigError(cat("distributed: ", world_var, " must be >= 1 (got ", e.world_size, ")"));
  if (e.rank < 0 || e.rank >= e.world_size)
    throw ConfigError(cat("distributed: ", rank_var, " ", e.rank, " is outside [0, ", world_var, " ", e.world_size, ")"));
  if (e.local_world_size < 1 || e.local_rank < 0 || e.local_rank >= e.local_world_size)
    throw ConfigError(cat("distributed: local rank ", e.local_rank, " is outside [0, local world size ", e.local_world_size, ")"));
  if (e.master_port <= 0 || e.master_port > 65535)
    throw ConfigError(cat("distributed: MASTER_PORT ", e.master_port, " is not a TCP port"));
  return e;
}

DistEnv DistEnv::from_environment() {
  return from_lookup([](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  });
}

}  // namespace mm::parallel
