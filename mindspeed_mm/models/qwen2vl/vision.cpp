// Qwen2-VL vision tower: patch embedding, 2-D rotary, per-frame attention, patch merger.
#include "mindspeed_mm/models/qwen2vl/vision.h"

#include <cmath>

#include <algorithm>
#include <tuple>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/rope.h"

namespace mm::models {

Qwen2VLVisionConfig Qwen2VLVisionConfig::from_json(const nlohmann::json& j, const std::string& source, bool qwen2_5) {
  Qwen2VLVisionConfig c;
  if (qwen2_5) {  // Qwen2_5_VLVisionConfig's defaults
    c.qwen2_5 = true;
    c.embed_dim = 3584;
    c.hidden_act = "silu";
  }
  if (j.is_null()) return c;
  read_hf_fields(c, j, source, /*strict=*/false, "vision_config.", qwen2_5 ? "qwen2_5_vl" : "qwen2_vl");
  HFConfigReader(j, source, "vision_config.")("in_channels", c.in_channels, config::gt(0));  // the class's own name
  activation_from_name(c.hidden_act, source);
  if (qwen2_5 && c.hidden_act != "silu")
    throw ConfigError(cat("config: vision_config.hidden_act must be \"silu\" for qwen2_5_vl (got \"", c.hidden_act,
                          "\") in ", source));
  if (qwen2_5 && c.window_units() < 1)
    throw ConfigError(cat("config: vision_config.window_size (", c.window_size, ") must be at least patch_size * spatial_merge_size (",
                          c.patch_size * c.spatial_merge_size, ") in ", source));
  if (c.embed_dim % c.num_heads != 0 || c.head_dim() % 4 != 0)
    throw ConfigError(cat("config: vision_config.", qwen2_5 ? "hidden_size" : "embed_dim", " (", c.embed_dim,
                          ") / num_heads (", c.num_heads, ") must be a multiple of 4 for the 2-D rotary embedding in ",
                          source));
  return c;
}

nlohmann::json Qwen2VLVisionConfig::to_json() const { return write_hf_fields(*this); }

int64_t Qwen2VLVisionConfig::num_parameters() const {
  const int64_t E = embed_dim, H = mlp_hidden(), W = embed_dim * spatial_merge_size * spatial_merge_size;
  const int64_t attention = (E * 3 * E + 3 * E)  // qkv
                            + (E * E + E);       // proj
  const int64_t mlp = qwen2_5 ? 2 * (E * H + H) + (H * E + E)  // gate, up, down (with biases)
                              : (E * H + H) + (H * E + E);     // fc1, fc2
  const int64_t norms = qwen2_5 ? 2 * E : 4 * E;               // norm1, norm2 (RMSNorm: weight only)
  const int64_t merger = (qwen2_5 ? E : 2 * E) + (W * W + W) + (W * hidden_size + hidden_size);
  return E * patch_dim() + depth * (attention + mlp + norms) + merger;
}

double Qwen2VLVisionConfig::training_flops(const at::Tensor& grid_thw) const {
  if (!grid_thw.defined() || grid_thw.numel() == 0) return 0;
  const double E = static_cast<double>(embed_dim), I = static_cast<double>(mlp_hidden());
  const int64_t m = spatial_merge_size;
  const double W = E * static_cast<double>(m * m);
  const double per_patch = static_cast<double>(patch_dim()) * E +
                           static_cast<double>(depth) * (4 * E * E + (qwen2_5 ? 3 : 2) * E * I);
  const double per_unit = W * W + W * static_cast<double>(hidden_size);
  at::Tensor g = grid_thw.to(at::kLong).contiguous();
  double patches = 0, frame_sq = 0;
  for (int64_t i = 0; i < g.size(0); ++i) {
    const double t = static_cast<double>(g[i][0].item<int64_t>()), hw = static_cast<double>(g[i][1].item<int64_t>() * g[i][2].item<int64_t>());
    patches += t * hw;
    frame_sq += t * hw * hw;
  }
  double window_sq = frame_sq;
  if (qwen2_5) {
    const WindowIndex wi = qwen2_5_vl_window_index(g, window_units(), m);
    window_sq = 0;
    for (size_t w = 0; w + 1 < wi.cu_seqlens.size(); ++w) {
      const double L = static_cast<double>(wi.cu_seqlens[w + 1] - wi.cu_seqlens[w]);
      window_sq += L * L;
    }
  }
  int64_t full_blocks = depth;
  if (qwen2_5) {
    full_blocks = 0;
    for (int64_t b : fullatt_block_indexes) full_blocks += b < depth;
  }
  const double attention = 12 * E * (static_cast<double>(full_blocks) * frame_sq +
                                     static_cast<double>(depth - full_blocks) * window_sq);
  return 6 * (per_patch * patches + per_unit * patches / static_cast<double>(m * m)) + attention;
}

double Qwen2VLVisionConfig::merger_training_flops(const at::Tensor& grid_thw) const {
  if (!grid_thw.defined() || grid_thw.numel() == 0) return 0;
  const int64_t m = spatial_merge_size;
  const double W = static_cast<double>(embed_dim) * static_cast<double>(m * m);
  const at::Tensor g = grid_thw.to(at::kLong);
  const double patches = static_cast<double>((g.select(1, 0) * g.select(1, 1) * g.select(1, 2)).sum().item<int64_t>());
  return 6 * (W * W + W * static_cast<double>(hidden_size)) * patches / static_cast<double>(m * m);
}

Qwen2VLVisionAttention::Qwen2VLVisionAttention(const Qwen2VLVisionConfig& c, at::ScalarType dtype)
    : num_heads(c.num_heads), head_dim(c.head_dim()) {
  qkv = register_module("qkv", std::make_shared<Linear>(c.embed_dim, 3 * c.embed_dim, true, dtype));
  proj = register_module("proj", std::make_shared<Linear>(c.embed_dim, c.embed_dim, true, dtype));
}

at::Tensor Qwen2VLVisionAttention::forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) const {
  const int64_t N = x.size(0);
  // [N, 3 * heads * D] -> q, k, v [1, heads, N, D]
  at::Tensor qkv_out = qkv->forward(x).view({N, 3, num_heads, head_dim}).permute({1, 2, 0, 3});
  at::Tensor q = qkv_out[0].unsqueeze(0), k = qkv_out[1].unsqueeze(0), v = qkv_out[2].unsqueeze(0);
  // HF rotates in fp32 and casts back (apply_rotary_pos_emb_vision).
  const auto dtype = q.scalar_type();
  std::tie(q, k) = apply_rope(q.to(at::kFloat), k.to(at::kFloat), ctx.cos, ctx.sin);
  q = q.to(dtype);
  k = k.to(dtype);
  at::Tensor o;
  if (attention_core) {
    o = attention_core->attend(q, k, v, /*causal=*/false, c10::nullopt);
  } else if (ctx.cu_seqlens.defined()) {
    at::Tensor cu = ctx.cu_seqlens.to(at::kCPU, at::kLong).contiguous();
    std::vector<int64_t> bounds(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
    if (q.is_cuda()) {
      // Per-image (per-window) attention in one varlen flash call, like HF's flash_attention_2.
      int64_t longest = 0;
      for (size_t i = 0; i + 1 < bounds.size(); ++i) longest = std::max(longest, bounds[i + 1] - bounds[i]);
      o = varlen_attention(q, k, v, cu, longest, /*causal=*/false);
    } else {
      o = segment_attention(q, k, v, bounds);
    }
  } else {
    o = scaled_dot_product_attention(q, k, v, ctx.attn_mask, /*causal=*/false);
  }
  return proj->forward(o.squeeze(0).transpose(0, 1).reshape({N, num_heads * head_dim}));
}

Qwen2VLVisionBlock::Qwen2VLVisionBlock(const Qwen2VLVisionConfig& c, at::ScalarType dtype) {
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(c.embed_dim, 1e-6, dtype));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(c.embed_dim, 1e-6, dtype));
  attn = register_module("attn", std::make_shared<Qwen2VLVisionAttention>(c, dtype));
  mlp = register_module("mlp", std::make_shared<FcMLP>(c.embed_dim, c.mlp_hidden(),
                                                       activation_from_name(c.hidden_act, "vision_config"), dtype));
}

