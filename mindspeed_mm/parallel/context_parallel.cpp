#include "mindspeed_mm/parallel/context_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "mindspeed_mm/core/errors.h"

namespace mm::parallel {

std::vector<std::pair<int64_t, int64_t>> CpLayout::ring_pieces(int64_t S, int j) const {
  MM_CHECK(S % multiple() == 0, "context parallel: a sequence of ", S, " tokens is not padded to a multiple of ",
           multiple());
  if (ring == 1) return {{0, S}};
  const int64_t c = S / (2LL * ring);
  return {{j * c, c}, {(2LL * ring - 1 - j) * c, c}};
}

std::vector<int64_t> CpLayout::token_indices(int64_t S, int rank) const {
  std::vector<int64_t> held;
  for (auto [start, len] : ring_pieces(S, rank / ulysses))
    for (int64_t i = 0; i < len; ++i) held.push_back(start + i);
  const int64_t share = static_cast<int64_t>(held.size()) / ulysses, first = (rank % ulysses) * share;
  return {held.begin() + first, held.begin() + first + share};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GroupHolder : torch::CustomClassHolder {
  CpGroup group;
  int64_t scatter_dim = 0, gather_dim = 0;
};

// x cut into n chunks along scatter_dim, chunk j to group rank j; the chunks received
// concatenated along gather_dim in group-rank order.
at::Tensor all_to_all_dims(const at::Tensor& x, Communicator& g, int64_t scatter_dim, int64_t gather_dim) {
  const int n = g.size();
  MM_CHECK(x.size(scatter_dim) % n == 0, "context parallel: dimension ", scatter_dim, " of ", x.sizes(),
           " does not divide by the group's ", n, " ranks");
  at::Tensor stacked = at::stack(x.chunk(n, scatter_dim), 0).contiguous();  // [n, ...chunk]
  at::Tensor got = g.all_to_all(stacked);                                     // row j from rank j
  return at::cat(got.unbind(0), gather_dim);
}

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue holder) {
    ctx->saved_data["g"] = holder;
    auto& h = *c10::static_intrusive_pointer_cast<GroupHolder>(holder.toCapsule());
    return all_to_all_dims(x, *h.group, h.scatter_dim, h.gather_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto& h = *c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["g"].toCapsule());
    return {all_to_all_dims(g[0], *h.group, h.gather_dim, h.scatter_dim), at::Tensor()};
  }
};

at::Tensor all_to_all_autograd(const at::Tensor& x, const CpGroup& g, int64_t scatter_dim, int64_t gather_dim) {
  if (!g || g->size() == 1) return x;
  auto h = c10::make_intrusive<GroupHolder>();
  h->group = g;
  h->scatter_dim = scatter_dim;
  h->gather_dim = gather_dim;
  return AllToAll::apply(x, c10::IValue::make_capsule(std::move(h)));
}

}  // namespace

at::Tensor sequence_to_heads(const at::Tensor& x, const CpGroup& g) {
  MM_CHECK(x.dim() == 4, "sequence_to_heads: x must be [B, H, s, D] (got ", x.sizes(), ")");
  return all_to_all_autograd(x, g, 1, 2);
}

at::Tensor heads_to_sequence(const at::Tensor& x, const CpGroup& g) {
  MM_CHECK(x.dim() == 4, "heads_to_sequence: x must be [B, H, S, D] (got ", x.sizes(), ")");
  return all_to_all_autograd(x, g, 2, 1);
}

// ---------------------------------------------------------------------------------------------
// Ring attention

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One block: the rows [q_off, q_off + q_len) of this rank's queries against the rows
// [k_off, k_off + k_len) of a travelling key/value block.
struct BlockPlan {
  int64_t q_off, q_len, k_off, k_len;
  bool causal = false;  // the same tokens on both sides: a square causal mask
  at::Tensor mask;      // otherwise bool [B|1, 1, q_len, k_len] (true = may attend), or none
};

