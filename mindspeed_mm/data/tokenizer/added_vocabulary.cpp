// Added-token matching, ported from tokenizers/src/tokenizer/added_vocabulary.rs (find_matches).
#include "mindspeed_mm/data/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

void AddedVocabulary::build(const std::vector<std::string>& normalized_patterns) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    display_.push_back(t.normalized ? normalized_patterns[i] : t.content);
    by_content_.emplace(t.content, i);
    by_id_.emplace(t.id, i);
    if (t.special) special_.insert(t.content);
    if (t.content.empty()) continue;  // HF ignores empty added tokens
    Trie& trie = t.normalized ? normalized_ : raw_;
    const std::string& pat = t.normalized ? normalized_patterns[i] : t.content;
    if (pat.empty()) continue;
    trie.patterns.push_back(pat);
    trie.token_index.push_back(i);
  }
  for (Trie* trie : {&raw_, &normalized_}) {
    for (size_t p = 0; p < trie->patterns.size(); ++p)
      trie->by_first_byte[static_cast<unsigned char>(trie->patterns[p][0])].push_back(p);
    for (auto& bucket : trie->by_first_byte)
      std::stable_sort(bucket.begin(), bucket.end(),
                       [&](size_t a, size_t b) { return trie->patterns[a].size() > trie->patterns[b].size(); });
  }
}

namespace {
// The code point that ends text (valid UTF-8, non-empty).
char32_t last_char(std::string_view text) {
  size_t i = text.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  return unicode::decode_at(text, i);
}
}  // namespace

void AddedVocabulary::split(std::string_view s, bool normalized_pass, std::vector<Segment>& out, bool at_start) const {
  const Trie& trie = normalized_pass ? normalized_ : raw_;
  auto push_text = [&](size_t b, size_t e) {
    if (e > b) out.push_back({std::string(s.substr(b, e - b)), -1, at_start && b == 0});
  };
  if (trie.patterns.empty()) {
    push_text(0, s.size());
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    // Leftmost-longest: the first position with any match, its longest pattern.
    const auto& bucket = trie.by_first_byte[static_cast<unsigned char>(s[pos])];
    const size_t* hit = nullptr;
    for (const size_t& p : bucket) {
      const std::string& pat = trie.patterns[p];
      if (s.compare(pos, pat.size(), pat) == 0) {
        hit = &p;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + trie.patterns[*hit].size();
    pos = stop;  // the search resumes after this match even when it is discarded below
    const AddedToken& tok = tokens_[trie.token_index[*hit]];
    if (tok.single_word) {
      bool start_space = start == 0 || !unicode::is_word_char(last_char(s.substr(0, start)));
      bool stop_space = stop == s.size() || !unicode::is_word_char(unicode::decode_at(s, stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t newstart = start;
      while (newstart > 0) {
        size_t b = newstart - 1;
        while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
        if (!unicode::is_whitespace(unicode::decode_at(s, b))) break;
        newstart = b;
      }
      start = std::max(newstart, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size() && unicode::is_whitespace(unicode::decode_at(s, stop))) stop += unicode::char_len(s, stop);
    }
    if (start_offset < start) push_text(start_offset, start);
    out.push_back({std::string(s.substr(start, stop - start)), tok.id, at_start && start == 0});
    start_offset = stop;
  }
  if (start_offset < s.size()) push_text(start_offset, s.size());
}

std::optional<int64_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

const AddedToken* AddedVocabulary::by_id(int64_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const std::string* AddedVocabulary::text_of(int64_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &display_[it->second];
}

int64_t AddedVocabulary::id_bound() const {
  int64_t b = 0;
  for (const auto& t : tokens_) b = std::max(b, t.id + 1);
  return b;
}

}  // namespace mm::data
