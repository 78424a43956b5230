// The Wan DiT's activation estimate (models/memory.h): the tensors wan_dit.cpp saves, per latent
// token (after patching) and per text token, in fp32; d = the width, F = the FFN's, t the
// tensor-parallel degree (heads and the FFN split, the norms and modulation whole):
//   modulated LayerNorm (norm, mean and rstd, the modulated input)          2 d + 2, twice
//   self-attention: q and k with their RMS norms' x * rsqrt, v, q and k
//   rotated, the output, the log-sum-exp                                    8 d / t + heads / t
//   the gated attention output and the residual                             2 d
//   norm2 (mean, rstd, output), cross-attention's q side (4 d / t + heads / t)
//   and its keys and values over the text (4 d / t per text token)
//   the residual after it, the FFN (its input and GELU, 2 F / t), the gated
//   FFN output and the block's output                                       d + 2 F / t + 2 d
// Outside: the patch embedding, the text embedder (3 d per text token), the objective's noisy
// latents and target, the head and the loss (prediction, difference).
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/wan/wan_dit.h"

namespace mm::models {

std::optional<ActivationEstimate> WanTransformer3DModel::estimate_activations(const data::Batch& host,
                                                                              const MemoryQuery& q) const {
  const at::Tensor& x0 = host.require(data::kLatents);
  const at::Tensor& text = host.require(data::kPromptEmbeds);
  const int64_t B = x0.size(0), f = 4, t = std::max<int64_t>(1, q.tp);
  const auto& p = config.patch_size;
  const int64_t tokens = B * (x0.size(2) / p[0]) * (x0.size(3) / p[1]) * (x0.size(4) / p[2]);
  const int64_t text_tokens = B * text.size(1), latent = x0.numel();
  const int64_t d = config.dim(), heads = config.num_attention_heads / t, F = config.ffn_dim / t;
  ActivationEstimate e;
  // The objective's noisy latents and velocity target ride in the batch through the step.
  e.before += 2 * latent * f;
  e.notes.emplace_back("noisy latents and target", 2 * latent * f);
  if (q.first_stage) {
    const int64_t embed = (tokens * d + text_tokens * 3 * d) * f;
    e.before += embed;
    e.notes.emplace_back("patch and text embeddings", embed);
  }
  // Context parallel: the blocks run on this rank's share of the patches (Ulysses keeps its
  // attention's output over all of them for its heads, and off CUDA a mask of the whole padded
  // sequence when padding was added), gathered whole after the last.
  const bool cut = q.cp_inside && q.cp_size() > 1;
  const int64_t per_row = tokens / B, mine = cut ? B * MemoryQuery::cp_share(per_row, q.cp_ulysses, q.cp_ring) : tokens;
  const bool ulysses = cut && q.cp_ulysses > 1;
  if (ulysses && q.cp_ring == 1 && mine * q.cp_size() != tokens) {
    const int64_t whole = mine / B * q.cp_ulysses;
    e.before += B * whole * whole;
    e.notes.emplace_back("Ulysses' whole-sequence mask", B * whole * whole);
  }
  const int64_t block = (mine * ((2 * d + 2) * 2 + 8 * d / t + heads + 2 * d + (d + 2) + 4 * d / t + heads + d +
                                 2 * F + 2 * d + (ulysses ? d / t : 0)) +
                         text_tokens * 4 * d / t) *
                        f;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string path = "blocks." + std::to_string(i);
    if (q.runs_block(path)) e.blocks.push_back({path, block, mine * d * f, mine * (2 * F + 2 * d) * f});
  }
  if (q.last_stage && cut) {
    e.after += tokens * d * f;
    e.notes.emplace_back("the gathered sequence", tokens * d * f);
  }
  if (q.last_stage) {
    const int64_t head = tokens * (2 * d + 2) * f + 3 * latent * f;
    e.after += head;
    e.backward_extra += 2 * latent * f;
    e.notes.emplace_back("head and loss", head);
  }
  return e;
}

}  // namespace mm::models
