// Qwen2-VL's activation estimate (models/memory.h): the vision tower's blocks and the merger as
// vision.cpp runs them, then the language model as Qwen2's (qwen2_memory.cpp). Per patch, in
// fp32, E = embed_dim, M = the MLP width, t the tensor-parallel degree:
//   Qwen2-VL block     norm1 (LayerNorm: output, mean, rstd)                  E + 2
//                      attention: q and k after RoPE, v and the output as
//                      segments, the output as the projection's input          6 E / t + heads / t
//                      the residual, norm2, the block's output                 2 E + 2 + E
//                      MLP (quick_gelu: fc1, sigmoid, product; gelu: two)      3 M / t (2 M / t)
//   Qwen2.5-VL block   RMSNorms (2 E each) and the SwiGLU MLP (4 I / t)
//   tower              patch embeddings (E), rotary tables (2 head_dim), Qwen2.5's window order (E)
//   merger, per unit   normed patches (m^2 E), fc_in's output and its GELU (2 m^2 E / t)
// Into the decoder: the text embeddings and their copy with the features placed (2 H per token).
// Measured against the counting allocator in tests/unit/test_memory.cpp.
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"

namespace mm::models {

std::optional<ActivationEstimate> Qwen2VLForConditionalGeneration::estimate_activations(const data::Batch& host,
                                                                                        const MemoryQuery& q) const {
  const at::Tensor& ids = host.require(data::kInputIds);
  const int64_t B = ids.size(0), S = ids.size(-1), N = B * S, f = 4, t = std::max<int64_t>(1, q.tp);
  const Qwen2VLVisionConfig& v = visual->config;
  int64_t patches = 0;
  for (auto field : {data::kPixelValues, data::kPixelValuesVideos})
    if (host.has(field)) patches += host[field].size(0);
  ActivationEstimate e;
  if (patches > 0) {
    const int64_t E = v.embed_dim, heads = v.num_heads / t, unit = v.spatial_merge_size * v.spatial_merge_size;
    // Context parallel (the batch is this rank's share of the tokens, the pixels whole): the
    // tower's blocks run on this rank's share of the patches (the layout's,
    // or a ring where the heads do not split over its Ulysses degree), embedded from its pixel
    // rows alone; the rotary tables are made whole and cut, the blocks' output gathered whole.
    int64_t uv = q.cp_ulysses, rv = q.cp_ring;
    if (uv > 1 && heads % uv != 0) {
      uv = 1;
      rv = q.cp_size();
    }
    const bool cut = q.cp_size() > 1;
    const int64_t mine = cut ? MemoryQuery::cp_share(patches, uv, rv) : patches;
    int64_t block = 0;
    if (v.qwen2_5) {
      block = 2 * E + 6 * E / t + heads + E + 2 * E + 4 * v.intermediate_size / t + E;
    } else {
      const int64_t mlp = (v.hidden_act == "quick_gelu" ? 3 : 2) * v.mlp_hidden() / t;
      block = (E + 2) + 6 * E / t + heads + E + (E + 2) + mlp + E;
    }
    if (q.first_stage) {
      const int64_t tower = (mine * E * (v.qwen2_5 && !cut ? 2 : 1) + (patches + (cut ? mine : 0)) * 2 * v.head_dim()) * f;
      e.before += tower;
      e.notes.emplace_back("vision tower's embeddings and rotary tables", tower);
      if (cut && uv > 1 && rv == 1) {  // Ulysses off CUDA: a mask of the whole padded tower sequence per segment layout
        const int64_t whole = mine * uv, masks = (v.qwen2_5 ? 2 : 1) * whole * whole;
        e.before += masks;
        e.notes.emplace_back("Ulysses' whole-sequence masks (vision)", masks);
      }
    }
    if (uv > 1 && cut) block += E / t;  // Ulysses: the attention output over every patch, this rank's heads
    for (int64_t i = 0; i < v.depth; ++i) {
      const std::string path = "visual.blocks." + std::to_string(i);
      if (q.runs_block(path)) e.blocks.push_back({path, mine * block * f, mine * E * f, 0});
    }
    if (q.first_stage && cut) {
      e.before += patches * E * f;
      e.notes.emplace_back("the tower's gathered patches", patches * E * f);
    }
    if (q.first_stage) {
      const int64_t merger = patches / unit * (unit * (v.qwen2_5 ? 2 * E : E + 2) + 2 * unit * E / t) * f;
      e.before += merger;
      e.notes.emplace_back("merger", merger);
    }
  }
  if (q.first_stage) {
    const int64_t embeds = N * config.hidden_size * f * (patches > 0 ? 2 : 1);
    e.before += embeds;
    e.notes.emplace_back("text embeddings (and with the vision features placed)", embeds);
  }
  estimate_decoder(e, B, S, host.has(data::kSegmentIds), /*embeddings=*/false, q, "", host.has(data::kAttentionMask));
  return e;
}

}  // namespace mm::models
