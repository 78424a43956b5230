// BPE merges with a priority queue, ported from tokenizers/src/models/bpe/word.rs so that
// the order of merges (and with it every id) is the same as Hugging Face's.
#include "mindspeed_mm/data/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

namespace {
uint64_t pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }
}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int64_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    MM_CHECK(id >= 0 && id < (int64_t(1) << 31), "tokenizer: vocabulary id ", id, " of '", tok, "' is out of range");
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(max_id + 1, nullptr);
  for (const auto& kv : vocab_) id_to_token_[kv.second] = &kv.first;

  size_t prefix_len = options_.continuing_subword_prefix ? options_.continuing_subword_prefix->size() : 0;
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    MM_CHECK(ia != vocab_.end(), "tokenizer: merge ", rank, " ('", a, " ", b, "') uses '", a, "', which is not in the vocabulary");
    MM_CHECK(ib != vocab_.end(), "tokenizer: merge ", rank, " ('", a, " ", b, "') uses '", b, "', which is not in the vocabulary");
    std::string merged = a + (prefix_len <= b.size() ? b.substr(prefix_len) : std::string());
    auto im = vocab_.find(merged);
    MM_CHECK(im != vocab_.end(), "tokenizer: merge ", rank, " ('", a, " ", b, "') makes '", merged,
             "', which is not in the vocabulary");
    // HF collects merges into a HashMap: a repeated pair keeps its last rank.
    merges_[pair_key(ia->second, ib->second)] = {static_cast<uint32_t>(rank), static_cast<uint32_t>(im->second)};
  }
}

BpeModel::BpeModel(const BpeModel& o) : Model(), vocab_(o.vocab_), merges_(o.merges_), options_(o.options_) {
  id_to_token_.assign(o.id_to_token_.size(), nullptr);
  for (const auto& kv : vocab_) id_to_token_[kv.second] = &kv.first;
}

std::optional<int64_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(id_to_token_.size())) return nullptr;
  return id_to_token_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (cache_.lookup(word, out)) return;
  size_t start = out.size();
  merge_word(word, out);
  cache_.insert(word, out.data() + start, out.size() - start);
}

void BpeModel::merge_word(std::string_view w, std::vector<int64_t>& out) const {
  struct Symbol {
    int64_t id;
    int64_t prev, next;
    size_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&](int64_t id, size_t len) {
    int64_t n = static_cast<int64_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };

  // Initial symbols: one per character, as in BPE::merge_word.
  int64_t unk_id = -1;  // a pending unk token (fused runs grow unk_len)
  size_t unk_len = 0;
  std::string piece;
  for (size_t i = 0; i < w.size();) {
    size_t n = unicode::char_len(w, i);
    bool is_first = i == 0, is_last = i + n >= w.size();
    piece.clear();
    if (!is_first && options_.continuing_subword_prefix) piece += *options_.continuing_subword_prefix;
    piece.append(w.substr(i, n));
    if (is_last && options_.end_of_word_suffix) piece += *options_.end_of_word_suffix;
    i += n;
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(it->second, n);
      continue;
    }
    if (options_.byte_fallback) {
      std::vector<int64_t> bytes;
      char name[8];
      for (unsigned char b : piece) {
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        auto bt = vocab_.find(name);
        if (bt == vocab_.end()) break;
        bytes.push_back(bt->second);
      }
      if (bytes.size() == piece.size()) {
        // HF adds the byte tokens without first flushing a pending unk (it follows them).
        for (int64_t id : bytes) add(id, 1);
        continue;
      }
    }
    if (options_.unk_token) {
      auto ut = vocab_.find(*options_.unk_token);
      MM_CHECK(ut != vocab_.end(), "tokenizer: unk_token '", *options_.unk_token, "' is not in the vocabulary");
      if (unk_id >= 0 && options_.fuse_unk) {
        unk_len += n;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = ut->second;
        unk_len = n;
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  // Merge the lowest-ranked pair first; among equal ranks the leftmost.
  struct Merge {
    size_t pos;
    uint32_t rank;
    uint32_t new_id;
    bool operator<(const Merge& o) const {  // inverted: std::priority_queue is a max-heap
      if (rank != o.rank) return rank > o.rank;
      return pos > o.pos;
    }
  };
  auto find_merge = [&](int64_t a, int64_t b) -> const std::pair<uint32_t, uint32_t>* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Merge> initial;
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    if (auto m = find_merge(symbols[i].id, symbols[i + 1].id)) initial.push_back({i, m->first, m->second});
  std::priority_queue<Merge> queue(std::less<Merge>(), std::move(initial));
  while (!queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    size_t next_pos = static_cast<size_t>(cur.next);
    Symbol right = symbols[next_pos];
    auto m = find_merge(cur.id, right.id);
    if (!m || m->second != top.new_id) continue;  // an expired entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && static_cast<size_t>(right.next) < symbols.size())
      symbols[right.next].prev = static_cast<int64_t>(top.pos);
    if (cur.prev >= 0) {
      if (auto pm = find_merge(symbols[cur.prev].id, cur.id))
        queue.push({static_cast<size_t>(cur.prev), pm->first, pm->second});
    }
    if (cur.next >= 0 && static_cast<size_t>(cur.next) < symbols.size()) {
      if (auto nm = find_merge(cur.id, symbols[cur.next].id)) queue.push({top.pos, nm->first, nm->second});
    }
  }
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

}  // namespace mm::data
