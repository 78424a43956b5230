// Unigram, ported from tokenizers/src/models/unigram/model.rs (encode_optimized, which follows
// SentencePiece's unigram_model.cc): one pass over byte positions keeps, for each position,
// the best-scoring path ending there; ties keep the first candidate seen (shorter pieces are
// seen first, the unk candidate last).
#include <cmath>
#include <limits>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/model.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"
#include "mindspeed_mm/data/tokenizer/word_cache.h"

namespace mm::data {

namespace {

constexpr double kUnkPenalty = 10.0;

// A byte trie: child lookups go through one hash map keyed by (node << 8 | byte).
class ByteTrie {
 public:
  ByteTrie() : value_(1, -1) {}
  void insert(std::string_view key, int64_t value) {
    uint32_t node = 0;
    for (unsigned char c : key) {
      uint64_t k = (uint64_t(node) << 8) | c;
      auto it = children_.find(k);
      if (it == children_.end()) {
        it = children_.emplace(k, static_cast<uint32_t>(value_.size())).first;
        value_.push_back(-1);
      }
      node = it->second;
    }
    value_[node] = value;
  }
  // Calls f(length, value) for every key that prefixes text, shortest first.
  template <class F>
  void common_prefixes(std::string_view text, F f) const {
    uint32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      auto it = children_.find((uint64_t(node) << 8) | static_cast<unsigned char>(text[i]));
      if (it == children_.end()) return;
      node = it->second;
      if (value_[node] >= 0) f(i + 1, value_[node]);
    }
  }

 private:
  std::unordered_map<uint64_t, uint32_t> children_;
  std::vector<int64_t> value_;
};

class UnigramModel : public Model {
 public:
  UnigramModel(std::vector<std::pair<std::string, double>> pieces, std::optional<int64_t> unk_id, bool byte_fallback,
               const std::string& source)
      : pieces_(std::move(pieces)), unk_id_(unk_id), byte_fallback_(byte_fallback) {
    if (unk_id_) {
      MM_CHECK(!pieces_.empty(), source, ": Unigram vocabulary is empty");
      MM_CHECK(*unk_id_ >= 0 && *unk_id_ < static_cast<int64_t>(pieces_.size()), source, ": Unigram unk_id ",
               *unk_id_, " is outside the vocabulary of ", pieces_.size());
    }
    min_score_ = std::numeric_limits<double>::infinity();
    for (size_t id = 0; id < pieces_.size(); ++id) {
      const auto& [tok, score] = pieces_[id];
      ids_[tok] = static_cast<int64_t>(id);  // a repeated piece keeps its last id, as in HF
      min_score_ = std::min(min_score_, score);
    }
    for (const auto& [tok, id] : ids_) trie_.insert(tok, id);
  }

  void tokenize(std::string_view word, std::vector<int64_t>& out) const override {
    if (word.empty() || cache_.lookup(word, out)) return;
    size_t first = out.size();
    for (auto [b, e] : segment(word)) {
      std::string_view piece = word.substr(b, e - b);
      auto it = ids_.find(std::string(piece));
      if (it != ids_.end()) {
        out.push_back(it->second);
        continue;
      }
      if (byte_fallback_ && push_bytes(piece, out)) continue;
      if (!unk_id_) throw Error(cat("tokenizer: Unigram model has no unk_id for '", piece, "'"));
      out.push_back(*unk_id_);
    }
    cache_.insert(word, out.data() + first, out.size() - first);
  }

  std::optional<int64_t> token_to_id(std::string_view t) const override {
    auto it = ids_.find(std::string(t));
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* id_to_token(int64_t id) const override {
    return id < 0 || id >= static_cast<int64_t>(pieces_.size()) ? nullptr : &pieces_[id].first;
  }
  int64_t id_bound() const override { return static_cast<int64_t>(pieces_.size()); }
  size_t vocab_len() const override { return pieces_.size(); }

 private:
  // The best segmentation as [begin, end) byte ranges; adjacent unk pieces are fused.
  std::vector<std::pair<size_t, size_t>> segment(std::string_view s) const {
    struct Node {
      int64_t id = 0;
      double score = 0.0;
      int64_t starts_at = -1;  // -1: no path ends here yet
    };
    const double unk_score = min_score_ - kUnkPenalty;
    std::vector<Node> best(s.size() + 1);
    for (size_t pos = 0; pos < s.size();) {
      double here = best[pos].score;
      size_t mblen = unicode::char_len(s, pos);
      bool has_single = false;
      trie_.common_prefixes(s.substr(pos), [&](size_t len, int64_t id) {
        Node& target = best[pos + len];
        double candidate = pieces_[id].second + here;
        if (target.starts_at < 0 || candidate > target.score) target = {id, candidate, static_cast<int64_t>(pos)};
        if (len == mblen) has_single = true;
      });
      if (!has_single) {
        Node& target = best[pos + mblen];
        double candidate = unk_score + here;
        if (target.starts_at < 0 || candidate > target.score) {
          if (!unk_id_)
            throw Error(cat("tokenizer: Unigram model has no unk_id for '", s.substr(pos, mblen), "'"));
          target = {*unk_id_, candidate, static_cast<int64_t>(pos)};
        }
      }
      pos += mblen;
    }
    std::vector<std::pair<size_t, size_t>> result;
    size_t end = s.size();
    int64_t unk_end = -1;  // the end of a run of unk pieces being fused
    while (end > 0) {
      const Node& n = best[end];
      size_t start = static_cast<size_t>(n.starts_at);
      bool unk = unk_id_ && n.id == *unk_id_;
      if (unk) {
        if (unk_end < 0) unk_end = static_cast<int64_t>(end);
      } else {
        if (unk_end >= 0) {
          result.emplace_back(end, static_cast<size_t>(unk_end));
          unk_end = -1;
        }
        result.emplace_back(start, end);
      }
      end = start;
    }
    if (unk_end >= 0) result.emplace_back(0, static_cast<size_t>(unk_end));
    std::reverse(result.begin(), result.end());
    return result;
  }

  bool push_bytes(std::string_view piece, std::vector<int64_t>& out) const {
    std::vector<int64_t> bytes;
    char name[8];
    for (unsigned char b : piece) {
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = ids_.find(name);
      if (it == ids_.end()) return false;
      bytes.push_back(it->second);
    }
    out.insert(out.end(), bytes.begin(), bytes.end());
    return true;
  }

  std::vector<std::pair<std::string, double>> pieces_;
  std::unordered_map<std::string, int64_t> ids_;
  ByteTrie trie_;
  std::optional<int64_t> unk_id_;
  bool byte_fallback_;
  double min_score_;
  WordCache cache_;
};

}  // namespace

std::unique_ptr<Model> make_unigram_model(std::vector<std::pair<std::string, double>> pieces,
                                          std::optional<int64_t> unk_id, bool byte_fallback, const std::string& source) {
  return std::make_unique<UnigramModel>(std::move(pieces), unk_id, byte_fallback, source);
}

}  // namespace mm::data
