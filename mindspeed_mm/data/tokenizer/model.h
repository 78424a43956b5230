// The model stage of a tokenizer.json: one pre-tokenized word in, ids out.
//   BPE        bpe_model.h      (merges, byte_fallback, ignore_merges, prefixes and suffixes)
//   WordPiece  wordpiece_model.cpp (greedy longest-match-first with "##" continuations)
//   WordLevel  wordpiece_model.cpp (whole words, else unk)
//   Unigram    unigram_model.cpp   (Viterbi over the piece scores, SentencePiece style)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mm::data {

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-tokenized word (valid UTF-8, non-empty).
  virtual void tokenize(std::string_view word, std::vector<int64_t>& out) const = 0;
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  // nullptr when the id is not in the vocabulary.
  virtual const std::string* id_to_token(int64_t id) const = 0;
  // One past the largest id in the vocabulary.
  virtual int64_t id_bound() const = 0;
  // The number of entries (HF's get_vocab_size; below id_bound() when ids have holes).
  virtual size_t vocab_len() const = 0;
};

// A token -> id vocabulary with the reverse lookup the models share.
class Vocab {
 public:
  Vocab() = default;
  // Ids must be in [0, 2^31); `source` names the file in errors.
  Vocab(std::unordered_map<std::string, int64_t> map, const std::string& source);
  Vocab(const Vocab& o) : Vocab(o.map_, "") {}
  Vocab& operator=(const Vocab&) = delete;
  std::optional<int64_t> find(std::string_view token) const {
    auto it = map_.find(std::string(token));
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* token(int64_t id) const {
    return id < 0 || id >= static_cast<int64_t>(by_id_.size()) ? nullptr : by_id_[id];
  }
  int64_t id_bound() const { return static_cast<int64_t>(by_id_.size()); }
  size_t size() const { return map_.size(); }

 private:
  std::unordered_map<std::string, int64_t> map_;
  std::vector<const std::string*> by_id_;  // into map_'s keys; null for holes
};

// WordPiece (models/wordpiece): greedy longest match from the left, continuation pieces
// carry `prefix`; a word with an unmatchable rest, or longer than max_chars characters, is
// the unk token alone.
std::unique_ptr<Model> make_wordpiece_model(Vocab vocab, std::string unk_token, std::string prefix,
                                            size_t max_chars);
// WordLevel (models/wordlevel): the word's id, else unk_token's.
std::unique_ptr<Model> make_wordlevel_model(Vocab vocab, std::string unk_token);
// Unigram (models/unigram): pieces with log-probability scores, id = position; the best
// segmentation by Viterbi, unknown characters scored min_score - 10 and fused into one unk;
// with byte_fallback an unknown piece becomes its <0xNN> byte tokens.
std::unique_ptr<Model> make_unigram_model(std::vector<std::pair<std::string, double>> pieces,
                                          std::optional<int64_t> unk_id, bool byte_fallback,
                                          const std::string& source);

// The tokenizer.json "model" object; mm::Error naming `source` for an unknown type, BPE
// dropout, a missing unk token, or a malformed vocabulary.
std::unique_ptr<Model> make_model(const nlohmann::json& m, const std::string& source);

}  // namespace mm::data
