#include "mindspeed_mm/training/data_parallel.h"

#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/training/plans.h"

namespace mm::training {
namespace {

at::ScalarType dtype_of(const std::string& name) { return name == "bf16" ? at::kBFloat16 : at::kFloat; }

}  // namespace

DataParallelModel::DataParallelModel(models::CausalLM& model, const TrainParallel& par, const config::ParallelConfig& pc)
    : model_(model), par_(par) {
  for (auto& p : model.parameters())
    if (p.requires_grad()) trainable_.push_back(p);
  if (par.dp_size() == 1) return;
  if (par.shape().dp_shard == 1) {
    ddp_ = std::make_unique<parallel::DistributedDataParallel>(trainable_, par.dp(),
                                                               static_cast<int64_t>(pc.ddp_bucket_cap_mb * (1 << 20)));
    return;
  }
  auto units = fsdp_units(model, pc.fsdp.units);
  parallel::FsdpOptions o;
  o.param_dtype = dtype_of(pc.fsdp.param_dtype);
  o.reduce_dtype = dtype_of(pc.fsdp.reduce_dtype);
  o.reshard_after_forward = pc.fsdp.reshard_after_forward;
  o.prefetch = static_cast<int>(pc.fsdp.prefetch);
  auto* st = par.state();
  fsdp_ = std::make_unique<parallel::FullyShardedDataParallel>(model, units, st->shared_group(parallel::MeshDim::kDpShard),
                                                               st->shared_group(parallel::MeshDim::kDpReplicate), o);
  log::info("fsdp: ", units.size(), " units plus the root, sharded over ", par.shape().dp_shard, " ranks",
            par.shape().dp_replicate > 1 ? cat(" x ", par.shape().dp_replicate, " replicas (HSDP)") : std::string(),
            "; parameters gathered in ", pc.fsdp.param_dtype, ", gradients reduced in ", pc.fsdp.reduce_dtype);
}

DataParallelModel::~DataParallelModel() = default;

std::vector<ParamGroup> DataParallelModel::param_groups(const std::vector<std::string>& lr_multipliers) const {
  auto groups = default_param_groups(model_.named_parameters(), lr_multipliers);
  if (fsdp_)
    for (auto& g : groups)
      for (size_t i = 0; i < g.params.size(); ++i) g.params[i] = fsdp_->shard(g.names[i]);
  return groups;
}

void DataParallelModel::broadcast_parameters() {
  if (ddp_) ddp_->broadcast_parameters();
}

void DataParallelModel::begin_forward() {
  if (fsdp_) fsdp_->begin_forward();
}

at::Tensor DataParallelModel::prepare_backward(const at::Tensor& loss, bool sync) {
  if (ddp_) {
    ddp_->set_requires_sync(sync);
    return ddp_->prepare_backward(loss);
  }
  return fsdp_ ? fsdp_->prepare_backward(loss) : loss;
}

double DataParallelModel::clip_grad_norm(double max_norm) {
  return fsdp_ ? fsdp_->clip_grad_norm(max_norm) : training::clip_grad_norm(trainable_, max_norm);
}

int64_t DataParallelModel::eval_shard() const { return fsdp_ ? 0 : par_.dp_rank(); }
int64_t DataParallelModel::eval_num_shards() const { return fsdp_ ? 1 : par_.dp_size(); }

void DataParallelModel::end_eval() {
  if (fsdp_) fsdp_->reshard();
}

void DataParallelModel::gather_full() {
  if (fsdp_) fsdp_->gather_all();
}

void DataParallelModel::release_full() {
  if (fsdp_) fsdp_->reshard();
}

TrainMemory DataParallelModel::memory(const Optimizer& optimizer) const {
  TrainMemory m;
  int64_t full = 0, trainable_full = 0, trainable_local = 0;
  for (auto& g : optimizer.groups())
    for (auto& p : g.params) {
      trainable_local += p.numel();
      if (p.grad().defined()) m.grads += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
    }
  for (auto& p : model_.parameters()) {
    full += p.numel();
    if (p.requires_grad()) trainable_full += p.numel();
  }
  m.params = fsdp_ ? fsdp_->shard_bytes() : full * 4;
  for (auto& [name, t] : optimizer.state())
    if (t.dim() > 0) m.optimizer += t.numel() * static_cast<int64_t>(t.element_size());
  // One process: every parameter, a gradient per trainable one, and optimizer state that scales
  // with the elements it updates (AdamW: two per element).
  const double per_element = trainable_local > 0 ? static_cast<double>(m.optimizer) / trainable_local : 0;
  m.one_process = full * 4 + trainable_full * 4 + static_cast<int64_t>(per_element * trainable_full);
  return m;
}

}  // namespace mm::training