at::Tensor Qwen2VLVisionBlock::forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) {
  at::Tensor h = x + attn->forward(norm1->forward(x), ctx);
  return h + mlp->forward(norm2->forward(h));
}

Qwen2_5_VLVisionBlock::Qwen2_5_VLVisionBlock(const Qwen2VLVisionConfig& c, at::ScalarType dtype) {
  norm1 = register_module("norm1", std::make_shared<RMSNorm>(c.embed_dim, 1e-6, dtype));
  norm2 = register_module("norm2", std::make_shared<RMSNorm>(c.embed_dim, 1e-6, dtype));
  attn = register_module("attn", std::make_shared<Qwen2VLVisionAttention>(c, dtype));
  mlp = register_module("mlp", std::make_shared<SwiGLUMLP>(c.embed_dim, c.intermediate_size, /*bias=*/true, dtype));
}

at::Tensor Qwen2_5_VLVisionBlock::forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) {
  at::Tensor h = x + attn->forward(norm1->forward(x), ctx);
  return h + mlp->forward(norm2->forward(h));
}

Qwen2VLPatchMerger::Qwen2VLPatchMerger(int64_t out_dim, int64_t context_dim, int64_t merge, at::ScalarType dtype,
                                       bool rms_norm)
    : window_dim(context_dim * merge * merge) {
  if (rms_norm)
    ln_q_rms = register_module("ln_q", std::make_shared<RMSNorm>(context_dim, 1e-6, dtype));
  else
    ln_q = register_module("ln_q", std::make_shared<LayerNorm>(context_dim, 1e-6, dtype));
  auto seq = register_module("mlp", std::make_shared<mm::nn::Module>());
  fc_in = seq->register_module("0", std::make_shared<Linear>(window_dim, window_dim, true, dtype));
  fc_out = seq->register_module("2", std::make_shared<Linear>(window_dim, out_dim, true, dtype));
}