// The blocks of this rank's queries (ring rank me) against ring rank t's keys; empty ones left out.
std::vector<BlockPlan> plan_blocks(const RingSpec& s, int me, int t, at::Device device) {
  std::vector<BlockPlan> out;
  int64_t q_off = 0;
  for (auto [qs, ql] : s.pieces[static_cast<size_t>(me)]) {
    int64_t k_off = 0;
    for (auto [ks, kl] : s.pieces[static_cast<size_t>(t)]) {
      BlockPlan p{q_off, ql, k_off, kl};
      k_off += kl;
      bool empty = false;
      if (s.causal) {
        if (ks >= qs + ql) {
          empty = true;  // every key after every query
        } else if (ks + kl <= qs + 1) {
          // every key at or before every query: no mask
        } else if (ks == qs && kl == ql) {
          p.causal = true;
        } else {
          at::Tensor qi = at::arange(qs, qs + ql, at::TensorOptions().dtype(at::kLong).device(device));
          at::Tensor ki = at::arange(ks, ks + kl, at::TensorOptions().dtype(at::kLong).device(device));
          p.mask = ki.unsqueeze(0).le(qi.unsqueeze(1)).view({1, 1, ql, kl});
        }
      }
      if (!empty && s.segment_ids.defined()) {
        at::Tensor same = s.segment_ids.narrow(1, qs, ql).unsqueeze(2).eq(s.segment_ids.narrow(1, ks, kl).unsqueeze(1));
        if (!same.any().item<bool>()) {
          empty = true;
        } else if (!same.all().item<bool>()) {
          at::Tensor m = same.unsqueeze(1);  // [B, 1, ql, kl]
          if (p.causal) m = at::logical_and(m, at::ones({ql, kl}, m.options()).tril());
          if (p.mask.defined()) m = at::logical_and(m, p.mask);
          p.mask = m;
          p.causal = false;
        }
      }
      if (!empty) out.push_back(std::move(p));
    }
    q_off += ql;
  }
  return out;
}

at::Tensor repeat_heads(const at::Tensor& x, int64_t n_rep) { return n_rep == 1 ? x : x.repeat_interleave(n_rep, 1); }

// [B, Hq, L, D] gradient of repeated heads -> [B, Hkv, L, D].
at::Tensor sum_heads(const at::Tensor& g, int64_t n_rep) {
  if (n_rep == 1) return g;
  return g.view({g.size(0), g.size(1) / n_rep, n_rep, g.size(2), g.size(3)}).sum(2);
}

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// libtorch's fused CPU kernel (flash attention for the CPU) where a block needs no explicit mask.
bool fused(const at::Tensor& q, const BlockPlan& p) {
  return q.device().is_cpu() && !p.mask.defined() &&
         (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble || q.scalar_type() == at::kBFloat16);
}

at::Tensor scores(const at::Tensor& q, const at::Tensor& kk, const BlockPlan& p, double sc) {
  at::Tensor s = at::matmul(q.to(acc_type(q.scalar_type())) * sc, kk.to(acc_type(q.scalar_type())).transpose(-2, -1));
  if (p.causal)
    s = s.masked_fill(at::ones({p.q_len, p.k_len}, s.options().dtype(at::kBool)).tril().logical_not(), -kInf);
  if (p.mask.defined()) s = s.masked_fill(p.mask.logical_not(), -kInf);
  return s;
}

// (output [B, Hq, q_len, D] in the accumulation type, log-sum-exp [B, Hq, q_len]) of one block.
std::pair<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const BlockPlan& p, double sc) {
  const int64_t n_rep = q.size(1) / k.size(1);
  const at::ScalarType acc = acc_type(q.scalar_type());
  at::Tensor kk = repeat_heads(k, n_rep), vv = repeat_heads(v, n_rep);
  if (fused(q, p)) {
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, kk, vv, 0.0, p.causal, {}, sc);
    return {o.to(acc), lse.to(acc)};
  }
  at::Tensor s = scores(q, kk, p, sc);
  at::Tensor lse = at::logsumexp(s, -1);
  at::Tensor prob = at::nan_to_num(at::exp(s - lse.unsqueeze(-1)), 0.0, 0.0, 0.0);  // a row with no key: 0
  return {at::matmul(prob, vv.to(acc)), lse};
}

