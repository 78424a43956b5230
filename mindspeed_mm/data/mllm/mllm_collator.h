// Collating encoded samples into a Batch.
//
//   padded: one row per sample, right-padded with pad_id to the longest sample (rounded up to
//           pad_to_multiple_of); attention_mask marks the real tokens.
//   packed: all samples of the micro-batch concatenated into ONE row (padded to the multiple),
//           with position_ids restarting at 0 for each sample and segment_ids / cu_seqlens /
//           max_seqlen marking the boundaries (the padding after the samples a segment of its own), so attention and RoPE see each sample exactly as if it ran
//           alone: the per-sample losses equal the unpacked ones.
//
// Labels are shifted within each sample: the last token of a sample predicts nothing (-100),
// never the first token of the next one.
#pragma once

#include <vector>

#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/data/mllm/sample_encoder.h"

namespace mm::data {

struct CollatorOptions {
  bool packing = false;
  int64_t pad_to_multiple_of = 1;
  int64_t pad_id = 0;
};

// Fields: input_ids, labels, attention_mask, position_ids; packed also segment_ids, cu_seqlens,
// max_seqlen; the vision fields when a sample has images or videos. mm::Error for an empty list.
Batch collate_samples(const std::vector<EncodedSample>& samples, const CollatorOptions& options);

}  // namespace mm::data
