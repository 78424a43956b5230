#include "mindspeed_mm/parallel/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include "mindspeed_mm/core/errors.h"

namespace mm::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group rides in the autograd context as a capsule (saved_data holds IValues only).
struct GroupHolder : torch::CustomClassHolder {
  TpGroup group;
  int64_t dim = -1;
};

c10::IValue hold(const TpGroup& tp, int64_t dim) {
  auto h = c10::make_intrusive<GroupHolder>();
  h->group = tp;
  h->dim = dim;
  return c10::IValue::make_capsule(std::move(h));
}

const GroupHolder& held(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["tp"].toCapsule());
}

int64_t wrap_dim(const at::Tensor& x, int64_t dim) { return dim < 0 ? dim + x.dim() : dim; }

void check_divides(const at::Tensor& x, int64_t dim, int size, const char* what) {
  if (x.size(dim) % size != 0)
    throw ConfigError(cat("config: ", what, ": dimension ", dim, " of size ", x.size(dim),
                          " does not divide by the tensor-parallel size ", size));
}

at::Tensor all_reduce_sum(const at::Tensor& x, Communicator& c) {
  at::Tensor t = x.contiguous().clone();
  c.all_reduce(t);
  return t;
}

// All ranks' x concatenated along dim.
at::Tensor all_gather_dim(const at::Tensor& x, Communicator& c, int64_t dim) {
  at::Tensor stacked = c.all_gather(x.contiguous());  // [size, ...x]
  return at::cat(stacked.unbind(0), dim);
}

// The sum over ranks of x, this rank's slice along dim.
at::Tensor reduce_scatter_dim(const at::Tensor& x, Communicator& c, int64_t dim) {
  at::Tensor front = x.movedim(dim, 0).contiguous();  // [size * chunk, ...]
  return c.reduce_scatter(front).movedim(0, dim).contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue group) {
    ctx->saved_data["tp"] = std::move(group);
    return x;  // autograd returns an input as a fresh view carrying this node
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduce_sum(g[0], *held(ctx).group), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, c10::IValue group) {
    auto h = c10::static_intrusive_pointer_cast<GroupHolder>(group.toCapsule());
    return all_reduce_sum(x, *h->group);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue group) {
    ctx->saved_data["tp"] = group;
    const GroupHolder& h = held(ctx);
    return all_gather_dim(x, *h.group, wrap_dim(x, h.dim));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const GroupHolder& h = held(ctx);
    const int64_t dim = wrap_dim(g[0], h.dim);
    return {tp_slice(g[0], dim, h.group->rank(), h.group->size()).contiguous(), at::Tensor()};
  }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue group) {
    ctx->saved_data["tp"] = group;
    const GroupHolder& h = held(ctx);
    const int64_t dim = wrap_dim(x, h.dim);
    check_divides(x, dim, h.group->size(), "scatter_to_tp_region");
    return tp_slice(x, dim, h.group->rank(), h.group->size()).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const GroupHolder& h = held(ctx);
    return {all_gather_dim(g[0], *h.group, wrap_dim(g[0], h.dim)), at::Tensor()};
  }
};

struct GatherFromSequence : torch::autograd::Function<GatherFromSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue group) {
    ctx->saved_data["tp"] = group;
    const GroupHolder& h = held(ctx);
    return all_gather_dim(x, *h.group, wrap_dim(x, h.dim));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const GroupHolder& h = held(ctx);
    return {reduce_scatter_dim(g[0], *h.group, wrap_dim(g[0], h.dim)), at::Tensor()};
  }
};

struct ReduceScatterToSequence : torch::autograd::Function<ReduceScatterToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue group) {
    ctx->saved_data["tp"] = group;
    const GroupHolder& h = held(ctx);
    const int64_t dim = wrap_dim(x, h.dim);
    check_divides(x, dim, h.group->size(), "reduce_scatter_to_sequence_region");
    return reduce_scatter_dim(x, *h.group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const GroupHolder& h = held(ctx);
    return {all_gather_dim(g[0], *h.group, wrap_dim(g[0], h.dim)), at::Tensor()};
  }
};

