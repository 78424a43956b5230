// How the trainer's model is spread over the data-parallel ranks: one process (nothing to do),
// DDP (dp_replicate > 1, dp_shard 1: gradients all-reduced; with parallel.distributed_optimizer
// also ZeRO-1: optimizer state sharded) or FSDP / HSDP (dp_shard > 1: parameters, gradients and
// optimizer state sharded); each of them over a model that tensor parallelism may already have
// split (TpLayout: then gradient norms, initial values, loaded weights, checkpoints and exports
// go by each parameter's whole tensor). The train loop calls the same few methods for all of them.
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/parallel/ddp.h"
#include "mindspeed_mm/parallel/fsdp.h"
#include "mindspeed_mm/parallel/zero1.h"
#include "mindspeed_mm/training/context_parallel.h"
#include "mindspeed_mm/training/optimizer.h"
#include "mindspeed_mm/training/parallel_setup.h"
#include "mindspeed_mm/training/pipeline.h"
#include "mindspeed_mm/training/tensor_parallel_plan.h"

namespace mm::training {

// Bytes of parameters, gradients and optimizer state that one rank holds, and what one process
// training the same model alone would hold.
struct TrainMemory {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t one_process = 0, optimizer_one_process = 0;
  int64_t total() const { return params + grads + optimizer; }
};

class DataParallelModel {
 public:
  // Applies DDP or FSDP to model (after freeze and before recompute plans: FSDP's wrapper must be
  // the outermost one of each unit). The model's current weights must be the same on every rank.
  // device: where FSDP puts its shards and buffers (DDP's buckets follow the parameters).
  DataParallelModel(models::Model& model, const TrainParallel& par, const config::ParallelConfig& pc,
                    at::Device device = at::kCPU, TpLayout tp = {}, std::optional<PipelineLayout> pipeline = {});
  ~DataParallelModel();

  bool sharded() const { return fsdp_ != nullptr; }
  const TpLayout& tp_layout() const { return tp_; }
  // Checkpoints hold only the parameters that train (LoRA: the adapters; the frozen base comes
  // from model.pretrained), and loading one leaves the frozen parameters as they are.
  void set_checkpoint_trainable_only(bool on) { trainable_only_ = on; }
  const std::optional<PipelineLayout>& pipeline_layout() const { return pipeline_; }
  // FSDP over a deferred model: runs init (the model's init_weights) keeping this rank's
  // slices of every value it draws, the same values an eager build has.
  void initialize(const std::function<void()>& init);
  // Where load_model_weights puts each tensor: FSDP keeps its slice; empty: a plain copy.
  checkpoint::WeightStore weight_store();
  // The optimizer's parameter groups: the model's trainable parameters, or under FSDP their
  // shards (the groups, names and weight-decay rules of the full parameters).
  std::vector<ParamGroup> param_groups(const std::vector<std::string>& lr_multipliers) const;
  // After the parameters were written in place (initialisation, loading): ZeRO-1's chunks follow.
  void weights_changed();
  // DDP: rank 0's weights into every rank (after a resume, say).
  void broadcast_parameters();

  // Context parallelism (parallelize installs it): each rank's shard of a host batch, which the
  // forward then takes. Without it the batch itself.
  // Encoders cut on their own sequences (PlanTable::context_parallel_encoders) come too: their
  // inputs are cut from the batch as well.
  void set_context_parallel(std::shared_ptr<ContextParallel> cp, std::vector<std::shared_ptr<ContextParallel>> encoders = {}) {
    cp_ = std::move(cp);
    cp_encoders_ = std::move(encoders);
  }
  const std::shared_ptr<ContextParallel>& context_parallel() const { return cp_; }
  data::Batch shard_batch(const data::Batch& host) const {
    data::Batch b = cp_ && cp_->shards_batches() ? cp_->shard(host) : host;
    for (const auto& e : cp_encoders_) b = e->shard_inputs(b);
    return b;
  }

