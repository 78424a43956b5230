// Pre-tokenizers, each ported from tokenizers/src/pre_tokenizers/*.rs.
#include <array>
#include <unordered_map>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/components.h"
#include "mindspeed_mm/data/tokenizer/json_fields.h"
#include "mindspeed_mm/data/tokenizer/text_split.h"
#include "mindspeed_mm/data/tokenizer/unicode_regex.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

using nlohmann::json;
using namespace json_fields;

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes take
// the code points 256, 257, ... in byte order.
struct ByteLevelTable {
  std::array<std::string, 256> chars;
  std::unordered_map<char32_t, unsigned char> bytes;
  ByteLevelTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      unicode::append_utf8(chars[b], cp);
      bytes[cp] = static_cast<unsigned char>(b);
    }
  }
};
const ByteLevelTable& table() {
  static const ByteLevelTable t;
  return t;
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(TextPattern p, SplitBehavior b, bool invert) : pattern_(std::move(p)), behavior_(b), invert_(invert) {}
  void split(const Piece& piece, std::vector<Piece>& out) const override {
    split_piece(piece, pattern_.find(piece.text), invert_, behavior_, out);
  }

 private:
  TextPattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  bool add_prefix_space = true;
  bool use_regex = true;
  void split(const Piece& piece, std::vector<Piece>& out) const override {
    static const UnicodeRegex gpt2(kGpt2Pattern);
    Piece p{add_prefix_space && (piece.text.empty() || piece.text[0] != ' ') ? " " + piece.text : piece.text,
            piece.at_start};
    std::vector<Piece> words;
    if (use_regex) split_piece(p, gpt2.find_all(p.text), false, SplitBehavior::Isolated, words);
    else if (!p.text.empty()) words.push_back(std::move(p));
    const auto& t = table();
    for (auto& w : words) {
      std::string mapped;
      mapped.reserve(w.text.size() * 2);
      for (unsigned char b : w.text) mapped += t.chars[b];
      out.push_back({std::move(mapped), w.at_start});
    }
  }
};

// Metaspace: spaces become the replacement character (U+2581), which is prepended to the
// piece per prepend_scheme; with split, each replacement starts a new piece.
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspaceOptions o;
  void split(const Piece& piece, std::vector<Piece>& out) const override {
    Piece p{std::string(), piece.at_start};
    p.text.reserve(piece.text.size() + 8);
    for (char c : piece.text) {
      if (c == ' ') p.text += o.replacement;
      else p.text += c;
    }
    bool starts = p.text.compare(0, o.replacement.size(), o.replacement) == 0;
    bool prepend = !p.text.empty() && !starts &&
                   (o.prepend == MetaspaceOptions::Prepend::Always ||
                    (o.prepend == MetaspaceOptions::Prepend::First && piece.at_start));
    if (prepend) p.text = o.replacement + p.text;
    if (o.split) split_piece(p, literal_matches(p.text, o.replacement), false, SplitBehavior::MergedWithNext, out);
    else if (!p.text.empty()) out.push_back(std::move(p));
  }
};

// Whitespace: the matches of `\w+|[^\w\s]+` (Rust regex, Unicode classes) are kept, the
// rest dropped. A scan over character classes gives the same matches.
class WhitespacePreTokenizer : public PreTokenizer {
 public:
  void split(const Piece& piece, std::vector<Piece>& out) const override {
    const std::string& t = piece.text;
    size_t i = 0;
    while (i < t.size()) {
      char32_t c = unicode::decode_at(t, i);
      if (unicode::is_whitespace(c)) {
        i += unicode::char_len(t, i);
        continue;
      }
      bool word = unicode::is_regex_word(c);
      size_t b = i;
      while (i < t.size()) {
        char32_t d = unicode::decode_at(t, i);
        bool same = word ? unicode::is_regex_word(d) : !unicode::is_regex_word(d) && !unicode::is_whitespace(d);
        if (!same) break;
        i += unicode::char_len(t, i);
      }
      out.push_back({t.substr(b, i - b), piece.at_start && b == 0});
    }
  }
};

// Splits on each character for which pred holds (WhitespaceSplit, BertPreTokenizer, Digits,
// Punctuation, CharDelimiterSplit).
class CharClassPreTokenizer : public PreTokenizer {
 public:
  CharClassPreTokenizer(std::function<bool(char32_t)> pred, SplitBehavior b) : pred_(std::move(pred)), behavior_(b) {}
  void split(const Piece& piece, std::vector<Piece>& out) const override {
    split_piece(piece, char_matches(piece.text, pred_), false, behavior_, out);
  }