at::Tensor Qwen2VLPatchMerger::forward(const at::Tensor& x) const {
  at::Tensor normed = ln_q ? ln_q->forward(x) : ln_q_rms->forward(x);
  at::Tensor windows = normed.reshape({-1, window_dim});
  return fc_out->forward(at::gelu(fc_in->forward(windows)));
}

Qwen2VisionTransformer::Qwen2VisionTransformer(const Qwen2VLVisionConfig& c, at::ScalarType dtype) : config(c) {
  auto patch_embed = register_module("patch_embed", std::make_shared<mm::nn::Module>());
  auto proj = patch_embed->register_module("proj", std::make_shared<mm::nn::Module>());
  patch_embed_weight = proj->register_parameter(
      "weight", at::zeros({c.embed_dim, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size},
                          at::TensorOptions().dtype(dtype)));
  auto list = register_module("blocks", std::make_shared<mm::nn::Module>());
  for (int64_t i = 0; i < c.depth; ++i) {
    std::shared_ptr<mm::nn::Block> b;
    if (c.qwen2_5)
      b = std::make_shared<Qwen2_5_VLVisionBlock>(c, dtype);
    else
      b = std::make_shared<Qwen2VLVisionBlock>(c, dtype);
    blocks.push_back(list->register_module(std::to_string(i), b));
  }
  merger = register_module("merger", std::make_shared<Qwen2VLPatchMerger>(c.hidden_size, c.embed_dim,
                                                                          c.spatial_merge_size, dtype, c.qwen2_5));
}

