// Unit tests of mm::data::Tokenizer on small hand-written tokenizer.json files: one test per
// component behaviour (BPE merges, ignore_merges, byte_fallback, unk; Split behaviours; added
// tokens' lstrip/rstrip/single_word/normalized; TemplateProcessing; ByteLevel), malformed
// files, empty input, invalid UTF-8 and a 1 MB line. Real files are in the conformance test.
#include <gtest/gtest.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/components.h"
#include "mindspeed_mm/data/tokenizer/tokenizer.h"
#include "mindspeed_mm/data/tokenizer/unicode_regex.h"
#include "run_command.h"

using mm::data::Tokenizer;
using nlohmann::json;
using Ids = std::vector<int64_t>;

namespace {

// A tokenizer.json with a BPE model over `vocab` and nothing else unless `extra` sets it.
json make_json(const json& vocab, const json& merges = json::array(), const json& extra = json::object()) {
  json j = {{"version", "1.0"},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"post_processor", nullptr},
            {"decoder", nullptr},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab}, {"merges", merges}}}};
  for (const auto& [k, v] : extra.items()) {
    if (k == "model") {
      for (const auto& [mk, mv] : v.items()) j["model"][mk] = mv;
    } else {
      j[k] = v;
    }
  }
  return j;
}

Tokenizer load(const json& j) { return Tokenizer::from_json_text(j.dump(), "test.json"); }

json added_token(const std::string& content, int64_t id, json flags = json::object()) {
  json t = {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
            {"rstrip", false},   {"normalized", false}, {"special", false}};
  for (const auto& [k, v] : flags.items()) t[k] = v;
  return t;
}

std::string error_of(const std::string& text) {
  try {
    Tokenizer::from_json_text(text, "bad/tokenizer.json");
  } catch (const mm::Error& e) {
    return e.what();
  }
  return "(no error)";
}

const json kChars = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {" ", 6}, {"-", 7},
                     {"a-", 8}, {"-b", 9}, {"--", 10}, {"x", 11}, {"é", 12}, {"<unk>", 13}};

}  // namespace

TEST(Tokenizer, BpeMergesLowestRankFirst) {
  // "b c" outranks "a b": abc -> a|bc -> abc; with only "a b": ab|c.
  EXPECT_EQ(load(make_json(kChars, {"b c", "a b", "a bc"})).encode("abc", false), (Ids{5}));
  EXPECT_EQ(load(make_json(kChars, {"b c", "a b"})).encode("abc", false), (Ids{0, 4}));
  EXPECT_EQ(load(make_json(kChars, {"a b", "b c"})).encode("abc", false), (Ids{3, 2}));
  // Merges may also be given as [a, b] pairs.
  EXPECT_EQ(load(make_json(kChars, json::parse(R"([["a","b"],["b","c"]])"))).encode("abc", false), (Ids{3, 2}));
}

TEST(Tokenizer, IgnoreMergesTakesWholeWordFromVocab) {
  json merges = {"a b"};
  EXPECT_EQ(load(make_json(kChars, merges)).encode("abc", false), (Ids{3, 2}));
  EXPECT_EQ(load(make_json(kChars, merges, {{"model", {{"ignore_merges", true}}}})).encode("abc", false), (Ids{5}));
}

TEST(Tokenizer, ByteFallbackAndUnk) {
  json vocab = kChars;
  vocab["<0xC3>"] = 20;
  vocab["<0xB6>"] = 21;
  // ö (C3 B6) is not in the vocabulary: its bytes are; without byte_fallback it vanishes.
  EXPECT_EQ(load(make_json(vocab, {}, {{"model", {{"byte_fallback", true}}}})).encode("aöb", false), (Ids{0, 20, 21, 1}));
  EXPECT_EQ(load(make_json(vocab)).encode("aöb", false), (Ids{0, 1}));
  // ü (C3 BC) has no <0xBC>: falls to unk; fuse_unk joins a run of unknowns into one.
  json unk = {{"model", {{"byte_fallback", true}, {"unk_token", "<unk>"}}}};
  EXPECT_EQ(load(make_json(vocab, {}, unk)).encode("aüüb", false), (Ids{0, 13, 13, 1}));
  unk["model"]["fuse_unk"] = true;
  EXPECT_EQ(load(make_json(vocab, {}, unk)).encode("aüüb", false), (Ids{0, 13, 1}));
}