// (dq, dk, dv) of one block given the whole output and log-sum-exp of its query rows.
std::tuple<at::Tensor, at::Tensor, at::Tensor> block_backward(const at::Tensor& dout, const at::Tensor& q,
                                                              const at::Tensor& k, const at::Tensor& v,
                                                              const at::Tensor& out, const at::Tensor& lse,
                                                              const BlockPlan& p, double sc) {
  const int64_t n_rep = q.size(1) / k.size(1);
  const at::ScalarType acc = acc_type(q.scalar_type());
  at::Tensor kk = repeat_heads(k, n_rep), vv = repeat_heads(v, n_rep);
  if (fused(q, p)) {
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        dout.to(q.scalar_type()).contiguous(), q, kk, vv, out.to(q.scalar_type()).contiguous(),
        lse.to(acc).contiguous(), 0.0, p.causal, {}, sc);
    return {dq.to(acc), sum_heads(dk.to(acc), n_rep), sum_heads(dv.to(acc), n_rep)};
  }
  at::Tensor s = scores(q, kk, p, sc);
  at::Tensor prob = at::nan_to_num(at::exp(s - lse.unsqueeze(-1)), 0.0, 0.0, 0.0);
  at::Tensor d = dout.to(acc);
  at::Tensor dv = at::matmul(prob.transpose(-2, -1), d);
  at::Tensor dp = at::matmul(d, vv.to(acc).transpose(-2, -1));
  at::Tensor ds = prob * (dp - (d * out.to(acc)).sum(-1, true));
  at::Tensor dq = at::matmul(ds, kk.to(acc)) * sc;
  at::Tensor dk = at::matmul(ds.transpose(-2, -1), q.to(acc)) * sc;
  return {dq, sum_heads(dk, n_rep), sum_heads(dv, n_rep)};
}

// Merges a block's (o_b, lse_b) into the running (o, lse) rows in place.
void merge(at::Tensor o, at::Tensor lse, const at::Tensor& o_b, const at::Tensor& lse_b) {
  at::Tensor lse_new = at::logaddexp(lse, lse_b);
  at::Tensor w_old = at::nan_to_num(at::exp(lse - lse_new), 0.0, 0.0, 0.0).unsqueeze(-1);
  at::Tensor w_new = at::nan_to_num(at::exp(lse_b - lse_new), 0.0, 0.0, 0.0).unsqueeze(-1);
  o.copy_(o * w_old + o_b * w_new);
  lse.copy_(lse_new);
}

struct RingHolder : torch::CustomClassHolder {
  std::shared_ptr<const RingSpec> spec;
  std::vector<std::vector<BlockPlan>> plans;  // by source ring rank
};

