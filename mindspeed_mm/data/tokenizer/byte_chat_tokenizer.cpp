#include "mindspeed_mm/data/tokenizer/byte_chat_tokenizer.h"

#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

std::string byte_chat_tokenizer_json() {
  using nlohmann::json;
  // bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 take 256, 257, ...
  json vocab = json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string ch;
    unicode::append_utf8(ch, printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++));
    vocab[ch] = b;
  }
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                            "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"};
  json added = json::array();
  int64_t id = 256;
  for (const char* s : specials)
    added.push_back({{"id", id++}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  // No regex split: with no merges every byte is its own token whatever the pre-split.
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", byte_level},
            {"post_processor", nullptr},
            {"decoder", byte_level},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
              {"vocab", vocab}, {"merges", json::array()}}}};
  return j.dump();
}

PretrainedTokenizer byte_chat_tokenizer() {
  PretrainedTokenizer p{Tokenizer::from_json_text(byte_chat_tokenizer_json(), "byte"), TokenizerConfig{}, "byte"};
  p.config.eos_token = "<|im_end|>";
  p.config.pad_token = "<|endoftext|>";
  p.config.additional_special_tokens = {"<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                                        "<|image_pad|>", "<|video_pad|>"};
  return p;
}

}  // namespace mm::data
