// Shared transformer blocks (RMSNorm, RoPE, attention, SwiGLU, cross-entropy), each run in float64
// and compared with an independent reference written as plain loops over std::vector<double>.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <torch/csrc/autograd/autograd.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/models/common/mlp.h"
#include "mindspeed_mm/models/common/norm.h"
#include "mindspeed_mm/models/common/rope.h"

namespace {

using namespace mm::models;
using Vec = std::vector<double>;

at::Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::empty(shape, at::kDouble).normal_(0.0, 1.0, gen);
}

Vec to_vec(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kDouble).contiguous();
  return Vec(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

double max_abs_diff(const at::Tensor& got, const Vec& want) {
  Vec g = to_vec(got);
  EXPECT_EQ(g.size(), want.size());
  double m = 0;
  for (size_t i = 0; i < g.size() && i < want.size(); ++i) m = std::max(m, std::abs(g[i] - want[i]));
  return m;
}

void fill_random(const at::Tensor& p, uint64_t seed, double scale = 1.0) {
  at::NoGradGuard ng;
  at::Tensor t = p;
  t.copy_(randn(p.sizes(), seed) * scale);
}

// ---------------------------------------------------------------------------------------------

TEST(Blocks, RMSNormMatchesLoops) {
  const int64_t R = 6, D = 8;
  const double eps = 1e-6;
  RMSNorm norm(D, eps, at::kDouble);
  fill_random(norm.weight, 1);
  at::Tensor x = randn({2, 3, D}, 2);
  at::Tensor y = norm.forward(x);

  Vec xv = to_vec(x), w = to_vec(norm.weight), want(R * D);
  for (int64_t r = 0; r < R; ++r) {
    double ms = 0;
    for (int64_t d = 0; d < D; ++d) ms += xv[r * D + d] * xv[r * D + d];
    ms /= D;
    for (int64_t d = 0; d < D; ++d) want[r * D + d] = w[d] * xv[r * D + d] / std::sqrt(ms + eps);
  }
  double err = max_abs_diff(y, want);
  std::printf("rmsnorm max abs err %.3g\n", err);
  EXPECT_LT(err, 1e-12);
  EXPECT_EQ(y.scalar_type(), at::kDouble);

  // bf16: normalised in fp32, cast back, then scaled (HF order); within bf16 rounding of fp64.
  RMSNorm norm16(D, eps, at::kBFloat16);
  fill_random(norm16.weight, 1);
  at::Tensor y16 = norm16.forward(x.to(at::kBFloat16));
  EXPECT_EQ(y16.scalar_type(), at::kBFloat16);
  EXPECT_LT(max_abs_diff(y16, want), 0.05);
}

TEST(Blocks, RopeTablesAndRotationMatchLoops) {
  const int64_t B = 2, S = 5, D = 8, half = D / 2;
  const double theta = 10000.0;
  at::Tensor inv = rope_inv_freq(D, theta, at::kDouble);
  Vec inv_want(half);
  for (int64_t i = 0; i < half; ++i) inv_want[i] = 1.0 / std::pow(theta, 2.0 * i / D);
  EXPECT_LT(max_abs_diff(inv, inv_want), 1e-15);
  // The default fp32 table (HF's) agrees to fp32 rounding.
  EXPECT_LT(max_abs_diff(rope_inv_freq(D, theta), inv_want), 1e-7);

  const std::vector<int64_t> pos = {0, 1, 2, 3, 4, 7, 3, 11, 0, 2};
  at::Tensor pos_t = at::tensor(pos, at::kLong).view({B, S});
  auto [cos, sin] = rope_cos_sin(pos_t, inv);
  ASSERT_EQ(cos.sizes(), (at::IntArrayRef{B, 1, S, D}));
  Vec cos_want(B * S * D), sin_want(B * S * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t d = 0; d < D; ++d) {
        double a = pos[b * S + s] * inv_want[d % half];
        cos_want[(b * S + s) * D + d] = std::cos(a);
        sin_want[(b * S + s) * D + d] = std::sin(a);
      }
  EXPECT_LT(max_abs_diff(cos, cos_want), 1e-12);
  EXPECT_LT(max_abs_diff(sin, sin_want), 1e-12);

  const int64_t Hq = 3, Hk = 1;
  at::Tensor q = randn({B, Hq, S, D}, 3), k = randn({B, Hk, S, D}, 4);
  auto [qr, kr] = apply_rope(q, k, cos, sin);
  auto rotate_ref = [&](const at::Tensor& x, int64_t H) {
    Vec xv = to_vec(x), out(xv.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t row = ((b * H + h) * S + s) * D, tab = (b * S + s) * D + d;
            // Pairs (d, d + half): [x1, x2] -> [x1 c - x2 s, x2 c + x1 s]
            double other = d < half ? -xv[row + d + half] : xv[row + d - half];
            out[row + d] = xv[row + d] * cos_want[tab] + other * sin_want[tab];
          }
    return out;
  };
  double eq = max_abs_diff(qr, rotate_ref(q, Hq)), ek = max_abs_diff(kr, rotate_ref(k, Hk));
  std::printf("rope q err %.3g k err %.3g\n", eq, ek);
  EXPECT_LT(eq, 1e-12);
  EXPECT_LT(ek, 1e-12);
}

// Reference attention: mask(b, i, j) returns {allowed, additive}; GQA maps query head h to kv
// head h / (Hq / Hkv).
struct MaskEntry { bool allowed; double add; };
Vec attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale,
                  const std::function<MaskEntry(int64_t, int64_t, int64_t)>& mask) {
  const int64_t B = q.size(0), Hq = q.size(1), S = q.size(2), D = q.size(3), Hk = k.size(1), T = k.size(2);
  Vec qv = to_vec(q), kv = to_vec(k), vv = to_vec(v), out(B * Hq * S * D, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hk);
      for (int64_t i = 0; i < S; ++i) {
        Vec score(T);
        std::vector<bool> ok(T);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          MaskEntry m = mask ? mask(b, i, j) : MaskEntry{true, 0.0};
          ok[j] = m.allowed && (!causal || j <= i + (T - S));
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += qv[((b * Hq + h) * S + i) * D + d] * kv[((b * Hk + hk) * T + j) * D + d];
          score[j] = s * scale + m.add;
          if (ok[j]) mx = std::max(mx, score[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < T; ++j) z += ok[j] ? std::exp(score[j] - mx) : 0.0;
        for (int64_t j = 0; j < T; ++j) {
          if (!ok[j]) continue;
          const double p = std::exp(score[j] - mx) / z;
          for (int64_t d = 0; d < D; ++d)
            out[((b * Hq + h) * S + i) * D + d] += p * vv[((b * Hk + hk) * T + j) * D + d];
        }
      }
    }
  return out;
}

