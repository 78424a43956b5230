#include "mindspeed_mm/training/context_parallel.h"

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

int64_t ContextParallel::apply(models::Model& model, const std::vector<std::string>& patterns,
                               const std::vector<std::string>& blocks) {
  int64_t n = 0;
  const int u = layout_.ulysses;
  for_each_matching_module(model, patterns, "context-parallel plan", [&](const std::string& path, mm::nn::Module& mod) {
    auto* host = dynamic_cast<models::AttentionCoreHost*>(&mod);
    if (!host)
      throw ConfigError(cat("config: parallel.context_parallel_size: the model's context-parallel plan names '", path,
                            "', a ", mod.type_name(), ", whose attention cannot be taken over"));
    if (auto* heads = dynamic_cast<models::HeadSplittable*>(&mod); heads && u > 1) {
      const auto [hq, hkv] = heads->heads();
      const int64_t kv = std::lcm(hkv, static_cast<int64_t>(u));  // key/value heads repeated up to this
      if (hq % u != 0 || hq % kv != 0)
        throw ConfigError(cat("config: parallel.context_parallel_size: Ulysses over ", u, " ranks splits the attention heads, but '",
                              path, "' has ", hq, " query and ", hkv, " key/value heads (per tensor-parallel rank); "
                              "query heads must divide by ", u, " and by the key/value heads repeated to a multiple of it (", kv,
                              "); use context_parallel_algo: ring or hybrid"));
    }
    host->attention_core = shared_from_this();
    ++n;
  });
  if (blocks.empty()) return n;
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
      at::Tensor h = first ? cp->enter(x) : x;
      mm::nn::ForwardContext local = c;
      local.cos = cp->cut_table(c.cos);
      local.sin = cp->cut_table(c.sin);
      local.attn_mask = at::Tensor();  // the whole sequence's: the core has the samples instead
      local.cu_seqlens = at::Tensor();
      h = f(h, local);
      return last ? cp->leave(h) : h;
    });
  }
  return n;
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
  return shard_for_rank(host, layout_, rank_, shard_multiple_);
}

data::Batch shard_for_rank(const data::Batch& host, const parallel::CpLayout& layout, int rank, int64_t shard_multiple) {
  const at::Tensor& ids = host.require_tensor(data::kInputIds);
  MM_CHECK(ids.dim() == 2, "context parallel: input_ids must be [batch, seq] (got ", ids.sizes(), ")");
  const int64_t B = ids.size(0), S = ids.size(1), m = layout.multiple() * std::max<int64_t>(1, shard_multiple);
  const int64_t padded = (S + m - 1) / m * m, pad = padded - S;
  const std::vector<int64_t> held = layout.token_indices(padded, rank);
  const at::Tensor index = at::tensor(held, at::kLong);
  auto cut = [&](const at::Tensor& t, int64_t fill) {
    MM_CHECK(t.dim() == 2 && t.size(0) == B && t.size(1) == S, "context parallel: a [", B, ", ", S,
             "] token field expected (got ", t.sizes(), ")");
    at::Tensor p = pad > 0 ? at::constant_pad_nd(t, {0, pad}, static_cast<double>(fill)) : t;
    return p.index_select(1, index).contiguous();
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
    else if (name == data::kCuSeqlens || name == data::kMaxSeqlen) out.set(name, at::Tensor());  // the whole row's
    else if (name == data::kSampleIds || name == data::kNoiseSeeds) continue;  // per sample
    else
      throw Error(cat("context parallel: cannot split the batch field '", name,
                      "' over the sequence (only token fields are split so far: input_ids, labels, position_ids, "
                      "segment_ids, attention_mask)"));
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

void ContextParallel::set_sequence(const at::Tensor& seg, at::Device device) {
  seq_len_ = seg.size(1);
  at::Tensor host = seg.to(at::kCPU);
  // One sample per row and no padding: nothing to mask but the causal diagonal.
  const bool uniform = host.eq(host.narrow(1, 0, 1)).all().item<bool>() && host.ge(0).all().item<bool>();
  segment_ids_ = uniform ? at::Tensor() : seg.to(device);
  cu_seqlens_ = mask_ = at::Tensor();
  if (!uniform && layout_.ring == 1) {
    // Ulysses attends over the whole sequence: flash-attention's varlen kernel on CUDA; elsewhere
    // one mask for every layer (varlen_attention would build it again in each).
    if (device.is_cuda()) {
      auto [cu, longest] = models::packed_cu_seqlens(host);
      cu_seqlens_ = cu.to(device);
      max_seqlen_ = longest;
    } else {
      mask_ = models::segment_attention_mask(segment_ids_);
    }
  }
  rings_[0].reset();
  rings_[1].reset();
}

void ContextParallel::begin(const data::Batch& batch) {
  if (!cuts_in_model_) return set_sequence(batch.require_tensor(kCpSegmentIds), batch.require_tensor(data::kInputIds).device());
  batch_segments_ = token_samples(batch);
}

at::Tensor ContextParallel::enter(const at::Tensor& x) {
  const int64_t B = x.size(0), L = x.size(1), m = multiple_;
  const int64_t padded = (L + m - 1) / m * m;
  real_len_ = L;
  at::Tensor seg = batch_segments_.defined() && batch_segments_.size(1) == L
                       ? batch_segments_.to(x.device())
                       : at::zeros({B, L}, x.options().dtype(at::kLong));
  if (padded > L) seg = at::constant_pad_nd(seg, {0, padded - L}, -1.0);
  set_sequence(seg, x.device());
  index_ = at::tensor(layout_.token_indices(padded, rank_), at::kLong).to(x.device());
  std::vector<int64_t> order;  // every rank's tokens in gather order
  for (int r = 0; r < layout_.size(); ++r) {
    auto t = layout_.token_indices(padded, r);
    order.insert(order.end(), t.begin(), t.end());
  }
  inverse_ = at::argsort(at::tensor(order, at::kLong)).to(x.device());
  cut_tables_.clear();
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
  MM_CHECK(seq_len_ > 0, "context parallel: attention before begin() gave it the batch's sequence");
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
    o = cu_seqlens_.defined() ? models::varlen_attention(qq, kk, vv, cu_seqlens_, max_seqlen_, causal, scale)
                              : models::scaled_dot_product_attention(qq, kk, vv, mask_, causal, scale);
  } else {
    auto& spec = rings_[causal ? 1 : 0];
    if (!spec || spec->scale != scale) {
      auto s = std::make_shared<parallel::RingSpec>();
      s->ring = ring_;
      for (int j = 0; j < layout_.ring; ++j) s->pieces.push_back(layout_.ring_pieces(seq_len_, j));
      s->segment_ids = segment_ids_;
      s->causal = causal;
      s->scale = scale;
      spec = std::move(s);
    }
    o = parallel::ring_attention(qq, kk, vv, spec);
  }
  return ulysses_ ? parallel::heads_to_sequence(o, ulysses_) : o;
}

}  // namespace mm::training
