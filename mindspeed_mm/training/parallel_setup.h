// How `mm train` joins a distributed job: the launcher's environment (mm launch, torchrun,
// Slurm) gives this process's rank; the config's parallel section gives the mesh, checked
// against the world size; the data-parallel group (replicate x shard) splits the batch.
// One process without a launcher is a world of 1 and builds no process group.
#pragma once

#include <functional>
#include <memory>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/parallel/device_mesh.h"
#include "mindspeed_mm/parallel/dist_env.h"

namespace mm::training {

// The parallel section's sizes with data_parallel_shard_size -1 resolved for world_size.
// ConfigError when they do not multiply to the world size, naming every size.
parallel::MeshShape resolve_mesh_shape(const config::ParallelConfig& p, int world_size);

// Whether parameters are sharded (FSDP, or HSDP with replicas): over data_parallel_shard_size >
// 1 ranks, or, as TorchTitan does, over the context-parallel ranks when the shard size is left to
// its default (-1) and ZeRO-1 is not asked for; FSDP then shards over dp_shard x cp.
// data_parallel_shard_size: 1 with context parallelism keeps DDP over dp x cp.
bool shards_parameters(const config::ParallelConfig& p, const parallel::MeshShape& m);

// training.global_batch_size (Megatron's --global-batch-size) turned into
// gradient_accumulation_steps for `dp_size` data-parallel ranks; the training section unchanged
// when it is 0. ConfigError when micro_batch_size x dp_size does not divide it, or when
// gradient_accumulation_steps is set (not 1) to something else.
config::TrainingConfig resolve_global_batch(const config::TrainingConfig& t, int dp_size);

class TrainParallel {
 public:
  // Joins the world group when env has more than one rank (collectives time out after
  // p.timeout_s) and builds the mesh's groups: Gloo for CPU tensors, and on a CUDA device NCCL
  // for CUDA tensors as well.
  // before_join runs once the mesh's sizes are checked and this rank's coordinates known
  // (shape(), dp_rank(), tp_size(), pp_size() answer; the groups are still null): what can fail
  // on the config (the data, the model's fit to the layout) fails there, before the ranks connect.
  TrainParallel(const config::ParallelConfig& p, const parallel::DistEnv& env, at::Device device = at::kCPU,
                const std::function<void(const TrainParallel&)>& before_join = {});

  const parallel::DistEnv& env() const { return env_; }
  const parallel::MeshShape& shape() const { return shape_; }
  bool is_main() const { return env_.rank == 0; }   // logs, metrics, HF export, samples
  int dp_rank() const { return dp_rank_; }
  int dp_size() const { return shape_.dp_replicate * shape_.dp_shard; }
  bool fsdp() const { return fsdp_; }  // shards_parameters
  int tp_size() const { return shape_.tp; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }  // 0 before the groups exist
  int pp_size() const { return shape_.pp; }
  int pp_rank() const { return pp_ ? pp_->rank() : 0; }
  int cp_size() const { return shape_.cp; }
  int cp_rank() const { return cp_rank_; }  // known before the groups exist
  // The ranks gradients and a step's loss and token counts are summed over: the data-parallel
  // ranks and, with context parallelism, their cp peers (each trains on a shard of the same
  // samples). The data-parallel group itself without cp; null in a world of 1.
  std::shared_ptr<parallel::Communicator> grad_group() const { return grad_; }
  int grad_size() const { return dp_size() * shape_.cp; }
  // The context-parallel group (null unless context_parallel_size > 1).
  std::shared_ptr<parallel::Communicator> cp() const { return cp_; }
  // The data-parallel group (null in a world of 1) and the mesh's groups (null likewise).
  std::shared_ptr<parallel::Communicator> dp() const { return dp_; }
  // The tensor-parallel group (null unless tensor_parallel_size > 1).
  std::shared_ptr<parallel::Communicator> tp() const { return tp_; }
  // The pipeline group: this rank's peers in the other stages (null unless pipeline_parallel_size > 1).
  std::shared_ptr<parallel::Communicator> pp() const { return pp_; }
  parallel::ParallelState* state() const { return state_.get(); }

  // Sums of the values over the data-parallel ranks (the values themselves in a world of 1).
  std::vector<double> dp_sum(std::vector<double> values) const;
  // Sums over grad_group(): the data-parallel ranks and their context-parallel peers.
  std::vector<double> grad_sum(std::vector<double> values) const;
  // Sums over the context-parallel group.
  std::vector<double> cp_sum(std::vector<double> values) const;
  // Every rank's values (the same count on each), by world rank.
  std::vector<std::vector<double>> world_gather(const std::vector<double>& values) const;
  void barrier() const;

 private:
  parallel::DistEnv env_;
  parallel::MeshShape shape_;
  std::shared_ptr<parallel::Communicator> world_, dp_, tp_, pp_, cp_, grad_;
  std::unique_ptr<parallel::ParallelState> state_;
  int dp_rank_ = 0, cp_rank_ = 0;
  bool fsdp_ = false;
};

}  // namespace mm::training
