// M-RoPE (mindspeed_mm/models/qwen2vl/rope_index.h, models/common/rope.h): get_rope_index on
// the worked examples of transformers' get_rope_index docstrings (Qwen2-VL and Qwen2.5-VL) and on
// hand-computed batches with several images, a video, padding and text-only rows; the section
// layout of the M-RoPE tables.
#include <gtest/gtest.h>

#include <vector>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/rope.h"
#include "mindspeed_mm/models/qwen2vl/rope_index.h"

using namespace mm::models;

namespace {

constexpr int64_t VS = 100, IMG = 101, VID = 102, VE = 103, T = 7;

RopeIndexConfig ids() {
  RopeIndexConfig c;
  c.vision_start_token_id = VS;
  c.image_token_id = IMG;
  c.video_token_id = VID;
  return c;
}

at::Tensor row(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).unsqueeze(0); }
at::Tensor grid(const std::vector<std::vector<int64_t>>& g) {
  at::Tensor t = at::empty({static_cast<int64_t>(g.size()), 3}, at::kLong);
  for (size_t i = 0; i < g.size(); ++i)
    for (int k = 0; k < 3; ++k) t[i][k] = g[i][k];
  return t;
}
std::vector<int64_t> axis(const RopeIndex& r, int a, int64_t b = 0) {
  at::Tensor x = r.position_ids[a][b].contiguous();
  return {x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel()};
}
std::vector<int64_t> plus(std::vector<int64_t> v, int64_t k) {
  for (auto& x : v) x += k;
  return v;
}
std::vector<int64_t> cat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

TEST(MRope, TextOnlyIsOneDimensional) {
  RopeIndex r = get_rope_index(row({T, T, T, T, T}), {}, {}, {}, ids());
  for (int a = 0; a < 3; ++a) EXPECT_EQ(axis(r, a), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(r.deltas[0].item<int64_t>(), 0);
  RopeIndex p = get_rope_index(row({T, T, T, T, T}), {}, {}, row({1, 1, 1, 0, 0}), ids());
  EXPECT_EQ(axis(p, 1), (std::vector<int64_t>{0, 1, 2, 1, 1}));  // padding holds 1, as in transformers
  EXPECT_EQ(p.deltas[0].item<int64_t>(), -2);
}

// The docstring example: a video of 3 x 2 x 2 merged patches then 5 text tokens. transformers
// finds vision blocks by their <|vision_start|>, so the sequence here starts with one and every
// documented position moves up by 1.
TEST(MRope, Qwen2VLDocstringExample) {
  std::vector<int64_t> tokens = {VS};
  tokens.insert(tokens.end(), 12, VID);
  tokens.insert(tokens.end(), 5, T);
  RopeIndex r = get_rope_index(row(tokens), {}, grid({{3, 4, 4}}), {}, ids());
  const std::vector<int64_t> doc_t = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, doc_h = {0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1},
                             doc_w = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}, doc_text = {3, 4, 5, 6, 7};
  EXPECT_EQ(axis(r, 0), cat({{0}, plus(doc_t, 1), plus(doc_text, 1)}));
  EXPECT_EQ(axis(r, 1), cat({{0}, plus(doc_h, 1), plus(doc_text, 1)}));
  EXPECT_EQ(axis(r, 2), cat({{0}, plus(doc_w, 1), plus(doc_text, 1)}));
  EXPECT_EQ(r.deltas[0].item<int64_t>(), 8 + 1 - 18);
}

// Qwen2.5-VL's docstring: tokens_per_second 25 and 2 seconds per temporal patch put the
// temporal patches at 0, 50, 100, and the text after them at 101...
TEST(MRope, Qwen25VLDocstringExampleScalesTime) {
  std::vector<int64_t> tokens = {VS};
  tokens.insert(tokens.end(), 12, VID);
  tokens.insert(tokens.end(), 5, T);
  RopeIndexConfig c = ids();
  c.tokens_per_second = 25;
  RopeIndex r = get_rope_index(row(tokens), {}, grid({{3, 4, 4}}), {}, c, {2.0});
  const std::vector<int64_t> doc_t = {0, 0, 0, 0, 50, 50, 50, 50, 100, 100, 100, 100},
                             doc_h = {0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1}, doc_text = {101, 102, 103, 104, 105};
  EXPECT_EQ(axis(r, 0), cat({{0}, plus(doc_t, 1), plus(doc_text, 1)}));
  EXPECT_EQ(axis(r, 1), cat({{0}, plus(doc_h, 1), plus(doc_text, 1)}));
  // An image in Qwen2.5-VL has no time: its temporal index stays 0 whatever the rate.
  RopeIndex im = get_rope_index(row({VS, IMG, IMG, IMG, IMG, VE}), grid({{1, 4, 4}}), {}, {}, c);
  EXPECT_EQ(axis(im, 0), (std::vector<int64_t>{0, 1, 1, 1, 1, 3}));
}