TEST(Tokenizer, SplitBehaviours) {
  // With ignore_merges a piece that is a whole vocabulary entry becomes one id, so the ids
  // show where Split cut: a=0 b=1 -=7 a-=8 -b=9 --=10.
  auto split = [](const std::string& behavior, bool invert, const std::string& text) {
    json pre = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return load(make_json(kChars, {}, {{"pre_tokenizer", pre}, {"model", {{"ignore_merges", true}}}})).encode(text, false);
  };
  EXPECT_EQ(split("Isolated", false, "a-b"), (Ids{0, 7, 1}));
  EXPECT_EQ(split("Removed", false, "a-b"), (Ids{0, 1}));
  EXPECT_EQ(split("MergedWithPrevious", false, "a-b"), (Ids{8, 1}));
  EXPECT_EQ(split("MergedWithNext", false, "a-b"), (Ids{0, 9}));
  EXPECT_EQ(split("Contiguous", false, "a--b"), (Ids{0, 10, 1}));
  EXPECT_EQ(split("Isolated", false, "a--b"), (Ids{0, 7, 7, 1}));
  EXPECT_EQ(split("Removed", true, "a-b"), (Ids{7}));  // invert: the letters are the delimiters
  // A regex with a Unicode class: \p{L}+ isolates the letters, é included.
  json pre = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Removed"}, {"invert", false}};
  EXPECT_EQ(load(make_json(kChars, {}, {{"pre_tokenizer", pre}})).encode("aé-b", false), (Ids{7}));
  // Oniguruma's \s: U+0085 is whitespace, U+180E (PCRE2's \h has it) is not.
  EXPECT_EQ(mm::data::UnicodeRegex::translate("\\s+(?!\\S)|[^\\s\\p{L}]\\h"),
            "[\\t-\\r\\x{85}\\p{Z}]+(?![^\\t-\\r\\x{85}\\p{Z}])|[^\\t-\\r\\x{85}\\p{Z}\\p{L}][0-9a-fA-F]");
  json ws = {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Removed"}, {"invert", false}};
  Tokenizer ws_tok = load(make_json(kChars, {}, {{"pre_tokenizer", ws}, {"model", {{"ignore_merges", true}}}}));
  EXPECT_EQ(ws_tok.encode("a\xC2\x85" "b\u3000a", false), (Ids{0, 1, 0}));
  EXPECT_EQ(mm::data::UnicodeRegex("\\s").find_all("a\u180E" "b").size(), 0u);
  json bad = {{"type", "Split"}, {"pattern", {{"Regex", "-"}}}, {"behavior", "Sideways"}, {"invert", false}};
  EXPECT_NE(error_of(make_json(kChars, {}, {{"pre_tokenizer", bad}}).dump()).find("split behavior 'Sideways'"),
            std::string::npos);
}

// Added-token ids are HF's: the model's id when the content is in its vocabulary, else the
// next id after the model's 14 entries, in file order (the "id" in the file is not used).
TEST(Tokenizer, AddedTokensStripAndSingleWord) {
  auto with = [](json flags, const std::string& text) {
    json at = json::array({added_token("<m>", 14, flags)});
    return load(make_json(kChars, {}, {{"added_tokens", at}})).encode(text, false);
  };
  EXPECT_EQ(with({}, "a <m> b"), (Ids{0, 6, 14, 6, 1}));
  EXPECT_EQ(with({{"lstrip", true}}, "a  <m> b"), (Ids{0, 14, 6, 1}));
  EXPECT_EQ(with({{"rstrip", true}}, "a <m>  b"), (Ids{0, 6, 14, 1}));
  EXPECT_EQ(with({{"lstrip", true}, {"rstrip", true}}, " <m> "), (Ids{14}));
  // single_word: a match touching a word character on either side is left as text.
  json at = json::array({added_token("ba", 14, {{"single_word", true}})});
  Tokenizer sw = load(make_json(kChars, {}, {{"added_tokens", at}}));
  EXPECT_EQ(sw.encode("ba cba bac ba", false), (Ids{14, 6, 2, 1, 0, 6, 1, 0, 2, 6, 14}));
  // Leftmost-longest: "bac" wins over "ba" at the same start.
  json two = json::array({added_token("ba", 14), added_token("bac", 15)});
  EXPECT_EQ(load(make_json(kChars, {}, {{"added_tokens", two}})).encode("xbacba", false), (Ids{11, 15, 14}));
  // As in HF, an added token already in the model's vocabulary takes the model's id.
  json known = json::array({added_token("ab", 99)});
  EXPECT_EQ(load(make_json(kChars, {}, {{"added_tokens", known}})).encode("cab", false), (Ids{2, 3}));
}

TEST(Tokenizer, NormalizedAddedTokensMatchAfterNfc) {
  // "xé" written decomposed (e + U+0301): only a normalized=true token sees it after NFC.
  const std::string decomposed = "xe\xCC\x81";
  auto with = [&](bool normalized) {
    json at = json::array({added_token("x\xC3\xA9", 14, {{"normalized", normalized}})});
    return load(make_json(kChars, {}, {{"added_tokens", at}, {"normalizer", {{"type", "NFC"}}}})).encode(decomposed, false);
  };
  EXPECT_EQ(with(true), (Ids{14}));
  EXPECT_EQ(with(false), (Ids{11, 12}));
  json seq = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFD"}}, {{"type", "NFC"}}})}};
  EXPECT_EQ(load(make_json(kChars, {}, {{"normalizer", seq}})).encode(decomposed, false), (Ids{11, 12}));
}

TEST(Tokenizer, TemplateProcessingAndSpecialTokens) {
  json at = json::array({added_token("<s>", 14, {{"special", true}}), added_token("<m>", 15)});
  json post = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [14], "tokens": ["<s>"]}}})");
  json seq = {{"type", "Sequence"}, {"processors", json::array({{{"type", "ByteLevel"}}, post})}};
  Tokenizer t = load(make_json(kChars, {}, {{"added_tokens", at}, {"post_processor", seq}}));
  EXPECT_EQ(t.encode("a<m>", false), (Ids{0, 15}));
  EXPECT_EQ(t.encode("a<m>", true), (Ids{14, 0, 15}));
  EXPECT_EQ(t.encode("", true), (Ids{14}));
  EXPECT_EQ(t.encode("", false), (Ids{}));
  // No decoder: tokens joined by spaces, as HF does; skip_special drops <s> but not <m>.
  EXPECT_EQ(t.decode({14, 0, 15}, false), "<s> a <m>");
  EXPECT_EQ(t.decode({14, 0, 15}, true), "a <m>");
  EXPECT_EQ(t.token_to_id("<m>"), 15);
  EXPECT_EQ(t.token_to_id("bc"), 4);
  EXPECT_FALSE(t.token_to_id("zz").has_value());
  EXPECT_EQ(t.id_to_token(14), "<s>");
  EXPECT_EQ(t.vocab_size(), 16);
  EXPECT_THROW(t.id_to_token(45), mm::Error);
  EXPECT_THROW(t.decode({1000}, false), mm::Error);
}

