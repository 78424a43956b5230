// Tensor- and sequence-parallel regions (Megatron-LM's mappings) as differentiable functions
// over a tensor-parallel group: collectives with gradients, so parallel layers are ordinary
// compositions (MLX's distributed ops are the model). Each pair is the other's transpose:
//
//   copy_to_tp_region        forward: identity             backward: all-reduce (sum)
//   reduce_from_tp_region    forward: all-reduce (sum)     backward: identity
//   gather_from_tp_region    forward: all-gather last dim  backward: this rank's slice
//   scatter_to_tp_region     forward: this rank's slice    backward: all-gather last dim
//   gather_from_sequence_region          forward: all-gather along `dim`  backward: reduce-scatter
//   reduce_scatter_to_sequence_region    forward: reduce-scatter          backward: all-gather
//
// A column-parallel linear is linear(copy_to(x), W_rows) (then gather_from to get the whole
// output); a row-parallel one is reduce_from(linear(x_cols, W_cols)). With sequence parallelism
// the copy / reduce around a TP region become gather_from_sequence / reduce_scatter_to_sequence.
// Slices are equal: the split dimension must divide by the group size (ConfigError otherwise,
// naming the sizes). A group of one returns its input.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <utility>

#include "mindspeed_mm/parallel/communicator.h"

namespace mm::parallel {

using TpGroup = std::shared_ptr<Communicator>;

at::Tensor copy_to_tp_region(const at::Tensor& x, const TpGroup& tp);
at::Tensor reduce_from_tp_region(const at::Tensor& x, const TpGroup& tp);
at::Tensor gather_from_tp_region(const at::Tensor& x, const TpGroup& tp);
at::Tensor scatter_to_tp_region(const at::Tensor& x, const TpGroup& tp);
at::Tensor gather_from_sequence_region(const at::Tensor& x, const TpGroup& tp, int64_t dim);
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const TpGroup& tp, int64_t dim);
// Entering and leaving a sequence-parallel stretch (the first and last block of a model whose
// hidden states are sequence-sharded between them):
//   scatter_to_sequence_region     forward: this rank's slice along dim  backward: all-gather
//   gather_from_sequence_to_whole  forward: all-gather along dim         backward: this rank's slice
// (the second's gradient is already whole on every rank: what follows runs replicated).
at::Tensor scatter_to_sequence_region(const at::Tensor& x, const TpGroup& tp, int64_t dim);
at::Tensor gather_from_sequence_to_whole(const at::Tensor& x, const TpGroup& tp, int64_t dim);

// Next-token cross-entropy of logits split over the group along the vocabulary (logits [..., V/n]:
// rank r holds ids [r V/n, (r+1) V/n)), without gathering them: the max, the sum of exponentials
// and the target's logit are all-reduced ([...] numbers each, never [..., V]). labels [...]
// aligned with the logits, -100 = not scored. Returns (sum of token losses, count of scored
// tokens) as lm_cross_entropy_sum does, the same on every rank; backward gives each rank its
// slice of the full logits' gradient.
std::pair<at::Tensor, at::Tensor> vocab_parallel_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                                                                   const TpGroup& tp);
// The per-token losses [...] of the same (0 where not scored), for per-sample normalisation.
at::Tensor vocab_parallel_token_losses(const at::Tensor& logits, const at::Tensor& labels, const TpGroup& tp);

// The head fused with the loss in chunks (training.loss_chunk_size) when the head is split along
// the vocabulary: hidden [..., H] whole on every rank, weight this rank's rows [V/n, H], labels
// [...]. Per chunk of `chunk` tokens this rank's logits [chunk, V/n] only; the max, the sum of
// exponentials and the target's logit are all-reduced ([chunk] numbers each). Returns the
// per-token losses [...] (0 where not scored), the same on every rank; backward recomputes each
// chunk's logits and sums the hidden states' gradient over the group.
at::Tensor vocab_parallel_chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& labels, int64_t chunk, const TpGroup& tp);

// This rank's equal slice of x along dim (no communication, no gradient bookkeeping beyond narrow).
at::Tensor tp_slice(const at::Tensor& x, int64_t dim, int rank, int size);

}  // namespace mm::parallel
