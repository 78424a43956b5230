// Causal language models: next-token logits from tokens, and from the images and videos a
// vision-language model puts in front of its decoder. forward(Batch) reads the batch fields
// (data/batch.h) into MultimodalInputs, the form the decoders and generation use.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "mindspeed_mm/models/model.h"

namespace mm::nn {
struct KVCache;
}

namespace mm::models {

// A batch as a language model's forward sees it. Vision fields are undefined when a batch has
// no images or videos.
struct MultimodalInputs {
  at::Tensor input_ids, position_ids, attn_mask;  // as forward()
  at::Tensor attention_mask;                      // int64 [B, S], 1 = real token (undefined: all)
  at::Tensor segment_ids;                         // packed rows: the sample of each token, -1 = padding
  // Packed rows without a mask (instead of attn_mask): int32 boundaries over the flattened B*S
  // tokens, every token in exactly one segment and no segment across rows (packed_cu_seqlens),
  // and the longest segment. On CUDA they go to the varlen flash kernel.
  at::Tensor cu_seqlens;
  int64_t max_seqlen = 0;
  at::Tensor pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw;
  std::vector<double> video_second_per_grid;
  bool pixels_cut = false;  // data::kPixelRowsCut: the pixel rows are a context-parallel rank's
  // A context-parallel rank's share of a row (data::kMropePositionIds, k*FeatureIndex): its
  // M-RoPE positions and the feature row of each of its pad tokens, made from the whole row.
  at::Tensor mrope_position_ids, image_feature_index, video_feature_index;
  // Incremental decoding (mindspeed_mm/models/common/kv_cache.h): the keys and values of the
  // tokens before input_ids; input_ids are appended. Positions continue after the cache.
  mm::nn::KVCache* kv_cache = nullptr;
};

// The batch's fields as MultimodalInputs. attention: also how attention sees packed rows (a
// per-sample mask [B, 1, S, S] on the CPU; cu_seqlens for the varlen kernel on CUDA); without
// it, only what sizes the work (FLOPs, token counts).
MultimodalInputs multimodal_inputs(const data::Batch& batch, bool attention = true);

// The context a decoder's blocks run in: rotary tables cos/sin cast to dtype, causal attention,
// and from `in` how attention sees packed rows (mask or cu_seqlens) and the KV cache. Qwen2's
// 1-D RoPE and Qwen2-VL's M-RoPE differ only in the tables.
mm::nn::ForwardContext decoder_context(const at::Tensor& cos, const at::Tensor& sin, at::ScalarType dtype,
                                       const MultimodalInputs& in);

// Vision features into a language model's input embeddings: the embedding of every token equal
// to `token` (the image or video pad token) replaced by the next row of features [n, hidden], in
// order. mm::Error "<model>: N <what> pad tokens (id T) but the vision tower gave F features<hint>"
// when the counts differ (a processor whose settings do not match the model's).
at::Tensor place_vision_features(const at::Tensor& embeds, const at::Tensor& input_ids, int64_t token,
                                 const at::Tensor& features, const std::string& model, const std::string& what,
                                 const std::string& hint = "");
// The same for a share of the rows (context parallelism): index [B, S] names the feature row of
// each pad token (-1 elsewhere), counted over the whole rows; the result depends on the features
// even where the share holds no pad token (a zero gradient). mm::Error when it names a row the
// tower did not give.
at::Tensor place_vision_features_at(const at::Tensor& embeds, const at::Tensor& index, const at::Tensor& features,
                                    const std::string& model, const std::string& what);
// Each `token` of input_ids [B, S] numbered in order over the batch (the feature row it takes),
// -1 on every other token: what place_vision_features_at takes.
at::Tensor vision_feature_index(const at::Tensor& input_ids, int64_t token);

// Real tokens of a batch: attention_mask ones, else non-negative segment ids, else B * S.
int64_t real_tokens(const MultimodalInputs& in);

class CausalLM : public Model {
 public:
  using Model::forward;
  // input_ids [B, S] int64 -> logits [B, S, vocab]. position_ids [B, S]; undefined = 0..S-1.
  // attn_mask (optional) bool [B, 1, S, S], true = may attend, combined with the causal mask:
  // packed rows pass segment_attention_mask() so each sample sees only itself.
  virtual at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& position_ids = {},
                             const at::Tensor& attn_mask = {}) = 0;
  // Logits of a (possibly multimodal) batch, using in.kv_cache when set; text models use the
  // token fields only.
  virtual at::Tensor forward_multimodal(const MultimodalInputs& in) = 0;
  // Training FLOPs (forward + backward) per text token at sequence length seq_len.
  virtual double flops_per_token(int64_t seq_len) const = 0;
  // Training FLOPs of one batch: its real (non-padding) tokens at flops_per_token(S), plus what a
  // vision tower spends on the batch's images and videos.
  virtual double training_flops(const MultimodalInputs& in) const;
  virtual int64_t vocab_size() const = 0;
  // Whether forward_multimodal uses the vision fields (a text model ignores them).
  virtual bool has_vision() const { return false; }
  // The tokens a prompt holds for an image of `features` merged features (Qwen2-VL: vision
  // start, the pads, vision end). Empty: the model does not place images by token count
  // (`mm memory`'s synthetic rows then hold none).
  virtual std::vector<int64_t> image_placeholder(int64_t /*features*/) const { return {}; }

