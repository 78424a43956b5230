// The mm binary as a user meets it: exit codes and one-line messages for each class of config
// error, --print-config, version, help.
#include <gtest/gtest.h>

#include "run_command.h"

namespace {

using mm::test::run_command;

std::string write_config(const std::string& dir, const std::string& extra) {
  std::string text = "data:\n  paths: [" + dir + "/corpus.txt]\n  seq_len: 16\nmodel:\n  id: qwen2\n  config:\n"
                     "    hidden_size: 32\n    intermediate_size: 64\n    num_hidden_layers: 1\n"
                     "    num_attention_heads: 2\n    num_key_value_heads: 1\ntraining:\n  train_iters: 2\n" + extra;
  mm::test::write_file(dir + "/cfg.yaml", text);
  mm::test::write_file(dir + "/corpus.txt", "hello world\n\nanother paragraph of text here\n");
  return dir + "/cfg.yaml";
}

// Output minus libtorch's own warnings: exactly what mm printed.
std::string last_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
}

TEST(Cli, VersionNamesLibtorchAndFeatures) {
  auto r = run_command(mm::test::mm_binary() + " version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("libtorch 2.11."), std::string::npos) << r.output;
  // PyPI's wheel is a CUDA build: compiled in, and the device count says what this machine has.
  EXPECT_NE(r.output.find("cuda: compiled in (CUDA 13."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cuda devices: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("collectives (c10d): gloo, nccl"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("models: llava, qwen2, qwen2_5_vl, qwen2_vl"), std::string::npos) << r.output;
}

TEST(Cli, BenchPeakReportsAPositiveRate) {
  auto r = run_command(mm::test::mm_binary() + " bench peak --size 256 --reps 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  double tflops = 0;
  auto pos = r.output.find("threads: ");
  ASSERT_NE(pos, std::string::npos) << r.output;
  tflops = std::atof(r.output.c_str() + pos + 9);
  EXPECT_GT(tflops, 0.0) << r.output;
}

TEST(Cli, TrainHelpListsOverrides) {
  auto r = run_command(mm::test::mm_binary() + " train --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--print-config"), std::string::npos);
  EXPECT_NE(r.output.find("key.sub=value"), std::string::npos);
}

TEST(Cli, ConfigErrorsExitWithCode2AndOneLine) {
  std::string dir = mm::test::fresh_dir("cli_errors");
  std::string cfg = write_config(dir, "  micro_bach_size: 4\n");
  auto r = run_command(mm::test::mm_binary() + " train " + cfg);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: config: unknown key 'training.micro_bach_size', did you mean "
                      "'training.micro_batch_size'? in cfg.yaml line 14\n");

  cfg = write_config(dir, "");
  r = run_command(mm::test::mm_binary() + " train " + cfg + " training.optimizer.lr=-1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: config: training.optimizer.lr must be > 0 (got -1) on the command line\n");

  r = run_command(mm::test::mm_binary() + " train " + cfg + " training.train_iters=abc");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: config: training.train_iters must be an integer (got 'abc') on the command line\n");

  r = run_command(mm::test::mm_binary() + " train " + cfg + " model.id=qwen3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(last_line(r.output), "error: config: model.id: unknown model id 'qwen3' (known: llava, qwen2, qwen2_5_vl, qwen2_vl, wan_dit, wan_vae)");

  r = run_command(mm::test::mm_binary() + " train " + cfg + " model.config.hiden_size=64");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(last_line(r.output),
            "error: config: unknown qwen2 key 'hiden_size' (did you mean 'hidden_size'?) in model.config in cfg.yaml");

  r = run_command(mm::test::mm_binary() + " train " + cfg + " model.config.num_attention_heads=3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(last_line(r.output).find("num_attention_heads"), std::string::npos) << r.output;
  EXPECT_NE(last_line(r.output).find("in model.config in cfg.yaml"), std::string::npos) << r.output;

  r = run_command(mm::test::mm_binary() + " train " + dir + "/missing.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: config: " + dir + "/missing.yaml: no such file\n");
}

TEST(Cli, RuntimeErrorsExitWithCode1) {
  std::string dir = mm::test::fresh_dir("cli_runtime");
  std::string cfg = write_config(dir, "");
  auto r = run_command(mm::test::mm_binary() + " train " + cfg + " data.paths=[" + dir + "/nope.txt]");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(dir + "/nope.txt"), std::string::npos) << r.output;
}

TEST(Cli, PrintConfigShowsResolvedValues) {
  std::string dir = mm::test::fresh_dir("cli_print");
  std::string cfg = write_config(dir, "");
  auto r = run_command(mm::test::mm_binary() + " train " + cfg + " --print-config training.optimizer.lr=0.5");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("lr: 0.5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("micro_batch_size: 8"), std::string::npos) << r.output;  // a default
  EXPECT_NE(r.output.find("hidden_size: 32"), std::string::npos) << r.output;
}

}  // namespace
