// Qwen2-VL's image processor (transformers' Qwen2VLImageProcessor): smart_resize to multiples of
// patch_size * merge_size within [min_pixels, max_pixels], PIL bicubic resize, rescale by
// 1/255 and normalize with the CLIP mean/std in float32 as numpy does, then patches of
// patch_size x patch_size x temporal_patch_size flattened in the model's order:
//   (grid_t, grid_h/m, grid_w/m, m, m) rows of (channel, temporal, patch_y, patch_x) values.
// A still image is repeated temporal_patch_size times; a video's frame count is padded to a
// multiple of temporal_patch_size by repeating its last frame.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "mindspeed_mm/data/media/image.h"

namespace mm::data {

struct Qwen2VLImageConfig {
  int patch_size = 14;
  int temporal_patch_size = 2;
  int merge_size = 2;
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  std::array<float, 3> mean = {0.48145466f, 0.4578275f, 0.40821073f};  // OPENAI_CLIP_MEAN
  std::array<float, 3> std = {0.26862954f, 0.26130258f, 0.27577711f};  // OPENAI_CLIP_STD
};

struct VisionPatches {
  std::vector<float> values;  // rows() x row_size()
  int64_t grid_t = 0, grid_h = 0, grid_w = 0;
  int64_t row_size = 0;  // 3 * temporal_patch_size * patch_size^2
  int64_t rows() const { return grid_t * grid_h * grid_w; }
  // Tokens the language model sees after the merge: rows() / merge_size^2.
  int64_t merged_tokens(int merge_size) const { return rows() / (merge_size * merge_size); }
};

// (height, width) as Qwen2-VL's smart_resize computes them, Python's round-half-even
// included; an aspect ratio above 200 is an mm::Error.
std::pair<int, int> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels);

VisionPatches process_image(const Image& image, const Qwen2VLImageConfig& config = {});
// Frames of one video (any sizes; all are resized to the first frame's smart_resize size).
VisionPatches process_video(const std::vector<Image>& frames, const Qwen2VLImageConfig& config = {});

// The normalized planes back from the patches, [grid_t * temporal][3][H][W] (tests: the
// layout is a permutation, so this is exact).
std::vector<float> unpatchify(const VisionPatches& p, const Qwen2VLImageConfig& config = {});

}  // namespace mm::data
