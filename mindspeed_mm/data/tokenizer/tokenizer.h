// Tokenizer: a Hugging Face tokenizer.json (BPE: Qwen2/Qwen3, Llama 3, GPT-2, Gemma, Mistral;
// WordPiece: BERT; Unigram: T5/ALBERT/XLM-R style; WordLevel), producing the same ids as HF's
// Rust `tokenizers` library. Encoding runs HF's pipeline:
// added tokens are split out of the raw text, the rest is normalized, split again on the
// normalized added tokens, pre-tokenized, run through the model, and post-processed.
//
// Input that is not valid UTF-8 is repaired first: each maximal invalid subsequence becomes
// U+FFFD, as in Rust's String::from_utf8_lossy and in the JS string the Node binding of HF
// receives, so such input encodes like HF's encoding of the repaired text.
//
// Supported components are listed in components.h and model.h; any other type, or BPE
// dropout, is an mm::Error naming it. Encoding is const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mm::data {

class Tokenizer {
 public:
  // Loads a tokenizer.json. Errors (missing file, bad JSON, missing model, unsupported
  // component) are mm::Error with the path in the message.
  static Tokenizer from_file(const std::string& tokenizer_json);
  // Parses tokenizer.json text; `source` names it in error messages.
  static Tokenizer from_json_text(const std::string& json_text, const std::string& source = "tokenizer.json");
  // GPT-2 style vocab.json + merges.txt: the pipeline of GPT-2's tokenizer.json (ByteLevel
  // pre-tokenizer without prefix space, BPE, ByteLevel decoder), with <|endoftext|> as a
  // special added token when the vocabulary has it.
  static Tokenizer from_gpt2_files(const std::string& vocab_json, const std::string& merges_txt);
  // The tokenizer.json text that from_gpt2_files builds (for feeding HF the same tokenizer).
  static std::string gpt2_tokenizer_json(const std::string& vocab_json, const std::string& merges_txt);

  // BERT's vocab.txt (one token per line, id = line number): the pipeline of
  // bert-base-(un)cased's tokenizer.json: BertNormalizer (lowercase and accent stripping when
  // `lowercase`), BertPreTokenizer, WordPiece with "##", [CLS] $A [SEP], WordPiece decoder.
  static Tokenizer from_bert_vocab(const std::string& vocab_txt, bool lowercase = true);
  static std::string bert_tokenizer_json(const std::string& vocab_txt, bool lowercase = true);

  // Runs HF's whole encode: added tokens, normalizer, pre-tokenizer, model, then the file's
  // "truncation" (room left for the special tokens), post-processor and "padding" (Fixed, or
  // BatchLongest, which for one text only rounds up to pad_to_multiple_of).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const;
  // encode() of every text, on up to num_threads threads (0: all hardware threads); the
  // result is the same for any thread count. BatchLongest padding pads to the longest text.
  std::vector<std::vector<int64_t>> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens,
                                                 int num_threads = 0) const;
  // Replaces the post-processor by the template [bos] $A [eos] (either may be absent), as
  // transformers does for Llama/Gemma tokenizers when tokenizer_config.json sets
  // add_bos_token / add_eos_token. A token missing from the vocabulary is an mm::Error.
  Tokenizer with_bos_eos(const std::optional<std::string>& bos, const std::optional<std::string>& eos) const;
  // Ids outside the vocabulary are an mm::Error (HF drops them silently).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const;

  // One past the largest id of the model or the added tokens (the embedding rows needed).
  int64_t vocab_size() const;
  std::optional<int64_t> token_to_id(std::string_view token) const;
  // mm::Error for an id outside the vocabulary.
  std::string id_to_token(int64_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace mm::data
