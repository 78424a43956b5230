// ResumableSampler: a deterministic, seeded, resumable stream of dataset indices, sharded by
// rank. Shuffling uses our own PRNG (splitmix64 + Fisher-Yates), never std::shuffle or
// std::uniform_int_distribution, whose output differs between standard libraries: the same
// seed gives the same order on every platform.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace mm::data {

// splitmix64's finaliser: a bijective 64-bit mix. Hashes a counter into well-spread bits.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Whether item i of a dataset is held out for validation: a seeded hash of its index below
// `fraction` (the same split on every rank and run).
inline bool held_out(uint64_t seed, int64_t i, double fraction) {
  const double u = static_cast<double>(splitmix64(seed * 0x100000001B3ULL + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;
  return u < fraction;
}

// A tiny sequential PRNG: the splitmix64 stream. below(n) is exactly uniform (rejection sampling).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n);  // uniform in [0, n); n > 0
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t state_;
};

// The permutation of 0..n-1 for one epoch: Fisher-Yates driven by SplitMix64(seed + epoch).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

class ResumableSampler {
 public:
  // Rank r of `world` takes entries r, r+world, r+2*world, ... of each epoch's order; the order is
  // truncated to a multiple of world so every rank draws the same count, per_epoch() = n / world.
  ResumableSampler(int64_t n, uint64_t seed, bool shuffle = true, int64_t rank = 0,
                   int64_t world = 1);

  // The next index; after per_epoch() draws it moves to the next epoch (reshuffled, seed + epoch).
  int64_t next();
  std::vector<int64_t> next_n(int64_t k);

  int64_t epoch() const { return epoch_; }
  // Draws made in the current epoch by this rank; equals per_epoch() until the next draw rolls over.
  int64_t position() const { return position_; }
  int64_t per_epoch() const { return n_ / world_; }
  int64_t size() const { return n_; }

  // Length grouping (Hugging Face's LengthGroupedSampler, group_by_length): each epoch's order
  // is cut into consecutive groups of group_size entries (take world * batch * 50 as HF does)
  // and every group is sorted by descending length, stably. The batches of one step then hold
  // samples of similar length on every rank, so little padding is needed, while the order
  // stays shuffled across groups. lengths has one entry per item.
  void group_by_length(std::vector<int64_t> lengths, int64_t group_size);

  // {"n","seed","shuffle","rank","world","epoch","position","consumed"}; consumed = position * world
  // is the count drawn by all ranks together this epoch. With length grouping also "group_size"
  // and "lengths_hash", so a resume with other grouping or other lengths is an error, not a
  // silently different order.
  nlohmann::json state() const;
  // Restores a state. A state for another n, seed or shuffle setting is an mm::Error. A state from
  // another world size resumes at the same global point of the epoch (consumed / world, rounded
  // down, so a few items may be seen twice but none skipped).
  void load_state(const nlohmann::json& state);

 private:
  int64_t order_at(int64_t epoch_position);  // the epoch order's entry for this rank
  uint64_t lengths_hash() const;

  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  int64_t rank_, world_;
  int64_t epoch_ = 0, position_ = 0;
  std::vector<int64_t> lengths_;  // empty: no length grouping
  int64_t group_size_ = 0;
  std::vector<int64_t> perm_;  // current epoch's order (shuffle or grouping); empty until first needed
  int64_t perm_epoch_ = -1;
};

}  // namespace mm::data
