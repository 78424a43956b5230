// Context parallelism's collectives: attention over a sequence whose tokens are split over the
// ranks of a cp group (training/context_parallel.h applies them to a model).
//
// Layout. The group's n = ulysses x ring ranks: `ulysses` neighbouring ranks form a Ulysses group,
// `ring` of those a ring. A sequence of S tokens (padded to CpLayout::multiple()) is cut into
// 2 x ring chunks; ring rank j holds chunks j and 2 ring - 1 - j (zigzag: under a causal mask
// every ring rank then has the same work) and splits them evenly over its Ulysses ranks. With
// ring 1 that is plain contiguous sharding.
//
// Ulysses (DeepSpeed-Ulysses): an all-to-all turns [B, H, s, D] (own tokens, every head) into
// [B, H/u, u s, D] (the ring rank's tokens, own heads), attention runs on whole head groups,
// and the inverse all-to-all brings the output back. Ring (ring attention): the ring rank's
// query stays, key/value blocks travel round the ring (the next one in flight while this one is
// computed), each block's output is merged by its log-sum-exp (online softmax), and backward
// passes the blocks round again with their gradient accumulators (blockwise, no whole matrix).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <memory>
#include <utility>
#include <vector>

#include "mindspeed_mm/parallel/communicator.h"

namespace mm::parallel {

using CpGroup = std::shared_ptr<Communicator>;

struct CpLayout {
  int ulysses = 1, ring = 1;
  int size() const { return ulysses * ring; }
  // Sequences are padded to a multiple of this: 2 x ring x ulysses with a ring, ulysses without.
  int64_t multiple() const { return ring > 1 ? 2LL * ring * ulysses : ulysses; }
  // The pieces [start, start + length) of a padded sequence of S tokens that ring rank j holds.
  std::vector<std::pair<int64_t, int64_t>> ring_pieces(int64_t S, int j) const;
  // The global positions of the tokens cp rank `rank` holds, in order (its Ulysses share
  // rank % ulysses of ring rank rank / ulysses's pieces).
  std::vector<int64_t> token_indices(int64_t S, int rank) const;
};

// Ulysses' all-to-all, differentiable (backward is the inverse all-to-all): x [B, H, s, D]
// (this rank's s tokens, all H heads; H divides by the group size n) -> [B, H/n, n s, D]: group
// rank r's heads [r H/n, (r+1) H/n) of every rank's tokens, concatenated in group-rank order.
at::Tensor sequence_to_heads(const at::Tensor& x, const CpGroup& g);
// The inverse: [B, H/n, n s, D] -> [B, H, s, D].
at::Tensor heads_to_sequence(const at::Tensor& x, const CpGroup& g);

// What ring attention needs besides q, k, v.
struct RingSpec {
  CpGroup ring;
  // The pieces of the (gathered) sequence each ring rank holds, by ring rank: CpLayout::ring_pieces.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> pieces;
  // [B, S] sample of every token of the whole padded sequence (attention stays inside a sample;
  // padding is a sample of its own), on q's device; undefined: every row is one sample.
  at::Tensor segment_ids;
  bool causal = false;
  c10::optional<double> scale;
};

// q [B, Hq, s, D], k, v [B, Hkv, s, D] (Hq a multiple of Hkv): this ring rank's tokens, in the
// order of its pieces -> its rows of attention over the whole sequence [B, Hq, s, D].
// Differentiable. Blocks that a causal mask or the samples leave empty are skipped.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          std::shared_ptr<const RingSpec> spec);

}  // namespace mm::parallel
