// WordPiece and WordLevel, ported from tokenizers/src/models/{wordpiece,wordlevel}/mod.rs.
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/model.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"
#include "mindspeed_mm/data/tokenizer/word_cache.h"

namespace mm::data {

Vocab::Vocab(std::unordered_map<std::string, int64_t> map, const std::string& source) : map_(std::move(map)) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : map_) {
    MM_CHECK(id >= 0 && id < (int64_t(1) << 31), source, (source.empty() ? "" : ": "), "vocabulary id ", id,
             " of '", tok, "' is out of range");
    max_id = std::max(max_id, id);
  }
  by_id_.assign(max_id + 1, nullptr);
  for (const auto& kv : map_) by_id_[kv.second] = &kv.first;
}

namespace {

class WordPieceModel : public Model {
 public:
  WordPieceModel(Vocab vocab, std::string unk, std::string prefix, size_t max_chars)
      : vocab_(std::move(vocab)), unk_(std::move(unk)), prefix_(std::move(prefix)), max_chars_(max_chars) {}

  void tokenize(std::string_view word, std::vector<int64_t>& out) const override {
    if (cache_.lookup(word, out)) return;
    size_t first = out.size();
    size_t chars = 0;
    for (size_t i = 0; i < word.size(); i += unicode::char_len(word, i)) ++chars;
    bool bad = chars > max_chars_;
    std::string candidate;
    for (size_t start = 0; start < word.size() && !bad;) {
      size_t end = word.size();
      std::optional<int64_t> hit;
      while (start < end) {
        candidate.assign(start > 0 ? prefix_ : std::string());
        candidate.append(word.substr(start, end - start));
        if ((hit = vocab_.find(candidate))) break;
        // Drop the last character of the candidate (of the word, since the prefix comes first).
        size_t p = end - 1;
        while (p > start && (static_cast<unsigned char>(word[p]) & 0xC0) == 0x80) --p;
        end = p;
      }
      if (!hit) {
        bad = true;
        break;
      }
      out.push_back(*hit);
      start = end;
    }
    if (bad) {
      out.resize(first);
      out.push_back(unk_id());
    }
    cache_.insert(word, out.data() + first, out.size() - first);
  }

  std::optional<int64_t> token_to_id(std::string_view t) const override { return vocab_.find(t); }
  const std::string* id_to_token(int64_t id) const override { return vocab_.token(id); }
  int64_t id_bound() const override { return vocab_.id_bound(); }
  size_t vocab_len() const override { return vocab_.size(); }

 private:
  int64_t unk_id() const {
    auto id = vocab_.find(unk_);
    if (!id) throw Error(cat("tokenizer: WordPiece unk_token '", unk_, "' is not in the vocabulary"));
    return *id;
  }
  Vocab vocab_;
  std::string unk_, prefix_;
  size_t max_chars_;
  WordCache cache_;
};

class WordLevelModel : public Model {
 public:
  WordLevelModel(Vocab vocab, std::string unk) : vocab_(std::move(vocab)), unk_(std::move(unk)) {}
  void tokenize(std::string_view word, std::vector<int64_t>& out) const override {
    if (auto id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }
    auto unk = vocab_.find(unk_);
    if (!unk) throw Error(cat("tokenizer: WordLevel word '", word, "' is not in the vocabulary and unk_token '", unk_,
                              "' is not either"));
    out.push_back(*unk);
  }
  std::optional<int64_t> token_to_id(std::string_view t) const override { return vocab_.find(t); }
  const std::string* id_to_token(int64_t id) const override { return vocab_.token(id); }
  int64_t id_bound() const override { return vocab_.id_bound(); }
  size_t vocab_len() const override { return vocab_.size(); }

 private:
  Vocab vocab_;
  std::string unk_;
};

}  // namespace

std::unique_ptr<Model> make_wordpiece_model(Vocab vocab, std::string unk_token, std::string prefix, size_t max_chars) {
  return std::make_unique<WordPieceModel>(std::move(vocab), std::move(unk_token), std::move(prefix), max_chars);
}

std::unique_ptr<Model> make_wordlevel_model(Vocab vocab, std::string unk_token) {
  return std::make_unique<WordLevelModel>(std::move(vocab), std::move(unk_token));
}

}  // namespace mm::data
