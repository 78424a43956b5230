// Megatron-LM flags as overrides (config/megatron_flags.h) and training.global_batch_size
// resolved into micro-batches per step (training/parallel_setup.h).
#include <gtest/gtest.h>

#include "config_error.h"
#include "mindspeed_mm/config/megatron_flags.h"
#include "mindspeed_mm/training/parallel_setup.h"

using mm::config::translate_megatron_flags;
using mm::test::config_error;

TEST(MegatronFlags, BecomeConfigOverrides) {
  const std::vector<std::string> own = {"--help", "--print-config"};
  const std::vector<std::string> in = {"cfg.yaml",
                                       "--tensor-model-parallel-size", "2",
                                       "--pipeline-model-parallel-size=4",
                                       "--sequence-parallel",
                                       "--num-layers-per-virtual-pipeline-stage", "3",
                                       "--micro-batch-size", "1",
                                       "--global-batch-size", "64",
                                       "training.seed=3",
                                       "--bf16",
                                       "--print-config",
                                       "--use-distributed-optimizer"};
  const std::vector<std::string> want = {"cfg.yaml",
                                         "parallel.tensor_parallel_size=2",
                                         "parallel.pipeline_parallel_size=4",
                                         "parallel.sequence_parallel=true",
                                         "parallel.num_layers_per_virtual_pipeline_stage=3",
                                         "training.micro_batch_size=1",
                                         "training.global_batch_size=64",
                                         "training.seed=3",
                                         "training.precision=bf16",
                                         "--print-config",
                                         "parallel.distributed_optimizer=true"};
  EXPECT_EQ(translate_megatron_flags(in, own), want);
  // After "--" nothing is translated.
  EXPECT_EQ(translate_megatron_flags({"--", "--lr", "1"}, own), (std::vector<std::string>{"--", "--lr", "1"}));
}

TEST(MegatronFlags, MisspeltOrIncompleteFlagsAreClearErrors) {
  const std::vector<std::string> own = {"--help", "--print-config"};
  EXPECT_EQ(config_error([&] { translate_megatron_flags({"--tensor-model-paralel-size", "2"}, own); }),
            "config: unknown flag '--tensor-model-paralel-size' on the command line, did you mean "
            "'--tensor-model-parallel-size'?");
  EXPECT_EQ(config_error([&] { translate_megatron_flags({"--print-confg"}, own); }),
            "config: unknown flag '--print-confg' on the command line, did you mean '--print-config'?");
  EXPECT_NE(config_error([&] { translate_megatron_flags({"--frobnicate-everything"}, own); })
                .find("unknown flag '--frobnicate-everything'"),
            std::string::npos);
  EXPECT_EQ(config_error([&] { translate_megatron_flags({"--micro-batch-size", "--bf16"}, own); }),
            "config: flag '--micro-batch-size' on the command line needs a value (it sets training.micro_batch_size)");
  EXPECT_EQ(config_error([&] { translate_megatron_flags({"--sequence-parallel=false"}, own); }),
            "config: flag '--sequence-parallel' on the command line takes no value (it sets "
            "parallel.sequence_parallel=true)");
}

TEST(MegatronFlags, GlobalBatchSizeSetsTheMicroBatchesPerStep) {
  mm::config::TrainingConfig t;
  t.micro_batch_size = 2;
  EXPECT_EQ(mm::training::resolve_global_batch(t, 4).gradient_accumulation_steps, 1);  // unset: unchanged
  t.global_batch_size = 64;
  EXPECT_EQ(mm::training::resolve_global_batch(t, 4).gradient_accumulation_steps, 8);
  t.gradient_accumulation_steps = 8;  // consistent: fine
  EXPECT_EQ(mm::training::resolve_global_batch(t, 4).gradient_accumulation_steps, 8);
  t.gradient_accumulation_steps = 2;
  EXPECT_EQ(config_error([&] { mm::training::resolve_global_batch(t, 4); }),
            "config: training.global_batch_size 64 = micro_batch_size 2 x data-parallel size 4 x 8 micro-batches, but "
            "training.gradient_accumulation_steps is 2 (set one of them)");
  t.gradient_accumulation_steps = 1;
  EXPECT_EQ(config_error([&] { mm::training::resolve_global_batch(t, 3); }),
            "config: training.global_batch_size 64 is not a multiple of micro_batch_size 2 x data-parallel size 3 = 6");
}
