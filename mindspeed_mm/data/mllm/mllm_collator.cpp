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
  b.input_ids = at::full({rows, S}, o.pad_id, at::kLong);
  b.labels = at::full({rows, S}, kIgnoreLabel, at::kLong);
  b.attention_mask = at::zeros({rows, S}, at::kLong);
  b.position_ids = at::zeros({rows, S}, at::kLong);
  if (o.packing) {
    b.segment_ids = at::full({rows, S}, -1, at::kLong);
    b.cu_seqlens = at::zeros({n + 1}, at::kInt);
  }
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto lab = b.labels.accessor<int64_t, 2>();
  auto mask = b.attention_mask.accessor<int64_t, 2>();
  auto pos = b.position_ids.accessor<int64_t, 2>();
  int64_t offset = 0;
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
      b.segment_ids[0].narrow(0, start, len).fill_(i);
      offset += len;
      b.cu_seqlens[i + 1] = static_cast<int32_t>(offset);
    }
    b.sources.push_back(s.source);
    b.video_second_per_grid.insert(b.video_second_per_grid.end(), s.video_second_per_grid.begin(),
                                   s.video_second_per_grid.end());
  }
  // Padding positions keep counting so RoPE tables stay well-defined; they are masked anyway.
  if (!o.packing) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t t = static_cast<int64_t>(samples[i].input_ids.size()); t < S; ++t) pos[i][t] = t;
  }
  b.pixel_values = cat_defined(samples, &EncodedSample::pixel_values);
  b.image_grid_thw = cat_defined(samples, &EncodedSample::image_grid_thw);
  b.pixel_values_videos = cat_defined(samples, &EncodedSample::pixel_values_videos);
  b.video_grid_thw = cat_defined(samples, &EncodedSample::video_grid_thw);
  return b;
}

}  // namespace mm::data
