#include "mindspeed_mm/training/context_parallel.h"

#include <algorithm>
#include <numeric>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/pattern.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/parallel/tensor_parallel.h"
#include "mindspeed_mm/training/plans.h"

namespace mm::training {

parallel::CpLayout resolve_cp_layout(const config::ParallelConfig& p) {
  const int n = static_cast<int>(p.context_parallel_size);
  std::string algo = p.context_parallel_algo;
  if (algo == "ulysses_cp_algo") algo = "ulysses";
  if (algo == "megatron_cp_algo") algo = "ring";
  if (algo == "hybrid_cp_algo") algo = "hybrid";
  parallel::CpLayout l;
  if (algo != "hybrid" && p.ulysses_degree_in_cp > 0)
    throw ConfigError(cat("config: parallel.ulysses_degree_in_cp applies to context_parallel_algo: hybrid (it is ", algo, ")"));
  if (algo == "ulysses") {
    l.ulysses = n;
  } else if (algo == "ring") {
    l.ring = n;
  } else {
    const int u = static_cast<int>(p.ulysses_degree_in_cp);
    if (u < 2 || u >= n || n % u != 0)
      throw ConfigError(cat("config: parallel.context_parallel_algo: hybrid needs parallel.ulysses_degree_in_cp between 2 "
                            "and context_parallel_size ", n, " (exclusive) that divides it (it is ", u, ")"));
    l.ulysses = u;
    l.ring = n / u;
  }
  return l;
}

ContextParallel::ContextParallel(const parallel::CpLayout& layout, parallel::CpGroup group, int64_t shard_multiple)
    : layout_(layout), shard_multiple_(std::max<int64_t>(1, shard_multiple)),
      multiple_(layout.multiple() * shard_multiple_), group_(std::move(group)),
      rank_(group_ ? group_->rank() : 0) {
  MM_CHECK(group_ && group_->size() == layout_.size(), "context parallel: a group of ", layout_.size(), " ranks expected");
  const std::vector<int>& m = group_->members();
  const int u = layout_.ulysses, ring_rank = rank_ / u, share = rank_ % u;
  // One algorithm: the cp group itself. Hybrid: a Ulysses group of neighbours and a ring across.
  if (layout_.ring == 1) {
    ulysses_ = group_;
  } else if (u == 1) {
    ring_ = group_;
  } else {
    std::vector<int> ulysses, ring;
    for (int i = 0; i < u; ++i) ulysses.push_back(m[static_cast<size_t>(ring_rank * u + i)]);
    for (int j = 0; j < layout_.ring; ++j) ring.push_back(m[static_cast<size_t>(j * u + share)]);
    ulysses_ = group_->subgroup(ulysses, "cp_ulysses");
    ring_ = group_->subgroup(ring, "cp_ring");
  }
}

std::string ContextParallel::ulysses_misfit(mm::nn::Module& model, const std::vector<std::string>& patterns, int u) {
  std::string why;
  if (u < 2) return why;
  for_each_matching_module(model, patterns, "context-parallel plan", [&](const std::string& path, mm::nn::Module& mod) {
    auto* heads = dynamic_cast<models::HeadSplittable*>(&mod);
    if (!heads || !why.empty()) return;
    const auto [hq, hkv] = heads->heads();
    const int64_t kv = std::lcm(hkv, static_cast<int64_t>(u));  // key/value heads repeated up to this
    if (hq % u != 0 || hq % kv != 0)
      why = cat("Ulysses over ", u, " ranks splits the attention heads, but '", path, "' has ", hq, " query and ", hkv,
                " key/value heads (per tensor-parallel rank); query heads must divide by ", u,
                " and by the key/value heads repeated to a multiple of it (", kv, ")");
  });
  return why;
}

ContextParallel::ContextParallel(const ContextParallel& o, int64_t shard_multiple)
    : layout_(o.layout_), shard_multiple_(std::max<int64_t>(1, shard_multiple)),
      multiple_(layout_.multiple() * shard_multiple_), group_(o.group_), ulysses_(o.ulysses_), ring_(o.ring_),
      rank_(o.rank_) {}

int64_t ContextParallel::install_core(mm::nn::Module& model, const std::vector<std::string>& patterns) {
  if (const std::string why = ulysses_misfit(model, patterns, layout_.ulysses); !why.empty())
    throw ConfigError(cat("config: parallel.context_parallel_size: ", why, "; use context_parallel_algo: ring or hybrid"));
  int64_t n = 0;
  for_each_matching_module(model, patterns, "context-parallel plan", [&](const std::string& path, mm::nn::Module& mod) {
    auto* host = dynamic_cast<models::AttentionCoreHost*>(&mod);
    if (!host)
      throw ConfigError(cat("config: parallel.context_parallel_size: the model's context-parallel plan names '", path,
                            "', a ", mod.type_name(), ", whose attention cannot be taken over"));
    host->attention_core = shared_from_this();
    ++n;
  });
  return n;
}

int64_t ContextParallel::apply(mm::nn::Module& model, const std::vector<std::string>& patterns,
                               const std::vector<std::string>& blocks,
                               std::function<std::pair<int64_t, int64_t>(const data::Batch&)> length) {
  length_ = std::move(length);
  const int64_t n = install_core(model, patterns);
  if (!blocks.empty()) install_cut(model, blocks);
  return n;
}

int64_t ContextParallel::apply_encoder(mm::nn::Module& model, const models::PlanTable::CpStretch& stretch) {
  MM_CHECK(!stretch.blocks.empty(), "context parallel: an encoder stretch names no blocks");
  encoder_ = true;
  inputs_ = stretch.inputs;
  order_ = stretch.order;
  const int64_t n = install_core(model, stretch.attention);
  install_cut(model, stretch.blocks);
  return n;
}

void ContextParallel::install_cut(mm::nn::Module& model, const std::vector<std::string>& blocks) {
  // Cutting inside the model: every block of the stretch sees its rotary tables cut to this
  // rank's tokens; the first cuts the hidden states, the last gathers them (outside every other
  // wrapper: tensor parallelism's sequence split then takes its share of this rank's).
  std::vector<mm::nn::Block*> stretch;
  for_each_matching_module(model, blocks, "context-parallel blocks", [&](const std::string& path, mm::nn::Module& mod) {
    auto* b = dynamic_cast<mm::nn::Block*>(&mod);
    if (!b)
      throw ConfigError(cat("config: the context-parallel plan names '", path, "', a ", mod.type_name(),
                            ", which is not a block"));
    stretch.push_back(b);
  });
  cuts_in_model_ = true;
  for (mm::nn::Block* b : stretch) {
    const bool first = b == stretch.front(), last = b == stretch.back();
    std::weak_ptr<ContextParallel> self = weak_from_this();
    b->add_outer_wrapper("context_parallel", [self, first, last](mm::nn::Block&, const at::Tensor& x,
                                                                 const mm::nn::ForwardContext& c,
                                                                 const mm::nn::BlockCtxFn& f) {
      if (c.kv_cache) return f(x, c);  // generation (the sample after training): the whole sequence here
      auto cp = self.lock();
      MM_CHECK(cp, "context parallel: the plan outlived its state");
      // An encoder's blocks take one unbatched sequence: a batch of one here.
      const bool unbatched = cp->encoder_;
      // The whole sequence's length: an encoder's (whose input may come cut) by its rotary table.
      const int64_t L = unbatched ? (c.cos.defined() ? c.cos.size(-2) : x.size(0)) : x.size(1);
      at::Tensor h = unbatched ? x.unsqueeze(0) : x;
      if (first) h = cp->enter(h, L);
      if (unbatched) cp->use_bounds(c.cu_seqlens, x.device());
      mm::nn::ForwardContext local = c;
      local.cos = cp->cut_table(c.cos);
      local.sin = cp->cut_table(c.sin);
      local.attn_mask = at::Tensor();  // the whole sequence's: the core has the samples instead
      local.cu_seqlens = at::Tensor();
      h = f(unbatched ? h.squeeze(0) : h, local);
      if (!last) return h;
      return unbatched ? cp->leave(h.unsqueeze(0)).squeeze(0) : cp->leave(h);
    });
  }
}

namespace {

// The sample of every token of a batch's token fields: packed rows' segments, a padded row's real
// tokens (0) and padding (-1); undefined when it has neither.
at::Tensor token_samples(const data::Batch& b) {
  if (const at::Tensor& s = b[data::kSegmentIds]; s.defined()) return s.to(at::kLong);
  if (const at::Tensor& a = b[data::kAttentionMask]; a.defined()) return at::where(a.ne(0), 0, -1).to(at::kLong);
  return {};
}

}  // namespace

data::Batch ContextParallel::shard(const data::Batch& host) const {
  return shard_for_rank(prepare_ ? prepare_(host) : host, layout_, rank_, shard_multiple_, whole_);
}

data::Batch shard_for_rank(const data::Batch& host, const parallel::CpLayout& layout, int rank, int64_t shard_multiple,
                           const std::vector<std::string>& whole) {
  const at::Tensor& ids = host.require_tensor(data::kInputIds);
  MM_CHECK(ids.dim() == 2, "context parallel: input_ids must be [batch, seq] (got ", ids.sizes(), ")");
  const int64_t B = ids.size(0), S = ids.size(1), m = layout.multiple() * std::max<int64_t>(1, shard_multiple);
  const int64_t padded = (S + m - 1) / m * m, pad = padded - S;
  const std::vector<int64_t> held = layout.token_indices(padded, rank);
  const at::Tensor index = at::tensor(held, at::kLong);
  // A token field [..., B, S] (M-RoPE positions have a leading 3) cut along its last dim.
  auto cut = [&](const at::Tensor& t, int64_t fill) {
    MM_CHECK(t.dim() >= 2 && t.size(-2) == B && t.size(-1) == S, "context parallel: a [", B, ", ", S,
             "] token field expected (got ", t.sizes(), ")");
    at::Tensor p = pad > 0 ? at::constant_pad_nd(t, {0, pad}, static_cast<double>(fill)) : t;
    return p.index_select(-1, index).contiguous();
  };
  // The sample of every token: packed rows' segments, a padded row's real tokens (0) and padding
  // (-1), one sample otherwise; the padding added here is a sample of its own.
  at::Tensor seg = token_samples(host);
  if (!seg.defined()) seg = at::zeros({B, S}, at::kLong);
  if (pad > 0) seg = at::constant_pad_nd(seg, {0, pad}, -1.0);

  data::Batch out = host;
  for (const auto& f : host.fields()) {
    const std::string& name = f.name;
    if (name == data::kInputIds) out.set(name, cut(f.tensor, 0), f.host);
    else if (name == data::kLabels) out.set(name, cut(f.tensor, -100), f.host);
    else if (name == data::kSegmentIds) out.set(name, cut(f.tensor, -1), f.host);
    else if (name == data::kAttentionMask) out.set(name, cut(f.tensor, 0), f.host);
    else if (name == data::kPositionIds) continue;  // below
    else if (name == data::kMropePositionIds) out.set(name, cut(f.tensor, 0), f.host);
    else if (name == data::kImageFeatureIndex || name == data::kVideoFeatureIndex) out.set(name, cut(f.tensor, -1), f.host);
    else if (std::find(whole.begin(), whole.end(), name) != whole.end()) continue;
    else if (name == data::kCuSeqlens || name == data::kMaxSeqlen) out.set(name, at::Tensor());  // the whole row's
    else if (name == data::kSampleIds || name == data::kNoiseSeeds) continue;  // per sample
    else
      throw Error(cat("context parallel: cannot split the batch field '", name,
                      "' over the sequence (only token fields are split: input_ids, labels, position_ids, "
                      "segment_ids, attention_mask, and the model's M-RoPE positions and feature indices)"));
  }
  at::Tensor pos = host[data::kPositionIds];
  if (!pos.defined()) pos = at::arange(S, at::kLong).unsqueeze(0).expand({B, S});
  MM_CHECK(pos.dim() == 2, "context parallel: position_ids must be [batch, seq] (got ", pos.sizes(),
           "; M-RoPE positions are not split yet)");
  if (pad > 0) pos = at::cat({pos, at::arange(S, padded, at::kLong).unsqueeze(0).expand({B, pad})}, 1);
  out.set(data::kPositionIds, pos.index_select(1, index).contiguous());
  out.set(kCpSegmentIds, seg, /*host=*/true);
  return out;
}

data::Batch ContextParallel::shard_inputs(const data::Batch& host) const {
  // enter() tells a cut input by its length: an input so short that a rank's share is as long
  // as the whole (a patch or two) stays whole, and so do the others (one flag for the batch).
  for (const auto& [name, grid_name] : inputs_) {
    const at::Tensor& rows = host[name];
    const int64_t N = rows.defined() ? rows.size(0) : 0, m = multiple_;
    if (N > 0 && (N + m - 1) / m * m / layout_.size() == N) return host;
  }
  data::Batch out = host;
  bool any = false;
  for (const auto& [name, grid_name] : inputs_) {
    const auto field = std::find_if(host.fields().begin(), host.fields().end(), [&](const auto& f) { return f.name == name; });
    if (field == host.fields().end() || !field->tensor.defined()) continue;
    const at::Tensor& rows = field->tensor;
    const int64_t N = rows.size(0), m = multiple_, padded = (N + m - 1) / m * m;
    const at::Tensor order = order_ ? order_(host.require_tensor(grid_name)) : at::Tensor();
    MM_CHECK(!order.defined() || order.numel() == N, "context parallel: ", name, " has ", N, " rows but its grid ",
             grid_name, " covers ", order.numel());
    // This rank's positions of the block order, and the rows there (padding: zero rows).
    std::vector<int64_t> at_pos, src;
    const std::vector<int64_t> held = layout_.token_indices(padded, rank_);
    const at::Tensor ord = order.defined() ? order.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
    for (size_t i = 0; i < held.size(); ++i)
      if (held[i] < N) {
        at_pos.push_back(static_cast<int64_t>(i));
        src.push_back(ord.defined() ? ord.data_ptr<int64_t>()[held[i]] : held[i]);
      }
    std::vector<int64_t> shape = rows.sizes().vec();
    shape[0] = static_cast<int64_t>(held.size());
    at::Tensor mine = at::zeros(shape, rows.options());
    mine.index_copy_(0, at::tensor(at_pos, at::kLong).to(rows.device()),
                     rows.index_select(0, at::tensor(src, at::kLong).to(rows.device())));
    out.set(name, mine, field->host);
    any = true;
  }
  if (any) out.set(data::kPixelRowsCut, at::ones({}, at::kLong), /*host=*/true);
  return out;
}

void ContextParallel::set_sequence(const at::Tensor& seg, at::Device device) {
  seq_len_ = seg.size(1);
  auto q = std::make_shared<Sequence>();
  at::Tensor host = seg.to(at::kCPU);
  // One sample per row and no padding: nothing to mask but the causal diagonal.
  const bool uniform = host.eq(host.narrow(1, 0, 1)).all().item<bool>() && host.ge(0).all().item<bool>();
  if (!uniform) q->segment_ids = seg.to(device);
  if (!uniform && layout_.ring == 1) {
    // Ulysses attends over the whole sequence: flash-attention's varlen kernel on CUDA; elsewhere
    // one mask for every layer (varlen_attention would build it again in each).
    if (device.is_cuda()) {
      auto [cu, longest] = models::packed_cu_seqlens(host);
      q->cu_seqlens = cu.to(device);
      q->max_seqlen = longest;
    } else {
      q->mask = models::segment_attention_mask(q->segment_ids);
    }
  }
  seq_ = std::move(q);
}

void ContextParallel::use_bounds(const at::Tensor& cu, at::Device device) {
  std::vector<int64_t> bounds;
  if (cu.defined()) {
    at::Tensor c = cu.to(at::kCPU, at::kLong).contiguous();
    bounds.assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }
  for (auto& [key, q] : by_bounds_)
    if (key == bounds) {
      seq_ = q;
      return;
    }
  MM_CHECK(bounds.empty() || (bounds.front() == 0 && bounds.back() == real_len_), "context parallel: segment bounds ",
           bounds.front(), "..", bounds.back(), " do not cover the ", real_len_, " tokens cut on entering");
  at::Tensor seg = at::full({1, seq_len_}, -1, at::kLong);
  if (bounds.empty()) seg.narrow(1, 0, real_len_).fill_(0);
  for (size_t i = 0; i + 1 < bounds.size(); ++i)
    seg.narrow(1, bounds[i], bounds[i + 1] - bounds[i]).fill_(static_cast<int64_t>(i));
  set_sequence(seg, device);
  by_bounds_.emplace_back(std::move(bounds), seq_);
}

void ContextParallel::begin(const data::Batch& batch) {
  if (!cuts_in_model_) return set_sequence(batch.require_tensor(kCpSegmentIds), batch.require_tensor(data::kInputIds).device());
  batch_segments_ = token_samples(batch);
  prepared_ = {0, 0};
  if (!length_) return;
  const auto [B, L] = length_(batch);
  at::Device device = at::kCPU;
  for (const auto& f : batch.fields())
    if (f.tensor.defined() && !f.host) {
      device = f.tensor.device();
      break;
    }
  prepare_cut(B, L, device);
  prepared_ = {B, L};
}

void ContextParallel::prepare_cut(int64_t B, int64_t L, at::Device device) {
  const int64_t m = multiple_, padded = (L + m - 1) / m * m;
  real_len_ = L;
  at::Tensor seg = batch_segments_.defined() && batch_segments_.size(1) == L
                       ? batch_segments_.to(device)
                       : at::zeros({B, L}, at::TensorOptions().dtype(at::kLong).device(device));
  if (padded > L) seg = at::constant_pad_nd(seg, {0, padded - L}, -1.0);
  by_bounds_.clear();
  if (encoder_) seq_len_ = padded;  // each block names its segments (use_bounds)
  else set_sequence(seg, device);
  index_ = at::tensor(layout_.token_indices(padded, rank_), at::kLong).to(device);
  std::vector<int64_t> order;  // every rank's tokens in gather order
  for (int r = 0; r < layout_.size(); ++r) {
    auto t = layout_.token_indices(padded, r);
    order.insert(order.end(), t.begin(), t.end());
  }
  inverse_ = at::argsort(at::tensor(order, at::kLong)).to(device);
  cut_tables_.clear();
}

at::Tensor ContextParallel::enter(const at::Tensor& x, int64_t L) {
  const int64_t B = x.size(0), m = multiple_;
  const int64_t padded = (L + m - 1) / m * m;
  const bool cut = x.size(1) != L;  // by shard_inputs
  MM_CHECK(!cut || x.size(1) == padded / layout_.size(), "context parallel: ", x.size(1), " rows enter a stretch of ", L,
           " tokens cut over ", layout_.size(), " ranks (", padded / layout_.size(), " expected)");
  if (prepared_ != std::make_pair(B, L)) prepare_cut(B, L, x.device());
  prepared_ = {0, 0};
  if (cut) return x;
  std::vector<int64_t> pad(2 * static_cast<size_t>(x.dim() - 2), 0);  // the dims after the sequence
  pad.push_back(0);
  pad.push_back(padded - L);
  at::Tensor h = padded > L ? at::constant_pad_nd(x, pad) : x;
  return h.index_select(1, index_);  // backward: this rank's rows of the gradient, zeros elsewhere
}

at::Tensor ContextParallel::leave(const at::Tensor& y) {
  // All ranks' rows in gather order (backward: the sum of every rank's gradient, this rank's rows:
  // each rank's loss is over the whole sequence), then in sequence order, the padding dropped.
  at::Tensor all = parallel::gather_from_sequence_region(y, group_, 1);
  return all.index_select(1, inverse_).narrow(1, 0, real_len_);
}

at::Tensor ContextParallel::cut_table(const at::Tensor& t) {
  if (!t.defined() || t.dim() < 2 || t.size(-2) != real_len_) return t;
  for (auto& [key, cut] : cut_tables_)
    if (key == t.unsafeGetTensorImpl()) return cut;
  const int64_t padded = seq_len_;
  std::vector<int64_t> pad = {0, 0, 0, padded - real_len_};
  at::Tensor p = padded > real_len_ ? at::constant_pad_nd(t, pad) : t;
  at::Tensor cut = p.index_select(t.dim() - 2, index_);
  cut_tables_.emplace_back(t.unsafeGetTensorImpl(), cut);
  return cut;
}

at::Tensor ContextParallel::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                   c10::optional<double> scale) {
  MM_CHECK(seq_ && seq_len_ > 0, "context parallel: attention before begin() gave it the batch's sequence");
  const Sequence& seq = *seq_;
  at::Tensor qq = q, kk = k, vv = v;
  if (ulysses_) {
    const int64_t u = layout_.ulysses, rep = std::lcm(k.size(1), u) / k.size(1);
    if (rep > 1) {  // fewer key/value heads than ranks: each repeated so that every rank gets whole groups
      kk = kk.repeat_interleave(rep, 1);
      vv = vv.repeat_interleave(rep, 1);
    }
    qq = parallel::sequence_to_heads(qq, ulysses_);
    kk = parallel::sequence_to_heads(kk, ulysses_);
    vv = parallel::sequence_to_heads(vv, ulysses_);
  }
  at::Tensor o;
  if (!ring_) {
    o = seq.cu_seqlens.defined() ? models::varlen_attention(qq, kk, vv, seq.cu_seqlens, seq.max_seqlen, causal, scale)
                                 : models::scaled_dot_product_attention(qq, kk, vv, seq.mask, causal, scale);
  } else {
    auto& spec = seq_->rings[causal ? 1 : 0];
    if (!spec || spec->scale != scale) {
      auto s = std::make_shared<parallel::RingSpec>();
      s->ring = ring_;
      for (int j = 0; j < layout_.ring; ++j) s->pieces.push_back(layout_.ring_pieces(seq_len_, j));
      s->segment_ids = seq.segment_ids;
      s->causal = causal;
      s->scale = scale;
      spec = std::move(s);
    }
    o = parallel::ring_attention(qq, kk, vv, spec);
  }
  return ulysses_ ? parallel::heads_to_sequence(o, ulysses_) : o;
}

}  // namespace mm::training
