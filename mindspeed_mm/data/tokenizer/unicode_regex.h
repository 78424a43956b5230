// UnicodeRegex: the Oniguruma-syntax patterns of tokenizer.json (`\p{L}`, `\p{N}`, `\s`,
// `(?i:...)`, `(?!...)`) compiled with PCRE2 in UTF + UCP mode, and searched the way the
// Rust `onig` crate's find_iter walks a string, so Split and ByteLevel see the same matches.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mm::data {

class UnicodeRegex {
 public:
  // Throws mm::Error naming the pattern when PCRE2 rejects it.
  explicit UnicodeRegex(const std::string& onig_pattern);

  // Non-overlapping matches of valid UTF-8 text, left to right, as [begin, end) byte offsets.
  // As in onig's find_iter, an empty match right after the previous match is skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

  // Oniguruma's `\s` is [\t-\r\x{85}\p{Z}]; PCRE2's UCP `\s` also takes U+180E. Rewrites
  // `\s`/`\S` to the Oniguruma set and Ruby's `\h`/`\H` (hex digit) to classes; the rest
  // passes through (`\S` or `\H` inside a [...] class and nested classes are not rewritten).
  static std::string translate(const std::string& onig_pattern);

 private:
  std::string pattern_;
  std::shared_ptr<void> code_;  // pcre2_code_8, freed with pcre2_code_free
};

}  // namespace mm::data
