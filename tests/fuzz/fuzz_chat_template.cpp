// Chat templates (qwen2vl, llama3, mistral, llava, default): any conversation. The input's first
// byte picks the template and options, the rest is messages separated by 0x1e, each a role byte
// then its content (with any <image>/<video> placeholders). A conversation the template takes
// gives ids and labels of equal length, labels -100 or equal to the id at that position.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "mindspeed_mm/data/chat_template.h"
#include "mindspeed_mm/data/tokenizer/byte_chat_tokenizer.h"
#include "mindspeed_mm/data/tokenizer/tokenizer.h"

namespace {

// The byte-level tokenizer with every template's special tokens added.
const mm::data::Tokenizer& tokenizer() {
  static const mm::data::Tokenizer t = [] {
    nlohmann::json j = nlohmann::json::parse(mm::data::byte_chat_tokenizer_json());
    std::set<std::string> have;
    int64_t next = 0;
    for (const auto& a : j["added_tokens"]) {
      have.insert(a["content"].get<std::string>());
      next = std::max(next, a["id"].get<int64_t>() + 1);
    }
    for (const std::string& name : mm::data::ChatTemplate::names()) {
      const auto& spec = mm::data::ChatTemplate::get(name).spec();
      std::vector<std::string> specials = spec.special;
      for (const std::string& s : {spec.bos, spec.eos, std::string("<image>"), std::string("<video>")})
        if (!s.empty()) specials.push_back(s);
      for (const std::string& s : specials)
        if (have.insert(s).second)
          j["added_tokens"].push_back({{"id", next++}, {"content", s}, {"single_word", false}, {"lstrip", false},
                                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    }
    return mm::data::Tokenizer::from_json_text(j.dump(), "fuzz/tokenizer.json");
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::vector<std::string> names = mm::data::ChatTemplate::names();
  const uint8_t flags = data[0];
  const mm::data::ChatTemplate& tmpl = mm::data::ChatTemplate::get(names[flags % names.size()]);
  mm::data::ChatOptions o;
  o.train_on_prompt = flags & 0x10;
  o.mask_history = flags & 0x20;
  o.add_generation_prompt = flags & 0x40;
  if (flags & 0x80) o.system = "Be brief.";
  std::vector<mm::data::ChatMessage> messages;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  for (size_t pos = 0; pos <= rest.size();) {
    size_t end = rest.find('\x1e', pos);
    if (end == std::string::npos) end = rest.size();
    const std::string part = rest.substr(pos, end - pos);
    if (!part.empty()) {
      static const char* roles[] = {"system", "user", "assistant", "tool"};
      messages.push_back({roles[static_cast<uint8_t>(part[0]) % 4], part.substr(1)});
    }
    pos = end + 1;
  }
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const mm::data::EncodedChat e = tmpl.encode(tokenizer(), messages, o, [](char kind, size_t i) {
      return static_cast<int64_t>(kind == 'i' ? 1 + i % 4 : 2 + i % 3);
    });
    if (e.input_ids.size() != e.labels.size()) __builtin_trap();
    for (size_t i = 0; i < e.labels.size(); ++i) {
      if (e.input_ids[i] < 0 || e.input_ids[i] >= tokenizer().vocab_size()) __builtin_trap();
      if (e.labels[i] != mm::data::kIgnoreLabel && e.labels[i] != e.input_ids[i]) __builtin_trap();
    }
  });
  return 0;
}