WindowIndex qwen2_5_vl_window_index(const at::Tensor& grid_thw, int64_t units, int64_t m) {
  MM_CHECK(units >= 1, "qwen2_5_vl: a window must span at least one merged unit (got ", units, ")");
  WindowIndex out;
  out.cu_seqlens.push_back(0);
  at::Tensor g = grid_thw.to(at::kLong).contiguous();
  const int64_t* p = g.data_ptr<int64_t>();
  int64_t base = 0;
  for (int64_t i = 0; i < g.size(0); ++i) {
    const int64_t t = p[3 * i], lh = p[3 * i + 1] / m, lw = p[3 * i + 2] / m;
    const int64_t windows_h = (lh + units - 1) / units, windows_w = (lw + units - 1) / units;
    for (int64_t f = 0; f < t; ++f)
      for (int64_t wy = 0; wy < windows_h; ++wy)
        for (int64_t wx = 0; wx < windows_w; ++wx) {
          int64_t count = 0;
          for (int64_t y = wy * units; y < std::min(lh, (wy + 1) * units); ++y)
            for (int64_t x = wx * units; x < std::min(lw, (wx + 1) * units); ++x, ++count)
              out.index.push_back(base + (f * lh + y) * lw + x);
          out.cu_seqlens.push_back(out.cu_seqlens.back() + count * m * m);
        }
    base += t * lh * lw;
  }
  return out;
}

at::Tensor Qwen2VisionTransformer::rotary_angles(const at::Tensor& grid_thw) const {
  // Patch (row, column) in the processor's merge-window order: windows of m x m patches row by
  // row, patches row by row inside a window; repeated for every temporal patch.
  const int64_t m = config.spatial_merge_size;
  std::vector<int64_t> rows, cols;
  int64_t max_side = 1;
  auto g = grid_thw.to(at::kLong).contiguous();
  const int64_t* p = g.data_ptr<int64_t>();
  for (int64_t i = 0; i < g.size(0); ++i) {
    const int64_t t = p[3 * i], h = p[3 * i + 1], w = p[3 * i + 2];
    max_side = std::max({max_side, h, w});
    for (int64_t f = 0; f < t; ++f)
      for (int64_t wy = 0; wy < h / m; ++wy)
        for (int64_t wx = 0; wx < w / m; ++wx)
          for (int64_t y = 0; y < m; ++y)
            for (int64_t x = 0; x < m; ++x) {
              rows.push_back(wy * m + y);
              cols.push_back(wx * m + x);
            }
  }
  at::Tensor inv = rope_inv_freq(config.head_dim() / 2, 10000.0);                 // [head_dim / 4]
  at::Tensor r = at::tensor(rows, at::kLong).to(at::kFloat).unsqueeze(1) * inv.unsqueeze(0);
  at::Tensor c = at::tensor(cols, at::kLong).to(at::kFloat).unsqueeze(1) * inv.unsqueeze(0);
  return at::cat({r, c}, 1);  // [N, head_dim / 2]
}

at::Tensor qwen2vl_patch_block_order(const Qwen2VLVisionConfig& c, const at::Tensor& grid_thw) {
  if (!c.qwen2_5) return {};
  // Whole merge units move: unit k of the window order is processor unit index[k].
  const int64_t m = c.spatial_merge_size, unit = m * m;
  WindowIndex wi = qwen2_5_vl_window_index(grid_thw.to(at::kCPU, at::kLong), c.window_units(), m);
  at::Tensor unit_order = at::tensor(wi.index, at::kLong);
  return (unit_order.unsqueeze(1) * unit + at::arange(unit, at::kLong).unsqueeze(0)).reshape({-1});
}

at::Tensor Qwen2VisionTransformer::forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw, bool cut) {
  Run run = prepare(pixel_values, grid_thw, /*embed=*/true, cut);
  at::Tensor h = run_blocks(run, run.h, 0, static_cast<int64_t>(blocks.size()));
  return finish(run, h);
}