bool alone(const TpGroup& tp) { return !tp || tp->size() == 1; }

}  // namespace

at::Tensor tp_slice(const at::Tensor& x, int64_t dim, int rank, int size) {
  const int64_t d = wrap_dim(x, dim);
  check_divides(x, d, size, "tensor-parallel slice");
  const int64_t chunk = x.size(d) / size;
  return x.narrow(d, rank * chunk, chunk);
}

std::pair<at::Tensor, at::Tensor> vocab_parallel_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                                                                   const TpGroup& tp) {
  return {vocab_parallel_token_losses(logits, labels, tp).sum(), labels.ne(-100).sum()};
}

at::Tensor vocab_parallel_token_losses(const at::Tensor& logits, const at::Tensor& labels, const TpGroup& tp) {
  const int n = alone(tp) ? 1 : tp->size(), r = alone(tp) ? 0 : tp->rank();
  const at::Tensor x = logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat);  // fp32 at least
  const int64_t v_local = x.size(-1), first = r * v_local;
  // The global max per token (a constant shift: no gradient through it).
  at::Tensor m = std::get<0>(x.detach().max(-1)).contiguous();
  if (n > 1) tp->all_reduce(m, ReduceOp::kMax);
  const at::Tensor shifted = x - m.unsqueeze(-1);
  const at::Tensor sum_exp = reduce_from_tp_region(shifted.exp().sum(-1), tp);
  // The target's shifted logit, from the rank that holds it (0 elsewhere), summed over ranks.
  const at::Tensor scored = labels.ne(-100);
  const at::Tensor local = labels - first;
  const at::Tensor mine = scored.logical_and(local.ge(0)).logical_and(local.lt(v_local));
  const at::Tensor index = at::where(mine, local, at::zeros_like(local)).unsqueeze(-1);
  const at::Tensor picked = shifted.gather(-1, index).squeeze(-1) * mine.to(shifted.scalar_type());
  const at::Tensor target = reduce_from_tp_region(picked, tp);
  return (sum_exp.log() - target) * scored.to(shifted.scalar_type());
}

