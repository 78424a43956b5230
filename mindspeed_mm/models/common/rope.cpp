#include "mindspeed_mm/models/common/rope.h"

#include "mindspeed_mm/core/errors.h"

namespace mm::models {

at::Tensor rope_inv_freq(int64_t head_dim, double theta, at::ScalarType dtype, at::Device device) {
  MM_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be even and > 0 (got ", head_dim, ")");
  auto opts = at::TensorOptions().device(device);
  at::Tensor exponent = at::arange(0, head_dim, 2, opts.dtype(at::kLong)).to(dtype) / static_cast<double>(head_dim);
  return at::reciprocal(at::pow(at::Scalar(theta), exponent));
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& position_ids, const at::Tensor& inv_freq) {
  at::Tensor pos = position_ids.dim() == 1 ? position_ids.unsqueeze(0) : position_ids;
  MM_CHECK(pos.dim() == 2, "rope: position_ids must be [batch, seq] (got ", pos.sizes(), ")");
  at::Tensor freqs = pos.to(inv_freq.scalar_type()).unsqueeze(-1) * inv_freq.view({1, 1, -1});  // [B, S, D/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);                                      // [B, 1, S, D]
  return {emb.cos(), emb.sin()};
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

std::pair<at::Tensor, at::Tensor> apply_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                             const at::Tensor& sin) {
  // No cast: cos/sin come in the model's dtype, so under bf16 autocast (fp32 weights, bf16 q)
  // the rotation promotes to fp32, as in Hugging Face's apply_rotary_pos_emb.
  return {q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin};
}

}  // namespace mm::models
