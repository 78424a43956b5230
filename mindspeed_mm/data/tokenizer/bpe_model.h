// BpeModel: Hugging Face's BPE model (tokenizers/src/models/bpe), merge for merge: symbols
// start as the word's characters, and the lowest-ranked adjacent pair is merged until none is
// left (ties go to the leftmost pair). Supports ignore_merges, byte_fallback (<0xNN> tokens),
// unk_token with fuse_unk, continuing_subword_prefix and end_of_word_suffix. Dropout is not
// supported (tokenizer.json files for training use none).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mindspeed_mm/data/tokenizer/model.h"
#include "mindspeed_mm/data/tokenizer/word_cache.h"

namespace mm::data {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel : public Model {
 public:
  // `merges` in rank order. A merge whose parts or result are not in the vocabulary is an
  // mm::Error, as it is in HF.
  BpeModel(std::unordered_map<std::string, int64_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  BpeModel(const BpeModel& other);

  // Appends the ids of one pre-tokenized word (valid UTF-8, already byte-level mapped when
  // the pipeline uses ByteLevel).
  void tokenize(std::string_view word, std::vector<int64_t>& out) const override;

  std::optional<int64_t> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(int64_t id) const override;
  int64_t id_bound() const override { return static_cast<int64_t>(id_to_token_.size()); }
  size_t vocab_len() const override { return vocab_.size(); }

 private:
  void merge_word(std::string_view word, std::vector<int64_t>& out) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<const std::string*> id_to_token_;  // into vocab_'s keys; null for holes
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges_;
  BpeOptions options_;

  // Words seen before: HF keeps the same kind of cache (10,000 words under 256 bytes).
  WordCache cache_;
};

}  // namespace mm::data
