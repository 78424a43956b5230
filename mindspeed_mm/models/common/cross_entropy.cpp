#include "mindspeed_mm/models/common/cross_entropy.h"

#include <ATen/core/Reduction.h>

#include "mindspeed_mm/core/errors.h"

namespace mm::models {

CrossEntropySum lm_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  MM_CHECK(logits.dim() >= 2 && labels.dim() == logits.dim() - 1 &&
               labels.sizes() == logits.sizes().slice(0, logits.dim() - 1),
           "cross_entropy: logits ", logits.sizes(), " and labels ", labels.sizes(), " do not line up");
  const int64_t V = logits.size(-1);
  at::Tensor x = logits.reshape({-1, V});
  if (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) x = x.to(at::kFloat);
  at::Tensor y = labels.reshape({-1}).to(at::kLong);
  at::Tensor sum = at::cross_entropy_loss(x, y, {}, at::Reduction::Sum, kIgnoreIndex);
  at::Tensor count = (y != kIgnoreIndex).sum();
  return {sum, count};
}

at::Tensor lm_cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  auto [sum, count] = lm_cross_entropy_sum(logits, labels);
  return sum / count.clamp_min(1).to(sum.scalar_type());
}

}  // namespace mm::models
