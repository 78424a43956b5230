// Batch: what a collator hands the train step. Labels are already shifted (labels[b, s] is the
// token logits[b, s] must predict), so packed rows, padding and multimodal samples need no
// special case in the loss. Optional fields are undefined tensors when a batch has none.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace mm::data {

struct Batch {
  at::Tensor input_ids;       // int64 [B, S]
  at::Tensor labels;          // int64 [B, S], -100 = not scored
  at::Tensor attention_mask;  // int64 [B, S], 1 = real token, 0 = padding (undefined: all real)
  at::Tensor position_ids;    // int64 [B, S]; restart at 0 for every packed sample (undefined: 0..S-1)
  // Packed rows: segment_ids[b, s] = index of the sample a token belongs to within its row, -1 on
  // padding; attention stays inside a segment. cu_seqlens (int32 [samples + 1]) are the same
  // boundaries over the flattened B*S tokens, as flash-attention's varlen kernels take them.
  at::Tensor segment_ids, cu_seqlens;
  // Vision inputs, concatenated over the batch's samples in order (see SampleEncoder).
  at::Tensor pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw;
  std::vector<double> video_second_per_grid;
  std::vector<std::string> sources;  // where each sample came from ("train.jsonl:12")
  int64_t num_samples = 0;
};

}  // namespace mm::data
