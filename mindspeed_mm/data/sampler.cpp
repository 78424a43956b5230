// ResumableSampler: per-epoch Fisher-Yates order from a splitmix64 stream, sharded by stride.
#include "mindspeed_mm/data/sampler.h"

#include <algorithm>
#include <string>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"

namespace mm::data {

uint64_t SplitMix64::below(uint64_t n) {
  MM_CHECK(n > 0, "SplitMix64::below: n must be > 0");
  // Reject the lowest (2^64 mod n) values so every residue is equally likely.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t r = next();
    if (r >= threshold) return r % n;
  }
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  SplitMix64 rng(seed + static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

ResumableSampler::ResumableSampler(int64_t n, uint64_t seed, bool shuffle, int64_t rank,
                                   int64_t world)
    : n_(n), seed_(seed), shuffle_(shuffle), rank_(rank), world_(world) {
  MM_CHECK(world >= 1, "sampler: world size must be >= 1 (got ", world, ")");
  MM_CHECK(rank >= 0 && rank < world, "sampler: rank ", rank, " is outside [0, ", world, ")");
  MM_CHECK(n >= world, "sampler: ", n, " items cannot feed ", world,
           " ranks (each rank needs at least one item per epoch)");
}

int64_t ResumableSampler::order_at(int64_t epoch_position) {
  const int64_t k = rank_ + epoch_position * world_;
  if (!shuffle_ && lengths_.empty()) return k;
  if (perm_epoch_ != epoch_) {
    if (shuffle_) {
      perm_ = epoch_permutation(n_, seed_, epoch_);
    } else {
      perm_.resize(static_cast<size_t>(n_));
      for (int64_t i = 0; i < n_; ++i) perm_[i] = i;
    }
    if (!lengths_.empty()) {
      for (int64_t g = 0; g < n_; g += group_size_) {
        auto first = perm_.begin() + g, last = perm_.begin() + std::min(n_, g + group_size_);
        std::stable_sort(first, last, [&](int64_t a, int64_t b) { return lengths_[a] > lengths_[b]; });
      }
    }
    perm_epoch_ = epoch_;
  }
  return perm_[static_cast<size_t>(k)];
}

void ResumableSampler::group_by_length(std::vector<int64_t> lengths, int64_t group_size) {
  MM_CHECK(static_cast<int64_t>(lengths.size()) == n_, "sampler: ", lengths.size(), " lengths for ", n_, " items");
  MM_CHECK(group_size >= 1, "sampler: length group size must be >= 1 (got ", group_size, ")");
  lengths_ = std::move(lengths);
  group_size_ = group_size;
  perm_epoch_ = -1;
}

int64_t ResumableSampler::next() {
  if (position_ >= per_epoch()) {
    ++epoch_;
    position_ = 0;
  }
  return order_at(position_++);
}

std::vector<int64_t> ResumableSampler::next_n(int64_t k) {
  MM_CHECK(k >= 0, "sampler: next_n needs k >= 0 (got ", k, ")");
  std::vector<int64_t> out(static_cast<size_t>(k));
  for (auto& v : out) v = next();
  return out;
}

uint64_t ResumableSampler::lengths_hash() const {
  uint64_t h = 0;
  for (int64_t l : lengths_) h = splitmix64(h ^ static_cast<uint64_t>(l));
  return h;
}

nlohmann::json ResumableSampler::state() const {
  nlohmann::json s = {{"n", n_},         {"seed", seed_},   {"shuffle", shuffle_},
                      {"rank", rank_},   {"world", world_}, {"epoch", epoch_},
                      {"position", position_}, {"consumed", position_ * world_}};
  if (!lengths_.empty()) {
    s["group_size"] = group_size_;
    s["lengths_hash"] = lengths_hash();
  }
  return s;
}

void ResumableSampler::load_state(const nlohmann::json& s) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    MM_CHECK(s.is_object() && s.contains(key), "sampler state: missing field '", key, "' in ",
             s.dump());
    return s.at(key);
  };
  try {
    const auto n = field("n").get<int64_t>();
    const auto seed = field("seed").get<uint64_t>();
    const auto shuffle = field("shuffle").get<bool>();
    MM_CHECK(n == n_, "sampler state is for ", n, " items but this sampler has ", n_,
             " (dataset changed since the checkpoint?)");
    MM_CHECK(seed == seed_, "sampler state has seed ", seed, " but this sampler has seed ", seed_);
    MM_CHECK(shuffle == shuffle_, "sampler state has shuffle=", shuffle,
             " but this sampler has shuffle=", shuffle_);
    const int64_t group = s.value("group_size", int64_t(0));
    MM_CHECK(group == (lengths_.empty() ? 0 : group_size_), "sampler state has length group size ", group,
             " but this sampler has ", lengths_.empty() ? 0 : group_size_,
             " (data.group_by_length or the batch size changed since the checkpoint?)");
    MM_CHECK(lengths_.empty() || s.value("lengths_hash", uint64_t(0)) == lengths_hash(),
             "sampler state: the sample lengths differ from the checkpoint's (dataset or media changed?)");
    const auto epoch = field("epoch").get<int64_t>();
    const auto world = field("world").get<int64_t>();
    const auto position = field("position").get<int64_t>();
    MM_CHECK(world >= 1 && epoch >= 0 && position >= 0 && position <= n / world,
             "sampler state: epoch ", epoch, " / position ", position, " out of range for ", n,
             " items over ", world, " ranks");
    const int64_t consumed = s.contains("consumed") ? s.at("consumed").get<int64_t>()
                                                    : position * world;
    epoch_ = epoch;
    position_ = world == world_ ? position : std::min(consumed / world_, per_epoch());
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("sampler state: malformed field (", json_error_text(e.what()), ") in ", s.dump()));
  }
}

}  // namespace mm::data
