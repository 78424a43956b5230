// ByteTokenizer: the simplest lossless tokenizer. Ids 0..255 are the bytes themselves, so any
// byte string (invalid UTF-8 included) round-trips exactly; four special tokens follow them.
// It stands in for the HF tokenizers until those exist, and keeps toy models' vocabularies tiny.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mm::data {

class ByteTokenizer {
 public:
  static constexpr int64_t kEos = 256;      // <|endoftext|>: end of text, also the document separator
  static constexpr int64_t kPad = 257;      // <|pad|>
  static constexpr int64_t kImStart = 258;  // <|im_start|>
  static constexpr int64_t kImEnd = 259;    // <|im_end|>
  static constexpr int64_t kVocabSize = 260;

  int64_t vocab_size() const { return kVocabSize; }
  int64_t eos_id() const { return kEos; }
  int64_t pad_id() const { return kPad; }

  // One id per byte. Text that spells a special token ("<|endoftext|>") stays plain bytes.
  std::vector<int64_t> encode(std::string_view text) const;
  // As encode, but the exact spellings of the special tokens become their ids.
  std::vector<int64_t> encode_with_specials(std::string_view text) const;
  // Bytes back to a string; special tokens render as their names unless skip_special.
  // An id outside [0, vocab_size) is an mm::Error.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;

  static bool is_special(int64_t id) { return id >= kEos && id < kVocabSize; }
  // "<|endoftext|>" for 256, ...; mm::Error for a byte id or an id out of range.
  static std::string_view special_name(int64_t id);
  // The id of a special token's name, if it is one.
  static std::optional<int64_t> special_id(std::string_view name);
};

}  // namespace mm::data