namespace {
// Byte-level BPE over all 256 byte characters plus a few merges, GPT-2's pipeline.
Tokenizer byte_level_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[mm::data::byte_level_char(static_cast<unsigned char>(b))] = b;
  vocab["\xC4\xA0w"] = 256;  // "Ġw"
  vocab["or"] = 257;
  vocab["\xC4\xA0wor"] = 258;
  json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json at = json::array({added_token("<|endoftext|>", 259, {{"special", true}})});
  return load(make_json(vocab, {"\xC4\xA0 w", "o r", "\xC4\xA0w or"},
                        {{"pre_tokenizer", bl}, {"decoder", bl}, {"post_processor", bl}, {"added_tokens", at}}));
}
}  // namespace

TEST(Tokenizer, ByteLevelRoundTripsAnyText) {
  Tokenizer t = byte_level_tokenizer();
  EXPECT_EQ(t.encode(" world", false), (Ids{258, 'l', 'd'}));
  EXPECT_EQ(t.encode("a<|endoftext|> world", false), (Ids{'a', 259, 258, 'l', 'd'}));
  for (std::string s : {"", " ", "hello  world\n\n\ttabs", "日本語テキスト、中文。", "emoji 😀👍🏽 and ✓",
                        "العربية кириллица", "code(x) { return x->y; }  \r\n"})
    EXPECT_EQ(t.decode(t.encode(s, false), false), s) << s;
  EXPECT_EQ(t.decode({'a', 259}, true), "a");
  EXPECT_EQ(t.encode("", false), (Ids{}));
  EXPECT_EQ(t.decode({}, false), "");
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacter) {
  // Each maximal invalid subsequence is one U+FFFD, as Rust's from_utf8_lossy and JS do:
  // a lone 0xFF, a truncated 3-byte sequence E2 82, a surrogate ED A0 80 (three U+FFFD).
  Tokenizer t = byte_level_tokenizer();
  EXPECT_EQ(t.encode("a\xFF" "b", false), t.encode("a\xEF\xBF\xBD" "b", false));
  EXPECT_EQ(t.decode(t.encode("a\xE2\x82" "b", false), false), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(t.decode(t.encode("\xED\xA0\x80", false), false), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  // Decoding ids that form invalid UTF-8 (a lone continuation byte) gives U+FFFD too.
  EXPECT_EQ(t.decode({0x80}, false), "\xEF\xBF\xBD");
}

TEST(Tokenizer, OneMegabyteLine) {
  Tokenizer t = byte_level_tokenizer();
  std::string words, spaces(1 << 20, ' '), one_word(1 << 20, 'o');
  while (words.size() < (1 << 20)) words += "héllo world 123 日本 ";
  for (const std::string* s : {&words, &spaces, &one_word}) {
    auto ids = t.encode(*s, false);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(t.decode(ids, false), *s);
  }
  // 1 MB of 'o' in one word: "o r" never applies, one id per byte.
  EXPECT_EQ(t.encode(one_word, false).size(), one_word.size());
  // Spaces: GPT-2's regex keeps the run as one word (\s+), one id per byte again.
  EXPECT_EQ(t.encode(spaces, false).size(), spaces.size());
}

TEST(Tokenizer, MalformedFilesAreClearErrors) {
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                                : ::testing::AssertionFailure() << "'" << msg << "' lacks '" << part << "'";
  };
  EXPECT_TRUE(has(error_of("{\"model\": "), "bad/tokenizer.json: not valid JSON"));
  EXPECT_TRUE(has(error_of("[1, 2]"), "bad/tokenizer.json: top level must be a JSON object"));
  EXPECT_TRUE(has(error_of("{\"version\": \"1.0\"}"), "bad/tokenizer.json: no \"model\" section"));
  json j = make_json(kChars);
  // Types HF has but we do not: named, never skipped.
  j["normalizer"] = {{"type", "Nmt"}};
  EXPECT_TRUE(has(error_of(j.dump()), "bad/tokenizer.json: normalizer type 'Nmt' is not supported"));
  j = make_json(kChars);
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  EXPECT_TRUE(has(error_of(j.dump()), "pre_tokenizer type 'UnicodeScripts' is not supported"));
  j = make_json(kChars);
  j["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "Teleport"}}})}};
  EXPECT_TRUE(has(error_of(j.dump()), "decoder type 'Teleport' is not supported"));
  j = make_json(kChars);
  j["post_processor"] = {{"type", "Quantum"}};
  EXPECT_TRUE(has(error_of(j.dump()), "post_processor type 'Quantum' is not supported"));
  j = make_json(kChars);
  j["model"]["type"] = "Trigram";
  EXPECT_TRUE(has(error_of(j.dump()), "model type 'Trigram' is not supported"));
  // Malformed members of supported components.
  j = make_json(kChars);
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  EXPECT_TRUE(has(error_of(j.dump()), "bad/tokenizer.json: precompiled_charsmap is 3 bytes, too short"));
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AA*A"}};
  EXPECT_TRUE(has(error_of(j.dump()), "invalid base64 character at offset 2"));
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "QAAAAAAA"}};  // declares 64 trie bytes
  EXPECT_TRUE(has(error_of(j.dump()), "declares a 64-byte trie but holds 2 bytes"));
  j = make_json(kChars);
  j["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_TRUE(has(error_of(j.dump()), "post_processor 'BertProcessing' has no \"cls\""));
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"<s>"}}, {"sep", {"</s>", 2}}};
  EXPECT_TRUE(has(error_of(j.dump()), "RobertaProcessing \"cls\" must be [token, id]"));
  j = make_json(kChars);
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  EXPECT_TRUE(has(error_of(j.dump()), "Metaspace replacement 'ab' must be one character"));
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}};
  EXPECT_TRUE(has(error_of(j.dump()), "Metaspace prepend_scheme 'sometimes' is not one of always, first, never"));
  j = make_json(kChars);
  j["model"] = {{"type", "Unigram"}, {"unk_id", 5}, {"vocab", json::array({json::array({"a", -1.0})})}};
  EXPECT_TRUE(has(error_of(j.dump()), "Unigram unk_id 5 is outside the vocabulary of 1"));
  j["model"] = {{"type", "Unigram"}, {"vocab", json::array({json::array({"a"})})}};
  EXPECT_TRUE(has(error_of(j.dump()), "Unigram vocab entry 0 must be [piece, score]"));
  j["model"] = {{"type", "WordPiece"}, {"vocab", {{"a", "zero"}}}};
  EXPECT_TRUE(has(error_of(j.dump()), "WordPiece vocab entry 'a' has a non-integer id \"zero\""));
  EXPECT_TRUE(has(error_of(make_json(kChars, {"a q"}).dump()), "uses 'q', which is not in the vocabulary"));
  EXPECT_TRUE(has(error_of(make_json(kChars, {"c a"}).dump()), "makes 'ca', which is not in the vocabulary"));
  EXPECT_TRUE(has(error_of(make_json(kChars, {"abc"}).dump()), "merge 0 'abc' is not two tokens"));
  j = make_json(kChars);
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(["}}}, {"behavior", "Isolated"}};
  EXPECT_TRUE(has(error_of(j.dump()), "regex '([' does not compile"));
  try {
    Tokenizer::from_file("/nonexistent/tokenizer.json");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const mm::Error& e) {
    EXPECT_TRUE(has(e.what(), "/nonexistent/tokenizer.json: cannot open"));
  }
}

TEST(Tokenizer, Gpt2VocabAndMergesFiles) {
  std::string dir = mm::test::fresh_dir("tokenizer_gpt2_files");
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[mm::data::byte_level_char(static_cast<unsigned char>(b))] = b;
  vocab["\xC4\xA0w"] = 256;
  vocab["<|endoftext|>"] = 257;
  mm::test::write_file(dir + "/vocab.json", vocab.dump());
  mm::test::write_file(dir + "/merges.txt", "#version: 0.2\n\xC4\xA0 w\n");
  Tokenizer t = Tokenizer::from_gpt2_files(dir + "/vocab.json", dir + "/merges.txt");
  EXPECT_EQ(t.encode("a w<|endoftext|>", false), (Ids{'a', 256, 257}));
  EXPECT_EQ(t.decode({'a', 256, 257}, true), "a w");
  EXPECT_EQ(t.vocab_size(), 258);
  mm::test::write_file(dir + "/bad.txt", "#version: 0.2\n\xC4\xA0 w x\n");
  try {
    Tokenizer::from_gpt2_files(dir + "/vocab.json", dir + "/bad.txt");
    ADD_FAILURE() << "no error for a three-part merge line";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt:2: a merge must be two tokens"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, EncodeIsThreadSafe) {
  // encode() is const and shares the BPE word cache: two threads must see the ids one sees.
  Tokenizer t = byte_level_tokenizer();
  std::vector<std::string> lines;
  for (int i = 0; i < 2000; ++i) lines.push_back("world " + std::to_string(i * 7919) + " wor\xC3\xB6ld " + std::to_string(i));
  std::vector<Ids> expect;
  for (const auto& l : lines) expect.push_back(byte_level_tokenizer().encode(l, false));
  std::vector<size_t> wrong(2, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k)
    threads.emplace_back([&, k] {
      for (size_t i = 0; i < lines.size(); ++i) wrong[k] += t.encode(lines[i], false) != expect[i];
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong[0] + wrong[1], 0u);
}

// BatchLongest padding and truncation semantics of HF's encode / encode_batch (Fixed padding
// and both truncation directions are checked against HF in test_tokenizer_variants.cpp).
TEST(Tokenizer, BatchLongestPaddingAndTruncation) {
  json post = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "c", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"c": {"id": "c", "ids": [2], "tokens": ["c"]}}})");
  json pad = {{"strategy", "BatchLongest"}, {"direction", "Right"}, {"pad_to_multiple_of", 4}, {"pad_id", 13}};
  json trunc = {{"direction", "Right"}, {"max_length", 5}, {"strategy", "LongestFirst"}, {"stride", 0}};
  Tokenizer t = load(make_json(kChars, {}, {{"post_processor", post}, {"padding", pad}, {"truncation", trunc}}));
  // One text: BatchLongest is its own length, rounded up to a multiple of 4.
  EXPECT_EQ(t.encode("ab", true), (Ids{2, 0, 1, 13}));
  EXPECT_EQ(t.encode("", false), (Ids{}));
  // Truncation keeps 5 - 1 ids for the sequence when the special token is added, 5 without.
  EXPECT_EQ(t.encode("aabbaab", true), (Ids{2, 0, 0, 1, 1, 13, 13, 13}));
  EXPECT_EQ(t.encode("aabbaab", false), (Ids{0, 0, 1, 1, 0, 13, 13, 13}));
  // A batch pads everything to its longest (5, rounded to 8).
  EXPECT_EQ(t.encode_batch({"a", "aabbaab", ""}, true, 2),
            (std::vector<Ids>{{2, 0, 13, 13, 13, 13, 13, 13}, {2, 0, 0, 1, 1, 13, 13, 13}, {2, 13, 13, 13, 13, 13, 13, 13}}));
  json tiny = {{"direction", "Right"}, {"max_length", 0}, {"strategy", "LongestFirst"}, {"stride", 0}};
  EXPECT_NE(error_of(make_json(kChars, {}, {{"post_processor", post}, {"truncation", tiny}}).dump())
                .find("truncation max_length 0 leaves no room for the 1 special tokens"),
            std::string::npos);
  json bad = {{"strategy", "Longest"}, {"direction", "Right"}};
  EXPECT_NE(error_of(make_json(kChars, {}, {{"padding", bad}}).dump()).find("padding strategy \"Longest\""),
            std::string::npos);
}