Qwen2VisionTransformer::Run Qwen2VisionTransformer::prepare(const at::Tensor& pixel_values, const at::Tensor& grid_thw,
                                                            bool embed, bool cut) const {
  MM_CHECK(pixel_values.dim() == 2 && pixel_values.size(1) == config.patch_dim(), "qwen2vl vision: pixel_values must be [N, ",
           config.patch_dim(), "] (got ", pixel_values.sizes(), ")");
  MM_CHECK(grid_thw.dim() == 2 && grid_thw.size(1) == 3, "qwen2vl vision: grid_thw must be [images, 3] (got ",
           grid_thw.sizes(), ")");
  at::Tensor g = grid_thw.to(at::kCPU, at::kLong).contiguous();  // sizes, read on the host
  const int64_t m = config.spatial_merge_size;
  // One attention segment per temporal patch of each image or video (cu_seqlens).
  std::vector<int64_t> frames = {0};
  for (int64_t i = 0; i < g.size(0); ++i) {
    const int64_t t = g[i][0].item<int64_t>(), h = g[i][1].item<int64_t>(), w = g[i][2].item<int64_t>();
    MM_CHECK(t > 0 && h % m == 0 && w % m == 0 && h > 0 && w > 0, "qwen2vl vision: grid ", i, " (", t, ", ", h, ", ", w,
             ") must be positive with h and w multiples of ", m);
    for (int64_t f = 0; f < t; ++f) frames.push_back(frames.back() + h * w);
  }
  MM_CHECK(cut || frames.back() == pixel_values.size(0), "qwen2vl vision: the grids cover ", frames.back(),
           " patches but pixel_values has ", pixel_values.size(0));

  const auto dtype = patch_embed_weight.scalar_type();
  // Conv3d with kernel = stride over one patch each: a matmul with the flattened kernel.
  at::Tensor h;
  if (embed) h = at::matmul(pixel_values.to(dtype), patch_embed_weight.reshape({config.embed_dim, -1}).t());
  at::Tensor angles = rotary_angles(g);
  const at::Tensor frame_cu = at::tensor(frames, at::kLong);
  at::Tensor window_cu, unit_order;
  if (config.qwen2_5) {
    // Window order: reorder whole merge units (patches and their rotary angles); frames stay
    // contiguous and in order, so the per-frame segments above still hold.
    // (A context-parallel cut is in this order already.)
    WindowIndex wi = qwen2_5_vl_window_index(g, config.window_units(), m);
    unit_order = at::tensor(wi.index, at::kLong);
    const at::Tensor patch_order = qwen2vl_patch_block_order(config, g);
    if (h.defined() && !cut) h = h.index_select(0, patch_order.to(h.device()));
    angles = angles.index_select(0, patch_order);
    window_cu = at::tensor(wi.cu_seqlens, at::kLong);
  }
  at::Tensor emb = at::cat({angles, angles}, -1).unsqueeze(0).unsqueeze(0);  // [1, 1, N, head_dim]
  mm::nn::ForwardContext ctx;
  ctx.cos = emb.cos().to(pixel_values.device());
  ctx.sin = emb.sin().to(pixel_values.device());
  ctx.causal = false;
  return {h, ctx, frame_cu, window_cu, unit_order};
}

at::Tensor Qwen2VisionTransformer::run_blocks(Run& run, at::Tensor h, int64_t begin, int64_t end) {
  const auto& full = config.fullatt_block_indexes;
  for (int64_t i = begin; i < end; ++i) {
    run.ctx.layer_index = i;
    const bool windowed = config.qwen2_5 && std::find(full.begin(), full.end(), i) == full.end();
    run.ctx.cu_seqlens = windowed ? run.window_cu : run.frame_cu;
    h = blocks[static_cast<size_t>(i)]->call(h, run.ctx);
  }
  return h;
}

at::Tensor Qwen2VisionTransformer::finish(const Run& run, const at::Tensor& h) const {
  at::Tensor merged = merger->forward(h);
  if (!config.qwen2_5) return merged;
  const at::Tensor& unit_order = run.unit_order;
  // Back to the processor's order: the unit at window position k is unit_order[k].
  at::Tensor inverse = at::empty_like(unit_order);
  inverse.index_put_({unit_order}, at::arange(unit_order.size(0), at::kLong));
  return merged.index_select(0, inverse.to(merged.device()));
}

}  // namespace mm::models
