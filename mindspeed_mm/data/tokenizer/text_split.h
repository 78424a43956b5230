// NormalizedString::split of HF's tokenizers on our Piece type: a text is cut into matches and
// the gaps between them, and the five SplitDelimiterBehavior values decide which parts are
// kept, isolated or merged. Shared by the pre-tokenizers and the Metaspace pre-tokenizer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/tokenizer/components.h"
#include "mindspeed_mm/data/tokenizer/unicode_regex.h"

namespace mm::data {

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous" (any case, as
// the Python bindings accept "isolated"); mm::Error naming `source` otherwise.
SplitBehavior parse_split_behavior(const std::string& name, const std::string& source);

using Matches = std::vector<std::pair<size_t, size_t>>;  // [begin, end) byte ranges, in order

// Appends the non-empty parts of `piece` to `out`; a part is at_start when the piece is and
// the part begins at byte 0.
void split_piece(const Piece& piece, const Matches& matches, bool invert, SplitBehavior behavior,
                 std::vector<Piece>& out);

// Every character for which `pred` holds is a match of its own (HF's Pattern for Fn(char)).
Matches char_matches(const std::string& text, const std::function<bool(char32_t)>& pred);
// Non-overlapping occurrences of `literal`, left to right.
Matches literal_matches(const std::string& text, const std::string& literal);

// The "pattern" of Split, Replace (normalizer and decoder): {"String": s}, matched literally,
// or {"Regex": r}, Oniguruma syntax (see unicode_regex.h).
class TextPattern {
 public:
  // mm::Error naming `source` and `what` (e.g. "Replace pattern") for any other shape.
  static TextPattern parse(const nlohmann::json& j, const std::string& source, const char* what);
  Matches find(const std::string& text) const { return regex_ ? regex_->find_all(text) : literal_matches(text, literal_); }
  // Every match replaced by `content`.
  std::string replace(const std::string& text, const std::string& content) const;

 private:
  std::shared_ptr<const UnicodeRegex> regex_;
  std::string literal_;
};

}  // namespace mm::data
