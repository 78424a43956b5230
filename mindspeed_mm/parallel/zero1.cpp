#include "mindspeed_mm/parallel/zero1.h"

#include <ATen/core/grad_mode.h>

#include "mindspeed_mm/core/errors.h"

namespace mm::parallel {

Zero1Partition::Zero1Partition(std::vector<std::pair<std::string, at::Tensor>> params, std::shared_ptr<Communicator> dp)
    : dp_(std::move(dp)) {
  const int64_t W = dp_->size(), r = dp_->rank();
  at::NoGradGuard no_grad;
  for (auto& [name, p] : params) {
    Part q;
    q.name = name;
    q.param = p;
    q.numel = p.numel();
    q.chunk = std::max<int64_t>(1, (q.numel + W - 1) / W);
    q.begin = std::min(q.numel, r * q.chunk);
    q.end = std::min(q.numel, (r + 1) * q.chunk);
    q.offset = packed_;
    packed_ += q.chunk;
    q.shard = p.detach().reshape({-1}).narrow(0, q.begin, q.end - q.begin).to(at::kFloat).clone();
    q.shard.set_requires_grad(true);
    parts_.push_back(std::move(q));
  }
}

at::Tensor Zero1Partition::shard(const std::string& name) const {
  for (const Part& q : parts_)
    if (q.name == name) return q.shard;
  throw Error(cat("zero1: no trainable parameter named '", name, "'"));
}

std::pair<int64_t, int64_t> Zero1Partition::shard_range(const std::string& name) const {
  for (const Part& q : parts_)
    if (q.name == name) return {q.begin, q.end};
  throw Error(cat("zero1: no trainable parameter named '", name, "'"));
}

void Zero1Partition::scatter_grads() {
  for (Part& q : parts_) {
    const at::Tensor& g = q.param.grad();
    if (!g.defined()) continue;
    q.shard.mutable_grad() = g.reshape({-1}).narrow(0, q.begin, q.end - q.begin).to(at::kFloat);
  }
}

void Zero1Partition::gather_params() {
  at::NoGradGuard no_grad;
  at::Tensor send = at::zeros({packed_}, at::TensorOptions()
                                             .dtype(at::kFloat)
                                             .device(parts_.empty() ? at::Device(at::kCPU) : parts_.front().param.device()));
  for (const Part& q : parts_) send.narrow(0, q.offset, q.end - q.begin).copy_(q.shard.detach());
  at::Tensor all = dp_->all_gather(send);  // [W, packed]
  for (Part& q : parts_) {
    at::Tensor whole = all.narrow(1, q.offset, q.chunk).reshape({-1}).narrow(0, 0, q.numel);
    q.param.detach().view({-1}).copy_(whole);  // in place: every view and saved reference sees it
    q.param.mutable_grad() = at::Tensor();
  }
}

void Zero1Partition::refresh_shards() {
  at::NoGradGuard no_grad;
  for (Part& q : parts_) q.shard.detach().copy_(q.param.detach().reshape({-1}).narrow(0, q.begin, q.end - q.begin));
}

int64_t Zero1Partition::shard_bytes() const {
  int64_t n = 0;
  for (const Part& q : parts_) n += (q.end - q.begin) * 4;
  return n;
}

}  // namespace mm::parallel
