// Fully sharded data parallelism (FSDP, ZeRO-3), the FSDP2 way: every parameter is flattened,
// padded to a multiple of the shard group's size and split into equal chunks; rank r keeps
// chunk r (an fp32 leaf the optimizer updates, so optimizer state is sharded with it). The
// model's parameters become views of one flat buffer per *unit* whose storage exists only
// while the unit is gathered:
//
//   forward of unit u      all-gather u's chunks (prefetching the next units), run, free
//                          (reshard_after_forward)
//   backward of unit u     all-gather again just before u's gradients (an identity Function
//                          on u's output triggers it), prefetching the units backward needs next
//   u's last gradient      reduce-scatter u's gradients into the chunks' .grad, free the
//                          full gradients (AccumulateGrad post-hooks); units reduce in a fixed
//                          order on every rank so the collectives pair up
//
// Units are blocks (decoder layers, vision blocks) chosen by a plan; every parameter outside
// them forms the root unit, gathered before each forward and freed after backward. HSDP: with a
// replicate group, chunk gradients are also all-reduced across the replicas. Mixed precision:
// gathered parameters in param_dtype, gradients reduced in reduce_dtype, chunks and optimizer
// state in fp32.
//
// Every rank must run the same units in the same order (a rank whose batch has no image skips
// the vision tower): each all-gather carries its unit's index, and a mismatch is an error naming
// both units rather than silently mixed weights.
#pragma once

#include <ATen/ATen.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/parallel/communicator.h"

namespace torch::autograd {
struct Node;
}

namespace mm::parallel {

struct FsdpOptions {
  at::ScalarType param_dtype = at::kFloat;   // gathered parameters (compute)
  at::ScalarType reduce_dtype = at::kFloat;  // gradient reduce-scatter
  bool reshard_after_forward = true;         // free a unit after its forward, gather again for backward
  int prefetch = 1;                          // units whose all-gather starts ahead of use (0 = none)
  at::Device device = at::kCPU;              // where shards, gathered buffers and collectives live
};

class FullyShardedDataParallel {
 public:
  // units: (module path, block) pairs, each block's parameters one unit; the rest of root's
  // parameters the root unit. shard: the group parameters are split over (dp_shard);
  // replicate: the HSDP replica group (null or one rank: none). The model's current values are
  // taken as the initial weights (the same on every rank); parameters built under
  // DeferredInitGuard take theirs through set_full_value.
  FullyShardedDataParallel(mm::nn::Module& root, const std::vector<std::pair<std::string, mm::nn::Block*>>& units,
                           std::shared_ptr<Communicator> shard, std::shared_ptr<Communicator> replicate,
                           FsdpOptions options = {});
  ~FullyShardedDataParallel();

  // This rank's chunk of a parameter (fp32, [chunk]) by the parameter's name; what the optimizer
  // updates. mm::Error for an unknown name.
  at::Tensor shard(const std::string& name) const;
  // (name, chunk) of every parameter, in the model's order.
  std::vector<std::pair<std::string, at::Tensor>> named_shards() const;
  // This rank's elements [begin, end) of the flattened parameter (end - begin may be less than
  // the chunk: the padding).
  std::pair<int64_t, int64_t> shard_range(const std::string& name) const;

  // This rank's slice of a full value of model parameter `param` into its chunk (deferred
  // initialisation and sharded loading: the full model never exists on any rank). False when
  // param is not one of this model's.
  bool set_full_value(const at::Tensor& param, const at::Tensor& value);

  // Before each forward (training or evaluation): gathers the root unit.
  void begin_forward();
  // backward on the returned tensor (the loss, unchanged): gradients are reduced into the
  // chunks and every unit is freed when it completes.
  at::Tensor prepare_backward(const at::Tensor& loss);
  // Every unit gathered and kept (evaluation on one rank, HF export, sampling) until reshard().
  void gather_all();
  // Frees every gathered unit.
  void reshard();
  // Streaming the full model one unit at a time (HF export without the whole model on any rank):
  // export_order() lists every parameter grouped by unit; full_parameter(name), called by every
  // rank in that order, gathers the parameter's unit (freeing the one gathered before) and
  // returns the full parameter. reshard() afterwards.
  std::vector<std::string> export_order() const;
  at::Tensor full_parameter(const std::string& name);

