// Device mesh layout and per-dimension communicators.
#include "mindspeed_mm/parallel/device_mesh.h"

#include "mindspeed_mm/core/errors.h"

namespace mm::parallel {

const char* mesh_dim_name(MeshDim d) {
  switch (d) {
    case MeshDim::kDpReplicate: return "dp_replicate";
    case MeshDim::kDpShard: return "dp_shard";
    case MeshDim::kCp: return "cp";
    case MeshDim::kTp: return "tp";
    case MeshDim::kPp: return "pp";
    case MeshDim::kDpCp: return "dp_cp";
    case MeshDim::kDpShardCp: return "dp_shard_cp";
    default: return "dp";
  }
}

DeviceMesh::DeviceMesh(const MeshShape& s, int world_size) : shape_(s) {
  if (s.dp_replicate < 1 || s.dp_shard < 1 || s.cp < 1 || s.tp < 1 || s.pp < 1)
    throw ConfigError(cat("config: parallel sizes must be >= 1 (dp_replicate ", s.dp_replicate, ", dp_shard ", s.dp_shard,
                          ", cp ", s.cp, ", tp ", s.tp, ", pp ", s.pp, ")"));
  if (s.size() != world_size)
    throw ConfigError(cat("config: parallel sizes pp ", s.pp, " x dp_replicate ", s.dp_replicate, " x dp_shard ", s.dp_shard,
                          " x cp ", s.cp, " x tp ", s.tp, " = ", s.size(), " do not equal the world size ", world_size));
}

int DeviceMesh::size(MeshDim d) const {
  switch (d) {
    case MeshDim::kDpReplicate: return shape_.dp_replicate;
    case MeshDim::kDpShard: return shape_.dp_shard;
    case MeshDim::kCp: return shape_.cp;
    case MeshDim::kTp: return shape_.tp;
    case MeshDim::kPp: return shape_.pp;
    case MeshDim::kDpCp: return shape_.dp_replicate * shape_.dp_shard * shape_.cp;
    case MeshDim::kDpShardCp: return shape_.dp_shard * shape_.cp;
    default: return shape_.dp_replicate * shape_.dp_shard;
  }
}

std::array<int, 5> DeviceMesh::coords(int rank) const {
  const int t = rank % shape_.tp, c = (rank / shape_.tp) % shape_.cp;
  const int s = (rank / (shape_.tp * shape_.cp)) % shape_.dp_shard;
  const int r = (rank / (shape_.tp * shape_.cp * shape_.dp_shard)) % shape_.dp_replicate;
  const int p = rank / (shape_.tp * shape_.cp * shape_.dp_shard * shape_.dp_replicate);
  return {r, s, c, t, p};
}

int DeviceMesh::rank_of(const std::array<int, 5>& k) const {
  return (((k[4] * shape_.dp_replicate + k[0]) * shape_.dp_shard + k[1]) * shape_.cp + k[2]) * shape_.tp + k[3];
}

std::vector<int> DeviceMesh::group(MeshDim d, int rank) const {
  std::array<int, 5> k = coords(rank);
  std::vector<int> out;
  if (d == MeshDim::kDp) {
    for (int r = 0; r < shape_.dp_replicate; ++r)
      for (int s = 0; s < shape_.dp_shard; ++s) out.push_back(rank_of({r, s, k[2], k[3], k[4]}));
    return out;
  }
  if (d == MeshDim::kDpCp || d == MeshDim::kDpShardCp) {
    const int replicas = d == MeshDim::kDpCp ? shape_.dp_replicate : 1;
    for (int r = 0; r < replicas; ++r)
      for (int s = 0; s < shape_.dp_shard; ++s)
        for (int c = 0; c < shape_.cp; ++c) out.push_back(rank_of({replicas == 1 ? k[0] : r, s, c, k[3], k[4]}));
    return out;
  }
  const int i = d == MeshDim::kPp ? 4 : static_cast<int>(d);
  for (int v = 0; v < size(d); ++v) {
    k[static_cast<size_t>(i)] = v;
    out.push_back(rank_of(k));
  }
  return out;
}

ParallelState::ParallelState(std::shared_ptr<Communicator> world, const MeshShape& shape)
    : world_(std::move(world)), mesh_(shape, world_->size()) {
  // Every rank builds the groups in the same order; each joins only the ones it belongs to.
  for (MeshDim d : {MeshDim::kDpReplicate, MeshDim::kDpShard, MeshDim::kCp, MeshDim::kTp, MeshDim::kDp, MeshDim::kPp})
    groups_.push_back(world_->subgroup(mesh_.group(d, world_->rank()), mesh_dim_name(d)));
  // Without context parallelism dp_cp is dp and dp_shard_cp is dp_shard: the same groups.
  for (MeshDim d : {MeshDim::kDpCp, MeshDim::kDpShardCp})
    groups_.push_back(shape.cp == 1 ? groups_[static_cast<size_t>(d == MeshDim::kDpCp ? MeshDim::kDp : MeshDim::kDpShard)]
                                    : world_->subgroup(mesh_.group(d, world_->rank()), mesh_dim_name(d)));
}

}  // namespace mm::parallel
