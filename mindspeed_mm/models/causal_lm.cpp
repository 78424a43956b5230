#include "mindspeed_mm/models/causal_lm.h"

#include <ATen/core/grad_mode.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/cross_entropy.h"

namespace mm::models {

MultimodalInputs multimodal_inputs(const data::Batch& b, bool attention) {
  MultimodalInputs in;
  in.input_ids = b.require(data::kInputIds);
  in.position_ids = b[data::kPositionIds];
  in.attention_mask = b[data::kAttentionMask];
  in.segment_ids = b[data::kSegmentIds];
  in.pixel_values = b[data::kPixelValues];
  in.image_grid_thw = b[data::kImageGridThw];
  in.pixel_values_videos = b[data::kPixelValuesVideos];
  in.video_grid_thw = b[data::kVideoGridThw];
  in.pixels_cut = b.has(data::kPixelRowsCut);
  in.mrope_position_ids = b[data::kMropePositionIds];
  in.image_feature_index = b[data::kImageFeatureIndex];
  in.video_feature_index = b[data::kVideoFeatureIndex];
  if (const at::Tensor& s = b[data::kVideoSecondPerGrid]; s.defined()) {
    at::Tensor d = s.to(at::kCPU, at::kDouble).contiguous();
    in.video_second_per_grid.assign(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  }
  if (!attention || !in.segment_ids.defined()) return in;
  if (in.input_ids.is_cuda()) {
    // Packed rows on CUDA: segment boundaries for the varlen flash kernel instead of a [B, 1, S, S] mask.
    if (b.has(data::kCuSeqlens) && b.has(data::kMaxSeqlen)) {
      in.cu_seqlens = b[data::kCuSeqlens];
      in.max_seqlen = b[data::kMaxSeqlen].item<int64_t>();  // a host field: no device sync
    } else {
      auto [cu, longest] = packed_cu_seqlens(in.segment_ids.cpu());
      in.cu_seqlens = cu.to(in.input_ids.device());
      in.max_seqlen = longest;
    }
  } else {
    in.attn_mask = segment_attention_mask(in.segment_ids);
  }
  return in;
}

mm::nn::ForwardContext decoder_context(const at::Tensor& cos, const at::Tensor& sin, at::ScalarType dtype,
                                       const MultimodalInputs& in) {
  mm::nn::ForwardContext ctx;
  ctx.cos = cos.to(dtype);
  ctx.sin = sin.to(dtype);
  ctx.causal = true;
  ctx.attn_mask = in.attn_mask;
  ctx.cu_seqlens = in.cu_seqlens;
  ctx.max_seqlen = in.max_seqlen;
  ctx.kv_cache = in.kv_cache;
  return ctx;
}

at::Tensor place_vision_features(const at::Tensor& embeds, const at::Tensor& input_ids, int64_t token,
                                 const at::Tensor& features, const std::string& model, const std::string& what,
                                 const std::string& hint) {
  at::Tensor mask = input_ids.eq(token);
  const int64_t pads = mask.sum().item<int64_t>();
  MM_CHECK(pads == features.size(0), model, ": ", pads, " ", what, " pad tokens (id ", token,
           ") but the vision tower gave ", features.size(0), " features", hint);
  return embeds.masked_scatter(mask.unsqueeze(-1), features.to(embeds.scalar_type()));
}

at::Tensor place_vision_features_at(const at::Tensor& embeds, const at::Tensor& index, const at::Tensor& features,
                                    const std::string& model, const std::string& what) {
  at::Tensor mask = index.ge(0);
  at::Tensor rows = index.masked_select(mask);
  if (rows.numel() > 0) {
    const int64_t top = rows.max().item<int64_t>();
    MM_CHECK(top < features.size(0), model, ": an ", what, " pad token takes feature row ", top,
             " but the vision tower gave ", features.size(0), " features");
  }
  // Even with none of them here the features stay in the graph: the tower's backward then runs
  // on every rank, as its collectives need.
  return embeds.masked_scatter(mask.unsqueeze(-1), features.index_select(0, rows).to(embeds.scalar_type()));
}

at::Tensor vision_feature_index(const at::Tensor& input_ids, int64_t token) {
  at::Tensor is = input_ids.eq(token);
  at::Tensor n = is.flatten().to(at::kLong).cumsum(0).view(input_ids.sizes()) - 1;
  return at::where(is, n, at::full({}, -1, n.options()));
}

int64_t real_tokens(const MultimodalInputs& in) {
  if (in.attention_mask.defined()) return in.attention_mask.ne(0).sum().item<int64_t>();
  if (in.segment_ids.defined()) return in.segment_ids.ge(0).sum().item<int64_t>();
  return in.input_ids.numel();
}

double CausalLM::training_flops(const MultimodalInputs& in) const {
  return static_cast<double>(real_tokens(in)) * flops_per_token(in.input_ids.size(-1));
}

at::Tensor CausalLM::forward_hidden(const MultimodalInputs&) {
  throw Error(cat("model ", type_name(), " cannot fuse its head with the loss (training.loss_chunk_size)"));
}

namespace {
bool fuses_head(int64_t chunk, const data::Batch& batch) {
  return chunk > 0 && at::GradMode::is_enabled() && batch.has(data::kLabels);
}
}  // namespace

void CausalLM::set_head_output(Outputs& out, const at::Tensor& hidden, const data::Batch& batch,
                               const std::function<at::Tensor(const at::Tensor&)>& logits) const {
  if (!fuses_head(loss_chunk_, batch)) return out.set(kLogits, logits(hidden));
  const at::Tensor& y = batch[data::kLabels];
  out.set(kTokenLosses, chunked_loss_ ? chunked_loss_(hidden, head_weight(), y, loss_chunk_)
                                      : chunked_linear_cross_entropy(hidden, head_weight(), y, loss_chunk_));
}

Outputs CausalLM::forward(const data::Batch& batch) {
  Outputs out;
  if (fuses_head(loss_chunk_, batch)) {
    set_head_output(out, forward_hidden(multimodal_inputs(batch)), batch, {});
    return out;
  }
  out.set(kLogits, forward_multimodal(multimodal_inputs(batch)));
  return out;
}

std::vector<std::string> CausalLM::required_fields() const { return {std::string(data::kInputIds)}; }

std::vector<std::string> CausalLM::optional_fields() const {
  std::vector<std::string> f;
  for (auto n : {data::kPositionIds, data::kAttentionMask, data::kSegmentIds, data::kCuSeqlens, data::kMaxSeqlen})
    f.emplace_back(n);
  if (has_vision())
    for (auto n : {data::kPixelValues, data::kImageGridThw, data::kPixelValuesVideos, data::kVideoGridThw,
                   data::kVideoSecondPerGrid})
      f.emplace_back(n);
  return f;
}

double CausalLM::input_tokens(const data::Batch& host) const {
  return static_cast<double>(real_tokens(multimodal_inputs(host, /*attention=*/false)));
}

double CausalLM::training_flops(const data::Batch& host) const {
  return training_flops(multimodal_inputs(host, /*attention=*/false));
}

std::string CausalLM::cost_summary(int64_t seq_len) const {
  return log::fixed(flops_per_token(seq_len) / 1e6, 2) + " MFLOP per text token" +
         (has_vision() ? " (the vision tower's FLOPs are counted per image)" : "");
}

std::shared_ptr<CausalLM> as_causal_lm(const std::shared_ptr<Model>& model, const std::string& what) {
  auto lm = std::dynamic_pointer_cast<CausalLM>(model);
  if (!lm) throw Error(cat(what, ": model ", model->type_name(), " is not a language model"));
  return lm;
}

}  // namespace mm::models
