// The device mesh: world = pp x dp_replicate x dp_shard x cp x tp, TorchTitan's order with pp
// outermost and tp innermost (neighbouring ranks share a tensor-parallel group, the fastest links):
//   rank = (((stage * dp_replicate + replicate) * dp_shard + shard) * cp + context) * tp + tensor
// A rank's group along a dimension is the ranks that differ from it only in that coordinate;
// "dp" is replicate x shard together (the data-parallel ranks that split the batch); "dp_cp" adds
// cp and "dp_shard_cp" is shard x cp: context-parallel ranks hold the same weights and train on
// shards of the same samples, so gradients reduce over them too (TorchTitan's dp_shard_cp).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/parallel/communicator.h"

namespace mm::parallel {

enum class MeshDim { kDpReplicate = 0, kDpShard = 1, kCp = 2, kTp = 3, kDp = 4, kPp = 5, kDpCp = 6, kDpShardCp = 7 };
const char* mesh_dim_name(MeshDim d);

struct MeshShape {
  int dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, pp = 1;
  int size() const { return pp * dp_replicate * dp_shard * cp * tp; }
};

class DeviceMesh {
 public:
  // mm::ConfigError when a size is < 1 or the product differs from world_size, naming the sizes.
  DeviceMesh(const MeshShape& shape, int world_size);

  const MeshShape& shape() const { return shape_; }
  int size(MeshDim d) const;
  // (replicate, shard, context, tensor, stage) of `rank`.
  std::array<int, 5> coords(int rank) const;
  int rank_of(const std::array<int, 5>& coords) const;
  // The ranks of `rank`'s group along d, in coordinate order (the group rank is the index).
  std::vector<int> group(MeshDim d, int rank) const;

 private:
  MeshShape shape_;
};

// This rank's mesh with a communicator per dimension (built once; size-1 dimensions get a
// one-rank communicator that never communicates).
class ParallelState {
 public:
  ParallelState(std::shared_ptr<Communicator> world, const MeshShape& shape);
  const DeviceMesh& mesh() const { return mesh_; }
  Communicator& world() { return *world_; }
  Communicator& group(MeshDim d) { return *groups_[static_cast<size_t>(d)]; }
  std::shared_ptr<Communicator> shared_group(MeshDim d) const { return groups_[static_cast<size_t>(d)]; }

 private:
  std::shared_ptr<Communicator> world_;
  DeviceMesh mesh_;
  std::vector<std::shared_ptr<Communicator>> groups_;
};

}  // namespace mm::parallel
