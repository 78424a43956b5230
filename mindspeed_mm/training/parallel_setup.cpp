#include "mindspeed_mm/training/parallel_setup.h"

#include <algorithm>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"

namespace mm::training {

parallel::MeshShape resolve_mesh_shape(const config::ParallelConfig& p, int world_size) {
  parallel::MeshShape s;
  s.dp_replicate = static_cast<int>(p.data_parallel_replicate_size);
  s.cp = static_cast<int>(p.context_parallel_size);
  s.tp = static_cast<int>(p.tensor_parallel_size);
  s.pp = static_cast<int>(p.pipeline_parallel_size);
  const int rest = s.dp_replicate * s.cp * s.tp * s.pp;
  if (p.data_parallel_shard_size == -1) {
    if (world_size % rest != 0)
      throw ConfigError(cat("config: parallel.pipeline_parallel_size ", s.pp, " x data_parallel_replicate_size ", s.dp_replicate,
                            " x context_parallel_size ", s.cp, " x tensor_parallel_size ", s.tp, " = ", rest,
                            " does not divide the world size ", world_size));
    s.dp_shard = world_size / rest;
  } else {
    s.dp_shard = static_cast<int>(p.data_parallel_shard_size);
  }
  if (s.size() != world_size)
    throw ConfigError(cat("config: parallel.pipeline_parallel_size ", s.pp, " x data_parallel_replicate_size ", s.dp_replicate,
                          " x data_parallel_shard_size ", s.dp_shard, " x context_parallel_size ", s.cp,
                          " x tensor_parallel_size ", s.tp, " = ", s.size(),
                          " does not equal the world size ", world_size, " (set by the launcher)"));
  return s;
}

bool shards_parameters(const config::ParallelConfig& p, const parallel::MeshShape& m) {
  // CP alone shards over its ranks (TorchTitan's dp_shard x cp); with a pipeline, DDP (no FSDP there yet).
  return m.dp_shard > 1 || (m.cp > 1 && m.pp == 1 && p.data_parallel_shard_size == -1 && !p.distributed_optimizer);
}

config::TrainingConfig resolve_global_batch(const config::TrainingConfig& t, int dp_size) {
  config::TrainingConfig out = t;
  if (t.global_batch_size == 0) return out;
  const int64_t per_step = t.micro_batch_size * dp_size;
  if (t.global_batch_size % per_step != 0)
    throw ConfigError(cat("config: training.global_batch_size ", t.global_batch_size, " is not a multiple of micro_batch_size ",
                          t.micro_batch_size, " x data-parallel size ", dp_size, " = ", per_step));
  out.gradient_accumulation_steps = t.global_batch_size / per_step;
  if (t.gradient_accumulation_steps != 1 && t.gradient_accumulation_steps != out.gradient_accumulation_steps)
    throw ConfigError(cat("config: training.global_batch_size ", t.global_batch_size, " = micro_batch_size ", t.micro_batch_size,
                          " x data-parallel size ", dp_size, " x ", out.gradient_accumulation_steps,
                          " micro-batches, but training.gradient_accumulation_steps is ", t.gradient_accumulation_steps,
                          " (set one of them)"));
  return out;
}

TrainParallel::TrainParallel(const config::ParallelConfig& p, const parallel::DistEnv& env, at::Device device,
                             const std::function<void(const TrainParallel&)>& before_join)
    : env_(env), shape_(resolve_mesh_shape(p, env.world_size)), fsdp_(shards_parameters(p, shape_)) {
  if (p.sequence_parallel && shape_.tp == 1)
    throw ConfigError("config: parallel.sequence_parallel needs parallel.tensor_parallel_size > 1 (it shards the "
                      "sequence over the tensor-parallel ranks)");
  if (env_.distributed()) {
    const std::vector<int> dp = parallel::DeviceMesh(shape_, env_.world_size).group(parallel::MeshDim::kDp, env_.rank);
    dp_rank_ = static_cast<int>(std::find(dp.begin(), dp.end(), env_.rank) - dp.begin());
    cp_rank_ = parallel::DeviceMesh(shape_, env_.world_size).coords(env_.rank)[2];
  }
  if (before_join) before_join(*this);
  if (!env_.distributed()) return;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(p.timeout_s * 1000));
  world_ = parallel::Communicator::create(env_, timeout, device);
  state_ = std::make_unique<parallel::ParallelState>(world_, shape_);
  dp_ = state_->shared_group(parallel::MeshDim::kDp);
  MM_CHECK(dp_->rank() == dp_rank_, "distributed: rank ", env_.rank, "'s data-parallel rank ", dp_->rank(),
           " is not its mesh coordinate ", dp_rank_);
  if (shape_.tp > 1) tp_ = state_->shared_group(parallel::MeshDim::kTp);
  if (shape_.pp > 1) pp_ = state_->shared_group(parallel::MeshDim::kPp);
  if (shape_.cp > 1) cp_ = state_->shared_group(parallel::MeshDim::kCp);
  grad_ = state_->shared_group(parallel::MeshDim::kDpCp);
  log::info("distributed: rank ", env_.rank, " of ", env_.world_size, " (", env_.source, "), mesh pp ", shape_.pp, " x dp_replicate ",
            shape_.dp_replicate, " x dp_shard ", shape_.dp_shard, " x cp ", shape_.cp, " x tp ", shape_.tp);
}

namespace {

std::vector<double> sum_over(const std::shared_ptr<parallel::Communicator>& g, std::vector<double> values) {
  if (!g || g->size() == 1) return values;
  at::Tensor t = at::tensor(values, at::kDouble);
  g->all_reduce(t, parallel::ReduceOp::kSum);
  auto a = t.accessor<double, 1>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = a[static_cast<int64_t>(i)];
  return values;
}

}  // namespace

std::vector<double> TrainParallel::dp_sum(std::vector<double> values) const { return sum_over(dp_, std::move(values)); }

std::vector<double> TrainParallel::grad_sum(std::vector<double> values) const {
  return sum_over(grad_, std::move(values));
}

std::vector<double> TrainParallel::cp_sum(std::vector<double> values) const { return sum_over(cp_, std::move(values)); }

std::vector<std::vector<double>> TrainParallel::world_gather(const std::vector<double>& values) const {
  if (!world_ || world_->size() == 1) return {values};
  const at::Tensor all = world_->all_gather(at::tensor(values, at::kDouble)).contiguous();
  std::vector<std::vector<double>> out(static_cast<size_t>(all.size(0)));
  for (int64_t r = 0; r < all.size(0); ++r) {
    const double* d = all[r].data_ptr<double>();
    out[static_cast<size_t>(r)].assign(d, d + all.size(1));
  }
  return out;
}

void TrainParallel::barrier() const {
  if (world_) world_->barrier();
}

}  // namespace mm::training
