// The built-in chat templates and the encoder that turns a conversation into ids and labels.
#include "mindspeed_mm/data/chat_template.h"

#include <algorithm>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/registry.h"

namespace mm::data {
namespace {

Registry<ChatTemplate>& chat_templates() {
  static Registry<ChatTemplate>* r = [] {
    auto* reg = new Registry<ChatTemplate>("chat template");
    ChatTemplate::Spec s;

    // Qwen2-VL's official chat_template (tokenizer_config.json of Qwen/Qwen2-VL-7B-Instruct).
    s = {};
    s.name = "qwen2vl";
    s.system = "<|im_start|>system\n{content}<|im_end|>\n";
    s.default_system = "You are a helpful assistant.";
    s.user = "<|im_start|>user\n{content}<|im_end|>\n";
    s.assistant_header = "<|im_start|>assistant\n";
    s.assistant = "{content}<|im_end|>";
    s.assistant_footer = "\n";
    s.special = {"<|im_start|>", "<|im_end|>"};
    s.eos = "<|im_end|>";
    s.qwen_vision = true;
    reg->add(s.name, ChatTemplate(s));

    // LLaMA-Factory's "llama3".
    s = {};
    s.name = "llama3";
    s.prefix = "{bos}";
    s.system = "<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>";
    s.user = "<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>";
    s.assistant_header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    s.assistant = "{content}<|eot_id|>";
    s.special = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    s.bos = "<|begin_of_text|>";
    s.eos = "<|eot_id|>";
    reg->add(s.name, ChatTemplate(s));

    // LLaMA-Factory's "mistral" (Llama2Template: the system text opens the first user turn).
    s = {};
    s.name = "mistral";
    s.prefix = "{bos}";
    s.system = "{content}\n\n";
    s.system_in_first_user = true;
    s.user = "[INST] {content}[/INST]";
    s.assistant = " {content}{eos}";
    s.bos = "<s>";
    s.eos = "</s>";
    reg->add(s.name, ChatTemplate(s));

    // LLaVA v1 (conv_vicuna_v1): sep " ", sep2 "</s>".
    s = {};
    s.name = "llava";
    s.prefix = "{bos}";
    s.system = "{content} ";
    s.default_system =
        "A chat between a curious user and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the user's questions.";
    s.user = "USER: {content} ";
    s.assistant_header = "ASSISTANT:";
    s.assistant = " {content}{eos}";
    s.bos = "<s>";
    s.eos = "</s>";
    reg->add(s.name, ChatTemplate(s));

    // MindSpeed-MM's "default".
    s = {};
    s.name = "default";
    s.system = "{content}\n";
    s.user = "Human: {content}\nAssistant:";
    s.assistant = "{content}{eos}";
    s.separator = "\n";
    s.eos = "</s>";
    reg->add(s.name, ChatTemplate(s));
    return reg;
  }();
  return *r;
}

// One stretch of the conversation: text to tokenize, or a single token id.
struct Piece {
  bool is_token = false;
  int64_t id = 0;
  std::string text;
  bool labeled = false;
};

int64_t require_token(const Tokenizer& tok, const std::string& token, const std::string& template_name) {
  auto id = tok.token_to_id(token);
  if (!id) {
    throw Error(cat("chat template ", template_name, ": token '", token,
                    "' is not in the tokenizer's vocabulary (is this the tokenizer of a model that uses ",
                    template_name, "?)"));
  }
  return *id;
}

class PieceWriter {
 public:
  PieceWriter(const ChatTemplate::Spec& spec, const Tokenizer& tok, const PlaceholderTokens& placeholders)
      : spec_(spec), tok_(tok), placeholders_(placeholders) {}

  // Appends `format` with {content}, {bos} and {eos} filled in; the template's special strings
  // become ids; <image>/<video> in the content expand when `expand` is set.
  void write(const std::string& format, const std::string& content, bool labeled, bool expand) {
    size_t pos = 0;
    while (pos < format.size()) {
      size_t brace = format.find('{', pos);
      size_t end = brace == std::string::npos ? format.size() : brace;
      literal(format.substr(pos, end - pos), labeled);
      if (brace == std::string::npos) break;
      if (format.compare(brace, 9, "{content}") == 0) {
        expand ? expanded(content, labeled) : text(content, labeled);
        pos = brace + 9;
      } else if (format.compare(brace, 5, "{bos}") == 0) {
        token(require_token(tok_, spec_.bos, spec_.name), labeled);
        pos = brace + 5;
      } else if (format.compare(brace, 5, "{eos}") == 0) {
        token(require_token(tok_, spec_.eos, spec_.name), labeled);
        pos = brace + 5;
      } else {
        literal("{", labeled);
        pos = brace + 1;
      }
    }
  }

  std::vector<Piece> take() { return std::move(pieces_); }

 private:
  void text(const std::string& t, bool labeled) {
    if (!t.empty()) pieces_.push_back({false, 0, t, labeled});
  }
  void token(int64_t id, bool labeled) { pieces_.push_back({true, id, "", labeled}); }

  void literal(const std::string& t, bool labeled) {
    size_t pos = 0;
    while (pos < t.size()) {
      size_t best = std::string::npos;
      const std::string* which = nullptr;
      for (const auto& sp : spec_.special) {
        size_t f = t.find(sp, pos);
        if (f < best) best = f, which = &sp;
      }
      if (!which) {
        text(t.substr(pos), labeled);
        return;
      }
      text(t.substr(pos, best - pos), labeled);
      token(require_token(tok_, *which, spec_.name), labeled);
      pos = best + which->size();
    }
  }

