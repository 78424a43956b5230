#include "mindspeed_mm/models/common/cross_entropy.h"

#include <ATen/core/Reduction.h>

#include "mindspeed_mm/core/errors.h"

namespace mm::models {

namespace {

// Logits as [tokens, vocab] (fp32 when stored in half precision) and labels as [tokens] longs.
std::pair<at::Tensor, at::Tensor> flat_logits_labels(const at::Tensor& logits, const at::Tensor& labels) {
  MM_CHECK(logits.dim() >= 2 && labels.dim() == logits.dim() - 1 &&
               labels.sizes() == logits.sizes().slice(0, logits.dim() - 1),
           "cross_entropy: logits ", logits.sizes(), " and labels ", labels.sizes(), " do not line up");
  at::Tensor x = logits.reshape({-1, logits.size(-1)});
  if (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) x = x.to(at::kFloat);
  return {x, labels.reshape({-1}).to(at::kLong)};
}

// Flat sample index of every token: row * (segments per row) + segment, or the row.
at::Tensor sample_index(const at::Tensor& labels, const at::Tensor& segment_ids, int64_t* num_samples) {
  const int64_t B = labels.size(0), S = labels.numel() / std::max<int64_t>(1, B);
  at::Tensor row = at::arange(B, at::TensorOptions().dtype(at::kLong).device(labels.device())).unsqueeze(1).expand({B, S});
  if (!segment_ids.defined()) {
    *num_samples = B;
    return row.reshape({-1});
  }
  MM_CHECK(segment_ids.sizes() == labels.sizes(), "cross_entropy: segment_ids ", segment_ids.sizes(), " and labels ",
           labels.sizes(), " do not line up");
  const int64_t per_row = segment_ids.numel() > 0 ? segment_ids.max().item<int64_t>() + 1 : 1;
  *num_samples = B * std::max<int64_t>(1, per_row);
  return (row * std::max<int64_t>(1, per_row) + segment_ids.to(at::kLong).clamp_min(0)).reshape({-1});
}

}  // namespace

CrossEntropySum lm_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  auto [x, y] = flat_logits_labels(logits, labels);
  at::Tensor sum = at::cross_entropy_loss(x, y, {}, at::Reduction::Sum, kIgnoreIndex);
  at::Tensor count = (y != kIgnoreIndex).sum();
  return {sum, count};
}

CrossEntropySum lm_cross_entropy_per_sample_sum(const at::Tensor& logits, const at::Tensor& labels,
                                                const at::Tensor& segment_ids) {
  auto [x, y] = flat_logits_labels(logits, labels);
  at::Tensor per_token = at::cross_entropy_loss(x, y, {}, at::Reduction::None, kIgnoreIndex);  // 0 where ignored
  return per_sample_sum(per_token, labels, segment_ids);
}

CrossEntropySum per_sample_sum(const at::Tensor& token_losses, const at::Tensor& labels, const at::Tensor& segment_ids) {
  at::Tensor per_token = token_losses.reshape({-1});
  at::Tensor y = labels.reshape({-1});
  int64_t n = 0;
  at::Tensor sid = sample_index(labels, segment_ids, &n);
  at::Tensor tokens = at::zeros({n}, per_token.options()).index_add(0, sid, (y != kIgnoreIndex).to(per_token.scalar_type()));
  at::Tensor sums = at::zeros({n}, per_token.options()).index_add(0, sid, per_token);
  at::Tensor scored = tokens > 0;
  return {(sums / tokens.clamp_min(1)).masked_select(scored).sum(), scored.sum()};
}

int64_t scored_samples(const at::Tensor& labels, const at::Tensor& segment_ids) {
  int64_t n = 0;
  at::Tensor sid = sample_index(labels, segment_ids, &n);
  at::Tensor tokens = at::zeros({n}, at::TensorOptions().dtype(at::kLong).device(labels.device()))
                          .index_add(0, sid, (labels.reshape({-1}) != kIgnoreIndex).to(at::kLong));
  return (tokens > 0).sum().item<int64_t>();
}

at::Tensor lm_cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  auto [sum, count] = lm_cross_entropy_sum(logits, labels);
  return sum / count.clamp_min(1).to(sum.scalar_type());
}

}  // namespace mm::models
