// ByteTokenizer: bytes are ids 0..255; specials 256..259 are matched only on request.
#include "mindspeed_mm/data/byte_tokenizer.h"

#include <array>

#include "mindspeed_mm/core/errors.h"

namespace mm::data {
namespace {

constexpr std::array<std::string_view, 4> kSpecialNames = {
    "<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"};

}  // namespace

std::string_view ByteTokenizer::special_name(int64_t id) {
  MM_CHECK(is_special(id), "ByteTokenizer: id ", id, " is not a special token (specials are ",
           kEos, "..", kVocabSize - 1, ")");
  return kSpecialNames[static_cast<size_t>(id - kEos)];
}

std::optional<int64_t> ByteTokenizer::special_id(std::string_view name) {
  for (size_t i = 0; i < kSpecialNames.size(); ++i)
    if (kSpecialNames[i] == name) return kEos + static_cast<int64_t>(i);
  return std::nullopt;
}

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::vector<int64_t> ByteTokenizer::encode_with_specials(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    if (text.compare(i, 2, "<|") == 0) {
      for (size_t s = 0; s < kSpecialNames.size(); ++s) {
        if (text.compare(i, kSpecialNames[s].size(), kSpecialNames[s]) == 0) {
          ids.push_back(kEos + static_cast<int64_t>(s));
          i += kSpecialNames[s].size();
          matched = true;
          break;
        }
      }
    }
    if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
  }
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    MM_CHECK(id >= 0 && id < kVocabSize, "ByteTokenizer::decode: id ", id, " at position ", i,
             " is outside the vocabulary [0, ", kVocabSize, ")");
    if (id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (!skip_special) {
      out += special_name(id);
    }
  }
  return out;
}

}  // namespace mm::data
