// Normalizers, each ported from tokenizers/src/normalizers/*.rs and the NormalizedString
// operations they use (tokenizers/src/tokenizer/normalizer.rs).
#include <memory>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/components.h"
#include "mindspeed_mm/data/tokenizer/json_fields.h"
#include "mindspeed_mm/data/tokenizer/precompiled_charsmap.h"
#include "mindspeed_mm/data/tokenizer/text_split.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

using nlohmann::json;
using namespace json_fields;

namespace {

// Keeps the characters for which keep(c) holds; a deleted first character clears at_start.
template <class Keep>
std::string filter_chars(const std::string& text, bool& at_start, Keep keep) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t n = unicode::char_len(text, i);
    if (keep(unicode::decode_at(text, i))) out.append(text, i, n);
    else if (i == 0) at_start = false;
    i += n;
  }
  return out;
}

bool has_non_ascii(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return true;
  return false;
}

std::string lowercase(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  if (!has_non_ascii(text)) {
    for (char c : text) out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
    return out;
  }
  for (size_t i = 0; i < text.size(); i += unicode::char_len(text, i)) unicode::append_lowercase(out, unicode::decode_at(text, i));
  return out;
}

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm f) : form_(f) {}
  std::string apply(std::string text, bool&) const override { return unicode::normalize(text, form_); }

 private:
  unicode::NormalForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  std::string apply(std::string text, bool&) const override { return lowercase(text); }
};

// Strips Rust-whitespace (White_Space) from either end.
class StripNormalizer : public Normalizer {
 public:
  bool left = true, right = true;
  std::string apply(std::string text, bool& at_start) const override {
    size_t b = 0, e = text.size();
    if (left)
      while (b < e && unicode::is_whitespace(unicode::decode_at(text, b))) b += unicode::char_len(text, b);
    if (right) {
      while (e > b) {
        size_t p = e - 1;
        while (p > b && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        if (!unicode::is_whitespace(unicode::decode_at(text, p))) break;
        e = p;
      }
    }
    if (b > 0) at_start = false;
    return text.substr(b, e - b);
  }
};

class StripAccentsNormalizer : public Normalizer {
 public:
  std::string apply(std::string text, bool& at_start) const override {
    if (!has_non_ascii(text)) return text;
    return filter_chars(text, at_start, [](char32_t c) { return !unicode::is_combining_mark(c); });
  }
};

// Replace: every match of a literal or an (Oniguruma-syntax) regex becomes `content`.
class ReplaceNormalizer : public Normalizer {
 public:
  explicit ReplaceNormalizer(TextPattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  std::string apply(std::string text, bool& at_start) const override {
    Matches m = pattern_.find(text);
    if (m.empty()) return text;
    // HF aligns inserted content with the last character it replaces, so the text no longer
    // starts at offset 0 when a match at 0 is deleted or spans more than one character.
    if (m[0].first == 0 && m[0].second > 0 && (content_.empty() || unicode::char_len(text, 0) < m[0].second))
      at_start = false;
    return pattern_.replace(text, content_);
  }

 private:
  TextPattern pattern_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  std::string prefix;
  std::string apply(std::string text, bool&) const override { return text.empty() ? text : prefix + text; }
};

class PrecompiledNormalizer : public Normalizer {
 public:
  explicit PrecompiledNormalizer(PrecompiledCharsmap map) : map_(std::move(map)) {}
  // Keeps at_start even when the first character maps to nothing: HF's transform then aligns
  // the next character with the deleted one.
  std::string apply(std::string text, bool&) const override { return map_.empty() ? text : map_.normalize(text); }

 private:
  PrecompiledCharsmap map_;
};

// BertNormalizer (normalizers/bert.rs): clean_text drops NUL, U+FFFD and control characters
// and turns whitespace into ' '; CJK ideographs get a space on each side; accents are
// stripped (NFD, then Mn removed) when strip_accents is set or, unset, when lowercasing.
class BertNormalizer : public Normalizer {
 public:
  bool clean_text = true, handle_chinese_chars = true, strip_accents = true, lowercase_text = true;

  static bool is_chinese_char(char32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
  }

  std::string apply(std::string text, bool& at_start) const override {
    if (clean_text) {
      std::string out;
      out.reserve(text.size());
      for (size_t i = 0; i < text.size();) {
        size_t n = unicode::char_len(text, i);
        char32_t c = unicode::decode_at(text, i);
        bool ws = c == '\t' || c == '\n' || c == '\r' || unicode::is_whitespace(c);
        bool control = !(c == '\t' || c == '\n' || c == '\r') && unicode::is_other(c);
        if (c == 0 || c == 0xFFFD || control) {
          if (i == 0) at_start = false;
        } else if (ws) {
          out += ' ';
        } else {
          out.append(text, i, n);
        }
        i += n;
      }
      text.swap(out);
    }
    if (handle_chinese_chars && has_non_ascii(text)) {
      std::string out;
      out.reserve(text.size() + 16);
      for (size_t i = 0; i < text.size();) {
        size_t n = unicode::char_len(text, i);
        bool cjk = is_chinese_char(unicode::decode_at(text, i));
        if (cjk) out += ' ';
        out.append(text, i, n);
        if (cjk) out += ' ';
        i += n;
      }
      text.swap(out);
    }
    if (strip_accents && has_non_ascii(text)) {
      text = unicode::normalize(text, unicode::NormalForm::NFD);
      text = filter_chars(text, at_start, [](char32_t c) { return !unicode::is_mark_nonspacing(c); });
    }
    if (lowercase_text) text = lowercase(text);
    return text;
  }
};

// ByteLevel normalizer: every byte becomes its character of GPT-2's byte alphabet.
class ByteLevelNormalizer : public Normalizer {
 public:
  std::string apply(std::string text, bool&) const override {
    std::string out;
    out.reserve(text.size() * 2);
    for (unsigned char b : text) out += byte_level_char(b);
    return out;
  }
};

class NormalizerSequence : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> stages;
  std::string apply(std::string text, bool& at_start) const override {
    for (const auto& s : stages) text = s->apply(std::move(text), at_start);
    return text;
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  std::string type = type_of(j, source, "normalizer");
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = flag(j, "strip_left", true);
    n->right = flag(j, "strip_right", true);
    return n;
  }
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(
        TextPattern::parse(member(j, "pattern", source, "normalizer"), source, "Replace pattern"),
        member(j, "content", source, "normalizer").get<std::string>());
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prefix = member(j, "prepend", source, "normalizer").get<std::string>();
    return n;
  }
  if (type == "Precompiled") {
    const json& map = member(j, "precompiled_charsmap", source, "normalizer");
    std::string blob = map.is_null() ? std::string() : decode_base64(map.get<std::string>(), source + " precompiled_charsmap");
    return std::make_unique<PrecompiledNormalizer>(PrecompiledCharsmap(std::move(blob), source));
  }
  if (type == "BertNormalizer") {
    auto n = std::make_unique<BertNormalizer>();
    n->clean_text = flag(j, "clean_text", true);
    n->handle_chinese_chars = flag(j, "handle_chinese_chars", true);
    n->lowercase_text = flag(j, "lowercase", true);
    n->strip_accents = flag(j, "strip_accents", n->lowercase_text);
    return n;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<NormalizerSequence>();
    for (const auto& s : member(j, "normalizers", source, "normalizer")) seq->stages.push_back(make_normalizer(s, source));
    return seq;
  }
  unsupported(source, "normalizer", j);
}

}  // namespace mm::data