  // Each <image>/<video> becomes N pad tokens, N from the callback (1 without one).
  void expanded(const std::string& content, bool labeled) {
    static const std::string kImage = "<image>", kVideo = "<video>";
    size_t pos = 0;
    while (pos < content.size()) {
      size_t fi = content.find(kImage, pos), fv = content.find(kVideo, pos);
      size_t f = std::min(fi, fv);
      if (f == std::string::npos) {
        text(content.substr(pos), labeled);
        return;
      }
      text(content.substr(pos, f - pos), labeled);
      char kind = f == fi ? 'i' : 'v';
      size_t index = kind == 'i' ? images_++ : videos_++;
      int64_t n = placeholders_ ? placeholders_(kind, index) : 1;
      if (n < 0) throw Error(cat("chat template ", spec_.name, ": placeholder callback gave ", n, " tokens for ",
                                 kind == 'i' ? "image " : "video ", index));
      std::string pad = spec_.qwen_vision ? (kind == 'i' ? "<|image_pad|>" : "<|video_pad|>") : (kind == 'i' ? kImage : kVideo);
      int64_t pad_id = require_token(tok_, pad, spec_.name);
      if (spec_.qwen_vision) token(require_token(tok_, "<|vision_start|>", spec_.name), labeled);
      for (int64_t k = 0; k < n; ++k) token(pad_id, labeled);
      if (spec_.qwen_vision) token(require_token(tok_, "<|vision_end|>", spec_.name), labeled);
      pos = f + (kind == 'i' ? kImage : kVideo).size();
    }
  }

  const ChatTemplate::Spec& spec_;
  const Tokenizer& tok_;
  const PlaceholderTokens& placeholders_;
  std::vector<Piece> pieces_;
  size_t images_ = 0, videos_ = 0;
};

size_t common_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// Encodes consecutive text pieces [b, e) as one string, as HF does with the text between two
// special tokens. A token that spans a label boundary (BPE merged across it) goes to the later
// side: the earlier side owns only the tokens its own prefix encodes to.
void encode_run(const Tokenizer& tok, const std::vector<Piece>& pieces, size_t b, size_t e, EncodedChat& out) {
  std::string run;
  for (size_t i = b; i < e; ++i) run += pieces[i].text;
  std::vector<int64_t> ids = tok.encode(run, false);
  size_t done = 0, offset = 0;
  for (size_t i = b; i < e; ++i) {
    offset += pieces[i].text.size();
    bool boundary = i + 1 == e || pieces[i + 1].labeled != pieces[i].labeled;
    if (!boundary) continue;
    size_t cut = i + 1 == e ? ids.size() : std::max(done, common_prefix(ids, tok.encode(run.substr(0, offset), false)));
    for (size_t k = done; k < cut; ++k) {
      out.input_ids.push_back(ids[k]);
      out.labels.push_back(pieces[i].labeled ? ids[k] : kIgnoreLabel);
    }
    done = cut;
  }
}

}  // namespace

const ChatTemplate& ChatTemplate::get(const std::string& name) { return chat_templates().get(name); }

std::vector<std::string> ChatTemplate::names() { return chat_templates().ids(); }

EncodedChat ChatTemplate::encode(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                 const ChatOptions& options, const PlaceholderTokens& placeholder_tokens) const {
  const Spec& s = spec_;
  size_t first = 0;
  std::string system = options.system.empty() ? s.default_system : options.system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  size_t last_assistant = messages.size();
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != want) {
      throw Error(cat("chat template ", s.name, ": message ", i, " has role '", messages[i].role, "', expected '",
                      want, "' (an optional system message, then user and assistant turns alternating)"));
    }
    if (want == "assistant") last_assistant = i;
  }
  if (first == messages.size()) throw Error(cat("chat template ", s.name, ": the conversation has no user turn"));

  PieceWriter w(s, tokenizer, placeholder_tokens);
  const bool prompt = options.train_on_prompt;
  w.write(s.prefix, "", prompt, false);
  std::string first_user_prefix;
  if (!system.empty()) {
    if (s.system_in_first_user) {
      first_user_prefix = system;
    } else {
      w.write(s.system, system, prompt, true);
    }
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      if (i > first) w.write(s.separator, "", prompt, false);
      std::string content = m.content;
      if (i == first && !first_user_prefix.empty()) {
        std::string sys = s.system;
        sys.replace(sys.find("{content}"), 9, first_user_prefix);
        content = sys + content;
      }
      w.write(s.user, content, prompt, true);
    } else {
      bool train = !options.mask_history || i == last_assistant;
      w.write(s.assistant_header, "", prompt, false);
      w.write(s.assistant, m.content, train, false);
      w.write(s.assistant_footer, "", prompt, false);
    }
  }
  if (options.add_generation_prompt && messages.back().role == "user") w.write(s.assistant_header, "", prompt, false);

  std::vector<Piece> pieces = w.take();
  EncodedChat out;
  for (size_t i = 0; i < pieces.size();) {
    if (pieces[i].is_token) {
      out.input_ids.push_back(pieces[i].id);
      out.labels.push_back(pieces[i].labeled ? pieces[i].id : kIgnoreLabel);
      ++i;
      continue;
    }
    size_t e = i;
    while (e < pieces.size() && !pieces[e].is_token) ++e;
    encode_run(tokenizer, pieces, i, e, out);
    i = e;
  }
  return out;
}

}  // namespace mm::data
