// M-RoPE position ids of Qwen2-VL / Qwen2.5-VL (transformers' get_rope_index): every token gets
// a (t, h, w) position. Text tokens advance all three together; the merged patches of an image
// or video take (start + t, start + h, start + w) over their grid, where start is one past the
// largest position so far; the text after a vision block continues from one past the block's
// largest position, so it no longer equals the token index.
//
// A vision block is recognised as in transformers: a <|vision_start|> token followed by an
// image or video pad token; blocks consume image_grid_thw / video_grid_thw rows in order over
// the whole batch. Qwen2.5-VL scales a video's temporal index by seconds per temporal patch
// times vision_config.tokens_per_second (truncated to an integer, in float32 as torch does).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace mm::models {

struct RopeIndexConfig {
  int64_t image_token_id = 151655, video_token_id = 151656, vision_start_token_id = 151652;
  int64_t spatial_merge_size = 2;
  int64_t tokens_per_second = 0;  // 0: Qwen2-VL (temporal index = patch index); Qwen2.5-VL: e.g. 2
};

struct RopeIndex {
  at::Tensor position_ids;  // int64 [3, B, S]; padding positions hold 1, as in transformers
  at::Tensor deltas;        // int64 [B]: max position + 1 - S, for positions of generated tokens
};

// input_ids [B, S]; grids int64 [n, 3] (undefined when none); attention_mask [B, S] 1/0
// (undefined: all ones); second_per_grid: one entry per video (Qwen2.5-VL; empty = 1.0 each).
// mm::Error when the grids do not match the vision blocks of input_ids.
RopeIndex get_rope_index(const at::Tensor& input_ids, const at::Tensor& image_grid_thw, const at::Tensor& video_grid_thw,
                         const at::Tensor& attention_mask, const RopeIndexConfig& config,
                         const std::vector<double>& second_per_grid = {});

}  // namespace mm::models
