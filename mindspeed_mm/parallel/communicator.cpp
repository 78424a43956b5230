// Collectives on c10d backends (Gloo for CPU tensors, NCCL for CUDA ones), with timeouts that
// name the missing ranks.
#include "mindspeed_mm/parallel/communicator.h"

#include <atomic>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef MM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <algorithm>
#include <numeric>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/tools/trace.h"

namespace mm::parallel {

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> gloo;  // CPU tensors
  c10::intrusive_ptr<c10d::Backend> nccl;  // CUDA tensors (a CUDA build on a GPU, device cuda)
  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> options;
  bool want_nccl = false;
  // The backend for t's device; none for a one-member group.
  c10d::Backend* for_tensor(const at::Tensor& t, const std::string& group) const {
    if (t.defined() && t.is_cuda()) {
      MM_CHECK(nccl || !gloo, "distributed: a CUDA tensor reached group ", group,
               ", which has no NCCL backend (training.device is cpu)");
      return nccl.get();
    }
    return gloo.get();
  }
  bool has_peer() const { return gloo || nccl; }
};

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}

#ifdef MM_WITH_CUDA
// NCCL's own timeout (its watchdog) equals ours; an error or timeout fails the pending work, and
// wait() rethrows it here (TORCH_NCCL_ASYNC_ERROR_HANDLING=2: abort the communicator, no
// process teardown), so the rank exits through mm's one-line error, never a hang.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout) {
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}
#endif

}  // namespace

Communicator::~Communicator() = default;

std::shared_ptr<Communicator> Communicator::create(const DistEnv& env, std::chrono::milliseconds timeout,
                                                   at::Device device) {
  std::shared_ptr<Communicator> c(new Communicator());
  c->rank_ = env.rank;
  c->size_ = env.world_size;
  for (int r = 0; r < env.world_size; ++r) c->members_.push_back(r);
  c->timeout_ = timeout;
  c->impl_ = std::make_unique<Impl>();
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env.master_port);
  so.isServer = env.rank == 0;
  so.numWorkers = static_cast<size_t>(env.world_size);
  so.waitWorkers = true;
  so.timeout = timeout;
  try {
    c->impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    // One node: loopback. Several: GLOO_SOCKET_IFNAME's interface, else this host's address.
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifname && *ifname)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (env.world_size == env.local_world_size)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    opts->threads = 2;
    c->impl_->options = opts;
    c->impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(c->impl_->store, env.rank, env.world_size, opts);
    // No rank leaves before every rank has its connections: one that finished joining and exited
    // at once (a worker with nothing to exchange) closed its sockets under peers still completing
    // Gloo's full-mesh handshake, and they failed with "connection closed by peer". (Not counted
    // as a collective: the numbers in fault messages start at the program's first.)
    if (env.world_size > 1) {
      c10d::BarrierOptions bo;
      bo.timeout = timeout;
      c->impl_->gloo->barrier(bo)->wait(timeout);
    }
    c->impl_->want_nccl = device.is_cuda();
#ifdef MM_WITH_CUDA
    if (c->impl_->want_nccl)
      c->impl_->nccl = make_nccl(c10::make_intrusive<c10d::PrefixStore>("nccl/", c->impl_->store), env.rank,
                                 env.world_size, timeout);
#else
    MM_CHECK(!c->impl_->want_nccl, "distributed: device ", device, " needs a CUDA build of mm");
#endif
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    throw Error(cat("distributed: rank ", env.rank, " of ", env.world_size, " could not join the group at ",
                    env.master_addr, ":", env.master_port, " within ", timeout.count() / 1000.0, " s: ",
                    msg.substr(0, msg.find('\n'))));
  }
  return c;
}