void check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                     bool causal, c10::optional<double> scale, const Vec& want, const char* what) {
  double e1 = max_abs_diff(scaled_dot_product_attention(q, k, v, mask, causal, scale), want);
  double e2 = max_abs_diff(scaled_dot_product_attention_math(q, k, v, mask, causal, scale), want);
  std::printf("attention %s: err %.3g (dispatch) %.3g (math)\n", what, e1, e2);
  EXPECT_LT(e1, 1e-6) << what;
  EXPECT_LT(e2, 1e-6) << what;
}

TEST(Blocks, AttentionCausalGqaMatchesLoops) {
  const int64_t B = 2, Hq = 4, Hk = 2, S = 5, D = 8;
  at::Tensor q = randn({B, Hq, S, D}, 10), k = randn({B, Hk, S, D}, 11), v = randn({B, Hk, S, D}, 12);
  const double sc = 1.0 / std::sqrt(double(D));
  check_attention(q, k, v, {}, true, c10::nullopt, attention_ref(q, k, v, true, sc, nullptr), "causal gqa");
  check_attention(q, k, v, {}, false, c10::nullopt, attention_ref(q, k, v, false, sc, nullptr), "full gqa");
  check_attention(q, k, v, {}, true, 0.3, attention_ref(q, k, v, true, 0.3, nullptr), "causal scale 0.3");

  // KV-cache shape: 3 new queries against 7 keys; the causal diagonal sits at the end.
  at::Tensor q3 = randn({B, Hq, 3, D}, 13), k7 = randn({B, Hk, 7, D}, 14), v7 = randn({B, Hk, 7, D}, 15);
  check_attention(q3, k7, v7, {}, true, c10::nullopt, attention_ref(q3, k7, v7, true, sc, nullptr), "causal S<T");
}

TEST(Blocks, AttentionExplicitMasksMatchLoops) {
  const int64_t B = 2, Hq = 4, Hk = 2, S = 5, T = 5, D = 8;
  at::Tensor q = randn({B, Hq, S, D}, 20), k = randn({B, Hk, T, D}, 21), v = randn({B, Hk, T, D}, 22);
  const double sc = 1.0 / std::sqrt(double(D));

  // Boolean key-padding mask [B, 1, 1, T]: the last two keys of sample 1 are padding.
  std::vector<int64_t> valid = {5, 3};
  at::Tensor keep = at::zeros({B, 1, 1, T}, at::kBool);
  for (int64_t b = 0; b < B; ++b) keep[b].narrow(-1, 0, valid[b]).fill_(true);
  auto pad = [&](int64_t b, int64_t, int64_t j) { return MaskEntry{j < valid[b], 0.0}; };
  check_attention(q, k, v, keep, false, c10::nullopt, attention_ref(q, k, v, false, sc, pad), "bool padding");
  check_attention(q, k, v, keep, true, c10::nullopt, attention_ref(q, k, v, true, sc, pad), "bool padding + causal");

  // Additive float mask [B, 1, S, T] combined with causal.
  at::Tensor add = randn({B, 1, S, T}, 23);
  Vec addv = to_vec(add);
  auto additive = [&](int64_t b, int64_t i, int64_t j) { return MaskEntry{true, addv[(b * S + i) * T + j]}; };
  check_attention(q, k, v, add, true, c10::nullopt, attention_ref(q, k, v, true, sc, additive), "additive + causal");
}