namespace {

// Chunked, vocabulary-parallel: forward keeps each token's log-sum-exp over the whole vocabulary
// (one number a token), backward rebuilds one chunk's local logits at a time.
struct VocabParallelChunkedCE : torch::autograd::Function<VocabParallelChunkedCE> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t chunk, c10::IValue group) {
    ctx->saved_data["tp"] = group;
    const TpGroup& tp = held(ctx).group;
    const int r = tp->rank();
    const int64_t H = hidden.size(-1), N = hidden.numel() / std::max<int64_t>(1, H), v_local = weight.size(0);
    const at::Tensor h = hidden.reshape({N, H}), y = labels.reshape({N}).to(at::kLong);
    const auto f32 = hidden.options().dtype(at::kFloat);
    at::Tensor out = at::zeros({N}, f32), lse = at::zeros({N}, f32);
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor logits = at::matmul(h.narrow(0, s, n), weight.t()).to(at::kFloat);
      at::Tensor m = std::get<0>(logits.max(1)).contiguous();
      tp->all_reduce(m, ReduceOp::kMax);
      const at::Tensor shifted = logits - m.unsqueeze(1);
      const at::Tensor local = y.narrow(0, s, n) - r * v_local;
      const at::Tensor mine = y.narrow(0, s, n).ne(-100).logical_and(local.ge(0)).logical_and(local.lt(v_local));
      const at::Tensor picked =
          shifted.gather(1, at::where(mine, local, at::zeros_like(local)).unsqueeze(1)).squeeze(1) * mine.to(at::kFloat);
      at::Tensor sums = at::stack({shifted.exp().sum(1), picked}).contiguous();  // one all-reduce for both
      tp->all_reduce(sums);
      const at::Tensor log_sum = sums[0].log();
      lse.narrow(0, s, n).copy_(log_sum + m);
      out.narrow(0, s, n).copy_((log_sum - sums[1]) * y.narrow(0, s, n).ne(-100).to(at::kFloat));
    }
    ctx->save_for_backward({hidden, weight, labels, lse});
    ctx->saved_data["chunk"] = chunk;
    return out.view(labels.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int r = held(ctx).group->rank();
    const int64_t H = hidden.size(-1), N = hidden.numel() / std::max<int64_t>(1, H), v_local = weight.size(0);
    const at::Tensor h = hidden.reshape({N, H}), y = saved[2].reshape({N}).to(at::kLong);
    const at::Tensor g = grads[0].reshape({N}).to(at::kFloat);
    at::Tensor grad_h = at::empty({N, H}, hidden.options());
    at::Tensor grad_w = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor yc = y.narrow(0, s, n), local = yc - r * v_local;
      const at::Tensor mine = yc.ne(-100).logical_and(local.ge(0)).logical_and(local.lt(v_local));
      // d loss / d logits = softmax over the whole vocabulary (this rank's columns) - onehot(label).
      at::Tensor d = (at::matmul(h.narrow(0, s, n), weight.t()).to(at::kFloat) - lse.narrow(0, s, n).unsqueeze(1)).exp();
      d.scatter_add_(1, at::where(mine, local, at::zeros_like(local)).unsqueeze(1), -mine.to(at::kFloat).unsqueeze(1));
      d.mul_((g.narrow(0, s, n) * yc.ne(-100).to(at::kFloat)).unsqueeze(1));
      const at::Tensor dh = d.to(weight.scalar_type());
      grad_h.narrow(0, s, n).copy_(at::matmul(dh, weight));  // this rank's part: summed by copy_to_tp_region
      grad_w.add_(at::matmul(dh.t(), h.narrow(0, s, n)).to(at::kFloat));
    }
    return {grad_h.view(hidden.sizes()), grad_w.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& labels, int64_t chunk, const TpGroup& tp) {
  MM_CHECK(chunk > 0 && hidden.dim() >= 2 && weight.dim() == 2 && weight.size(1) == hidden.size(-1) &&
               labels.numel() * hidden.size(-1) == hidden.numel(),
           "vocab-parallel chunked cross-entropy: hidden ", hidden.sizes(), ", head rows ", weight.sizes(), " and labels ",
           labels.sizes(), " do not line up (chunk ", chunk, ")");
  MM_CHECK(!alone(tp), "vocab-parallel chunked cross-entropy: needs a tensor-parallel group");
  return VocabParallelChunkedCE::apply(copy_to_tp_region(hidden, tp), weight, labels, chunk, hold(tp, -1));
}

at::Tensor copy_to_tp_region(const at::Tensor& x, const TpGroup& tp) {
  return alone(tp) ? x : CopyToRegion::apply(x, hold(tp, -1));
}
at::Tensor reduce_from_tp_region(const at::Tensor& x, const TpGroup& tp) {
  return alone(tp) ? x : ReduceFromRegion::apply(x, hold(tp, -1));
}
at::Tensor gather_from_tp_region(const at::Tensor& x, const TpGroup& tp) {
  return alone(tp) ? x : GatherFromRegion::apply(x, hold(tp, -1));
}
at::Tensor scatter_to_tp_region(const at::Tensor& x, const TpGroup& tp) {
  return alone(tp) ? x : ScatterToRegion::apply(x, hold(tp, -1));
}
at::Tensor gather_from_sequence_region(const at::Tensor& x, const TpGroup& tp, int64_t dim) {
  return alone(tp) ? x : GatherFromSequence::apply(x, hold(tp, dim));
}
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const TpGroup& tp, int64_t dim) {
  return alone(tp) ? x : ReduceScatterToSequence::apply(x, hold(tp, dim));
}

at::Tensor scatter_to_sequence_region(const at::Tensor& x, const TpGroup& tp, int64_t dim) {
  return alone(tp) ? x : ScatterToRegion::apply(x, hold(tp, dim));
}
at::Tensor gather_from_sequence_to_whole(const at::Tensor& x, const TpGroup& tp, int64_t dim) {
  return alone(tp) ? x : GatherFromRegion::apply(x, hold(tp, dim));
}

}  // namespace mm::parallel