std::shared_ptr<Communicator> Communicator::subgroup(const std::vector<int>& ranks, const std::string& name) {
  auto it = std::find(ranks.begin(), ranks.end(), members_[static_cast<size_t>(rank_)]);
  MM_CHECK(it != ranks.end(), "distributed: rank ", members_[static_cast<size_t>(rank_)], " is not in its own group ", name);
  std::shared_ptr<Communicator> c(new Communicator());
  c->rank_ = static_cast<int>(it - ranks.begin());
  c->size_ = static_cast<int>(ranks.size());
  c->members_ = ranks;
  c->timeout_ = timeout_;
  c->impl_ = std::make_unique<Impl>();
  std::string key = name;
  for (int r : ranks) key += "_" + std::to_string(r);
  c->name_ = key;
  c->impl_->store = c10::make_intrusive<c10d::PrefixStore>(key + "/", impl_->store);
  c->impl_->options = impl_->options;
  c->impl_->want_nccl = impl_->want_nccl;
  if (c->size_ > 1) {
    try {
      c->impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(c->impl_->store, c->rank_, c->size_, impl_->options);
#ifdef MM_WITH_CUDA
      if (c->impl_->want_nccl)
        c->impl_->nccl = make_nccl(c10::make_intrusive<c10d::PrefixStore>("nccl/", c->impl_->store), c->rank_,
                                   c->size_, timeout_);
#endif
    } catch (const std::exception& e) {
      std::string msg = e.what();
      throw Error(cat("distributed: group ", key, " did not form on rank ", members_[static_cast<size_t>(rank_)], ": ",
                      msg.substr(0, msg.find('\n'))));
    }
  }
  return c;
}

std::string Communicator::laggards() const {
  std::string out;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    int64_t seen = 0;
    try {
      const std::string key = "mm/arrived/" + std::to_string(r);
      if (impl_->store->check({key})) {
        std::vector<uint8_t> v = impl_->store->get(key);
        seen = std::stoll(std::string(v.begin(), v.end()));
      }
    } catch (const std::exception&) {
      seen = -1;  // the store itself is gone (rank 0 died)
    }
    if (seen < seq_) out += cat(out.empty() ? "" : ", ", members_[static_cast<size_t>(r)], seen < 0 ? " (unreachable)" : "");
  }
  return out.empty() ? "none (all had entered it)" : out;
}

namespace {
std::atomic<int64_t> g_wait_ns{0};
void add_wait_time(std::chrono::steady_clock::duration d) {
  g_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}
}  // namespace

double Communicator::wait_seconds() { return static_cast<double>(g_wait_ns.load()) * 1e-9; }

class WorkHandle : public PendingWork {
 public:
  WorkHandle(const Communicator* c, const char* what, int64_t seq, c10::intrusive_ptr<c10d::Work> w, bool cuda,
             int64_t bytes = 0, double started_us = -1)
      : c_(c), what_(what), seq_(seq), work_(std::move(w)), cuda_(cuda), bytes_(bytes), started_us_(started_us) {}
  void wait() override {
    if (!work_) return;
    const auto t0 = std::chrono::steady_clock::now();
    const double wait0 = started_us_ >= 0 && tools::Trace::on() ? tools::Trace::now_us() : -1;
    try {
      // Gloo: block the CPU up to the timeout. NCCL: make the current stream wait on the
      // communication stream (no CPU block, compute overlaps); NCCL's watchdog enforces the
      // timeout and fails the work, which the next wait or synchronisation rethrows.
      if (cuda_)
        work_->wait();
      else
        work_->wait(c_->timeout_);
      add_wait_time(std::chrono::steady_clock::now() - t0);
      // The profile: the collective from its launch to the end of this wait, with the wait alone.
      if (wait0 >= 0 && tools::Trace::on()) {
        tools::TraceEvent e;
        e.name = what_;
        e.cat = "comm";
        e.ts_us = started_us_;
        e.dur_us = tools::Trace::now_us() - started_us_;
        e.tid = tools::Trace::thread_id();
        e.args = {{"bytes", bytes_}, {"wait_us", tools::Trace::now_us() - wait0}, {"group", c_->name()},
                  {"collective", seq_}};
        tools::Trace::add(std::move(e));
      }
    } catch (const std::exception& e) {
      work_.reset();
      c_->fail(what_, seq_, e);
    }
    work_.reset();
  }

 private:
  const Communicator* c_;
  const char* what_;
  int64_t seq_;
  c10::intrusive_ptr<c10d::Work> work_;
  bool cuda_;
  int64_t bytes_;
  double started_us_;
};

void Communicator::fail(const char* what, int64_t seq, const std::exception& e) const {
  std::string msg = e.what();
  throw Error(cat("distributed: ", what, " (collective #", seq, name_ == "world" ? "" : " of group " + name_, ") failed on rank ",
                  members_[static_cast<size_t>(rank_)], " of ", size_, " after at most ", timeout_.count() / 1000.0,
                  " s; ranks that did not arrive: ", laggards(), " (", msg.substr(0, msg.find('\n')), ")"));
}

