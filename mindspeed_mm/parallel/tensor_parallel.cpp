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