  // Before each forward, with the (device) batch it takes.
  void begin_forward(const data::Batch& batch);
  // The tensor to call backward on (loss, unchanged). sync false: a gradient-accumulation
  // micro-step without communication (DDP).
  at::Tensor prepare_backward(const at::Tensor& loss, bool sync);
  // After the step's backward passes: the gradients tensor parallelism leaves partial (sequence-
  // parallel norms, replicated key/value projections) summed over the tensor-parallel group.
  void finish_gradients();
  // Global gradient norm over all ranks' gradients, clipped to max_norm when > 0.
  double clip_grad_norm(double max_norm);
  // Around optimizer->step(): ZeRO-1 hands each rank its chunks' gradients, then gathers the
  // updated chunks into the full parameters.
  void before_optimizer_step();
  void after_optimizer_step();

  // Validation: which share of the batches this rank runs (FSDP: all of them, since every
  // forward needs every rank), and whether the sums must be added over the ranks.
  int64_t eval_shard() const;
  int64_t eval_num_shards() const;
  void end_eval();
  // Full weights on every rank until release_full() (HF export, samples); FSDP gathers them.
  void gather_full();
  void release_full();

  // Writes the model as an HF directory from rank 0. FSDP streams it unit by unit (every rank
  // takes part in the gathers), so no rank ever holds the whole model.
  void export_hf(const std::string& dir, const nlohmann::json& hf_config);
  // The whole values of the named parameters (every rank calls it: FSDP, tensor and pipeline
  // parallel ranks take part in the gathers); rank 0 gets them, in model order.
  std::vector<std::pair<std::string, at::Tensor>> whole_parameters(const std::set<std::string>& names);

  TrainMemory memory(const Optimizer& optimizer) const;

  // This rank's part of a checkpoint: unsharded layouts (one process, DDP) rank 0's full model
  // and optimizer; sharded ones (FSDP, ZeRO-1) every rank's pieces of parameters and state.
  checkpoint::RankCheckpoint checkpoint_part(const Optimizer& optimizer) const;
  // Parameters and optimizer state from a checkpoint of any layout and world size, each rank
  // reading only the ranges it holds.
  void load_checkpoint(const checkpoint::CheckpointReader& reader, Optimizer& optimizer);

 private:
  models::Model& model_;
  const TrainParallel& par_;
  TpLayout tp_;
  bool trainable_only_ = false;
  std::optional<PipelineLayout> pipeline_;
  bool manual_dp_ = false;  // pipeline stages: gradients all-reduced over the data-parallel ranks after the step
  std::vector<at::Tensor> trainable_;
  std::vector<std::string> trainable_names_;
  std::unordered_map<const c10::TensorImpl*, std::string> names_;  // parameter -> its name
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
  std::unique_ptr<parallel::FullyShardedDataParallel> fsdp_;
  std::unique_ptr<parallel::Zero1Partition> zero1_;
  std::shared_ptr<ContextParallel> cp_;
  std::vector<std::shared_ptr<ContextParallel>> cp_encoders_;

  // Elements [begin, end) of a parameter's flattened (tensor-parallel local) tensor that this
  // rank holds (and writes).
  std::pair<int64_t, int64_t> range(const std::string& name, const at::Tensor& param) const;
  // Whether this rank holds the parameter (a pipeline stage holds its chunks' only), and whether
  // it writes it to a checkpoint (one holder: tensor-parallel rank 0 unless split, the first stage).
  bool holds(const std::string& name) const;
  // The one rank of the data-parallel x cp replicas that writes replicated state.
  bool replica_leader() const { return par_.dp_rank() == 0 && par_.cp_rank() == 0; }
  bool writes(const std::string& name) const;
  // This rank's value of a parameter from its whole tensor, into FSDP's chunk or the parameter.
  bool store_full_value(const at::Tensor& param, const at::Tensor& value);
  // Every parameter by name into params; the order whole parameters are gathered in (FSDP: unit
  // by unit), the same on every rank.
  std::vector<std::string> gather_order(std::map<std::string, at::Tensor>& params) const;
  // The whole tensor of a parameter on rank 0 (every rank calls it in the same order: FSDP and
  // tensor-parallel gathers); undefined elsewhere.
  at::Tensor whole_parameter(const std::string& name, const at::Tensor& param);
  at::Tensor whole_tp(const std::string& name, const at::Tensor& param);  // this stage's gather
};

}  // namespace mm::training
