// Named chat templates, as MindSpeed-MM and LLaMA-Factory register them: a conversation becomes
// input ids plus labels for supervised fine-tuning, with -100 on every token the loss skips.
//
//   qwen2vl  ChatML as Qwen2-VL's official chat_template renders it ("You are a helpful
//            assistant." when no system prompt is given); <image>/<video> become
//            <|vision_start|> N x <|image_pad|>/<|video_pad|> <|vision_end|>
//   llama3   <|begin_of_text|> and <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
//   mistral  LLaMA-Factory's "mistral": <s>[INST] system\n\nuser[/INST] assistant</s>
//   llava    LLaVA v1's vicuna conversation: "<s>system USER: ... ASSISTANT: ...</s>"
//   default  MindSpeed-MM's "default" (LLaMA-Factory's older one):
//            "system\nHuman: ...\nAssistant:...</s>\nHuman: ..."
//
// Labels keep each assistant turn's content and its end-of-turn token (<|im_end|>, <|eot_id|>,
// </s>); the role header before it and the separator after it are -100, as is every prompt
// token. ChatOptions::train_on_prompt labels the prompt tokens too; mask_history leaves only
// the last assistant turn labeled (LLaMA-Factory's options of the same names).
//
// input_ids are exactly what Hugging Face gives for the rendered text (apply_chat_template):
// the text between two template special tokens is encoded as one piece, and a label boundary
// inside such a piece falls after the tokens its prefix encodes to on its own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mindspeed_mm/data/tokenizer/tokenizer.h"

namespace mm::data {

inline constexpr int64_t kIgnoreLabel = -100;

struct ChatMessage {
  std::string role;  // "system" (first message only), "user", "assistant"
  std::string content;
};

struct ChatOptions {
  bool train_on_prompt = false;
  bool mask_history = false;
  // Used when the conversation has no leading system message; empty means the template's
  // default (only qwen2vl and llava have one).
  std::string system;
  // After a trailing user turn, the assistant header the reply follows (transformers'
  // add_generation_prompt): prompts for generation.
  bool add_generation_prompt = false;
};

struct EncodedChat {
  std::vector<int64_t> input_ids, labels;
};

// How many pad tokens the i-th (from 0, counted per kind over the whole conversation) image
// ('i') or video ('v') placeholder expands to: the image processor's token count.
using PlaceholderTokens = std::function<int64_t(char kind, size_t index)>;

class ChatTemplate {
 public:
  // The literal text of each part; "{content}" is replaced by the message, "{bos}"/"{eos}" by
  // the template's bos/eos tokens. Strings listed in `special` (and bos/eos) become single ids
  // and must be in the tokenizer's vocabulary.
  struct Spec {
    std::string name;
    std::string prefix;            // once, before everything
    std::string system;            // the system prompt turn
    std::string default_system;
    bool system_in_first_user = false;  // the system text is prepended to the first user content
    std::string user;
    std::string assistant_header;  // prompt side, before the assistant content
    std::string assistant;         // labeled: content and end-of-turn
    std::string assistant_footer;  // after every assistant turn, not labeled
    std::string separator;         // before every user turn but the first, not labeled
    std::vector<std::string> special;
    std::string bos, eos;
    // qwen2vl wraps the pads in <|vision_start|>...<|vision_end|>; the others repeat the
    // tokenizer's own "<image>"/"<video>" token.
    bool qwen_vision = false;
  };

  // Throws mm::ConfigError listing the known names when `name` is unknown.
  static const ChatTemplate& get(const std::string& name);
  static std::vector<std::string> names();

  ChatTemplate() = default;  // for the registry's map
  explicit ChatTemplate(Spec spec) : spec_(std::move(spec)) {}
  const Spec& spec() const { return spec_; }

  // Messages: an optional leading system message, then user and assistant turns alternating,
  // starting with user; a trailing user turn is allowed (no assistant header follows it).
  // Anything else, or a template token missing from the tokenizer, is an mm::Error.
  EncodedChat encode(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                     const ChatOptions& options, const PlaceholderTokens& placeholder_tokens = {}) const;

 private:
  Spec spec_;
};

}  // namespace mm::data
