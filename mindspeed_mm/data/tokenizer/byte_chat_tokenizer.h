// byte_chat_tokenizer: a real Tokenizer (tokenizer.json pipeline) whose vocabulary is the 256
// bytes in GPT-2's byte-level alphabet (id = byte value, no merges) plus the special tokens of
// Qwen2-VL's chat template. Tiny models train with it on any text, and the qwen2vl template,
// image/video pads and labels work exactly as with Qwen's own tokenizer. `data.tokenizer: byte`.
//   256 <|endoftext|>   257 <|im_start|>   258 <|im_end|>   259 <|vision_start|>
//   260 <|vision_end|>  261 <|image_pad|>  262 <|video_pad|>          vocab_size 263
#pragma once

#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"

namespace mm::data {

// eos <|im_end|>, pad <|endoftext|>; source "byte".
PretrainedTokenizer byte_chat_tokenizer();

// The tokenizer.json text it is built from (to check it against HF's library).
std::string byte_chat_tokenizer_json();

}  // namespace mm::data
