// The Darts double-array lookup of spm_precompiled (huggingface/spm_precompiled, src/lib.rs),
// bit for bit: a unit holds a label (bits 0-7 and 31), a leaf flag (bit 8) and an offset
// (bits 10-31, shifted left by 8 when bit 9 is set).
#include "mindspeed_mm/data/tokenizer/precompiled_charsmap.h"

#include <cstring>
#include <vector>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

namespace {
bool has_leaf(uint32_t u) { return ((u >> 8) & 1) == 1; }
uint32_t value(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t label(uint32_t u) { return u & ((1u << 31) | 0xFFu); }
size_t offset(uint32_t u) { return static_cast<size_t>(u >> 10) << ((u & (1u << 9)) >> 6); }
}  // namespace

PrecompiledCharsmap::PrecompiledCharsmap(std::string blob, const std::string& source) {
  if (blob.size() < 4) throw Error(cat(source, ": precompiled_charsmap is ", blob.size(), " bytes, too short"));
  uint32_t trie_bytes = 0;
  for (int k = 3; k >= 0; --k) trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>(blob[k]);
  size_t units = trie_bytes / 4;
  if (4 + units * 4 > blob.size())
    throw Error(cat(source, ": precompiled_charsmap declares a ", trie_bytes, "-byte trie but holds ", blob.size() - 4,
                    " bytes"));
  trie_.resize(units);
  for (size_t i = 0; i < units; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(blob.data() + 4 + 4 * i);
    trie_[i] = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
  }
  normalized_ = blob.substr(4 + units * 4);
  if (!unicode::is_valid_utf8(normalized_))
    throw Error(cat(source, ": precompiled_charsmap's replacement strings are not valid UTF-8"));
}

void PrecompiledCharsmap::check_for_sentencepiece(const std::string& blob, const std::string& source) {
  if (blob.empty()) return;
  const PrecompiledCharsmap m(blob, source);
  const std::vector<uint32_t>& t = m.trie_;
  auto bad = [&](const std::string& what) {
    throw Error(cat(source, ": precompiled_charsmap is not a usable trie (", what, ")"));
  };
  if (t.empty() || t.size() % 256 != 0) bad(cat(t.size(), " units, not whole 256-unit blocks"));
  std::vector<bool> seen(t.size(), false);
  std::vector<size_t> todo = {offset(t[0])};
  while (!todo.empty()) {
    const size_t node = todo.back();
    todo.pop_back();
    if ((node | 0xFFu) >= t.size()) bad(cat("node ", node, " is past the end"));
    if (seen[node]) continue;
    seen[node] = true;
    for (uint32_t c = 1; c < 256; ++c) {
      const uint32_t unit = t[node ^ c];
      if (label(unit) != c) continue;
      const size_t child = (node ^ c) ^ offset(unit);
      if (child >= t.size()) bad(cat("a child of node ", node, " is past the end"));
      if (has_leaf(unit) && value(t[child]) >= m.normalized_.size()) bad("a replacement is past the strings");
      todo.push_back(child);
    }
  }
}

std::optional<std::string_view> PrecompiledCharsmap::transform(std::string_view chunk) const {
  if (trie_.empty()) return std::nullopt;
  size_t node = offset(trie_[0]);
  for (unsigned char c : chunk) {
    if (c == 0) break;
    node ^= c;
    if (node >= trie_.size()) return std::nullopt;
    uint32_t unit = trie_[node];
    if (label(unit) != c) return std::nullopt;
    node ^= offset(unit);
    if (node >= trie_.size()) return std::nullopt;
    if (has_leaf(unit)) {  // the first (shortest) key found is the one HF uses
      size_t index = value(trie_[node]);
      if (index > normalized_.size()) return std::nullopt;
      size_t end = normalized_.find('\0', index);
      if (end == std::string::npos) end = normalized_.size();
      return std::string_view(normalized_).substr(index, end - index);
    }
  }
  return std::nullopt;
}

std::string PrecompiledCharsmap::normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  std::vector<size_t> g = unicode::grapheme_starts(text);
  for (size_t k = 0; k + 1 < g.size(); ++k) {
    std::string_view grapheme = text.substr(g[k], g[k + 1] - g[k]);
    if (grapheme.size() < 6) {
      if (auto n = transform(grapheme)) {
        out.append(*n);
        continue;
      }
    }
    for (size_t i = 0; i < grapheme.size();) {
      size_t len = unicode::char_len(grapheme, i);
      std::string_view ch = grapheme.substr(i, len);
      if (auto n = transform(ch)) {
        out.append(*n);
      } else {
        out.append(ch);
      }
      i += len;
    }
  }
  return out;
}

std::string decode_base64(std::string_view text, const std::string& source) {
  auto value_of = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] != '='; ++i) {
    int v = value_of(text[i]);
    if (v < 0) throw Error(cat(source, ": invalid base64 character at offset ", i));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  for (; i < text.size(); ++i)
    if (text[i] != '=') throw Error(cat(source, ": invalid base64 (data after padding at offset ", i, ")"));
  return out;
}

std::string encode_base64(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace mm::data
