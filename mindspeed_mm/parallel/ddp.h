// Data parallelism (DDP): every rank holds the whole model; after backward each gradient is the
// sum over the data-parallel ranks. Gradients are all-reduced in buckets of about
// bucket_cap_bytes, filled in reverse registration order (the order backward produces them): a
// bucket's all-reduce starts from the AccumulateGrad post-hook of its last gradient while backward
// is still running (buckets start in index order on every rank, so collectives pair up even when
// a parameter gets no gradient on some rank), and a callback queued on the autograd engine from
// the loss (prepare_backward) waits for all of them at the end of backward.
// set_requires_sync(false) on gradient-accumulation micro-steps: no communication, gradients
// accumulate locally, and the next synced backward reduces the accumulated sum.
//
// The sum (not the mean) is reduced: the trainer divides each rank's loss by the global token
// count, so the summed gradient equals one process's on the whole batch.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "mindspeed_mm/parallel/communicator.h"

namespace torch::autograd {
struct Node;
}

namespace mm::parallel {

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::vector<at::Tensor> params, std::shared_ptr<Communicator> dp,
                          int64_t bucket_cap_bytes = int64_t(25) << 20);
  ~DistributedDataParallel();

  // Rank 0's values into every rank's parameters (start from identical weights).
  void broadcast_parameters();
  void set_requires_sync(bool sync) { sync_ = sync; }
  // Call backward on the returned tensor (the loss, unchanged): when the backward completes,
  // every bucket has been reduced. Without it the buckets are launched but never waited.
  at::Tensor prepare_backward(const at::Tensor& loss);
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // All-reduces launched so far (for tests: none on accumulation micro-steps).
  int64_t reductions() const { return reductions_; }

  // Called by the hooks (public for them; not for users).
  void grad_ready(size_t param);
  void finish_backward();

 private:
  struct Bucket {
    std::vector<size_t> params;
    int64_t numel = 0;
    int pending = 0;
    at::Tensor flat;
    std::shared_ptr<PendingWork> work;
  };
  void launch(Bucket& b);

  std::vector<at::Tensor> params_;
  std::shared_ptr<Communicator> dp_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<std::shared_ptr<void>> accumulators_;  // on_gradient_ready handles (autograd keeps weak refs)
  size_t next_launch_ = 0;  // buckets launch in index order
  bool sync_ = true;
  int64_t reductions_ = 0;
};

}  // namespace mm::parallel