TEST(Blocks, SwiGLUMatchesLoops) {
  const int64_t N = 6, H = 6, I = 10;
  SwiGLUMLP mlp(H, I, false, at::kDouble);
  fill_random(mlp.gate_proj->weight, 30, 0.5);
  fill_random(mlp.up_proj->weight, 31, 0.5);
  fill_random(mlp.down_proj->weight, 32, 0.5);
  at::Tensor x = randn({2, 3, H}, 33);
  at::Tensor y = mlp.forward(x);

  Vec xv = to_vec(x), g = to_vec(mlp.gate_proj->weight), u = to_vec(mlp.up_proj->weight),
      dw = to_vec(mlp.down_proj->weight), want(N * H, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    Vec act(I);
    for (int64_t i = 0; i < I; ++i) {
      double a = 0, b = 0;
      for (int64_t h = 0; h < H; ++h) {
        a += g[i * H + h] * xv[n * H + h];
        b += u[i * H + h] * xv[n * H + h];
      }
      act[i] = a / (1.0 + std::exp(-a)) * b;  // silu(a) * b
    }
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < I; ++i) want[n * H + h] += dw[h * I + i] * act[i];
  }
  double err = max_abs_diff(y, want);
  std::printf("swiglu max abs err %.3g\n", err);
  EXPECT_LT(err, 1e-12);
}

TEST(Blocks, CrossEntropyIgnoresMinus100) {
  const int64_t B = 2, S = 4, V = 7;
  at::Tensor logits = randn({B, S, V}, 40);
  std::vector<int64_t> labels = {3, -100, 0, 6, -100, 2, 5, -100};
  at::Tensor lab = at::tensor(labels, at::kLong).view({B, S});
  Vec lv = to_vec(logits);
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < B * S; ++r) {
    if (labels[r] == -100) continue;
    double mx = -1e300, z = 0;
    for (int64_t c = 0; c < V; ++c) mx = std::max(mx, lv[r * V + c]);
    for (int64_t c = 0; c < V; ++c) z += std::exp(lv[r * V + c] - mx);
    sum += mx + std::log(z) - lv[r * V + labels[r]];
    ++count;
  }
  auto s = lm_cross_entropy_sum(logits, lab);
  EXPECT_EQ(s.count.item<int64_t>(), count);
  EXPECT_NEAR(s.sum.item<double>(), sum, 1e-12);
  EXPECT_NEAR(lm_cross_entropy(logits, lab).item<double>(), sum / count, 1e-12);
  // No counted token: loss 0, not NaN.
  EXPECT_EQ(lm_cross_entropy(logits, at::full({B, S}, -100, at::kLong)).item<double>(), 0.0);
}

}  // namespace

// Variable-length attention over cu_seqlens equals attention with the block-diagonal segment
// mask (float64, to rounding), including runs of equal lengths, a lone segment and gradients.
TEST(Blocks, SegmentAttentionEqualsTheSegmentMask) {
  const std::vector<int64_t> cu = {0, 4, 8, 12, 15, 23, 31, 32};  // runs of 4 x3, 3, 8 x2, 1
  const int64_t N = cu.back(), H = 2, D = 5;
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor q = at::randn({1, H, N, D}, opts).requires_grad_(), k = at::randn({1, H, N, D}, opts).requires_grad_(),
             v = at::randn({1, H, N, D}, opts).requires_grad_();
  std::vector<int64_t> seg(static_cast<size_t>(N));
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int64_t i = cu[s]; i < cu[s + 1]; ++i) seg[static_cast<size_t>(i)] = static_cast<int64_t>(s);
  at::Tensor mask = mm::models::segment_attention_mask(at::tensor(seg, at::kLong).unsqueeze(0));
  at::Tensor ref = mm::models::scaled_dot_product_attention(q, k, v, mask, false);
  at::Tensor got = mm::models::segment_attention(q, k, v, cu);
  EXPECT_LT((got - ref).abs().max().item<double>(), 1e-12);
  at::Tensor w = at::randn_like(ref);
  auto g_ref = torch::autograd::grad({(ref * w).sum()}, {q, k, v});
  auto g_got = torch::autograd::grad({(got * w).sum()}, {q, k, v});
  for (int i = 0; i < 3; ++i) EXPECT_LT((g_got[i] - g_ref[i]).abs().max().item<double>(), 1e-12) << i;
  EXPECT_THROW(mm::models::segment_attention(q, k, v, {0, 5}), mm::Error);
}
