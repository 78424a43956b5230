// WordCache: ids of words seen before, shared by the threads of a batch encode. Like HF's
// Cache it holds a bounded number of short words and never blocks: a lookup or insert that
// finds its shard locked by another thread simply skips the cache.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mm::data {

class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;

  explicit WordCache(size_t capacity = 10000) : per_shard_(capacity / kShards + 1) {}
  WordCache(const WordCache& o) : per_shard_(o.per_shard_) {}  // copies start empty

  // Appends the cached ids of `word` to out and returns true, or returns false.
  bool lookup(std::string_view word, std::vector<int64_t>& out) const {
    if (word.size() >= kMaxWordBytes) return false;
    Shard& s = shards_[shard_of(word)];
    std::shared_lock<std::shared_mutex> lock(s.mutex, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    auto it = s.map.find(std::string(word));  // heterogeneous lookup is C++20
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view word, const int64_t* ids, size_t n) const {
    if (word.size() >= kMaxWordBytes) return;
    Shard& s = shards_[shard_of(word)];
    std::unique_lock<std::shared_mutex> lock(s.mutex, std::try_to_lock);
    if (!lock.owns_lock() || s.map.size() >= per_shard_) return;
    s.map.emplace(std::string(word), std::vector<int64_t>(ids, ids + n));
  }

 private:
  static constexpr size_t kShards = 64;
  struct Shard {
    std::shared_mutex mutex;
    std::unordered_map<std::string, std::vector<int64_t>> map;
  };
  static size_t shard_of(std::string_view w) { return (std::hash<std::string_view>()(w) >> 7) % kShards; }

  size_t per_shard_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace mm::data
