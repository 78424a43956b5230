// Config: every error class names the key and where it came from; overrides; round trip.
#include <gtest/gtest.h>

#include "mindspeed_mm/config/config.h"

namespace {

using mm::config::parse_config;

const char* kBase = R"(data:
  paths: [/tmp/x.txt]
model:
  id: qwen2
  config:
    hidden_size: 64
training:
  train_iters: 10
  optimizer:
    lr: 0.001
)";

std::string error_of(const std::string& yaml, std::vector<std::string> overrides = {}) {
  try {
    parse_config(yaml, "test.yaml", overrides);
  } catch (const mm::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ParsesDefaultsAndValues) {
  auto c = parse_config(kBase, "test.yaml", {});
  EXPECT_EQ(c.training.train_iters, 10);
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 0.001);
  EXPECT_EQ(c.training.micro_batch_size, 8);  // default
  EXPECT_EQ(c.model.config["hidden_size"].get<int64_t>(), 64);
  EXPECT_EQ(c.data.paths.size(), 1u);
}

TEST(Config, UnknownKeyHasDidYouMeanAndLine) {
  std::string y = std::string(kBase) + "  micro_batch_sise: 4\n";
  EXPECT_EQ(error_of(y), "config: unknown key 'training.micro_batch_sise', did you mean 'training.micro_batch_size'? in test.yaml line 11");
}

TEST(Config, UnknownSection) {
  std::string y = std::string(kBase) + "trainig:\n  x: 1\n";
  EXPECT_EQ(error_of(y), "config: unknown key 'trainig', did you mean 'training'? in test.yaml line 11");
}

TEST(Config, WrongTypeNamesKeyFileLine) {
  std::string y = kBase;
  y.replace(y.find("train_iters: 10"), 15, "train_iters: ten");
  EXPECT_EQ(error_of(y), "config: training.train_iters must be an integer (got 'ten') in test.yaml line 8");
}

TEST(Config, OutOfRange) {
  std::string y = kBase;
  y.replace(y.find("lr: 0.001"), 9, "lr: -1");
  EXPECT_EQ(error_of(y), "config: training.optimizer.lr must be > 0 (got -1) in test.yaml line 10");
}

TEST(Config, BadChoiceSuggests) {
  EXPECT_EQ(error_of(kBase, {"training.precision=bf61"}),
            "config: training.precision must be one of fp32, bf16 (got 'bf61', did you mean 'bf16'?) on the command line");
}

TEST(Config, OverridesApplyAndAreChecked) {
  auto c = parse_config(kBase, "test.yaml", {"training.optimizer.lr=3e-4", "features.recompute=[model.layers.{*}]",
                                             "training.optimizer.betas=[0.9, 0.99]"});
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 3e-4);
  ASSERT_EQ(c.features.recompute.size(), 1u);
  EXPECT_EQ(c.features.recompute[0], "model.layers.{*}");
  EXPECT_DOUBLE_EQ(c.training.optimizer.betas[1], 0.99);
  EXPECT_EQ(error_of(kBase, {"training.train_iters=-3"}), "config: training.train_iters must be >= 0 (got -3) on the command line");
  EXPECT_EQ(error_of(kBase, {"training.bogus_knob=1"}), "config: unknown key 'training.bogus_knob' on the command line");
  EXPECT_EQ(error_of(kBase, {"oops"}), "config: override 'oops' must look like key.sub=value");
}

TEST(Config, CrossFieldRules) {
  EXPECT_EQ(error_of(kBase, {"training.resume=auto"}), "config: training.resume: auto needs training.save_dir in test.yaml");
  EXPECT_EQ(error_of(kBase, {"training.optimizer.betas=[0.9]"}), "config: training.optimizer.betas must hold 2 numbers (got 1) in test.yaml");
}

TEST(Config, InvalidYamlNamesLine) {
  std::string e = error_of("data:\n  paths: [a\ntraining: {\n");
  EXPECT_NE(e.find("test.yaml line"), std::string::npos) << e;
  EXPECT_NE(e.find("invalid YAML"), std::string::npos) << e;
}

TEST(Config, PrintedConfigParsesBackToTheSame) {
  auto c = parse_config(kBase, "test.yaml", {"training.precision=bf16"});
  std::string y = mm::config::to_yaml(c);
  auto c2 = parse_config(y, "printed.yaml", {});
  EXPECT_EQ(mm::config::to_yaml(c2), y);
  EXPECT_EQ(c2.training.precision, "bf16");
}

}  // namespace
