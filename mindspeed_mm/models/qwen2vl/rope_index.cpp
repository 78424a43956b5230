#include "mindspeed_mm/models/qwen2vl/rope_index.h"

#include <algorithm>
#include <array>

#include "mindspeed_mm/core/errors.h"

namespace mm::models {

RopeIndex get_rope_index(const at::Tensor& input_ids, const at::Tensor& image_grid_thw, const at::Tensor& video_grid_thw,
                         const at::Tensor& attention_mask, const RopeIndexConfig& c,
                         const std::vector<double>& second_per_grid) {
  MM_CHECK(input_ids.dim() == 2, "get_rope_index: input_ids must be [batch, seq] (got ", input_ids.sizes(), ")");
  const int64_t B = input_ids.size(0), S = input_ids.size(1);
  // A walk over the tokens on the host (ids and masks of a CUDA batch come over once); the
  // caller moves the positions to the device.
  at::Tensor ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  at::Tensor mask =
      attention_mask.defined() ? attention_mask.to(at::kCPU, at::kLong).contiguous() : at::ones({B, S}, at::kLong);
  RopeIndex out;
  out.deltas = at::zeros({B}, at::kLong);
  if (!image_grid_thw.defined() && !video_grid_thw.defined()) {
    // Text only: the 1-D positions of the real tokens, 1 on padding, the same on all three axes.
    at::Tensor pos = mask.cumsum(-1) - 1;
    pos = pos.masked_fill(mask.eq(0), 1);
    out.position_ids = pos.unsqueeze(0).expand({3, B, S}).contiguous();
    out.deltas = std::get<0>(pos.max(-1)) + 1 - S;
    return out;
  }
  at::Tensor img =
      image_grid_thw.defined() ? image_grid_thw.to(at::kCPU, at::kLong).contiguous() : at::zeros({0, 3}, at::kLong);
  at::Tensor vid =
      video_grid_thw.defined() ? video_grid_thw.to(at::kCPU, at::kLong).contiguous() : at::zeros({0, 3}, at::kLong);
  const int64_t* ig = img.data_ptr<int64_t>();
  const int64_t* vg = vid.data_ptr<int64_t>();
  const int64_t m = c.spatial_merge_size;

  out.position_ids = at::ones({3, B, S}, at::kLong);
  auto P = out.position_ids.accessor<int64_t, 3>();
  auto I = ids.accessor<int64_t, 2>();
  auto M = mask.accessor<int64_t, 2>();
  auto D = out.deltas.accessor<int64_t, 1>();
  int64_t image_index = 0, video_index = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> tokens, where;  // the row's real tokens and their columns
    for (int64_t s = 0; s < S; ++s)
      if (M[b][s] == 1) {
        tokens.push_back(I[b][s]);
        where.push_back(s);
      }
    const int64_t n = static_cast<int64_t>(tokens.size());
    int64_t remain_images = 0, remain_videos = 0;
    for (int64_t i = 0; i + 1 < n; ++i)
      if (tokens[i] == c.vision_start_token_id) {
        remain_images += tokens[i + 1] == c.image_token_id;
        remain_videos += tokens[i + 1] == c.video_token_id;
      }
    std::vector<std::array<int64_t, 3>> pos;  // (t, h, w) of each real token, in order
    pos.reserve(static_cast<size_t>(n));
    int64_t next = 0;  // one past the largest position so far
    auto text = [&](int64_t count) {
      for (int64_t k = 0; k < count; ++k) pos.push_back({next + k, next + k, next + k});
      next += count;
    };
    auto find = [&](int64_t token, int64_t remaining, int64_t from) {
      if (remaining <= 0) return n + 1;
      auto it = std::find(tokens.begin() + from, tokens.end(), token);
      return it == tokens.end() ? n + 1 : static_cast<int64_t>(it - tokens.begin());
    };
    int64_t st = 0;
    for (int64_t blocks = remain_images + remain_videos; blocks > 0; --blocks) {
      const int64_t ed_image = find(c.image_token_id, remain_images, st);
      const int64_t ed_video = find(c.video_token_id, remain_videos, st);
      const bool is_image = ed_image < ed_video;
      const at::Tensor& grids = is_image ? img : vid;
      const int64_t index = is_image ? image_index++ : video_index++;
      MM_CHECK(index < grids.size(0), "get_rope_index: row ", b, " has more ", is_image ? "image" : "video",
               " blocks than the ", grids.size(0), " rows of ", is_image ? "image_grid_thw" : "video_grid_thw");
      const int64_t* g = (is_image ? ig : vg) + 3 * index;
      // Seconds per temporal patch: 0 for images (Qwen2.5-VL), the video's own for videos.
      const double spg = is_image ? 0.0 : (index < static_cast<int64_t>(second_per_grid.size()) ? second_per_grid[index] : 1.0);
      (is_image ? remain_images : remain_videos) -= 1;
      const int64_t ed = is_image ? ed_image : ed_video;
      MM_CHECK(ed <= n, "get_rope_index: row ", b, " has a vision start without pad tokens after it");
      const int64_t gt = g[0], gh = g[1] / m, gw = g[2] / m;
      text(ed - st);
      const int64_t base = next;
      int64_t top = base;
      for (int64_t t = 0; t < gt; ++t) {
        int64_t ti = t;
        if (c.tokens_per_second > 0) {
          // torch: int64 arange * float32 seconds -> float32, * int -> float32, .long() truncates.
          const float scaled = static_cast<float>(t) * static_cast<float>(spg);
          ti = static_cast<int64_t>(scaled * static_cast<float>(c.tokens_per_second));
        }
        for (int64_t h = 0; h < gh; ++h)
          for (int64_t w = 0; w < gw; ++w) {
            pos.push_back({base + ti, base + h, base + w});
            top = std::max({top, base + ti, base + h, base + w});
          }
      }
      next = top + 1;
      st = ed + gt * gh * gw;
      MM_CHECK(st <= n, "get_rope_index: row ", b, " ends inside a vision block (grid ", g[0], "x", g[1], "x", g[2],
               " needs ", gt * gh * gw, " pad tokens)");
    }
    if (st < n) text(n - st);
    int64_t row_max = 0;
    for (int64_t k = 0; k < n; ++k) {
      for (int a = 0; a < 3; ++a) {
        P[a][b][where[k]] = pos[k][a];
        row_max = std::max(row_max, pos[k][a]);
      }
    }
    D[b] = row_max + 1 - S;
  }
  MM_CHECK(image_index == img.size(0) && video_index == vid.size(0), "get_rope_index: the batch has ", image_index,
           " image and ", video_index, " video blocks but ", img.size(0), " image and ", vid.size(0), " video grids");
  return out;
}

}  // namespace mm::models
