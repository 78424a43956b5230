// LLaVA's activation estimate (models/memory.h): the CLIP tower's layers and the projector as
// llava.cpp runs them, then the language model as Qwen2's (qwen2_memory.cpp). Per image token
// (the patches and the class token, T of them), in fp32, E = the tower's width, M its MLP's:
//   embeddings     the patches as the patch matmul's input (C P^2 per patch), the embeddings with
//                  positions and pre_layrnorm's output                            2 E + 2 + C P^2
//   encoder layer  layer_norm1 (output, mean, rstd), q, k, v and the attention output, the
//                  log-sum-exp, the residual, layer_norm2, the MLP (quick_gelu: fc1, sigmoid,
//                  product; gelu: two) and the output          (E + 2) + 4 E + heads + E + (E + 2) + 3 M + E
//   projector      linear_1's output and its activation, per image token         2 H
// Into the decoder: the text embeddings and their copy with the features placed (2 H per token).
// Measured against the counting allocator in tests/unit/test_memory.cpp.
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/llava/llava.h"

namespace mm::models {

std::optional<ActivationEstimate> LlavaForConditionalGeneration::estimate_activations(const data::Batch& host,
                                                                                      const MemoryQuery& q) const {
  const at::Tensor& ids = host.require(data::kInputIds);
  const int64_t B = ids.size(0), S = ids.size(-1), N = B * S, f = 4;
  const ClipVisionConfig& v = config.vision;
  const int64_t images = host.has(data::kPixelValues) ? host[data::kPixelValues].size(0) : 0;
  ActivationEstimate e;
  if (images > 0) {
    const int64_t E = v.hidden_size, M = v.intermediate_size, T = v.num_patches() + 1;
    const int64_t patch = v.num_channels * v.patch_size * v.patch_size;
    const int64_t embed = images * (v.num_patches() * patch + T * (2 * E + 2)) * f;
    e.before += embed;
    e.notes.emplace_back("vision tower's embeddings", embed);
    const int64_t mlp = (v.hidden_act == "quick_gelu" ? 3 : 2) * M;
    const int64_t layer = images * T * ((E + 2) + 4 * E + v.num_attention_heads + E + (E + 2) + mlp + E) * f;
    for (int64_t i = 0; i < config.vision_layers_used(); ++i) {
      const std::string path = "vision_tower.vision_model.encoder.layers." + std::to_string(i);
      if (q.runs_block(path)) e.blocks.push_back({path, layer, images * T * E * f, images * T * (2 * M + E) * f});
    }
    const int64_t projector = images * config.image_tokens() * 2 * config.text.hidden_size * f;
    e.before += projector;
    e.notes.emplace_back("projector", projector);
  }
  const int64_t embeds = N * config.text.hidden_size * f * (images > 0 ? 2 : 1);
  e.before += embeds;
  e.notes.emplace_back("text embeddings (and with the vision features placed)", embeds);
  language_model->estimate_decoder(e, B, S, host.has(data::kSegmentIds), /*embeddings=*/false, q, "language_model.");
  return e;
}

}  // namespace mm::models
