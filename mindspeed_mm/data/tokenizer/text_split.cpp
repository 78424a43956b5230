// Split behaviours, ported from NormalizedString::split (tokenizers/src/tokenizer/normalizer.rs).
#include "mindspeed_mm/data/tokenizer/text_split.h"

#include <algorithm>
#include <cctype>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

SplitBehavior parse_split_behavior(const std::string& name, const std::string& source) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "removed") return SplitBehavior::Removed;
  if (lower == "isolated") return SplitBehavior::Isolated;
  if (lower == "mergedwithprevious" || lower == "merged_with_previous") return SplitBehavior::MergedWithPrevious;
  if (lower == "mergedwithnext" || lower == "merged_with_next") return SplitBehavior::MergedWithNext;
  if (lower == "contiguous") return SplitBehavior::Contiguous;
  throw Error(cat(source, ": split behavior '", name,
                  "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous"));
}

void split_piece(const Piece& piece, const Matches& found, bool invert, SplitBehavior behavior,
                 std::vector<Piece>& out) {
  const std::string& text = piece.text;
  struct Part {
    size_t b, e;
    bool is_match;
  };
  std::vector<Part> parts;
  if (text.empty()) {
    parts.push_back({0, 0, false});
  } else {
    parts.reserve(found.size() * 2 + 1);
    size_t prev = 0;
    for (auto [s, e] : found) {
      if (prev != s) parts.push_back({prev, s, invert});
      parts.push_back({s, e, !invert});
      prev = e;
    }
    if (prev != text.size()) parts.push_back({prev, text.size(), invert});
  }
  std::vector<std::pair<size_t, size_t>> keep;
  keep.reserve(parts.size());
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const auto& p : parts) keep.emplace_back(p.b, p.e);
      break;
    case SplitBehavior::Removed:
      for (const auto& p : parts)
        if (!p.is_match) keep.emplace_back(p.b, p.e);
      break;
    case SplitBehavior::Contiguous: {
      bool previous = false;
      for (const auto& p : parts) {
        if (p.is_match == previous && !keep.empty()) keep.back().second = p.e;
        else keep.emplace_back(p.b, p.e);
        previous = p.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool previous = false;
      for (const auto& p : parts) {
        if (p.is_match && !previous && !keep.empty()) keep.back().second = p.e;
        else keep.emplace_back(p.b, p.e);
        previous = p.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous && !keep.empty()) keep.back().first = it->b;
        else keep.emplace_back(it->b, it->e);
        previous = it->is_match;
      }
      std::reverse(keep.begin(), keep.end());
      break;
    }
  }
  for (auto [b, e] : keep)
    if (e > b) out.push_back({text.substr(b, e - b), piece.at_start && b == 0});
}

Matches char_matches(const std::string& text, const std::function<bool(char32_t)>& pred) {
  Matches m;
  for (size_t i = 0; i < text.size();) {
    size_t n = unicode::char_len(text, i);
    if (pred(unicode::decode_at(text, i))) m.emplace_back(i, i + n);
    i += n;
  }
  return m;
}

Matches literal_matches(const std::string& text, const std::string& lit) {
  Matches found;
  if (lit.empty()) return found;
  for (size_t pos = text.find(lit); pos != std::string::npos; pos = text.find(lit, pos + lit.size()))
    found.emplace_back(pos, pos + lit.size());
  return found;
}

TextPattern TextPattern::parse(const nlohmann::json& j, const std::string& source, const char* what) {
  TextPattern p;
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string())
    p.regex_ = std::make_shared<UnicodeRegex>(j["Regex"].get<std::string>());
  else if (j.is_object() && j.contains("String") && j["String"].is_string())
    p.literal_ = j["String"].get<std::string>();
  else
    throw Error(cat(source, ": ", what, " must be {\"Regex\": ...} or {\"String\": ...} (got ", j.dump(), ")"));
  return p;
}

std::string TextPattern::replace(const std::string& text, const std::string& content) const {
  Matches m = find(text);
  if (m.empty()) return text;
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (auto [b, e] : m) {
    out.append(text, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  return out;
}

}  // namespace mm::data
