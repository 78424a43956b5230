// Qwen2's activation estimate (models/memory.h): the tensors qwen2.cpp and models/common save for
// backward, counted per token. Measured against the counting allocator in tests/unit/test_memory.cpp.
//
// A decoder layer, per token, in fp32 (Q = query heads x head_dim, I = intermediate size, each
// divided by the tensor-parallel degree t):
//   input_layernorm     x * rsqrt(ms) and its weighted output                    2 H
//   q (after RoPE), k and v repeated to the query heads, the attention output     4 Q / t
//   attention's log-sum-exp (fused SDPA)                                        heads / t
//   the residual after attention                                                  H
//   post_attention_layernorm                                                     2 H
//   MLP: gate, silu(gate), up, silu(gate) * up                                   4 I / t
//   the layer's output                                                            H
// Its backward holds the MLP's three intermediate gradients and the hidden state's at once.
// Outside the layers: the embedding output (H), the rotary tables (2 head_dim), the final norm
// (2 H), and for the loss the logits and their log-softmax (2 V, V / t when vocabulary-parallel),
// whose two gradients backward makes first; with the chunked head and loss only the per-token
// losses, and one chunk's logits in backward. Packed rows add their [B, 1, S, S] attention masks.
// Under context parallelism the batch is a rank's shard; Ulysses adds its gathered attention output.
#include <algorithm>

#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/qwen2/qwen2.h"

namespace mm::models {

void Qwen2ForCausalLM::estimate_decoder(ActivationEstimate& e, int64_t B, int64_t S, bool segment_mask, bool embeddings,
                                        const MemoryQuery& q, const std::string& prefix, bool padded_rows) const {
  const Qwen2Config& c = config;
  const int64_t N = B * S, t = std::max<int64_t>(1, q.tp), f = 4;
  const int64_t H = c.hidden_size, D = c.head_dim(), heads = c.num_attention_heads / t;
  const int64_t Q = heads * D, I = c.intermediate_size / t;
  const int64_t sp = q.sequence_parallel ? t : 1;  // norms and residuals on sequence shards
  if (q.first_stage && embeddings) {
    e.before += N / sp * H * f;
    e.notes.emplace_back("embeddings", N / sp * H * f);
  }
  // Every stage computes the rotary tables; packed rows' masks (bool, then SDPA's float copy).
  const int64_t tables = N * 2 * D * f;
  e.before += tables;
  e.notes.emplace_back("rotary tables", tables);
  if (segment_mask) {
    e.before += B * S * S;
    e.notes.emplace_back("packed-row masks", B * S * S);
  }
  // Context parallel (the batch is this rank's shard): Ulysses keeps its attention's output over
  // the whole sequence's tokens for its share of the heads too (N x Q again), and without a ring,
  // off CUDA, one mask of the whole sequence's samples for every layer; the ring saves what SDPA would.
  // Rows padded to a length (padded_rows: the batch's attention mask) have samples too.
  const bool ulysses = q.cp_ulysses > 1;
  if (ulysses && q.cp_ring == 1 && (segment_mask || padded_rows)) {
    const int64_t whole = S * q.cp_ulysses;
    e.before += B * whole * whole;
    e.notes.emplace_back("Ulysses' whole-sequence mask", B * whole * whole);
  }
  // Sequence parallel: the column-parallel projections save their all-gathered (whole) inputs.
  const int64_t layer = N * (6 * H / sp + (sp > 1 ? 2 * H : 0) + 4 * Q + heads + 4 * I + (ulysses ? Q : 0)) * f;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string path = prefix + "model.layers." + std::to_string(i);
    // Selective recompute: the attention's q, k, v, output and log-sum-exp; the MLP's four.
    if (q.runs_block(path))
      e.blocks.push_back({path, layer, N / sp * H * f, N * (3 * I + H / sp) * f,
                          {{"self_attn", N * (4 * Q + heads + (ulysses ? Q : 0)) * f}, {"mlp", N * 4 * I * f}}});
  }
  if (q.last_stage) {
    const int64_t V = q.vocab_parallel ? c.vocab_size / t : c.vocab_size;
    const int64_t norm = N / sp * 2 * H * f;
    e.after += norm;
    e.notes.emplace_back("final norm", norm);
    if (q.loss_chunk > 0) {
      // Only the per-token losses stay; backward rebuilds one chunk's logits and their softmax and
      // makes the hidden states' and the head's gradients whole.
      e.after += N * f;
      e.backward_extra += (2 * std::min(q.loss_chunk, N) * V + N * H + V * H) * f;
      e.notes.emplace_back("token losses (chunked head and loss)", N * f);
    } else {
      const int64_t logits = N * 2 * V * f;
      e.after += logits;
      e.backward_extra += logits;
      e.notes.emplace_back("logits and log-softmax", logits);
    }
  }
}

std::optional<ActivationEstimate> Qwen2ForCausalLM::estimate_activations(const data::Batch& host,
                                                                         const MemoryQuery& q) const {
  const at::Tensor& ids = host.require(data::kInputIds);
  ActivationEstimate e;
  estimate_decoder(e, ids.size(0), ids.size(-1), host.has(data::kSegmentIds), /*embeddings=*/true, q);
  return e;
}

}  // namespace mm::models
