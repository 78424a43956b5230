#include "mindspeed_mm/models/common/attention.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/torch_compat.h"

namespace mm::models {
namespace {

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  MM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: q, k, v must be [B, H, S, D] (got ",
           q.sizes(), ", ", k.sizes(), ", ", v.sizes(), ")");
  MM_CHECK(k.sizes() == v.sizes(), "attention: k ", k.sizes(), " and v ", v.sizes(), " differ");
  MM_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "attention: q ", q.sizes(), " and k ", k.sizes(),
           " disagree on batch or head_dim");
  MM_CHECK(q.size(1) % k.size(1) == 0, "attention: query heads (", q.size(1), ") not a multiple of kv heads (",
           k.size(1), ")");
}

// Bool [S, T]: true where query i may see key j, i.e. j <= i + (T - S).
at::Tensor causal_keep(int64_t S, int64_t T, at::Device device) {
  return at::ones({S, T}, at::TensorOptions().dtype(at::kBool).device(device)).tril(T - S);
}

// Folds `causal` into the user mask: bool stays bool (and-ed), float stays additive (-inf added).
at::Tensor merge_causal(const at::Tensor& mask, int64_t S, int64_t T, at::Device device) {
  at::Tensor keep = causal_keep(S, T, device);
  if (!mask.defined()) return keep;
  if (mask.scalar_type() == at::kBool) return at::logical_and(mask, keep);
  return mask.masked_fill(at::logical_not(keep), -std::numeric_limits<double>::infinity());
}

// Additive causal mask [S, T] (0 where allowed, -inf elsewhere), built once per shape and dtype:
// adding it costs nothing in backward, unlike masked_fill, which masks the gradient again.
at::Tensor additive_causal_mask(int64_t S, int64_t T, at::ScalarType dtype, at::Device device) {
  struct Key {
    int64_t S, T;
    at::ScalarType dtype;
    at::Device device;
    bool operator==(const Key& o) const { return S == o.S && T == o.T && dtype == o.dtype && device == o.device; }
  };
  thread_local std::vector<std::pair<Key, at::Tensor>> cache;
  Key key{S, T, dtype, device};
  for (auto& [k, t] : cache)
    if (k == key) return t;
  at::Tensor m = at::zeros({S, T}, at::TensorOptions().dtype(dtype).device(device))
                     .masked_fill(at::logical_not(causal_keep(S, T, device)), -std::numeric_limits<double>::infinity());
  if (cache.size() >= 8) cache.erase(cache.begin());
  cache.emplace_back(key, m);
  return m;
}

}  // namespace

at::Tensor segment_attention_mask(const at::Tensor& segment_ids) {
  MM_CHECK(segment_ids.dim() == 2, "attention: segment_ids must be [batch, seq] (got ", segment_ids.sizes(), ")");
  return segment_ids.unsqueeze(2).eq(segment_ids.unsqueeze(1)).unsqueeze(1);
}

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  return x.repeat_interleave(n_rep, /*dim=*/1);
}

at::Tensor scaled_dot_product_attention_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& attn_mask, bool causal,
                                             c10::optional<double> scale) {
  check_shapes(q, k, v);
  const int64_t S = q.size(2), T = k.size(2), n_rep = q.size(1) / k.size(1);
  const double sc = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor kk = repeat_kv(k, n_rep), vv = repeat_kv(v, n_rep);

  // Scores in the input dtype (as HF eager does), mask and softmax in at least fp32. The scale
  // goes on q, the smaller tensor.
  at::Tensor scores = at::matmul(q * sc, kk.transpose(-2, -1));
  const bool reduced = scores.scalar_type() == at::kBFloat16 || scores.scalar_type() == at::kHalf;
  if (reduced) scores = scores.to(at::kFloat);
  if (causal && !attn_mask.defined()) {
    // In place is safe: matmul saved its inputs, not its output, for backward.
    scores.add_(additive_causal_mask(S, T, scores.scalar_type(), scores.device()));
    return at::matmul(at::softmax(scores, -1).to(v.scalar_type()), vv);
  }
  at::Tensor mask = causal ? merge_causal(attn_mask, S, T, q.device()) : attn_mask;
  if (mask.defined()) {
    if (mask.scalar_type() == at::kBool)
      scores = scores.masked_fill(at::logical_not(mask), -std::numeric_limits<double>::infinity());
    else
      scores = scores + mask.to(scores.scalar_type());
  }
  at::Tensor probs = at::softmax(scores, -1).to(v.scalar_type());
  return at::matmul(probs, vv);
}

at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& attn_mask, bool causal, c10::optional<double> scale) {
  check_shapes(q, k, v);
  const int64_t S = q.size(2), T = k.size(2), n_rep = q.size(1) / k.size(1);
  at::Tensor kk = repeat_kv(k, n_rep), vv = repeat_kv(v, n_rep);
  // at::sdpa's is_causal aligns the diagonal to the top-left and refuses an explicit mask with it,
  // so anything but the plain square causal case goes in as an explicit mask.
  const bool native_causal = causal && S == T && !attn_mask.defined();
  at::Tensor mask = (causal && !native_causal) ? merge_causal(attn_mask, S, T, q.device()) : attn_mask;
  if (mask.defined() && mask.scalar_type() != at::kBool) mask = mask.to(q.scalar_type());
  c10::optional<at::Tensor> opt_mask;
  if (mask.defined()) opt_mask = mask;
  return at::scaled_dot_product_attention(q, kk, vv, opt_mask, 0.0, native_causal, scale);
}

