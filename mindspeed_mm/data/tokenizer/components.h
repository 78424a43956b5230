// The pipeline stages of a Hugging Face tokenizer.json, each built from its JSON object:
// normalizer (NFC, NFD, NFKC, NFKD, Sequence), pre-tokenizer (Split, ByteLevel, Sequence),
// post-processor (ByteLevel, TemplateProcessing, Sequence) and decoder (ByteLevel, Sequence).
// Any other "type" is an mm::Error naming it and the file: never a silent fallback.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mm::data {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

// Splits one piece of normalized text into the pieces the model sees, appending the
// non-empty ones to `out` (HF's PreTokenizedString drops empty splits).
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(const std::string& piece, std::vector<std::string>& out) const = 0;
};

// Adds special tokens around the ids of one sequence (only when add_special_tokens).
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int64_t>& ids, bool add_special_tokens) const = 0;
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

// GPT-2's byte-to-unicode table: byte b is written as the code point byte_char(b) (UTF-8).
const std::string& byte_level_char(unsigned char b);
// The pre-tokenizer regex of GPT-2 that ByteLevel uses when use_regex is true.
extern const char* const kGpt2Pattern;

}  // namespace mm::data