 private:
  std::function<bool(char32_t)> pred_;
  SplitBehavior behavior_;
};

class PreTokenizerSequence : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> stages;
  void split(const Piece& piece, std::vector<Piece>& out) const override {
    std::vector<Piece> cur{piece}, next;
    for (const auto& s : stages) {
      next.clear();
      for (const auto& p : cur) s->split(p, next);
      cur.swap(next);
    }
    for (auto& p : cur)
      if (!p.text.empty()) out.push_back(std::move(p));
  }
};

std::unique_ptr<PreTokenizer> sequence_of(std::unique_ptr<PreTokenizer> a, std::unique_ptr<PreTokenizer> b) {
  auto seq = std::make_unique<PreTokenizerSequence>();
  seq->stages.push_back(std::move(a));
  seq->stages.push_back(std::move(b));
  return seq;
}

}  // namespace

const std::string& byte_level_char(unsigned char b) { return table().chars[b]; }

int byte_level_byte(char32_t cp) {
  const auto& bytes = table().bytes;
  auto it = bytes.find(cp);
  return it == bytes.end() ? -1 : it->second;
}

MetaspaceOptions parse_metaspace(const json& j, const std::string& source) {
  MetaspaceOptions o;
  std::string rep = string_or(j, "replacement", o.replacement);
  MM_CHECK(!rep.empty() && unicode::char_len(rep, 0) == rep.size(), source, ": Metaspace replacement '", rep,
           "' must be one character");
  o.replacement = rep;
  std::string scheme = string_or(j, "prepend_scheme", "always");
  if (scheme == "always") o.prepend = MetaspaceOptions::Prepend::Always;
  else if (scheme == "first") o.prepend = MetaspaceOptions::Prepend::First;
  else if (scheme == "never") o.prepend = MetaspaceOptions::Prepend::Never;
  else throw Error(cat(source, ": Metaspace prepend_scheme '", scheme, "' is not one of always, first, never"));
  if (j.contains("add_prefix_space") && !j["add_prefix_space"].is_null() && !j["add_prefix_space"].get<bool>()) {
    MM_CHECK(o.prepend == MetaspaceOptions::Prepend::Never || !j.contains("prepend_scheme"), source,
             ": Metaspace add_prefix_space false does not match prepend_scheme '", scheme, "'");
    o.prepend = MetaspaceOptions::Prepend::Never;
  }
  o.split = flag(j, "split", true);
  return o;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  std::string type = type_of(j, source, "pre_tokenizer");
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = flag(j, "add_prefix_space", true);
    p->use_regex = flag(j, "use_regex", true);
    return p;
  }
  if (type == "Split")
    return std::make_unique<SplitPreTokenizer>(
        TextPattern::parse(member(j, "pattern", source, "pre_tokenizer"), source, "Split pattern"),
        parse_split_behavior(member(j, "behavior", source, "pre_tokenizer").get<std::string>(), source),
        flag(j, "invert", false));
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    p->o = parse_metaspace(j, source);
    return p;
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit")
    return std::make_unique<CharClassPreTokenizer>(unicode::is_whitespace, SplitBehavior::Removed);
  if (type == "BertPreTokenizer")
    return sequence_of(std::make_unique<CharClassPreTokenizer>(unicode::is_whitespace, SplitBehavior::Removed),
                       std::make_unique<CharClassPreTokenizer>(unicode::is_punctuation, SplitBehavior::Isolated));
  if (type == "Digits")
    return std::make_unique<CharClassPreTokenizer>(
        unicode::is_numeric, flag(j, "individual_digits", false) ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
  if (type == "Punctuation") {
    std::string b = string_or(j, "behavior", "Isolated");
    return std::make_unique<CharClassPreTokenizer>(unicode::is_punctuation, parse_split_behavior(b, source));
  }
  if (type == "CharDelimiterSplit") {
    std::string d = member(j, "delimiter", source, "pre_tokenizer").get<std::string>();
    MM_CHECK(!d.empty() && unicode::char_len(d, 0) == d.size(), source, ": CharDelimiterSplit delimiter '", d,
             "' must be one character");
    char32_t dc = unicode::decode_at(d, 0);
    return std::make_unique<CharClassPreTokenizer>([dc](char32_t c) { return c == dc; }, SplitBehavior::Removed);
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<PreTokenizerSequence>();
    for (const auto& s : member(j, "pretokenizers", source, "pre_tokenizer"))
      seq->stages.push_back(make_pre_tokenizer(s, source));
    return seq;
  }
  unsupported(source, "pre_tokenizer", j);
}

}  // namespace mm::data
