// load_pretrained_tokenizer: a tokenizer as transformers' AutoTokenizer.from_pretrained(DIR)
// gives it, from the files a Hugging Face model directory holds:
//   tokenizer.json                      any supported pipeline
//   vocab.json + merges.txt             GPT-2 style byte-level BPE
//   vocab.txt                           BERT WordPiece (do_lower_case from tokenizer_config.json)
//   tokenizer.model (Unigram)           converted as transformers' SpmConverter does
// and tokenizer_config.json beside them: for Llama/Gemma tokenizer classes, add_bos_token
// (default true) and add_eos_token (default false) rebuild the post-processor as
// transformers' update_post_processor does; the special tokens, model_max_length and
// chat_template are returned with it.
#pragma once

#include <string>

#include "mindspeed_mm/data/tokenizer/tokenizer.h"
#include "mindspeed_mm/data/tokenizer/tokenizer_config.h"

namespace mm::data {

struct PretrainedTokenizer {
  Tokenizer tokenizer;
  TokenizerConfig config;  // defaults when the directory has no tokenizer_config.json
  std::string source;      // the file the vocabulary came from
};

// `path` is a directory or a tokenizer.json file. mm::Error naming the path when nothing
// loadable is there or a file is malformed.
PretrainedTokenizer load_pretrained_tokenizer(const std::string& path);

}  // namespace mm::data
