// AddedVocabulary: the "added_tokens" of a tokenizer.json, found in the input before anything
// else runs, exactly as HF's AddedVocabulary::extract_and_normalize does: first the tokens
// with normalized=false in the raw text, then the tokens with normalized=true in the
// normalized remainder. Matching is leftmost-longest; lstrip/rstrip swallow the whitespace
// beside a match, single_word discards matches touching a word character.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mm::data {

struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool single_word = false;
};

// A stretch of input: plain text still to tokenize, or one added token (id >= 0).
// at_start: the stretch begins at byte 0 of the original input.
struct Segment {
  std::string text;
  int64_t id = -1;
  bool at_start = false;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalize` gives the normalizer's output for the normalized=true tokens' patterns.
  template <class NormalizeFn>
  AddedVocabulary(std::vector<AddedToken> tokens, NormalizeFn normalize) : tokens_(std::move(tokens)) {
    std::vector<std::string> npatterns;
    for (const auto& t : tokens_) npatterns.push_back(t.normalized ? normalize(t.content) : t.content);
    build(npatterns);
  }

  // Splits one stretch of text on the raw-text tokens (normalized_pass=false) or on the
  // normalized tokens (true). Empty stretches are dropped. A part is at_start when `at_start`
  // is set and the part begins at byte 0.
  void split(std::string_view text, bool normalized_pass, std::vector<Segment>& out, bool at_start = false) const;

  std::optional<int64_t> token_to_id(std::string_view content) const;
  const AddedToken* by_id(int64_t id) const;
  // The text HF's id_to_token and decode give for an added id: the normalized content for a
  // normalized=true token whose normalization changes it, else the content.
  const std::string* text_of(int64_t id) const;
  bool is_special(std::string_view content) const { return special_.count(std::string(content)) > 0; }
  int64_t id_bound() const;  // one past the largest id
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Trie {  // patterns by first byte, longest first: leftmost-longest in one scan
    std::vector<std::string> patterns;
    std::vector<size_t> token_index;
    std::vector<std::vector<size_t>> by_first_byte = std::vector<std::vector<size_t>>(256);
  };
  void build(const std::vector<std::string>& normalized_patterns);

  std::vector<AddedToken> tokens_;
  std::vector<std::string> display_;  // per token, see text_of
  std::unordered_map<std::string, size_t> by_content_;
  std::unordered_map<int64_t, size_t> by_id_;
  std::unordered_set<std::string> special_;
  Trie raw_, normalized_;
};

}  // namespace mm::data
