// Key/value cache for incremental decoding. Attention layers append the rotated keys and the
// values of the new tokens (ForwardContext::kv_cache, at ForwardContext::layer_index) and attend
// over everything cached; a causal mask aligned to the end of the keys keeps new queries off
// later positions. Storage grows by doubling, so a token costs one copy of its own keys, not of
// the whole history.
#pragma once

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "mindspeed_mm/core/errors.h"

namespace mm::nn {

struct KVCache {
  // Tokens cached so far (layer 0's count: read it before a forward, which appends).
  int64_t length() const { return lengths_.empty() ? 0 : lengths_[0]; }

  // k, v [B, Hkv, S, D] -> the layer's keys and values [B, Hkv, T + S, D], T = cached before.
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
    MM_CHECK(layer >= 0, "kv cache: a layer without layer_index used the cache");
    if (static_cast<size_t>(layer) >= keys_.size()) {
      keys_.resize(static_cast<size_t>(layer) + 1);
      values_.resize(static_cast<size_t>(layer) + 1);
      lengths_.resize(static_cast<size_t>(layer) + 1, 0);
    }
    at::Tensor& K = keys_[layer];
    at::Tensor& V = values_[layer];
    int64_t& len = lengths_[layer];
    const int64_t S = k.size(2);
    if (!K.defined() || K.size(2) < len + S) {
      const int64_t cap = std::max<int64_t>(len + S, K.defined() ? 2 * K.size(2) : 64);
      at::Tensor nk = at::empty({k.size(0), k.size(1), cap, k.size(3)}, k.options());
      at::Tensor nv = at::empty({v.size(0), v.size(1), cap, v.size(3)}, v.options());
      if (len > 0) {
        nk.narrow(2, 0, len).copy_(K.narrow(2, 0, len));
        nv.narrow(2, 0, len).copy_(V.narrow(2, 0, len));
      }
      K = nk;
      V = nv;
    }
    K.narrow(2, len, S).copy_(k);
    V.narrow(2, len, S).copy_(v);
    len += S;
    return {K.narrow(2, 0, len), V.narrow(2, 0, len)};
  }

  void clear() {
    keys_.clear();
    values_.clear();
    lengths_.clear();
    rope_deltas = at::Tensor();
  }

  // M-RoPE models: a new token's (t, h, w) position is its index plus this delta [B], set when
  // the prompt is prefilled (get_rope_index's deltas).
  at::Tensor rope_deltas;

 private:
  std::vector<at::Tensor> keys_, values_;
  std::vector<int64_t> lengths_;
};

}  // namespace mm::nn