// Hand-computed: row 0 has two images (2 x 2 and 1 x 1 merged patches) with text between and
// after; row 1 a video of 2 x 1 x 2 merged patches and right padding. Grids are consumed in
// order over the batch.
TEST(MRope, SeveralImagesVideoAndPaddingByHand) {
  const std::vector<int64_t> r0 = {T, VS, IMG, IMG, IMG, IMG, VE, T, T, VS, IMG, VE, T};
  const std::vector<int64_t> r1 = {VS, VID, VID, VID, VID, VE, T, 0, 0, 0, 0, 0, 0};
  at::Tensor input = at::stack({at::tensor(r0, at::kLong), at::tensor(r1, at::kLong)});
  at::Tensor mask = at::ones({2, 13}, at::kLong);
  mask[1].narrow(0, 7, 6).fill_(0);
  RopeIndex r = get_rope_index(input, grid({{1, 4, 4}, {1, 2, 2}}), grid({{2, 2, 4}}), mask, ids());
  // Row 0: T 0, VS 1 | image at base 2: t 2, h 2,2,3,3, w 2,3,2,3 | VE T T VS 4..7 | image 8 | VE T 9, 10.
  EXPECT_EQ(axis(r, 0, 0), (std::vector<int64_t>{0, 1, 2, 2, 2, 2, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(axis(r, 1, 0), (std::vector<int64_t>{0, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(axis(r, 2, 0), (std::vector<int64_t>{0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  // Row 1: VS 0 | video at base 1: t 1,1,2,2, h 1,1,1,1, w 1,2,1,2 | VE 3, T 4 | padding 1.
  EXPECT_EQ(axis(r, 0, 1), (std::vector<int64_t>{0, 1, 1, 2, 2, 3, 4, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(axis(r, 1, 1), (std::vector<int64_t>{0, 1, 1, 1, 1, 3, 4, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(axis(r, 2, 1), (std::vector<int64_t>{0, 1, 2, 1, 2, 3, 4, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(r.deltas[0].item<int64_t>(), 10 + 1 - 13);
  EXPECT_EQ(r.deltas[1].item<int64_t>(), 4 + 1 - 13);
  // Grids that do not match the blocks are an error, not garbage positions.
  EXPECT_THROW(get_rope_index(input, grid({{1, 4, 4}}), grid({{2, 2, 4}}), mask, ids()), mm::Error);
  EXPECT_THROW(get_rope_index(row({VS, IMG, IMG}), grid({{1, 4, 4}}), {}, {}, ids()), mm::Error);
}

TEST(MRope, SectionTables) {
  // Equal t, h, w positions: exactly the 1-D tables.
  at::Tensor inv = rope_inv_freq(16, 10000.0);
  at::Tensor pos = at::arange(6, at::kLong).view({1, 6});
  auto [c1, s1] = rope_cos_sin(pos, inv);
  auto [c3, s3] = mrope_cos_sin(pos.unsqueeze(0).expand({3, 1, 6}), inv, {2, 3, 3});
  EXPECT_TRUE(at::equal(c1, c3));
  EXPECT_TRUE(at::equal(s1, s3));
  // Distinct axes: frequency j of each half takes its angle from the axis of its section.
  at::Tensor p3 = at::stack({at::full({1, 1}, 3, at::kLong), at::full({1, 1}, 5, at::kLong), at::full({1, 1}, 11, at::kLong)});
  auto [c, s] = mrope_cos_sin(p3, inv, {2, 3, 3});
  const int64_t axis_of[8] = {0, 0, 1, 1, 1, 2, 2, 2};
  const double position[3] = {3, 5, 11};
  for (int64_t d = 0; d < 16; ++d) {
    const int64_t j = d % 8;
    const double angle = position[axis_of[j]] * inv[j].item<double>();
    EXPECT_NEAR(c[0][0][0][d].item<double>(), std::cos(angle), 1e-6) << d;
    EXPECT_NEAR(s[0][0][0][d].item<double>(), std::sin(angle), 1e-6) << d;
  }
  EXPECT_THROW(mrope_cos_sin(p3, inv, {2, 3, 2}), mm::Error);
}
