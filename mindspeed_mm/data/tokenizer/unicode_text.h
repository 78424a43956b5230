// UTF-8 and Unicode helpers for the tokenizers, with Rust's semantics where Hugging Face's
// tokenizers library depends on them: lossy UTF-8 repair as String::from_utf8_lossy does it,
// char::is_whitespace (White_Space), char::is_alphanumeric, and NFC/NFD/NFKC/NFKD through ICU.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mm::data::unicode {

// Length of the UTF-8 sequence starting at text[i] (text must be valid UTF-8), 1 at the end.
size_t char_len(std::string_view text, size_t i);

// Decodes the code point at text[i] of valid UTF-8.
char32_t decode_at(std::string_view text, size_t i);

// Appends code point cp as UTF-8.
void append_utf8(std::string& out, char32_t cp);

// True when text is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool is_valid_utf8(std::string_view text);

// Replaces every maximal invalid subsequence with U+FFFD, exactly like Rust's
// String::from_utf8_lossy and the WHATWG decoder that turns bytes into a JS string.
std::string to_valid_utf8(std::string_view bytes);

// Rust char::is_whitespace: the Unicode White_Space property.
bool is_whitespace(char32_t c);
// HF's added-token word character: Rust char::is_alphanumeric (Alphabetic, Nd, Nl, No) or '_'.
bool is_word_char(char32_t c);

// General-category tests with the meaning the Rust crates behind HF's components give them:
// Rust char::is_ascii_punctuation || unicode_categories' is_punctuation (P*), is_other (C*),
// is_mark_nonspacing (Mn), unicode-normalization's is_combining_mark (M*), char::is_numeric (N*).
bool is_punctuation(char32_t c);
bool is_other(char32_t c);
bool is_mark_nonspacing(char32_t c);
bool is_combining_mark(char32_t c);
bool is_numeric(char32_t c);
// The Rust regex crate's Unicode `\w`: Alphabetic, M, Nd, Pc or Join_Control.
bool is_regex_word(char32_t c);

// Appends Rust's char::to_lowercase(c): the full, context-free mapping (U+0130 -> "i\u0307").
void append_lowercase(std::string& out, char32_t c);

// Byte offsets where the extended grapheme clusters of valid UTF-8 text start, then text.size().
std::vector<size_t> grapheme_starts(std::string_view text);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
// Normalizes valid UTF-8 text.
std::string normalize(std::string_view text, NormalForm form);

}  // namespace mm::data::unicode
