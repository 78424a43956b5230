#include "mindspeed_mm/training/data_parallel.h"

#include <map>

#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/training/plans.h"
#include "mindspeed_mm/training/train_step.h"

namespace mm::training {
namespace {

at::ScalarType dtype_of(const std::string& name) { return name == "bf16" ? at::kBFloat16 : at::kFloat; }

}  // namespace

DataParallelModel::DataParallelModel(models::Model& model, const TrainParallel& par, const config::ParallelConfig& pc,
                                     at::Device device, TpLayout tp, std::optional<PipelineLayout> pipeline)
    : model_(model), par_(par), tp_(std::move(tp)), pipeline_(std::move(pipeline)) {
  for (auto& [name, p] : model.named_parameters()) {
    names_.emplace(p.unsafeGetTensorImpl(), name);
    if (!p.requires_grad()) continue;
    trainable_.push_back(p);
    trainable_names_.push_back(name);
  }
  if (pc.distributed_optimizer && par.fsdp())
    throw ConfigError("config: parallel.distributed_optimizer (ZeRO-1) applies to DDP; FSDP "
                      "(parallel.data_parallel_shard_size > 1) shards the optimizer state already");
  if (par.grad_size() == 1) return;
  if (!par.fsdp()) {
    // Pipeline stages run many backward passes per step (one per micro-batch and chunk): their
    // gradients are all-reduced once after the step instead of in DDP's buckets.
    manual_dp_ = pipeline_.has_value();
    if (!manual_dp_)
      ddp_ = std::make_unique<parallel::DistributedDataParallel>(trainable_, par.grad_group(),
                                                                 static_cast<int64_t>(pc.ddp_bucket_cap_mb * (1 << 20)));
    if (pc.distributed_optimizer) {
      std::vector<std::pair<std::string, at::Tensor>> named;
      for (auto& [name, p] : model.named_parameters())
        if (p.requires_grad()) named.emplace_back(name, p);
      zero1_ = std::make_unique<parallel::Zero1Partition>(std::move(named), par.grad_group());
      log::info("distributed optimizer (ZeRO-1): optimizer state sharded over ", par.grad_size(), " ranks");
    }
    return;
  }
  auto units = fsdp_units(model, pc.fsdp.units);
  parallel::FsdpOptions o;
  o.param_dtype = dtype_of(pc.fsdp.param_dtype);
  o.reduce_dtype = dtype_of(pc.fsdp.reduce_dtype);
  o.reshard_after_forward = pc.fsdp.reshard_after_forward;
  o.prefetch = static_cast<int>(pc.fsdp.prefetch);
  o.device = device;
  auto* st = par.state();
  // Context-parallel peers hold the same weights: FSDP shards over them as well (dp_shard x cp).
  fsdp_ = std::make_unique<parallel::FullyShardedDataParallel>(model, units, st->shared_group(parallel::MeshDim::kDpShardCp),
                                                               st->shared_group(parallel::MeshDim::kDpReplicate), o);
  log::info("fsdp: ", units.size(), " units plus the root, sharded over ", par.shape().dp_shard * par.shape().cp, " ranks",
            par.shape().cp > 1 ? cat(" (dp_shard ", par.shape().dp_shard, " x cp ", par.shape().cp, ")") : std::string(),
            par.shape().dp_replicate > 1 ? cat(" x ", par.shape().dp_replicate, " replicas (HSDP)") : std::string(),
            "; parameters gathered in ", pc.fsdp.param_dtype, ", gradients reduced in ", pc.fsdp.reduce_dtype);
}

DataParallelModel::~DataParallelModel() = default;

bool DataParallelModel::holds(const std::string& name) const {
  return !pipeline_ || pipeline_->held_by(name, par_.pp_rank());
}

bool DataParallelModel::writes(const std::string& name) const {
  if (!holds(name)) return false;
  if (pipeline_ && !pipeline_->first_holder(name, par_.pp_rank())) return false;
  return par_.tp_rank() == 0 || tp_.split(name);
}

bool DataParallelModel::store_full_value(const at::Tensor& param, const at::Tensor& value) {
  auto it = names_.find(param.unsafeGetTensorImpl());
  if (it == names_.end()) return false;
  if (!holds(it->second)) return true;  // another pipeline stage's
  const at::Tensor local = tp_.local(it->second, value);
  if (fsdp_) return fsdp_->set_full_value(param, local);
  at::NoGradGuard no_grad;
  at::Tensor p = param;
  p.copy_(local);
  return true;
}

void DataParallelModel::initialize(const std::function<void()>& init) {
  if (!fsdp_ && tp_.size == 1 && !pipeline_) return init();
  mm::nn::ParamInitHookGuard hook([this](const at::Tensor& p, const at::Tensor& v) { return store_full_value(p, v); });
  init();
}

checkpoint::WeightStore DataParallelModel::weight_store() {
  if (!fsdp_ && tp_.size == 1 && !pipeline_) return {};
  return [this](at::Tensor& p, const at::Tensor& v) {
    MM_CHECK(store_full_value(p, v), "parallel: a loaded tensor is not one of the model's parameters");
  };
}

std::vector<ParamGroup> DataParallelModel::param_groups(const std::vector<std::string>& lr_multipliers) const {
  auto groups = default_param_groups(model_.named_parameters(), lr_multipliers);
  for (auto& g : groups)
    for (size_t i = 0; i < g.params.size(); ++i) {
      if (fsdp_) g.params[i] = fsdp_->shard(g.names[i]);
      if (zero1_) g.params[i] = zero1_->shard(g.names[i]);
    }
  return groups;
}

void DataParallelModel::before_optimizer_step() {
  if (zero1_) zero1_->scatter_grads();
}

void DataParallelModel::after_optimizer_step() {
  if (zero1_) zero1_->gather_params();
}

void DataParallelModel::weights_changed() {
  if (zero1_) zero1_->refresh_shards();
}

void DataParallelModel::broadcast_parameters() {
  if (ddp_) ddp_->broadcast_parameters();
}

void DataParallelModel::begin_forward(const data::Batch& batch) {
  if (cp_) cp_->begin(batch);
  if (fsdp_) fsdp_->begin_forward();
}

at::Tensor DataParallelModel::prepare_backward(const at::Tensor& loss, bool sync) {
  if (ddp_) {
    ddp_->set_requires_sync(sync);
    return ddp_->prepare_backward(loss);
  }
  return fsdp_ ? fsdp_->prepare_backward(loss) : loss;
}

namespace {

// One all-reduce for a list of tensors (flattened into one fp32 buffer and copied back).
void all_reduce_together(std::vector<at::Tensor>& ts, parallel::Communicator& c) {
  if (ts.empty()) return;
  std::vector<at::Tensor> flat;
  for (auto& g : ts) flat.push_back(g.reshape({-1}).to(at::kFloat));
  at::Tensor buf = at::cat(flat);
  c.all_reduce(buf);
  int64_t at = 0;
  for (auto& g : ts) {
    g.copy_(buf.narrow(0, at, g.numel()).view(g.sizes()));
    at += g.numel();
  }
}

}  // namespace

void DataParallelModel::finish_gradients() {
  at::NoGradGuard no_grad;
  if (manual_dp_) {
    std::vector<at::Tensor> grads;
    for (auto& p : trainable_)
      if (p.grad().defined()) grads.push_back(p.grad());
    all_reduce_together(grads, *par_.grad_group());
  }
  if (pipeline_) {
    // Tied parameters (the embedding on the first stage and as the head on the last): each
    // holder's gradient is summed over the stages (the others add zeros of the same size).
    std::vector<at::Tensor> grads;
    std::map<std::string, at::Tensor> params;
    for (auto& [name, p] : model_.named_parameters()) params.emplace(name, p);
    for (const auto& name : pipeline_->shared()) {
      at::Tensor p = params.at(name);
      if (!p.requires_grad() && holds(name)) continue;  // frozen
      const std::vector<int64_t> shape = tp_.local(name, at::empty(mm::nn::full_shape(p), at::kMeta)).sizes().vec();
      if (holds(name)) {
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
        grads.push_back(p.grad());
      } else {
        grads.push_back(at::zeros(shape, at::TensorOptions().dtype(at::kFloat).device(p.device())));
      }
    }
    all_reduce_together(grads, *par_.pp());
  }
  if (tp_.partial_grads.empty() || !par_.tp()) return;
  std::vector<at::Tensor> grads;
  for (const auto& name : tp_.partial_grads) {
    at::Tensor g = fsdp_ ? fsdp_->shard(name).grad() : at::Tensor();
    if (!fsdp_)
      for (size_t i = 0; i < trainable_.size(); ++i)
        if (trainable_names_[i] == name) g = trainable_[i].grad();
    if (g.defined()) grads.push_back(g);
  }
  all_reduce_together(grads, *par_.tp());
}

double DataParallelModel::clip_grad_norm(double max_norm) {
  auto split = [this](const std::string& name) { return tp_.split(name); };
  if (fsdp_) return fsdp_->clip_grad_norm(max_norm, split, par_.tp().get());
  if (tp_.size == 1 && !pipeline_) return training::clip_grad_norm(trainable_, max_norm);
  // Slices of tensor-parallel parameters summed over the group; replicated ones counted once;
  // each pipeline stage's own, summed over the stages (a tied one on its first stage only).
  at::NoGradGuard no_grad;
  const at::Device device = model_device(model_);
  at::Tensor sq = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (size_t i = 0; i < trainable_.size(); ++i) {
    const at::Tensor& g = trainable_[i].grad();
    if (pipeline_ && !pipeline_->first_holder(trainable_names_[i], par_.pp_rank())) continue;
    if (g.defined()) sq[split(trainable_names_[i]) ? 0 : 1].add_(g.to(at::kFloat).pow(2).sum().to(at::kDouble));
  }
  if (par_.tp()) {
    if (par_.tp_rank() != 0) sq[1].zero_();
    par_.tp()->all_reduce(sq);
  }
  if (par_.pp()) par_.pp()->all_reduce(sq);
  const double norm = std::sqrt(sq.sum().item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double coef = max_norm / (norm + 1e-6);  // torch.nn.utils.clip_grad_norm_'s
    for (auto& p : trainable_)
      if (p.grad().defined()) p.grad().mul_(coef);
  }
  return norm;
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

at::Tensor DataParallelModel::whole_parameter(const std::string& name, const at::Tensor& param) {
  if (pipeline_) {
    // From the first stage that holds it: its tensor-parallel ranks gather the slices, then the
    // stages' rank 0 of each pipeline group receives it.
    int owner = 0;
    while (!pipeline_->first_holder(name, owner)) ++owner;
    at::Tensor whole;
    if (owner == par_.pp_rank()) whole = whole_tp(name, param);
    at::Tensor t = whole.defined() ? whole.contiguous()
                                   : at::zeros(mm::nn::full_shape(param), at::TensorOptions().dtype(param.scalar_type()).device(param.device()));
    par_.pp()->broadcast(t, owner);
    return par_.pp_rank() == 0 ? t : at::Tensor();
  }
  return whole_tp(name, param);
}

at::Tensor DataParallelModel::whole_tp(const std::string& name, const at::Tensor& param) {
  at::Tensor local = fsdp_ ? fsdp_->full_parameter(name) : param.detach();
  if (!tp_.split(name)) return local;
  // Every tensor-parallel rank's slice, put back in place in the split's view.
  const TpLayout::Split& s = tp_.splits.at(name);
  at::Tensor pieces = par_.tp()->all_gather(local.contiguous());  // [n, ...local]
  if (par_.tp_rank() != 0) return {};
  std::vector<int64_t> local_view = s.view;
  local_view[static_cast<size_t>(s.dim)] /= tp_.size;
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < pieces.size(0); ++r) parts.push_back(pieces[r].reshape(local_view));
  return at::cat(parts, s.dim).reshape(s.full_shape);
}

std::vector<std::string> DataParallelModel::gather_order(std::map<std::string, at::Tensor>& params) const {
  for (auto& [name, p] : model_.named_parameters()) params.emplace(name, p);
  if (fsdp_) return fsdp_->export_order();
  std::vector<std::string> order;
  for (auto& [name, p] : model_.named_parameters()) order.push_back(name);
  return order;
}

void DataParallelModel::export_hf(const std::string& dir, const nlohmann::json& hf_config) {
  if (!fsdp_ && tp_.size == 1 && !pipeline_) {
    if (par_.is_main()) checkpoint::export_hf_directory(dir, hf_config, model_);
    return;
  }
  // Streamed one tensor at a time (FSDP: unit by unit), so no rank holds the whole model.
  std::map<std::string, at::Tensor> params;
  const std::vector<std::string> order = gather_order(params);
  if (par_.is_main()) {
    std::vector<st::TensorSpec> specs;
    for (const auto& name : order) specs.push_back({name, at::kFloat, mm::nn::full_shape(params.at(name))});
    checkpoint::export_hf_streaming(dir, hf_config, specs,
                                    [&](const std::string& n) { return whole_parameter(n, params.at(n)); });
  } else {
    for (const auto& name : order) whole_parameter(name, params.at(name));
  }
  if (fsdp_) fsdp_->reshard();
}

std::vector<std::pair<std::string, at::Tensor>> DataParallelModel::whole_parameters(const std::set<std::string>& names) {
  std::map<std::string, at::Tensor> params;
  const std::vector<std::string> order = gather_order(params);
  std::map<std::string, at::Tensor> got;
  for (const auto& name : order) {
    if (!names.count(name)) continue;
    at::Tensor t = whole_parameter(name, params.at(name));
    if (par_.is_main()) got[name] = t.detach().cpu().clone();
  }
  if (fsdp_) fsdp_->reshard();
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (par_.is_main())
    for (auto& [name, p] : model_.named_parameters())
      if (got.count(name)) out.emplace_back(name, got.at(name));
  return out;
}

TrainMemory DataParallelModel::memory(const Optimizer& optimizer) const {
  TrainMemory m;
  int64_t full_bytes = 0, trainable_full = 0, updated = 0;
  int64_t local_bytes = 0;
  for (auto& [name, p] : model_.named_parameters()) {
    int64_t whole = 1;
    for (int64_t d : mm::nn::full_shape(p)) whole *= d;
    // Bytes as stored (a LoRA base may be bf16); trainable parameters are fp32.
    const auto bytes = static_cast<int64_t>(p.element_size());
    full_bytes += whole * bytes;
    local_bytes += p.numel() * bytes;
    if (p.requires_grad() || (pipeline_ && pipeline_->trainable.count(name))) trainable_full += whole;
    if (!fsdp_ && p.grad().defined()) m.grads += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
  }
  for (auto& g : optimizer.groups())
    for (auto& p : g.params) {
      updated += p.numel();
      // FSDP's chunk gradients are the only ones; ZeRO-1's are views of the full ones.
      if (fsdp_ && p.grad().defined()) m.grads += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
    }
  m.params = fsdp_ ? fsdp_->shard_bytes() : local_bytes + (zero1_ ? zero1_->shard_bytes() : 0);
  for (auto& [name, t] : optimizer.state())
    if (t.dim() > 0) m.optimizer += t.numel() * static_cast<int64_t>(t.element_size());
  // One process: every parameter, a gradient per trainable one, and optimizer state that scales
  // with the elements it updates (AdamW: two per element).
  const double per_element = updated > 0 ? static_cast<double>(m.optimizer) / updated : 0;
  m.optimizer_one_process = static_cast<int64_t>(per_element * trainable_full + 0.5);
  m.one_process = full_bytes + trainable_full * 4 + m.optimizer_one_process;
  return m;
}

std::pair<int64_t, int64_t> DataParallelModel::range(const std::string& name, const at::Tensor& param) const {
  if (fsdp_) return fsdp_->shard_range(name);
  if (zero1_ && param.requires_grad()) return zero1_->shard_range(name);
  return {0, replica_leader() ? param.numel() : 0};  // replicated: rank 0 holds it for the checkpoint
}

checkpoint::RankCheckpoint DataParallelModel::checkpoint_part(const Optimizer& optimizer) const {
  checkpoint::RankCheckpoint part;
  part.sharded = fsdp_ || zero1_ || tp_.size > 1 || pipeline_;
  // The data position is the data-parallel rank's (tensor-parallel peers read the same data).
  part.loader_rank = par_.dp_rank();
  part.loader_world = par_.dp_size();
  part.writes_loader = par_.tp_rank() == 0 && par_.cp_rank() == 0;
  part.writes_loader = part.writes_loader && par_.pp_rank() == 0;
  part.trainable_only = trainable_only_;
  if (!part.sharded) {
    if (replica_leader()) {
      part.model = &model_;
      part.optimizer_state = optimizer.state();
    }
    return part;
  }
  std::map<std::string, at::Tensor> params;
  for (auto& [name, p] : model_.named_parameters()) {
    params.emplace(name, p);
    if (!writes(name)) continue;
    if (trainable_only_ && !(pipeline_ ? pipeline_->trainable.count(name) > 0 : p.requires_grad())) continue;
    auto [b, e] = range(name, p);
    if (e <= b && !(fsdp_ || p.requires_grad())) continue;
    at::Tensor data = fsdp_ ? fsdp_->shard(name).narrow(0, 0, e - b) : p.detach().reshape({-1}).narrow(0, b, e - b);
    part.model_shards.push_back({name, mm::nn::full_shape(p), b, e, data, tp_.box(name)});
  }
  for (auto& [name, t] : optimizer.state()) {
    if (t.dim() == 0) {
      if (replica_leader() && par_.tp_rank() == 0 && par_.pp_rank() == 0)
        part.optimizer_shards.push_back({name, {}, 0, 1, t.reshape({1})});
      continue;
    }
    const std::string param = name.substr(name.find('.') + 1);  // "exp_avg.<param>"
    auto it = params.find(param);
    MM_CHECK(it != params.end(), "checkpoint: optimizer state '", name, "' names no parameter");
    if (!writes(param)) continue;
    auto [b, e] = range(param, it->second);
    part.optimizer_shards.push_back({name, mm::nn::full_shape(it->second), b, e, t.reshape({-1}).narrow(0, 0, e - b),
                                     tp_.box(param)});
  }
  return part;
}

void DataParallelModel::load_checkpoint(const checkpoint::CheckpointReader& r, Optimizer& optimizer) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> params;
  std::vector<std::string> missing, mismatched;
  for (auto& [name, p] : model_.named_parameters()) {
    params.emplace(name, p);
    const std::vector<int64_t> shape = mm::nn::full_shape(p);
    const bool trains = pipeline_ ? pipeline_->trainable.count(name) > 0 : p.requires_grad();
    if (trainable_only_ && !trains && !r.has("model", name)) continue;  // frozen: model.pretrained's
    if (!r.has("model", name)) missing.push_back(name);
    else if (r.shape("model", name) != shape)
      mismatched.push_back(cat(name, " ", c10::IntArrayRef(r.shape("model", name)), " vs model ", c10::IntArrayRef(shape)));
  }
  if (!missing.empty() || !mismatched.empty())
    throw Error(cat("checkpoint: '", r.dir(), "' does not fit the model:",
                    missing.empty() ? "" : cat(" missing ", missing.front(), " (", missing.size(), " in all)"),
                    mismatched.empty() ? "" : cat(" shape mismatch ", mismatched.front(), " (", mismatched.size(), " in all)")));
  for (auto& [name, p] : params) {
    if (!holds(name)) continue;  // another pipeline stage's
    if (!r.has("model", name)) continue;  // frozen, not saved (checked above)
    const checkpoint::TensorBox box = tp_.box(name);  // this rank's tensor-parallel slice (or all of it)
    if (fsdp_) {
      auto [b, e] = fsdp_->shard_range(name);
      fsdp_->shard(name).narrow(0, 0, e - b).copy_(r.read_box("model", name, box, b, e));
    } else {
      p.copy_(r.read_box("model", name, box, 0, p.numel()).view(p.sizes()));  // replicated: every rank reads it all
    }
  }
  if (zero1_) zero1_->refresh_shards();
  std::map<std::string, at::Tensor> state;
  for (auto& [name, t] : optimizer.state()) {
    if (t.dim() == 0) {
      state[name] = r.read_full("optimizer", name);
      continue;
    }
    const std::string param = name.substr(name.find('.') + 1);
    auto it = params.find(param);
    MM_CHECK(it != params.end(), "checkpoint: optimizer state '", name, "' names no parameter");
    // This rank's range, whatever it holds (replicated layouts read the whole tensor).
    auto [b, e] = fsdp_ || (zero1_ && it->second.requires_grad()) ? range(param, it->second)
                                                                   : std::pair<int64_t, int64_t>{0, it->second.numel()};
    at::Tensor local = at::zeros({t.numel()}, t.options());
    local.narrow(0, 0, e - b).copy_(r.read_box("optimizer", name, tp_.box(param), b, e));
    state[name] = local.view(t.sizes());
  }
  optimizer.load_state([&](const std::string& name) {
    auto it = state.find(name);
    if (it == state.end()) throw Error(cat("checkpoint: '", r.dir(), "' has no optimizer state '", name, "'"));
    return it->second;
  });
}

}  // namespace mm::training