template <class Launch>
std::shared_ptr<PendingWork> Communicator::start(const char* what, const at::Tensor& like, Launch&& launch) {
  MM_CHECK(impl_->has_peer(), "distributed: ", what, " on the one-rank group ", name_, " has no peer");
  c10d::Backend* backend = impl_->for_tensor(like, name_);
  ++seq_;
  const std::string n = std::to_string(seq_);
  try {
    impl_->store->set("mm/arrived/" + std::to_string(rank_), std::vector<uint8_t>(n.begin(), n.end()));
    const double t0 = tools::Trace::on() ? tools::Trace::now_us() : -1;
    const int64_t bytes = like.defined() ? like.numel() * static_cast<int64_t>(like.element_size()) : 0;
    return std::make_shared<WorkHandle>(this, what, seq_, launch(*backend), like.defined() && like.is_cuda(), bytes, t0);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(what, seq_, e);
  }
}

template <class Launch>
void Communicator::run(const char* what, const at::Tensor& like, Launch&& launch) {
  start(what, like, std::forward<Launch>(launch))->wait();
}

namespace {
std::shared_ptr<PendingWork> done() { return std::make_shared<WorkHandle>(nullptr, "", 0, nullptr, false); }

// c10d wants dense tensors; a copy only when t is not already one.
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
}  // namespace

std::shared_ptr<PendingWork> Communicator::all_reduce_async(at::Tensor& t) {
  MM_CHECK(t.is_contiguous(), "all_reduce_async: needs a contiguous tensor");
  if (size_ == 1) return done();
  auto v = std::make_shared<std::vector<at::Tensor>>(std::vector<at::Tensor>{t});
  c10d::AllreduceOptions o;
  o.timeout = timeout_;
  return start("all_reduce", t, [&](c10d::Backend& b) { return b.allreduce(*v, o); });
}

void Communicator::all_reduce(at::Tensor& t, ReduceOp op) {
  if (size_ == 1) return;
  at::Tensor buf = dense(t);
  std::vector<at::Tensor> v = {buf};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = timeout_;
  run("all_reduce", buf, [&](c10d::Backend& b) { return b.allreduce(v, o); });
  if (op == ReduceOp::kAvg) buf.div_(size_);
  if (!buf.is_same(t)) t.copy_(buf);
}

at::Tensor Communicator::all_gather(const at::Tensor& t) {
  at::Tensor in = dense(t);
  std::vector<int64_t> shape = {size_};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor out = at::empty(shape, in.options());
  all_gather_async(in, out)->wait();
  return out;
}

std::shared_ptr<PendingWork> Communicator::all_gather_async(const at::Tensor& t, at::Tensor& out) {
  MM_CHECK(t.is_contiguous() && out.is_contiguous() && out.scalar_type() == t.scalar_type() && out.dim() >= 1 &&
               out.size(0) == size_ && out.numel() == t.numel() * size_ && out.device() == t.device(),
           "all_gather_async: needs a contiguous tensor and a contiguous output of [", size_,
           ", ...] with its dtype and device");
  if (size_ == 1) {
    out[0].view_as(t).copy_(t);
    return done();
  }
  // One flat buffer, filled in rank order (c10d's allgather into one tensor).
  at::Tensor flat_out = out.view({-1}), flat_in = t.view({-1});
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  return start("all_gather", t, [&](c10d::Backend& b) { return b._allgather_base(flat_out, flat_in, o); });
}

at::Tensor Communicator::all_gather_uneven(const at::Tensor& t, const std::vector<int64_t>& counts) {
  MM_CHECK(static_cast<int>(counts.size()) == size_ && t.size(0) == counts[rank_], "all_gather_uneven: rank ", rank_,
           " holds ", t.size(0), " rows but counts say ", counts.size() == size_ ? counts[rank_] : -1);
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  std::vector<int64_t> padded_shape(t.sizes().begin(), t.sizes().end());
  padded_shape[0] = most;
  at::Tensor padded = at::zeros(padded_shape, t.options());
  padded.narrow(0, 0, t.size(0)).copy_(t);
  at::Tensor all = all_gather(padded);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < size_; ++r) parts.push_back(all[r].narrow(0, 0, counts[r]));
  return at::cat(parts, 0);
}

