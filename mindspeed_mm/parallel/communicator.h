// Collectives over c10d backends: the layer DDP, FSDP and distributed checkpoints build on.
// Rendezvous through a TCPStore that rank 0 hosts at MASTER_ADDR:PORT. Each operation goes to
// the backend of its tensor's device: Gloo for CPU tensors, NCCL for CUDA tensors (a group made
// for a CUDA device has both; NCCL runs on its own stream, so async work overlaps compute).
//
// Every operation blocks until done and never hangs: after `timeout` it throws mm::Error naming
// the collective, this rank, and the ranks that had not reached it (each rank records in the
// store how many collectives it has entered; a rank that died or lags shows a smaller count).
// A peer that died mid-collective is reported the same way as soon as Gloo notices.
//
// libtorch 2.11's Gloo has every operation used here natively, for fp32, bf16 and fp16 alike
// (checked: all-reduce, reduce-scatter and all-gather into one tensor, all-to-all, broadcast,
// send/recv): nothing is emulated and 16-bit tensors travel as themselves. Gloo has no AVG
// reduction, so kAvg is a sum divided by the group size on every backend.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/parallel/dist_env.h"

namespace mm::parallel {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

// An operation in flight (DDP's bucket all-reduces overlap backward): wait() blocks until done,
// with the same timeout and error as the blocking calls.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  // Joins the group of env (rank 0 starts the store). mm::Error naming MASTER_ADDR:PORT when the
  // rendezvous does not complete within timeout.
  // A CUDA `device` adds an NCCL backend for CUDA tensors (CPU tensors keep using Gloo).
  static std::shared_ptr<Communicator> create(const DistEnv& env, std::chrono::milliseconds timeout,
                                              at::Device device = at::kCPU);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // "world" or the subgroup's name
  // The global (world) rank of each member, in group-rank order.
  const std::vector<int>& members() const { return members_; }

  // A communicator over `ranks` (global ranks, this one among them) named `name`: its own
  // process group on a prefix of this one's store. One member: a group that never communicates.
  std::shared_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& name);

  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::kSum);
  // Sum all-reduce of a contiguous tensor, in place, without waiting.
  std::shared_ptr<PendingWork> all_reduce_async(at::Tensor& t);
  // Every rank's tensor (all the same shape) stacked along a new first dimension: [size, ...].
  at::Tensor all_gather(const at::Tensor& t);
  // All-gather of a contiguous tensor into out ([size, ...], t's dtype and device, size x t's
  // elements, contiguous) without waiting (FSDP prefetches the next units' parameters).
  std::shared_ptr<PendingWork> all_gather_async(const at::Tensor& t, at::Tensor& out);
  // Uneven sizes: rank r contributes t with counts[r] rows (dim 0); the result concatenates them.
  at::Tensor all_gather_uneven(const at::Tensor& t, const std::vector<int64_t>& counts);
  // t [size * chunk, ...] -> the sum over ranks of block `rank()`: [chunk, ...]. t.size(0) must
  // divide by size(); pad before (FSDP shards do).
  at::Tensor reduce_scatter(const at::Tensor& t, ReduceOp op = ReduceOp::kSum);
  // Sum reduce-scatter of a contiguous t [size * chunk] into out [chunk] (t's dtype and device)
  // without waiting: FSDP's gradient reduction runs while backward goes on.
  std::shared_ptr<PendingWork> reduce_scatter_async(const at::Tensor& t, at::Tensor& out);
  // Rows t[sum(send_counts[:j]) ...] go to rank j; the result holds recv_counts[j] rows from rank j
  // in rank order. Empty counts: an even split.
  at::Tensor all_to_all(const at::Tensor& t, const std::vector<int64_t>& send_counts = {},
                        const std::vector<int64_t>& recv_counts = {});
  void broadcast(at::Tensor& t, int root);
  void send(const at::Tensor& t, int dst, int tag = 0);
  // send without waiting (pipeline stages: a stage's sends never block its next receive).
  std::shared_ptr<PendingWork> isend(const at::Tensor& t, int dst, int tag = 0);
  void recv(at::Tensor& t, int src, int tag = 0);
  // recv into a contiguous t without waiting (ring attention: the next block arrives while this
  // one is computed). t must stay alive until wait() returns.
  std::shared_ptr<PendingWork> irecv(at::Tensor& t, int src, int tag = 0);
  void barrier();

  std::chrono::milliseconds timeout() const { return timeout_; }
  int64_t collectives_entered() const { return seq_; }
  // Seconds this process has spent waiting for collectives to finish, all groups together (the
  // communication share of a step; overlapped all-reduces count only what backward did not hide).
  static double wait_seconds();

 private:
  Communicator() = default;
  // Records arrival, runs `launch`, waits; rethrows failures with the laggards named.
  // `like` picks the backend (its device); undefined: Gloo.
  template <class Launch>
  void run(const char* what, const at::Tensor& like, Launch&& launch);
  template <class Launch>
  std::shared_ptr<PendingWork> start(const char* what, const at::Tensor& like, Launch&& launch);
  [[noreturn]] void fail(const char* what, int64_t seq, const std::exception& e) const;
  friend class WorkHandle;
  std::string laggards() const;

  int rank_ = 0, size_ = 1;
  std::vector<int> members_;
  std::string name_ = "world";
  std::chrono::milliseconds timeout_{30000};
  int64_t seq_ = 0;
  struct Impl;  // the c10d store and process group (their headers stay out of every includer)
  std::unique_ptr<Impl> impl_;
};

}  // namespace mm::parallel
