// UTF-8 repair and Unicode properties; normalization through ICU's Normalizer2.
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

#include <unicode/brkiter.h>
#include <unicode/normalizer2.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <memory>

#include "mindspeed_mm/core/errors.h"

namespace mm::data::unicode {

size_t char_len(std::string_view text, size_t i) {
  if (i >= text.size()) return 1;
  unsigned char b = static_cast<unsigned char>(text[i]);
  if (b < 0x80) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

char32_t decode_at(std::string_view text, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  unsigned char b0 = b(0);
  if (b0 < 0x80) return b0;
  if (b0 < 0xE0) return ((b0 & 0x1F) << 6) | (b(1) & 0x3F);
  if (b0 < 0xF0) return ((b0 & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b0 & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the valid sequence at bytes[i], or 0 with *maximal set to the length of the
// maximal subpart of an ill-formed sequence (Unicode 3.9, "U+FFFD substitution of maximal
// subparts"), which is what both Rust and WHATWG replace by one U+FFFD.
static size_t valid_len(std::string_view s, size_t i, size_t* maximal) {
  auto at = [&](size_t k) -> int { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : -1; };
  int b0 = at(0);
  if (b0 < 0x80) return 1;
  size_t need;
  int lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *maximal = 1;
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    int b = at(k);
    int l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *maximal = k;
      return 0;
    }
  }
  return need;
}

bool is_valid_utf8(std::string_view text) {
  size_t i = 0, bad = 0;
  while (i < text.size()) {
    size_t n = valid_len(text, i, &bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 16);
  size_t i = 0;
  while (i < bytes.size()) {
    size_t bad = 0;
    size_t n = valid_len(bytes, i, &bad);
    if (n) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

bool is_whitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool is_word_char(char32_t c) {
  if (c == '_') return true;
  if (u_isUAlphabetic(static_cast<UChar32>(c))) return true;
  int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

namespace {
uint32_t category_mask(char32_t c) { return U_GET_GC_MASK(static_cast<UChar32>(c)); }
}  // namespace

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
  return (category_mask(c) & U_GC_P_MASK) != 0;
}
bool is_other(char32_t c) { return (category_mask(c) & U_GC_C_MASK) != 0; }
bool is_mark_nonspacing(char32_t c) { return (category_mask(c) & U_GC_MN_MASK) != 0; }
bool is_combining_mark(char32_t c) { return (category_mask(c) & U_GC_M_MASK) != 0; }
bool is_numeric(char32_t c) { return (category_mask(c) & U_GC_N_MASK) != 0; }
bool is_regex_word(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  if (u_isUAlphabetic(static_cast<UChar32>(c))) return true;
  return (category_mask(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

void append_lowercase(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  // One code point at a time, so no context (Final_Sigma) applies, as in Rust.
  UChar src[2];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, static_cast<UChar32>(c));
  UChar dst[8];
  UErrorCode status = U_ZERO_ERROR;
  int32_t len = u_strToLower(dst, 8, src, n, "", &status);
  if (U_FAILURE(status) || len > 8) {
    append_utf8(out, c);
    return;
  }
  for (int32_t i = 0; i < len;) {
    UChar32 cp;
    U16_NEXT(dst, i, len, cp);
    append_utf8(out, static_cast<char32_t>(cp));
  }
}

std::vector<size_t> grapheme_starts(std::string_view text) {
  std::vector<size_t> starts;
  UErrorCode status = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  thread_local std::unique_ptr<icu::BreakIterator> it;
  if (!it) it.reset(icu::BreakIterator::createCharacterInstance(icu::Locale::getRoot(), status));
  MM_CHECK(U_SUCCESS(status) && it, "tokenizer: ICU grapheme iterator unavailable (", u_errorName(status), ")");
  it->setText(ut, status);
  for (int32_t b = it->first(); b != icu::BreakIterator::DONE; b = it->next()) starts.push_back(static_cast<size_t>(b));
  utext_close(ut);
  if (starts.empty() || starts.back() != text.size()) starts.push_back(text.size());
  return starts;
}

std::string normalize(std::string_view text, NormalForm form) {
  bool ascii = true;
  for (char ch : text) ascii &= static_cast<unsigned char>(ch) < 0x80;
  if (ascii) return std::string(text);  // ASCII is invariant under all four forms
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::NFC: n = icu::Normalizer2::getNFCInstance(status); break;
    case NormalForm::NFD: n = icu::Normalizer2::getNFDInstance(status); break;
    case NormalForm::NFKC: n = icu::Normalizer2::getNFKCInstance(status); break;
    case NormalForm::NFKD: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  MM_CHECK(U_SUCCESS(status), "tokenizer: ICU normalizer unavailable (", u_errorName(status), ")");
  icu::UnicodeString src = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
  if (n->isNormalized(src, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  icu::UnicodeString dst = n->normalize(src, status);
  MM_CHECK(U_SUCCESS(status), "tokenizer: ICU normalization failed (", u_errorName(status), ")");
  std::string out;
  dst.toUTF8String(out);
  return out;
}

}  // namespace mm::data::unicode