at::Tensor Communicator::all_to_all(const at::Tensor& t, const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& recv_counts) {
  at::Tensor in = dense(t);
  std::vector<int64_t> shape(in.sizes().begin(), in.sizes().end());
  if (send_counts.empty()) {
    MM_CHECK(in.size(0) % size_ == 0, "all_to_all: ", in.size(0), " rows do not split evenly over ", size_, " ranks");
  } else {
    MM_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_ &&
                 std::accumulate(send_counts.begin(), send_counts.end(), int64_t(0)) == in.size(0),
             "all_to_all: send/recv counts must have one entry per rank and send_counts must sum to the rows");
    shape[0] = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t(0));
  }
  at::Tensor out = at::empty(shape, in.options());
  if (size_ == 1) {
    out.copy_(in);
    return out;
  }
  // alltoall_base splits count rows of dim 0.
  std::vector<int64_t> sc = send_counts, rc = recv_counts;
  c10d::AllToAllOptions o;
  o.timeout = timeout_;
  run("all_to_all", in, [&](c10d::Backend& b) { return b.alltoall_base(out, in, rc, sc, o); });
  return out;
}

at::Tensor Communicator::reduce_scatter(const at::Tensor& t, ReduceOp op) {
  MM_CHECK(t.dim() >= 1 && t.size(0) % size_ == 0, "reduce_scatter: ", t.size(0), " rows do not split over ", size_,
           " ranks (pad first)");
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape[0] /= size_;
  if (size_ == 1) return t.clone();
  at::Tensor in = dense(t);
  at::Tensor out = at::empty(shape, in.options());
  c10d::ReduceScatterOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = timeout_;
  run("reduce_scatter", in, [&](c10d::Backend& b) { return b._reduce_scatter_base(out, in, o); });
  if (op == ReduceOp::kAvg) out.div_(size_);
  return out;
}

std::shared_ptr<PendingWork> Communicator::reduce_scatter_async(const at::Tensor& t, at::Tensor& out) {
  MM_CHECK(t.is_contiguous() && out.is_contiguous() && out.scalar_type() == t.scalar_type() &&
               t.numel() == out.numel() * size_ && out.device() == t.device(),
           "reduce_scatter_async: needs a contiguous input of size x the output's elements, same dtype and device");
  if (size_ == 1) {
    out.copy_(t.view_as(out));
    return done();
  }
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = timeout_;
  at::Tensor in = t.view({-1}), flat_out = out.view({-1});
  return start("reduce_scatter", t, [&](c10d::Backend& b) { return b._reduce_scatter_base(flat_out, in, o); });
}

void Communicator::broadcast(at::Tensor& t, int root) {
  if (size_ == 1) return;
  at::Tensor buf = dense(t);
  std::vector<at::Tensor> v = {buf};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = timeout_;
  run("broadcast", buf, [&](c10d::Backend& b) { return b.broadcast(v, o); });
  if (!buf.is_same(t)) t.copy_(buf);
}

void Communicator::send(const at::Tensor& t, int dst, int tag) {
  std::vector<at::Tensor> v = {dense(t)};
  run("send", v[0], [&](c10d::Backend& b) { return b.send(v, dst, tag); });
}

std::shared_ptr<PendingWork> Communicator::isend(const at::Tensor& t, int dst, int tag) {
  std::vector<at::Tensor> v = {dense(t)};
  return start("send", v[0], [&](c10d::Backend& b) { return b.send(v, dst, tag); });
}

void Communicator::recv(at::Tensor& t, int src, int tag) {
  at::Tensor buf = dense(t);
  std::vector<at::Tensor> v = {buf};
  run("recv", buf, [&](c10d::Backend& b) { return b.recv(v, src, tag); });
  if (!buf.is_same(t)) t.copy_(buf);
}

std::shared_ptr<PendingWork> Communicator::irecv(at::Tensor& t, int src, int tag) {
  MM_CHECK(t.is_contiguous(), "irecv: needs a contiguous tensor to receive into");
  std::vector<at::Tensor> v = {t};
  return start("recv", t, [&](c10d::Backend& b) { return b.recv(v, src, tag); });
}

void Communicator::barrier() {
  if (size_ == 1) return;
  c10d::BarrierOptions o;
  o.timeout = timeout_;
  run("barrier", at::Tensor(), [&](c10d::Backend& b) { return b.barrier(o); });
}

}  // namespace mm::parallel
