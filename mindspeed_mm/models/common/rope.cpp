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

std::pair<at::Tensor, at::Tensor> mrope_cos_sin(const at::Tensor& position_ids, const at::Tensor& inv_freq,
                                                const std::vector<int64_t>& mrope_section) {
  MM_CHECK(position_ids.dim() == 3 && position_ids.size(0) == 3, "rope: M-RoPE position_ids must be [3, batch, seq] (got ",
           position_ids.sizes(), ")");
  int64_t total = 0;
  for (int64_t s : mrope_section) {
    MM_CHECK(s > 0, "rope: mrope_section entries must be > 0");
    total += s;
  }
  MM_CHECK(total == inv_freq.numel(), "rope: mrope_section sums to ", total, " but head_dim / 2 is ", inv_freq.numel());
  std::pair<at::Tensor, at::Tensor> axis[3];
  for (int a = 0; a < 3; ++a) axis[a] = rope_cos_sin(position_ids[a], inv_freq);  // [B, 1, S, D] each
  std::vector<at::Tensor> cos_parts, sin_parts;
  int64_t offset = 0;
  const size_t n = mrope_section.size();
  for (size_t i = 0; i < 2 * n; ++i) {  // the sections of both halves: mrope_section * 2
    const int64_t len = mrope_section[i % n];
    const int a = static_cast<int>(i % 3);
    cos_parts.push_back(axis[a].first.narrow(-1, offset, len));
    sin_parts.push_back(axis[a].second.narrow(-1, offset, len));
    offset += len;
  }
  return {at::cat(cos_parts, -1), at::cat(sin_parts, -1)};
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