  // L2 norm of all chunk gradients over the shard group (each element counted once); scales
  // them to max_norm when larger (max_norm > 0). Returns the norm before clipping.
  // With tensor parallelism (tp), parameters for which tp_split(name) holds are slices of larger
  // tensors: their squares are also summed over tp; the rest are the same on every tp rank.
  double clip_grad_norm(double max_norm, const std::function<bool(const std::string&)>& tp_split = {},
                        Communicator* tp = nullptr);

  int num_units() const { return static_cast<int>(units_.size()); }  // the root included
  int64_t all_gathers() const { return all_gathers_; }
  int64_t reduce_scatters() const { return reduce_scatters_; }
  // Bytes of this rank's chunks, and of every gathered unit's full parameters right now.
  int64_t shard_bytes() const;
  int64_t gathered_bytes() const;

  // Called by the hooks (public for them; not for users).
  void before_unit_forward(size_t u);
  void after_unit_forward(size_t u);
  void before_unit_backward(size_t u);
  void grad_ready(size_t param);
  void finish_backward();

 private:
  struct Param {
    std::string name;
    at::Tensor param;                // the model's tensor: a view of its unit's flat buffer
    at::Tensor shard;                // fp32 [chunk]
    std::vector<int64_t> shape;
    int64_t numel = 0, chunk = 0;
    int64_t full_offset = 0;         // in the unit's flat buffer
    int64_t shard_offset = 0;        // in the unit's concatenated chunks
    size_t unit = 0;
    bool trainable = false;
  };
  struct Unit {
    std::string path;                // "" for the root
    mm::nn::Block* block = nullptr;
    std::vector<size_t> params;
    at::Tensor full;                 // param_dtype [full_numel]; storage freed while resharded
    int64_t full_numel = 0, shard_numel = 0;
    int trainable = 0, pending = 0;  // trainable parameters; those whose gradient has not arrived
    // A unit with frozen parameters whose input takes a gradient: its backward has ended only
    // when that input's gradient is out too (a frozen norm's weight is used after the last
    // trainable parameter's gradient); counted in pending.
    bool awaits_input = false;
    bool gathered = false, reduced = false;
    std::shared_ptr<PendingWork> inflight;  // a started all-gather
    at::Tensor send, recv;
    std::shared_ptr<PendingWork> reducing;  // a started gradient reduce-scatter into reduce_out
    at::Tensor reduce_in, reduce_out;
  };

  void start_gather(size_t u);
  void gather(size_t u);
  void free(size_t u);
  void reduce(size_t u);           // starts the unit's reduce-scatter
  void finish_reduce(size_t u);    // waits for it and adds the result to the shards' gradients
  void launch_ready_reductions();
  void prefetch_after(const std::vector<size_t>& order, size_t u);

  std::vector<Param> params_;
  std::unordered_map<const c10::TensorImpl*, size_t> index_;  // parameter -> params_ index
  std::vector<Unit> units_;  // units_[0] is the root
  std::shared_ptr<Communicator> shard_, replicate_;
  FsdpOptions options_;
  std::vector<size_t> forward_order_, last_forward_order_;  // units in the order forward ran them
  std::vector<size_t> reduce_order_;
  std::deque<size_t> reducing_;  // units whose reduce-scatter is in flight, oldest first
  size_t next_reduce_ = 0;
  bool in_backward_ = false, pinned_ = false;
  size_t streamed_ = 0;  // the unit full_parameter gathered last
  int64_t all_gathers_ = 0, reduce_scatters_ = 0;
  std::vector<std::shared_ptr<void>> accumulators_;  // on_gradient_ready handles (autograd keeps weak refs)
};

}  // namespace mm::parallel
