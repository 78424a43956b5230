// Rotary position embedding (RoPE) in Hugging Face layout: the rotated pairs are (i, i + D/2),
// not interleaved, and the tables repeat the frequencies: emb = cat(freqs, freqs).
//   inv_freq[i] = 1 / theta^(2i / D),  i in [0, D/2)
//   angle[b, s, j] = position[b, s] * inv_freq[j mod D/2]
//   x' = x * cos(angle) + rotate_half(x) * sin(angle),  rotate_half(x) = cat(-x[D/2:], x[:D/2])
#pragma once

#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace mm::models {

// [head_dim / 2]. fp32 by default, computed the same way as HF (fp32 exponent, then pow).
at::Tensor rope_inv_freq(int64_t head_dim, double theta, at::ScalarType dtype = at::kFloat,
                         at::Device device = at::kCPU);

// position_ids [B, S] (or [S]) int64 -> cos, sin [B, 1, S, head_dim] in inv_freq's dtype,
// broadcastable against q/k laid out [B, heads, S, head_dim].
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& position_ids, const at::Tensor& inv_freq);

// M-RoPE (Qwen2-VL's multimodal rotary embedding): position_ids [3, B, S] hold the (t, h, w)
// position of every token; the D/2 rotary frequencies are cut into consecutive sections
// mrope_section (e.g. [16, 24, 24] for head_dim 128, summing to D/2), the same cut applied to
// both halves of the table, and section i takes its angle from axis i % 3. Returns cos, sin
// [B, 1, S, D]; with equal t, h and w positions they equal rope_cos_sin's exactly.
std::pair<at::Tensor, at::Tensor> mrope_cos_sin(const at::Tensor& position_ids, const at::Tensor& inv_freq,
                                                const std::vector<int64_t>& mrope_section);

at::Tensor rotate_half(const at::Tensor& x);

// Rotates q [B, Hq, S, D] and k [B, Hkv, S, D]; cos/sin are cast to q's dtype first (as HF does).
std::pair<at::Tensor, at::Tensor> apply_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                             const at::Tensor& sin);

}  // namespace mm::models
