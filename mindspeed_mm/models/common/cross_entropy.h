// Next-token cross-entropy over language-model logits.
// Labels are ALIGNED with logits: labels[b, t] is the token that logits[b, t] should predict
// (the collator does the shift, so packed and multimodal samples need no special case here).
// Positions with label -100 are ignored. Reduced-precision logits are upcast to fp32.
#pragma once

#include <ATen/ATen.h>

namespace mm::models {

constexpr int64_t kIgnoreIndex = -100;

struct CrossEntropySum {
  at::Tensor sum;    // 0-dim, sum of per-token losses over counted tokens (differentiable)
  at::Tensor count;  // 0-dim int64, number of tokens with label != -100
};

// Per-token sum and token count, so callers can normalise by the token count of a whole global
// batch (sum over micro-batches and ranks) rather than averaging per micro-batch means.
CrossEntropySum lm_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels);

// Per-sample normalisation: `sum` is the sum over samples of each sample's mean token loss and
// `count` the number of samples with at least one counted token. A sample is a segment of a
// packed row when segment_ids [B, S] is defined (-1 = padding), else a whole row.
CrossEntropySum lm_cross_entropy_per_sample_sum(const at::Tensor& logits, const at::Tensor& labels,
                                                const at::Tensor& segment_ids);
// The same from per-token losses [B, S] (0 where not scored), e.g. vocabulary-parallel ones.
CrossEntropySum per_sample_sum(const at::Tensor& token_losses, const at::Tensor& labels, const at::Tensor& segment_ids);
// The `count` of lm_cross_entropy_per_sample_sum from the labels alone (before the forward).
int64_t scored_samples(const at::Tensor& labels, const at::Tensor& segment_ids);

// The language-model head fused with its loss, in chunks of `chunk` tokens, so that the full
// [tokens, vocab] logits never exist: hidden [..., H] (the final normed states), the head's
// weight [V, H] (no bias), labels shaped like hidden without its last dim -> fp32 per-token
// cross-entropy of hidden @ weight^T, 0 where the label is -100. Backward recomputes each chunk's
// logits (one more head matmul) and gives hidden's and weight's gradients; at most one chunk's
// logits and their softmax live at once (Liger's / Megatron's fused linear cross-entropy).
at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                        int64_t chunk);

// Mean over counted tokens; 0 (with zero gradients) when no token is counted.
at::Tensor lm_cross_entropy(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace mm::models
