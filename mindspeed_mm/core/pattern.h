// Module-path patterns, the language of plans (freeze, recompute, FSDP units, LoRA targets).
//
// A pattern and a path are split at dots and matched segment by segment:
//   {*}      any non-negative integer            model.layers.{*}
//   {a-b}    an integer in [a, b]                model.layers.{0-3}
//   {a,b,c}  one of the listed integers          model.layers.{0,5,11}
//   *        any run of characters in a segment  model.layers.{*}.*_proj,  *  (any one name)
//   ?        exactly one character               model.layers.{*}.mlp.?p_proj
// A pattern ending in ".**" also matches every path below its prefix.
#pragma once

#include <string>
#include <vector>

namespace mm {

class PathPattern {
 public:
  // Throws ConfigError for a malformed pattern (unbalanced braces, bad range).
  explicit PathPattern(const std::string& pattern);
  bool matches(const std::string& path) const;
  const std::string& str() const { return text_; }

 private:
  struct Segment {
    enum Kind { kGlob, kAnyIndex, kRange, kList, kDeep } kind = kGlob;
    std::string glob;
    long lo = 0, hi = 0;
    std::vector<long> list;
  };
  std::string text_;
  std::vector<Segment> segments_;
};

// True when any of `patterns` matches `path`.
// Splits a dotted module or config path into its segments ("a..b" gives an empty one).
std::vector<std::string> split_path(const std::string& path);

bool matches_any(const std::vector<PathPattern>& patterns, const std::string& path);
std::vector<PathPattern> compile_patterns(const std::vector<std::string>& patterns);

}  // namespace mm
