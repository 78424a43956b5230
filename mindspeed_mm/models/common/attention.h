// Scaled dot-product attention with grouped-query heads, shared by every attention block.
//   out = softmax(q k^T * scale + mask) v,  scale = 1/sqrt(D) unless given
// Uses at::scaled_dot_product_attention where libtorch has it (>= 2.0: flash / memory-efficient
// kernels on GPU), a math path otherwise. Both give the same numbers up to kernel rounding.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <memory>
#include <utility>
#include <vector>

namespace mm::models {

// An attention module whose heads a tensor-parallel plan splits: after keep_heads it runs
// q_heads query and kv_heads key/value heads (its projections sharded to match).
struct HeadSplittable {
  virtual ~HeadSplittable() = default;
  virtual std::pair<int64_t, int64_t> heads() const = 0;  // (query, key/value)
  virtual void keep_heads(int64_t q_heads, int64_t kv_heads) = 0;
};

// The attention of a module that a plan may replace (context parallelism): q [B, Hq, s, D] and
// k, v [B, Hkv, s, D] hold this rank's tokens of a sequence split over ranks; the core reaches
// the other ranks' tokens and returns this rank's rows of the whole sequence's attention. Which
// tokens attend to which (packed samples, padding) the core knows from the batch, not from q.
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  virtual at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                            c10::optional<double> scale) = 0;
};

// A module whose self-attention an AttentionCore can take over (training/context_parallel.h
// installs one on the modules a model's PlanTable::context_parallel names). Null: its own.
struct AttentionCoreHost {
  virtual ~AttentionCoreHost() = default;
  std::shared_ptr<AttentionCore> attention_core;
};

// q [B, Hq, S, D]; k, v [B, Hkv, T, D] with Hq % Hkv == 0 (kv head h serves query heads
// h*Hq/Hkv .. (h+1)*Hq/Hkv - 1, i.e. repeat_interleave as in HF repeat_kv).
// attn_mask (optional) broadcastable to [B, Hq, S, T]: bool (true = may attend) or additive float.
// causal: query i sees keys j <= i + (T - S), the diagonal aligned to the END so that S new
// queries against a KV cache of T keys behave like the last S rows of a full causal mask.
// Rows that see no key at all come out NaN on the math path; don't build such masks.
at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& attn_mask = {}, bool causal = false,
                                        c10::optional<double> scale = c10::nullopt);

// The reference path, always available (tests compare it with the fused one on 2.x).
at::Tensor scaled_dot_product_attention_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& attn_mask = {}, bool causal = false,
                                             c10::optional<double> scale = c10::nullopt);

// Packed sequences: segment_ids [B, S] (the sample each token belongs to) -> bool [B, 1, S, S],
// true where query and key belong to the same segment. Padding (-1) forms a segment of its own,
// so its rows are never empty. Combine with causal = true.
at::Tensor segment_attention_mask(const at::Tensor& segment_ids);

// Variable-length attention without a mask (flash-attn's varlen, cu_seqlens): q, k, v
// [1, H, N, D] hold consecutive segments [cu[i], cu[i+1]) (cu[0] = 0, cu.back() = N) and each
// token attends only to its own segment, non-causally. Runs of equal-length segments go through
// one batched attention each, so cost is sum(L^2), not N^2, and segments never mix.
at::Tensor segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& cu_seqlens);

// Packed rows as variable-length attention: q [B, Hq, S, D], k, v [B, Hkv, S, D]; cu_seqlens
// int32 [n + 1] on q's device splits the flattened B*S tokens into segments (none across rows);
// max_seqlen is the longest. Each token attends within its segment (causally when causal).
// On CUDA in bf16/fp16 this is flash-attention's varlen kernel (no padding, no mask); elsewhere
// the same result through a block-diagonal segment mask. Output [B, Hq, S, D].
at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                            int64_t max_seqlen, bool causal, c10::optional<double> scale = c10::nullopt);

// segment_ids [B, S] (the sample of each token, -1 = padding) -> (cu_seqlens int32 [n + 1] over
// the flattened tokens, max segment length) with every run of equal ids in a row one segment
// (padding runs too, so every token is covered). Read on the host.
std::pair<at::Tensor, int64_t> packed_cu_seqlens(const at::Tensor& segment_ids);

// [B, Hkv, T, D] -> [B, Hkv * n_rep, T, D], each kv head repeated n_rep times in place.
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);

}  // namespace mm::models
