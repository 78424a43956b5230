// tokenizer_config.json: the special tokens, BOS/EOS flags, length limit and chat template that
// Hugging Face keeps beside tokenizer.json. Special tokens may be written as strings or as
// AddedToken objects ({"content": "<s>", ...}); null means the model has none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mm::data {

struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::vector<std::string> additional_special_tokens;
  bool add_bos_token = false;
  bool add_eos_token = false;
  bool has_add_bos_token = false;  // the file sets add_bos_token (Llama/Gemma default it to true)
  bool has_add_eos_token = false;
  std::optional<bool> do_lower_case;  // BERT-style vocab.txt tokenizers
  // HF writes 1e30 ("no limit") for many models; such values are kept as INT64_MAX.
  int64_t model_max_length = INT64_MAX;
  std::string chat_template;      // Jinja source, empty when absent
  std::string tokenizer_class;    // e.g. "Qwen2Tokenizer"; informational
};

// Reads DIR/tokenizer_config.json or the file itself. A missing file, bad JSON or a field of the
// wrong type is an mm::Error naming the file and the field.
TokenizerConfig load_tokenizer_config(const std::string& dir_or_file);

}  // namespace mm::data