  // The final normed hidden states of `in` (what the head turns into logits) and the head's weight
  // [vocab, hidden] (the embedding's when tied), for the fused chunked loss. The defaults: none.
  virtual at::Tensor forward_hidden(const MultimodalInputs& in);
  virtual at::Tensor head_weight() const { return {}; }
  // training.loss_chunk_size: with tokens > 0, a training forward (grad mode, labels in the batch)
  // gives {"token_losses"} through chunked_linear_cross_entropy instead of the whole logits.
  void set_loss_chunk(int64_t tokens) { loss_chunk_ = tokens; }
  // The model's last output from its final normed hidden states: {"token_losses"} through the
  // chunked head and loss when a training forward asks for it (as forward does), else {"logits"}
  // from `logits` (the head). A pipeline's last stage calls it.
  void set_head_output(Outputs& out, const at::Tensor& hidden, const data::Batch& batch,
                       const std::function<at::Tensor(const at::Tensor&)>& logits) const;
  // A plan's own fused head and loss (hidden, head weight, labels, chunk -> per-token losses):
  // tensor parallelism's vocabulary-parallel one. Empty: chunked_linear_cross_entropy.
  using ChunkedLoss = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t)>;
  void set_chunked_loss(ChunkedLoss fn) { chunked_loss_ = std::move(fn); }
  int64_t loss_chunk() const { return loss_chunk_; }

  // The Model interface: {"logits": [B, S, vocab]} (or {"token_losses"}, above); objective causal_lm.
  Outputs forward(const data::Batch& batch) override;
  std::vector<std::string> required_fields() const override;
  std::vector<std::string> optional_fields() const override;
  std::string default_objective() const override { return "causal_lm"; }
  // Tied checkpoints sometimes carry a copy of the embedding as lm_head.weight.
  std::vector<std::string> optional_checkpoint_tensors() const override { return {"lm_head.weight"}; }
  double input_tokens(const data::Batch& host) const override;
  double training_flops(const data::Batch& host) const override;
  std::string cost_summary(int64_t seq_len) const override;

 private:
  int64_t loss_chunk_ = 0;
  ChunkedLoss chunked_loss_;
};

// model as a CausalLM, or mm::Error "<what>: model <type> is not a language model".
std::shared_ptr<CausalLM> as_causal_lm(const std::shared_ptr<Model>& model, const std::string& what);

}  // namespace mm::models
