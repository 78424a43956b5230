// FSDP: per-parameter flat chunks, unit buffers whose storage is freed and re-allocated in
// place (DESIGN.md, "Freeing parameter memory"), gathers and reduce-scatters around each unit.
#include "mindspeed_mm/parallel/fsdp.h"

#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/parallel/backward_hooks.h"

namespace mm::parallel {
namespace {

// Frees (bytes 0) or re-allocates a unit buffer's storage in place, so that views of it (the
// parameters) stay valid. The contents are not kept: a gather rewrites all of them.
void set_storage_bytes(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (t.is_cpu()) return at::native::resize_bytes_cpu(s, bytes);
  // Other devices: a fresh block from the storage's own allocator (CUDA: the caching allocator,
  // on the current stream, which is the one every use of the buffer runs on).
  c10::DeviceGuard guard(t.device());
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(mm::nn::Module& root,
                                                   const std::vector<std::pair<std::string, mm::nn::Block*>>& units,
                                                   std::shared_ptr<Communicator> shard,
                                                   std::shared_ptr<Communicator> replicate, FsdpOptions options)
    : shard_(std::move(shard)), replicate_(std::move(replicate)), options_(options) {
  MM_CHECK(shard_, "fsdp: needs a shard group");
  const int64_t W = shard_->size(), r = shard_->rank();
  // Which unit each parameter belongs to (by TensorImpl: a tied parameter is one tensor).
  std::map<const c10::TensorImpl*, size_t> unit_of;
  units_.push_back({});  // the root
  for (const auto& [path, block] : units) {
    MM_CHECK(block, "fsdp: unit '", path, "' is not a block");
    Unit u;
    u.path = path;
    u.block = block;
    units_.push_back(std::move(u));
    for (auto& [name, p] : block->named_parameters(path)) unit_of.emplace(p.unsafeGetTensorImpl(), units_.size() - 1);
  }
  std::map<const c10::TensorImpl*, bool> seen;
  for (auto& [name, p] : root.named_parameters()) {
    if (!seen.emplace(p.unsafeGetTensorImpl(), true).second) continue;
    MM_CHECK(p.device().is_cpu() || p.device() == options_.device, "fsdp: parameter ", name, " is on ", p.device(),
             " but the shards go to ", options_.device);
    Param q;
    q.name = name;
    q.param = p;
    q.shape = p.sizes().vec();
    q.numel = p.numel();
    q.chunk = std::max<int64_t>(1, (q.numel + W - 1) / W);
    auto it = unit_of.find(p.unsafeGetTensorImpl());
    q.unit = it == unit_of.end() ? 0 : it->second;
    q.trainable = p.requires_grad();
    params_.push_back(std::move(q));
  }
  // Layout: parameters in model order inside each unit; the chunk of rank r holds elements
  // [r * chunk, (r + 1) * chunk) of the flattened parameter, zero past its end.
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    Param& q = params_[k];
    Unit& u = units_[q.unit];
    q.full_offset = u.full_numel;
    q.shard_offset = u.shard_numel;
    u.full_numel += q.numel;
    u.shard_numel += q.chunk;
    u.params.push_back(k);
    if (q.trainable) ++u.trainable;
    q.shard = at::zeros({q.chunk}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
    const int64_t begin = std::min(q.numel, r * q.chunk), end = std::min(q.numel, (r + 1) * q.chunk);
    if (end > begin) {
      // A deferred parameter has no values yet: its constructor's constant, until
      // set_full_value hands this rank its slice of the initialised or loaded tensor.
      if (auto v = mm::nn::deferred_value(q.param)) q.shard.narrow(0, 0, end - begin).fill_(*v);
      else q.shard.narrow(0, 0, end - begin).copy_(q.param.detach().reshape({-1}).narrow(0, begin, end - begin));
    }
    q.shard.set_requires_grad(q.trainable);
    index_.emplace(q.param.unsafeGetTensorImpl(), k);
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    u.full = at::empty({u.full_numel}, at::TensorOptions().dtype(options_.param_dtype).device(options_.device));
    for (size_t k : u.params) {
      Param& q = params_[k];
      q.param.set_data(u.full.narrow(0, q.full_offset, q.numel).view(q.shape));
    }
    u.gathered = true;
    free(i);
    if (u.block) {
      u.block->add_wrapper("fsdp", [this, i](mm::nn::Block&, const at::Tensor& x, const mm::nn::ForwardContext& c,
                                             const mm::nn::BlockCtxFn& inner) {
        before_unit_forward(i);
        at::Tensor in = x;
        Unit& unit = units_[i];
        if (at::GradMode::is_enabled() && x.requires_grad() && unit.trainable < static_cast<int>(unit.params.size())) {
          // Frozen parameters may be used after the last trainable gradient arrives: the unit is
          // done (and may be freed) once its input's gradient is computed as well.
          unit.awaits_input = true;
          in = call_before_backward_of(x, [this, i] {
            if (!in_backward_) return;
            --units_[i].pending;
            launch_ready_reductions();
          });
        }
        at::Tensor out = inner(in, c);
        after_unit_forward(i);
        if (at::GradMode::is_enabled()) out = call_before_backward_of(out, [this, i] { before_unit_backward(i); });
        return out;
      });
    }
  }
  // After set_data: it resets a parameter's gradient accumulator when the dtype changes.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].trainable) continue;
    accumulators_.push_back(on_gradient_ready(params_[k].param, [this, k] { grad_ready(k); }));
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

bool FullyShardedDataParallel::set_full_value(const at::Tensor& param, const at::Tensor& value) {
  auto it = index_.find(param.unsafeGetTensorImpl());
  if (it == index_.end()) return false;
  Param& q = params_[it->second];
  MM_CHECK(value.numel() == q.numel, "fsdp: a value of ", value.numel(), " elements for ", q.name, " of ", q.numel);
  auto [begin, end] = shard_range(q.name);
  at::NoGradGuard no_grad;
  if (end > begin) q.shard.detach().narrow(0, 0, end - begin).copy_(value.reshape({-1}).narrow(0, begin, end - begin));
  return true;
}

at::Tensor FullyShardedDataParallel::shard(const std::string& name) const {
  for (const Param& q : params_)
    if (q.name == name) return q.shard;
  throw Error(cat("fsdp: no parameter named '", name, "'"));
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallel::named_shards() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const Param& q : params_) out.emplace_back(q.name, q.shard);
  return out;
}

std::pair<int64_t, int64_t> FullyShardedDataParallel::shard_range(const std::string& name) const {
  for (const Param& q : params_)
    if (q.name == name) {
      const int64_t r = shard_->rank();
      return {std::min(q.numel, r * q.chunk), std::min(q.numel, (r + 1) * q.chunk)};
    }
  throw Error(cat("fsdp: no parameter named '", name, "'"));
}

void FullyShardedDataParallel::start_gather(size_t i) {
  Unit& u = units_[i];
  if (u.gathered || u.inflight) return;
  at::NoGradGuard no_grad;
  // Gathered in param_dtype (FSDP2's mixed precision: the cast happens on the shard, so a bf16
  // gather moves half the bytes and gives the same full parameters as casting after it). The
  // unit's index travels in the last two elements (i % 256, i / 256: exact even in bf16), to
  // catch ranks that run different units.
  const auto dt = options_.param_dtype;
  u.send = at::empty({u.shard_numel + 2}, at::TensorOptions().dtype(dt).device(options_.device));
  for (size_t k : u.params) u.send.narrow(0, params_[k].shard_offset, params_[k].chunk).copy_(params_[k].shard.detach());
  u.send[u.shard_numel].fill_(static_cast<double>(i % 256));
  u.send[u.shard_numel + 1].fill_(static_cast<double>(i / 256));
  u.recv = at::empty({shard_->size(), u.shard_numel + 2}, at::TensorOptions().dtype(dt).device(options_.device));
  u.inflight = shard_->all_gather_async(u.send, u.recv);
  ++all_gathers_;
}

void FullyShardedDataParallel::gather(size_t i) {
  Unit& u = units_[i];
  if (u.gathered) return;
  start_gather(i);
  u.inflight->wait();
  u.inflight.reset();
  auto name = [&](int64_t id) {
    return id >= 0 && id < static_cast<int64_t>(units_.size()) ? (units_[id].path.empty() ? "<root>" : units_[id].path)
                                                               : "?";
  };
  // The ids go to the host: on CUDA a small copy that waits for this gather only (the prefetched
  // ones keep running on the communication stream).
  at::Tensor ids = u.recv.narrow(1, u.shard_numel, 2).to(at::kCPU, at::kFloat);
  for (int r = 0; r < shard_->size(); ++r) {
    const auto id = static_cast<int64_t>(ids[r][0].item<float>()) + 256 * static_cast<int64_t>(ids[r][1].item<float>());
    if (id != static_cast<int64_t>(i))
      throw Error(cat("fsdp: rank ", shard_->members()[r], " gathered unit '", name(id), "' while rank ",
                      shard_->members()[shard_->rank()], " gathered '", name(static_cast<int64_t>(i)),
                      "': every rank must run the same blocks in the same order (a batch without images skips the "
                      "vision tower on that rank)"));
  }
  at::NoGradGuard no_grad;
  set_storage_bytes(u.full, static_cast<size_t>(u.full_numel) * u.full.element_size());
  at::Tensor dst = u.full.data();  // its own version counter: saved parameters stay valid for backward
  for (size_t k : u.params) {
    const Param& q = params_[k];
    at::Tensor whole = u.recv.narrow(1, q.shard_offset, q.chunk).reshape({-1}).narrow(0, 0, q.numel);
    dst.narrow(0, q.full_offset, q.numel).copy_(whole);
  }
  u.send = at::Tensor();
  u.recv = at::Tensor();
  u.gathered = true;
}

void FullyShardedDataParallel::free(size_t i) {
  Unit& u = units_[i];
  if (u.inflight) gather(i);  // a started collective completes on every rank
  if (!u.gathered) return;
  set_storage_bytes(u.full, 0);
  u.gathered = false;
}

void FullyShardedDataParallel::prefetch_after(const std::vector<size_t>& order, size_t i) {
  auto it = std::find(order.begin(), order.end(), i);
  if (it == order.end()) return;
  for (int d = 0; d < options_.prefetch && ++it != order.end(); ++d)
    if (*it != 0) start_gather(*it);
}

void FullyShardedDataParallel::begin_forward() {
  if (!forward_order_.empty()) last_forward_order_ = forward_order_;
  forward_order_.clear();
  if (!pinned_) gather(0);
}

void FullyShardedDataParallel::before_unit_forward(size_t i) {
  if (pinned_) return;
  forward_order_.push_back(i);
  gather(i);
  prefetch_after(last_forward_order_, i);
}

void FullyShardedDataParallel::after_unit_forward(size_t i) {
  if (!pinned_ && options_.reshard_after_forward) free(i);
}

void FullyShardedDataParallel::before_unit_backward(size_t i) {
  if (pinned_) return;
  gather(i);
  std::vector<size_t> backward_order(forward_order_.rbegin(), forward_order_.rend());
  prefetch_after(backward_order, i);
}

at::Tensor FullyShardedDataParallel::prepare_backward(const at::Tensor& loss) {
  if (!loss.requires_grad()) return loss;
  // Reduce order, the same on every rank: units in reverse forward order, then units this
  // forward did not run (their gradients are zeros here; another rank may have used them),
  // then the root.
  reduce_order_.clear();
  for (auto it = forward_order_.rbegin(); it != forward_order_.rend(); ++it)
    if (std::find(reduce_order_.begin(), reduce_order_.end(), *it) == reduce_order_.end()) reduce_order_.push_back(*it);
  for (size_t i = 1; i < units_.size(); ++i)
    if (std::find(reduce_order_.begin(), reduce_order_.end(), i) == reduce_order_.end()) reduce_order_.push_back(i);
  reduce_order_.push_back(0);
  reduce_order_.erase(std::remove_if(reduce_order_.begin(), reduce_order_.end(),
                                     [&](size_t i) { return units_[i].trainable == 0; }),
                      reduce_order_.end());
  for (Unit& u : units_) {
    u.pending = u.trainable + (u.awaits_input && u.trainable > 0 ? 1 : 0);
    u.awaits_input = false;
    u.reduced = false;
  }
  next_reduce_ = 0;
  in_backward_ = true;
  return call_after_backward(loss, [this] { finish_backward(); });
}

void FullyShardedDataParallel::grad_ready(size_t k) {
  if (!in_backward_) return;
  --units_[params_[k].unit].pending;
  launch_ready_reductions();
}

void FullyShardedDataParallel::launch_ready_reductions() {
  while (next_reduce_ < reduce_order_.size() && units_[reduce_order_[next_reduce_]].pending <= 0)
    reduce(reduce_order_[next_reduce_++]);
}

void FullyShardedDataParallel::reduce(size_t i) {
  Unit& u = units_[i];
  at::NoGradGuard no_grad;
  const int64_t W = shard_->size();
  // Row r of buf holds rank r's chunk of every parameter's gradient: reduce-scatter hands each
  // rank the sum of its own row.
  at::Tensor buf = at::zeros({W, u.shard_numel}, at::TensorOptions().dtype(options_.reduce_dtype).device(options_.device));
  for (size_t k : u.params) {
    Param& q = params_[k];
    if (!q.trainable || !q.param.grad().defined()) continue;
    at::Tensor padded = at::zeros({W * q.chunk}, buf.options());
    padded.narrow(0, 0, q.numel).copy_(q.param.grad().reshape({-1}));
    buf.narrow(1, q.shard_offset, q.chunk).copy_(padded.view({W, q.chunk}));
    q.param.mutable_grad().reset();
  }
  // Started, not waited: the collective runs (NCCL: on its stream; Gloo: on its threads) while
  // backward computes the next units' gradients; finish_backward adds the results.
  u.reduce_in = buf.view({-1});
  u.reduce_out = at::empty({u.shard_numel}, buf.options());
  u.reducing = shard_->reduce_scatter_async(u.reduce_in, u.reduce_out);
  reducing_.push_back(i);
  // At most two in flight: each holds a unit-sized gradient buffer until it completes.
  while (reducing_.size() > 2) {
    finish_reduce(reducing_.front());
    reducing_.pop_front();
  }
  ++reduce_scatters_;
  u.reduced = true;
  if (!pinned_) free(i);
}

void FullyShardedDataParallel::finish_reduce(size_t i) {
  Unit& u = units_[i];
  if (!u.reducing) return;
  at::NoGradGuard no_grad;
  u.reducing->wait();
  u.reducing.reset();
  at::Tensor out = u.reduce_out.to(at::kFloat);
  u.reduce_in = at::Tensor();
  u.reduce_out = at::Tensor();
  if (replicate_ && replicate_->size() > 1) replicate_->all_reduce(out);
  for (size_t k : u.params) {
    Param& q = params_[k];
    if (!q.trainable) continue;
    at::Tensor g = out.narrow(0, q.shard_offset, q.chunk);
    if (q.shard.grad().defined()) q.shard.mutable_grad().add_(g);
    else q.shard.mutable_grad() = g.clone();
  }
}

void FullyShardedDataParallel::finish_backward() {
  // The rest in order: units some of whose parameters got no gradient in this backward.
  while (next_reduce_ < reduce_order_.size()) reduce(reduce_order_[next_reduce_++]);
  // In launch order, the same on every rank (HSDP's replica all-reduces pair up).
  for (size_t i : reducing_) finish_reduce(i);
  reducing_.clear();
  in_backward_ = false;
  if (!pinned_)
    for (size_t i = 0; i < units_.size(); ++i) free(i);
}

void FullyShardedDataParallel::gather_all() {
  for (size_t i = 0; i < units_.size(); ++i) gather(i);
  pinned_ = true;
}

void FullyShardedDataParallel::reshard() {
  pinned_ = false;
  for (size_t i = 0; i < units_.size(); ++i) free(i);
}

std::vector<std::string> FullyShardedDataParallel::export_order() const {
  std::vector<std::string> out;
  for (const Unit& u : units_)
    for (size_t k : u.params) out.push_back(params_[k].name);
  return out;
}

at::Tensor FullyShardedDataParallel::full_parameter(const std::string& name) {
  for (const Param& q : params_) {
    if (q.name != name) continue;
    if (q.unit != streamed_ && !pinned_) free(streamed_);
    streamed_ = q.unit;
    gather(q.unit);
    return q.param.detach();
  }
  throw Error(cat("fsdp: no parameter named '", name, "'"));
}

double FullyShardedDataParallel::clip_grad_norm(double max_norm, const std::function<bool(const std::string&)>& tp_split,
                                                Communicator* tp) {
  at::NoGradGuard no_grad;
  // Summed in fp64 on the device, one transfer at the end (no sync per parameter): [0] slices
  // of tensor-parallel parameters, [1] the rest.
  at::Tensor t = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(options_.device));
  const bool with_tp = tp && tp->size() > 1;
  for (const Param& q : params_)
    if (q.trainable && q.shard.grad().defined())
      t[with_tp && tp_split && tp_split(q.name) ? 0 : 1].add_(q.shard.grad().pow(2).sum().to(at::kDouble));
  shard_->all_reduce(t);
  if (with_tp) {
    if (tp->rank() != 0) t[1].zero_();  // replicated over tp: counted once
    tp->all_reduce(t);
  }
  const double norm = std::sqrt(t.sum().item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double coef = max_norm / (norm + 1e-6);  // torch.nn.utils.clip_grad_norm_'s
    for (const Param& q : params_)
      if (q.trainable && q.shard.grad().defined()) q.shard.grad().mul_(coef);
  }
  return norm;
}

int64_t FullyShardedDataParallel::shard_bytes() const {
  int64_t n = 0;
  for (const Param& q : params_) n += q.chunk * 4;
  return n;
}

int64_t FullyShardedDataParallel::gathered_bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_)
    if (u.gathered) n += u.full_numel * static_cast<int64_t>(u.full.element_size());
  return n;
}

}  // namespace mm::parallel
