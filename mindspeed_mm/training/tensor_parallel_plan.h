// Tensor parallelism as a plan (Megatron-style, applied to unchanged model code): the model's
// PlanTable::tensor_parallel says, by module-path pattern, how each module is split over the
// tensor-parallel group. Styles:
//   colwise      Linear: output features split (q, gate, up; the vision MLP's first layer)
//   rowwise      Linear: input features split, partial products summed (o, down)
//   heads        attention (HeadSplittable): this rank runs its share of the query heads and of
//                the key/value heads; with fewer key/value heads than ranks each rank runs the
//                one its query heads use (GQA replication)
//   kv_colwise   Linear k/v projection of the attention that is its parent: colwise when the
//                key/value heads divide by the ranks, else kept whole (replicated) with this
//                rank's head picked from its output, the gradient summed over the group
//   qkv_colwise  Linear with q, k and v fused along the output ([3 * heads * dim, in]): each third split
//   vocab        Embedding: vocabulary split; ids outside this rank's rows look up zeros, summed
//   vocab_head   Linear LM head: vocabulary split, logits left split for the vocabulary-parallel loss
//   vocab_tied   Embedding whose weight is also the LM head (Embedding::attend): both of the above
//   colwise_norm RMSNorm over features a colwise layer split (Wan's q/k norm across heads): its
//                weight split, the mean of squares summed over the group
// Each rank keeps its slice of every split weight (set_data: the parameter objects stay the ones
// the optimizer and checkpoints see; a deferred parameter stays deferred with its new shape and
// records its full shape for initialisation); the layers run through the regions of
// parallel/tensor_parallel.h, so gradients are exact.
//
// Sequence parallelism (options.sequence_parallel): the hidden states between the first and the
// last block of PlanTable::sequence_parallel are sharded along the sequence (dim 1): the first
// block's input is scattered, the last block's output gathered; inside, column-parallel layers
// all-gather their input along the sequence and row-parallel ones reduce-scatter their output.
// Norms (and any replicated parameter) inside run on sequence shards: their gradients are partial
// and summed over the group (TpLayout::partial_grads).
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/parallel/tensor_parallel.h"

namespace mm::training {

struct TpOptions {
  bool sequence_parallel = false;
  std::vector<std::string> sequence_parallel_blocks;  // PlanTable::sequence_parallel
};

// Where the plan left each parameter.
struct TpLayout {
  int size = 1, rank = 0;
  // A split parameter holds slice `rank` of `size` along `dim` of its full tensor viewed as `view`
  // (the full shape, or a finer one: qkv_colwise's [3, heads * dim, in]).
  struct Split {
    std::vector<int64_t> full_shape, view;
    int64_t dim = 0;
  };
  std::map<std::string, Split> splits;  // by parameter name
  // Replicated parameters whose gradient each rank computes only in part (sequence-parallel norms,
  // replicated key/value projections): summed over the group after backward.
  std::set<std::string> partial_grads;
  bool vocab_parallel_logits = false;  // the model's logits come out split along the vocabulary
  int64_t modules = 0;                 // modules the plan changed

  bool split(const std::string& name) const { return splits.count(name) > 0; }
  // This rank's slice of a full value of parameter `name` (the value itself when not split).
  at::Tensor local(const std::string& name, const at::Tensor& full) const;
  // The box this rank holds, in the split's view (whole when not split): its checkpoint placement.
  checkpoint::TensorBox box(const std::string& name) const;
};

// ConfigError (before anything changes) for a pattern that matches nothing, a style that does
// not fit the module, an unknown style, or sizes (features, heads, vocabulary) that do not divide
// by the group size, each naming the module and the sizes.
TpLayout apply_tensor_parallel_plan(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                                    const parallel::TpGroup& tp, const TpOptions& options = {});
// The same checks for a group of `size` ranks, changing nothing: run before any process group
// exists, so a bad layout fails before the ranks connect.
void check_tensor_parallel_plan(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                                int size, const TpOptions& options = {});
// Where the plan over `size` ranks would put each parameter (the layout of rank 0: set `rank` for
// another's boxes), changing nothing: offline conversion between layouts (checkpoint/convert.h).
TpLayout tensor_parallel_splits(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                                int size);

}  // namespace mm::training