namespace {

bool flash_varlen_eligible(const at::Tensor& q, const at::Tensor& k) {
  const auto dt = q.scalar_type();
  const int64_t D = q.size(3);
  return q.is_cuda() && (dt == at::kBFloat16 || dt == at::kHalf) && k.scalar_type() == dt && D % 8 == 0 && D <= 256 &&
         at::globalContext().userEnabledFlashSDP();
}

}  // namespace

at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                            int64_t max_seqlen, bool causal, c10::optional<double> scale) {
  check_shapes(q, k, v);
  const int64_t B = q.size(0), Hq = q.size(1), S = q.size(2), D = q.size(3), Hkv = k.size(1);
  MM_CHECK(k.size(2) == S && cu_seqlens.defined() && cu_seqlens.dim() == 1, "varlen_attention: q ", q.sizes(), ", k ",
           k.sizes(), " and cu_seqlens must describe the same packed tokens");
  static std::atomic<bool> flash_failed{false};
  if (flash_varlen_eligible(q, k) && !flash_failed.load()) {
    try {
      // [B, H, S, D] -> [B*S, H, D]: the kernel's layout; GQA is native (no repeat of k, v).
      at::Tensor qf = q.transpose(1, 2).reshape({B * S, Hq, D});
      at::Tensor kf = k.transpose(1, 2).reshape({B * S, Hkv, D});
      at::Tensor vf = v.transpose(1, 2).reshape({B * S, Hkv, v.size(3)});
      at::Tensor cu = cu_seqlens.to(q.device(), at::kInt);
      auto out = at::_flash_attention_forward(qf, kf, vf, cu, cu, max_seqlen, max_seqlen, 0.0, causal,
                                              /*return_debug_mask=*/false, scale);
      return std::get<0>(out).view({B, S, Hq, v.size(3)}).transpose(1, 2);
    } catch (const c10::Error& e) {
      // A GPU or build without the flash kernel: the masked path from now on, said once.
      flash_failed = true;
      std::string msg = e.what();
      std::fprintf(stderr, "warning: attention: flash varlen kernel unavailable (%s); packed rows use a segment mask\n",
                   msg.substr(0, msg.find('\n')).c_str());
    }
  }
  // Segment of every token: how many boundaries cu[1..] lie at or before it.
  at::Tensor cu = cu_seqlens.to(q.device(), at::kLong);
  at::Tensor tok = at::arange(B * S, at::TensorOptions().dtype(at::kLong).device(q.device()));
  at::Tensor seg = at::searchsorted(cu.narrow(0, 1, cu.size(0) - 1).contiguous(), tok, /*out_int32=*/false, /*right=*/true);
  return scaled_dot_product_attention(q, k, v, segment_attention_mask(seg.view({B, S})), causal, scale);
}

std::pair<at::Tensor, int64_t> packed_cu_seqlens(const at::Tensor& segment_ids) {
  MM_CHECK(segment_ids.dim() == 2, "attention: segment_ids must be [batch, seq] (got ", segment_ids.sizes(), ")");
  at::Tensor s = segment_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t B = s.size(0), S = s.size(1);
  const int64_t* p = s.data_ptr<int64_t>();
  std::vector<int32_t> cu = {0};
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t a = 0; a < S;) {
      int64_t e = a;
      while (e < S && p[b * S + e] == p[b * S + a]) ++e;
      cu.push_back(static_cast<int32_t>(b * S + e));
      longest = std::max(longest, e - a);
      a = e;
    }
  return {at::tensor(cu, at::kInt), longest};
}

at::Tensor segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& cu) {
  MM_CHECK(q.dim() == 4 && q.size(0) == 1 && !cu.empty() && cu.front() == 0 && cu.back() == q.size(2),
           "segment_attention: q must be [1, H, N, D] with cu_seqlens from 0 to N (got ", q.sizes(), ", ", cu.size(),
           " boundaries)");
  const int64_t H = q.size(1), D = q.size(3), Dv = v.size(3);
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i + 1 < cu.size();) {
    const int64_t L = cu[i + 1] - cu[i];
    size_t j = i + 1;
    while (j + 1 < cu.size() && cu[j + 1] - cu[j] == L) ++j;
    const int64_t n = static_cast<int64_t>(j - i), start = cu[i];
    if (L > 0) {
      // [1, H, n * L, D] -> [n, H, L, D]: segment s of the run is batch element s.
      auto batched = [&](const at::Tensor& t, int64_t d) {
        return t.narrow(2, start, n * L).reshape({H, n, L, d}).transpose(0, 1);
      };
      at::Tensor o = scaled_dot_product_attention(batched(q, D), batched(k, D), batched(v, Dv), {}, /*causal=*/false);
      parts.push_back(o.transpose(0, 1).reshape({1, H, n * L, Dv}));
    }
    i = j;
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 2);
}

}  // namespace mm::models
