#include "mindspeed_mm/training/device_batches.h"


namespace mm::training {

DevicePrefetcher::DevicePrefetcher(data::BatchStream& stream, at::Device device, int64_t ahead,
                                   std::function<void(Item&)> shard)
    : stream_(stream), device_(device), ahead_(ahead), shard_(std::move(shard)), state_(stream.state()),
      skipped_(stream.skipped_samples()) {}

void DevicePrefetcher::fill(int64_t n) {
  while (static_cast<int64_t>(pending_.size()) < n) {
    Pending p;
    p.item.host = stream_.next();
    if (shard_) shard_(p.item);
    p.item.device = data::batch_to_device(p.item.host, device_);
    p.state_after = stream_.state();
    p.skipped_after = stream_.skipped_samples();
    pending_.push_back(std::move(p));
  }
}

DevicePrefetcher::Item DevicePrefetcher::next() {
  fill(1);  // the batch asked for
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  state_ = std::move(p.state_after);
  skipped_ = p.skipped_after;
  fill(ahead_);  // queue the next ones' copies now, before the caller computes on this one
  return std::move(p.item);
}

nlohmann::json DevicePrefetcher::state() const { return state_; }

void DevicePrefetcher::load_state(const nlohmann::json& state) {
  pending_.clear();
  stream_.load_state(state);
  state_ = stream_.state();
  skipped_ = stream_.skipped_samples();
}

}  // namespace mm::training
