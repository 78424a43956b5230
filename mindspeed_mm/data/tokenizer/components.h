// The pipeline stages of a Hugging Face tokenizer.json, each built from its JSON object:
//   normalizers:    NFC NFD NFKC NFKD Lowercase Strip StripAccents Replace Prepend Precompiled
//                   BertNormalizer ByteLevel Sequence                  (normalizers.cpp)
//   pre-tokenizers: ByteLevel Split Metaspace Whitespace WhitespaceSplit BertPreTokenizer
//                   Digits Punctuation CharDelimiterSplit Sequence     (pre_tokenizers.cpp)
//   post-processors: TemplateProcessing BertProcessing RobertaProcessing ByteLevel Sequence
//                                                                      (post_processors.cpp)
//   decoders:       ByteLevel Metaspace WordPiece ByteFallback Fuse Strip Replace BPEDecoder
//                   CTC Sequence                                       (decoders.cpp)
// Any other "type" is an mm::Error naming it and the file: never a silent fallback.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mm::data {

// A stretch of text moving through the pipeline. at_start: it begins at byte 0 of the
// original input, which is what HF's `offsets_original().0 == 0` tests (Metaspace's
// prepend_scheme "first" adds its replacement only there).
struct Piece {
  std::string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Normalizes one stretch; clears at_start when the first original character is deleted
  // (the new first character then comes from a later offset).
  virtual std::string apply(std::string text, bool& at_start) const = 0;
  std::string normalize(std::string text) const {
    bool at_start = false;
    return apply(std::move(text), at_start);
  }
};

// Splits one piece of normalized text into the pieces the model sees, appending the
// non-empty ones to `out` (HF's PreTokenizedString drops empty splits).
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(const Piece& piece, std::vector<Piece>& out) const = 0;
};

// Adds special tokens around the ids of one sequence (only when add_special_tokens).
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int64_t>& ids, bool add_special_tokens) const = 0;
  // How many ids process() adds to a single sequence (truncation leaves room for them).
  virtual size_t added_tokens() const = 0;
};

// HF's Decoder::decode_chain: tokens in, (fewer or as many) strings out; the results are
// concatenated at the end.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

// `source` names the file in error messages. A null JSON value gives nullptr (no stage).
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& source);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& source);
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const std::string& source);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& source);

// GPT-2's byte-to-unicode table: byte b is written as the code point byte_level_char(b) (UTF-8).
const std::string& byte_level_char(unsigned char b);
// The byte a code point of that alphabet stands for, or -1.
int byte_level_byte(char32_t cp);
// The pre-tokenizer regex of GPT-2 that ByteLevel uses when use_regex is true.
extern const char* const kGpt2Pattern;

// Metaspace's JSON fields (shared by the pre-tokenizer and the decoder): replacement char,
// prepend_scheme "always" | "first" | "never" (legacy add_prefix_space=false means never),
// split (default true).
struct MetaspaceOptions {
  std::string replacement = "\xE2\x96\x81";  // U+2581
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool split = true;
};
MetaspaceOptions parse_metaspace(const nlohmann::json& j, const std::string& source);

}  // namespace mm::data
