#include "mindspeed_mm/data/mllm/mllm_collator.h"

#include <algorithm>

#include "mindspeed_mm/core/errors.h"

namespace mm::data {
namespace {

int64_t round_up(int64_t n, int64_t multiple) { return multiple > 1 ? (n + multiple - 1) / multiple * multiple : n; }

// Concatenates the defined tensors along dim 0; undefined when none is.
at::Tensor cat_defined(const std::vector<EncodedSample>& s, at::Tensor EncodedSample::*field) {
  std::vector<at::Tensor> parts;
  for (const auto& x : s)
    if ((x.*field).defined()) parts.push_back(x.*field);
  return parts.empty() ? at::Tensor() : at::cat(parts, 0);
}

}  // namespace

Batch collate_samples(const std::vector<EncodedSample>& samples, const CollatorOptions& o) {
  MM_CHECK(!samples.empty(), "collator: no samples to collate");
  const int64_t n = static_cast<int64_t>(samples.size());
  int64_t longest = 0, total = 0;
  for (const auto& s : samples) {
    const int64_t len = static_cast<int64_t>(s.input_ids.size());
    MM_CHECK(len > 0 && s.labels.size() == s.input_ids.size(), "collator: sample ", s.source,
             " has ", len, " ids and ", s.labels.size(), " labels");
    longest = std::max(longest, len);
    total += len;
  }
  const int64_t rows = o.packing ? 1 : n;
  const int64_t S = round_up(o.packing ? total : longest, o.pad_to_multiple_of);

  Batch b;
  b.num_samples = n;
  at::Tensor input_ids = at::full({rows, S}, o.pad_id, at::kLong);
  at::Tensor labels = at::full({rows, S}, kIgnoreLabel, at::kLong);
  at::Tensor attention_mask = at::zeros({rows, S}, at::kLong);
  at::Tensor position_ids = at::zeros({rows, S}, at::kLong);
  at::Tensor segment_ids, cu_seqlens;
  if (o.packing) segment_ids = at::full({rows, S}, -1, at::kLong);
  std::vector<int32_t> cu = {0};
  std::vector<double> second_per_grid;
  auto ids = input_ids.accessor<int64_t, 2>();
  auto lab = labels.accessor<int64_t, 2>();
  auto mask = attention_mask.accessor<int64_t, 2>();
  auto pos = position_ids.accessor<int64_t, 2>();
  int64_t offset = 0, longest_segment = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& s = samples[i];
    const int64_t len = static_cast<int64_t>(s.input_ids.size());
    const int64_t row = o.packing ? 0 : i, start = o.packing ? offset : 0;
    for (int64_t t = 0; t < len; ++t) {
      ids[row][start + t] = s.input_ids[t];
      lab[row][start + t] = t + 1 < len ? s.labels[t + 1] : kIgnoreLabel;
      mask[row][start + t] = 1;
      pos[row][start + t] = t;
    }
    if (o.packing) {
      segment_ids[0].narrow(0, start, len).fill_(i);
      offset += len;
      cu.push_back(static_cast<int32_t>(offset));
      longest_segment = std::max(longest_segment, len);
    }
    b.sources.push_back(s.source);
    second_per_grid.insert(second_per_grid.end(), s.video_second_per_grid.begin(), s.video_second_per_grid.end());
  }
  // Padding positions keep counting so RoPE tables stay well-defined; they are masked anyway.
  if (!o.packing) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t t = static_cast<int64_t>(samples[i].input_ids.size()); t < S; ++t) pos[i][t] = t;
  }
  b.set(kInputIds, input_ids);
  b.set(kLabels, labels);
  b.set(kAttentionMask, attention_mask);
  b.set(kPositionIds, position_ids);
  if (o.packing) {
    // The padding after the samples is a segment of its own, so the boundaries cover every token.
    if (offset < S) {
      cu.push_back(static_cast<int32_t>(S));
      longest_segment = std::max(longest_segment, S - offset);
    }
    b.set(kSegmentIds, segment_ids);
    b.set(kCuSeqlens, at::tensor(cu, at::kInt));
    b.set(kMaxSeqlen, at::scalar_tensor(longest_segment, at::kLong), /*host=*/true);
  }
  b.set(kPixelValues, cat_defined(samples, &EncodedSample::pixel_values));
  b.set(kImageGridThw, cat_defined(samples, &EncodedSample::image_grid_thw), /*host=*/true);
  b.set(kPixelValuesVideos, cat_defined(samples, &EncodedSample::pixel_values_videos));
  b.set(kVideoGridThw, cat_defined(samples, &EncodedSample::video_grid_thw), /*host=*/true);
  if (!second_per_grid.empty())
    b.set(kVideoSecondPerGrid, at::tensor(second_per_grid, at::kDouble), /*host=*/true);
  return b;
}

}  // namespace mm::data
