// ZeRO-1, the distributed optimizer (Megatron's --use-distributed-optimizer): parameters and
// gradients stay replicated as in DDP, but each data-parallel rank keeps optimizer state for,
// and updates, only its chunk of every flattened parameter; the updated chunks are then
// all-gathered into every rank's full parameters. The update is elementwise, so it equals
// DDP's exactly while optimizer state takes 1/N of the memory.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/parallel/communicator.h"

namespace mm::parallel {

class Zero1Partition {
 public:
  // params: the trainable (name, parameter) pairs, the same on every rank of dp.
  Zero1Partition(std::vector<std::pair<std::string, at::Tensor>> params, std::shared_ptr<Communicator> dp);

  // This rank's chunk of a parameter: an fp32 copy of elements [begin, end) of the flattened
  // parameter (possibly empty), which the optimizer updates. mm::Error for an unknown name.
  at::Tensor shard(const std::string& name) const;
  std::pair<int64_t, int64_t> shard_range(const std::string& name) const;
  // Before the optimizer step: each chunk's gradient becomes a view of its slice of the
  // (all-reduced) full gradient.
  void scatter_grads();
  // After the step: every rank's updated chunks into every rank's full parameters (one
  // all-gather), and the full gradients released.
  void gather_params();
  int64_t shard_bytes() const;
  // The chunks again from the full parameters (after loading a checkpoint into them).
  void refresh_shards();

 private:
  struct Part {
    std::string name;
    at::Tensor param, shard;
    int64_t numel = 0, chunk = 0, begin = 0, end = 0, offset = 0;  // offset: in the packed chunks
  };
  std::vector<Part> parts_;
  std::shared_ptr<Communicator> dp_;
  int64_t packed_ = 0;
};

}  // namespace mm::parallel
