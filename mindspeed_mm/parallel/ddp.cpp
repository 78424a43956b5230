// DDP: bucketed gradient all-reduce overlapping backward.
#include "mindspeed_mm/parallel/ddp.h"

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/parallel/backward_hooks.h"

namespace mm::parallel {

DistributedDataParallel::DistributedDataParallel(std::vector<at::Tensor> params, std::shared_ptr<Communicator> dp,
                                                 int64_t bucket_cap_bytes)
    : params_(std::move(params)), dp_(std::move(dp)), bucket_of_(params_.size()) {
  // Reverse registration order: the last layers' gradients are ready first.
  Bucket cur;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    MM_CHECK(p.requires_grad(), "ddp: parameter ", k, " does not require grad (pass trainable parameters only)");
    if (!cur.params.empty() && (cur.numel + p.numel()) * 4 > bucket_cap_bytes) {
      buckets_.push_back(std::move(cur));
      cur = Bucket();
    }
    cur.params.push_back(k);
    cur.numel += p.numel();
  }
  if (!cur.params.empty()) buckets_.push_back(std::move(cur));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = static_cast<int>(buckets_[b].params.size());
    for (size_t k : buckets_[b].params) bucket_of_[k] = b;
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    accumulators_.push_back(on_gradient_ready(params_[k], [this, k] { grad_ready(k); }));
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::broadcast_parameters() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    at::Tensor v = p.detach();
    dp_->broadcast(v, 0);
  }
}

void DistributedDataParallel::launch(Bucket& b) {
  // On the parameters' device: NCCL reduces a CUDA bucket on its own stream while the rest of
  // backward runs (c10d orders it after the gradient copies below on the current stream).
  b.flat = at::empty({b.numel}, at::TensorOptions().dtype(at::kFloat).device(params_[b.params.front()].device()));
  int64_t off = 0;
  for (size_t k : b.params) {
    const at::Tensor& g = params_[k].grad();
    const int64_t n = params_[k].numel();
    if (g.defined()) b.flat.narrow(0, off, n).copy_(g.reshape({-1}));
    else b.flat.narrow(0, off, n).zero_();  // unused in this backward: contributes zeros
    off += n;
  }
  b.work = dp_->all_reduce_async(b.flat);
  ++reductions_;
}

at::Tensor DistributedDataParallel::prepare_backward(const at::Tensor& loss) {
  if (!sync_ || dp_->size() == 1) return loss;
  return call_after_backward(loss, [this] { finish_backward(); });
}

void DistributedDataParallel::grad_ready(size_t k) {
  if (!sync_ || dp_->size() == 1) return;
  --buckets_[bucket_of_[k]].pending;
  // Buckets start in index order on every rank, so the ranks' collectives pair up even when a
  // parameter gets no gradient on some rank (a batch without images leaves the vision tower idle).
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(buckets_[next_launch_++]);
}

void DistributedDataParallel::finish_backward() {
  // The rest, in order: some of their parameters got no gradient in this backward.
  while (next_launch_ < buckets_.size()) launch(buckets_[next_launch_++]);
  next_launch_ = 0;
  for (Bucket& b : buckets_) {
    b.work->wait();
    b.work.reset();
    int64_t off = 0;
    for (size_t k : b.params) {
      at::Tensor& p = params_[k];
      const int64_t n = p.numel();
      at::Tensor reduced = b.flat.narrow(0, off, n).view(p.sizes()).to(p.scalar_type());
      if (p.grad().defined()) p.mutable_grad().copy_(reduced);
      else p.mutable_grad() = reduced.clone();
      off += n;
    }
    b.flat = at::Tensor();  // the gradients hold copies: the bucket's memory is free until the next backward
    b.pending = static_cast<int>(b.params.size());
  }
}

}  // namespace mm::parallel