int ring_rank(const RingSpec& s) { return s.ring ? s.ring->rank() : 0; }
int ring_size(const RingSpec& s) { return s.ring ? s.ring->size() : 1; }

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            c10::IValue holder) {
    auto& h = *c10::static_intrusive_pointer_cast<RingHolder>(holder.toCapsule());
    const RingSpec& s = *h.spec;
    const int me = ring_rank(s), n = ring_size(s);
    const double sc = s.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
    const at::ScalarType acc = acc_type(q.scalar_type());
    h.plans.assign(static_cast<size_t>(n), {});
    for (int t = 0; t < n; ++t) h.plans[static_cast<size_t>(t)] = plan_blocks(s, me, t, q.device());

    at::Tensor o = at::zeros(q.sizes(), q.options().dtype(acc));
    at::Tensor lse = at::full({q.size(0), q.size(1), q.size(2)}, -kInf, q.options().dtype(acc));
    at::Tensor kv = at::stack({k, v}).contiguous();
    for (int step = 0; step < n; ++step) {
      const int t = (me - step + n) % n;
      at::Tensor next;
      std::shared_ptr<PendingWork> sent, received;
      if (step + 1 < n) {  // the next block travels while this one is computed
        next = at::empty_like(kv);
        sent = s.ring->isend(kv, (me + 1) % n, step);
        received = s.ring->irecv(next, (me - 1 + n) % n, step);
      }
      for (const BlockPlan& p : h.plans[static_cast<size_t>(t)]) {
        auto [ob, lb] = block_forward(q.narrow(2, p.q_off, p.q_len), kv[0].narrow(2, p.k_off, p.k_len),
                                      kv[1].narrow(2, p.k_off, p.k_len), p, sc);
        merge(o.narrow(2, p.q_off, p.q_len), lse.narrow(2, p.q_off, p.q_len), ob, lb);
      }
      if (sent) {
        sent->wait();
        received->wait();
        kv = next;
      }
    }
    at::Tensor out = o.to(q.scalar_type());
    ctx->saved_data["ring"] = holder;
    ctx->save_for_backward({q, k, v, out, lse});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& h = *c10::static_intrusive_pointer_cast<RingHolder>(ctx->saved_data["ring"].toCapsule());
    const RingSpec& s = *h.spec;
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const at::Tensor dout = grads[0].contiguous();
    const int me = ring_rank(s), n = ring_size(s);
    const double sc = s.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
    const at::ScalarType acc = acc_type(q.scalar_type());

    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(acc));
    at::Tensor kv = at::stack({k, v}).contiguous();
    // A block's gradient accumulator [2, ...] (dk, dv) travels one step behind its keys and values:
    // at step i this rank adds its share to the accumulator of block me - i, received from the
    // previous rank (which added its share at step i - 1) and sent on to the next; after the last
    // step each accumulator reaches its owner.
    std::vector<std::shared_ptr<PendingWork>> pending;
    std::vector<at::Tensor> keep;  // buffers in flight
    at::Tensor acc_in;
    for (int step = 0; step < n; ++step) {
      const int t = (me - step + n) % n;
      at::Tensor next;
      std::shared_ptr<PendingWork> kv_sent, kv_received, acc_received;
      if (step + 1 < n) {
        next = at::empty_like(kv);
        kv_sent = s.ring->isend(kv, (me + 1) % n, 2 * step);
        kv_received = s.ring->irecv(next, (me - 1 + n) % n, 2 * step);
      }
      if (step > 0) {
        acc_in = at::empty({2, k.size(0), k.size(1), k.size(2), k.size(3)}, k.options().dtype(acc));
        acc_received = s.ring->irecv(acc_in, (me - 1 + n) % n, 2 * step + 1);
      }
      at::Tensor mine = at::zeros({2, k.size(0), k.size(1), k.size(2), k.size(3)}, k.options().dtype(acc));
      for (const BlockPlan& p : h.plans[static_cast<size_t>(t)]) {
        auto [dqb, dkb, dvb] = block_backward(dout.narrow(2, p.q_off, p.q_len), q.narrow(2, p.q_off, p.q_len),
                                              kv[0].narrow(2, p.k_off, p.k_len), kv[1].narrow(2, p.k_off, p.k_len),
                                              out.narrow(2, p.q_off, p.q_len), lse.narrow(2, p.q_off, p.q_len), p, sc);
        dq.narrow(2, p.q_off, p.q_len).add_(dqb);
        mine[0].narrow(2, p.k_off, p.k_len).add_(dkb);
        mine[1].narrow(2, p.k_off, p.k_len).add_(dvb);
      }
      if (acc_received) {
        acc_received->wait();
        mine.add_(acc_in);
      }
      if (n > 1) {
        keep.push_back(mine);
        pending.push_back(s.ring->isend(mine, (me + 1) % n, 2 * (step + 1) + 1));
      } else {
        acc_in = mine;
      }
      if (kv_sent) {
        kv_sent->wait();
        kv_received->wait();
        kv = next;
      }
    }
    if (n > 1) {  // this rank's own block's accumulator, home after the last step
      acc_in = at::empty({2, k.size(0), k.size(1), k.size(2), k.size(3)}, k.options().dtype(acc));
      s.ring->irecv(acc_in, (me - 1 + n) % n, 2 * n + 1)->wait();
    }
    for (auto& w : pending) w->wait();
    return {dq.to(q.scalar_type()), acc_in[0].to(k.scalar_type()), acc_in[1].to(v.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          std::shared_ptr<const RingSpec> spec) {
  MM_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
               q.size(3) == k.size(3) && q.size(1) % k.size(1) == 0,
           "ring_attention: q [B, Hq, s, D] and k, v [B, Hkv, s, D] expected (got ", q.sizes(), ", ", k.sizes(), ", ",
           v.sizes(), ")");
  MM_CHECK(spec && static_cast<int>(spec->pieces.size()) == ring_size(*spec), "ring_attention: pieces for ",
           spec ? spec->pieces.size() : 0, " ring ranks, the ring has ", spec ? ring_size(*spec) : 0);
  auto h = c10::make_intrusive<RingHolder>();
  h->spec = std::move(spec);
  return RingAttention::apply(q.contiguous(), k.contiguous(), v.contiguous(), c10::IValue::make_capsule(std::move(h)));
}

}  // namespace mm::parallel
