// `mm train` on several loopback ranks under `mm launch`, against one process with the same
// global batch: DDP and FSDP over 2, 3 and 4 ranks and HSDP 2x2 give the same per-step losses
// (1e-5 relative over 20 steps, fp32) and the same validation losses, on the Qwen2 text model
// and the tiny Qwen2-VL model, per token and per sample, with recompute, prefetch depths and
// units that stay gathered; ZeRO-1 equals DDP bitwise with a third of the optimizer state on 3
// ranks; FSDP over 4 holds a quarter of one process's parameter, gradient
// and optimizer bytes; bf16 gathers stay close to fp32; rank 0 alone logs and writes; a mesh
// that does not fit the world is a one-line error.
#include "dist_train_runs.h"

using namespace mm::test;

TEST(DistributedTrain, DdpTextLossesEqualOneProcess) {
  const std::string dir = mm::test::fresh_dir("dist_train_text");
  const std::string cfg = text_config(dir);
  // Global batch of 8 rows per step in 2 accumulation micro-steps: 1 x 4 rows, 2 x 2, 4 x 1.
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4 training.gradient_accumulation_steps=2");
  for (int n : {2, 4}) {
    // Over 2 ranks with recompute too: the recomputed blocks' gradients arrive in nested
    // backward passes, and the buckets must still be waited only at the very end.
    const TrainRun dist = train(cfg, n, dir + "/ddp.jsonl",
                                "training.micro_batch_size=" + std::to_string(4 / n) +
                                    " training.gradient_accumulation_steps=2 parallel.data_parallel_replicate_size=" +
                                    std::to_string(n) + (n == 2 ? " 'features.recompute=[\"model.layers.{*}\"]'" : ""));
    expect_same_run(one, dist, "qwen2 text, DDP over " + std::to_string(n));
    // Only rank 0 prints progress.
    EXPECT_NE(dist.output.find("[rank 0] iter 20/20"), std::string::npos) << dist.output;
    EXPECT_EQ(dist.output.find("[rank 1] iter"), std::string::npos) << dist.output;
  }
  // 3 ranks: a world size that divides no parameter size of this model (48, 96, 256 ...).
  const TrainRun one6 = train(cfg, 1, dir + "/one6.jsonl", "training.micro_batch_size=6");
  const TrainRun three = train(cfg, 3, dir + "/ddp3.jsonl", "training.micro_batch_size=2 parallel.data_parallel_replicate_size=3");
  expect_same_run(one6, three, "qwen2 text, DDP over 3");
  // ZeRO-1 over 3: the same elementwise update on a third of the optimizer state each.
  const TrainRun zero = train(cfg, 3, dir + "/zero3.jsonl",
                              "training.micro_batch_size=2 parallel.data_parallel_replicate_size=3 "
                              "parallel.distributed_optimizer=true");
  expect_same_run(one6, zero, "qwen2 text, ZeRO-1 over 3");
  EXPECT_EQ(zero.losses, three.losses);  // bitwise: the same arithmetic as DDP, partitioned
  EXPECT_NEAR(zero.optimizer_fraction, 1.0 / 3, 0.002);
  EXPECT_NEAR(three.optimizer_fraction, 1.0, 1e-12);
  std::printf("ZeRO-1 over 3: optimizer state per rank = %.4f of one process's\n", zero.optimizer_fraction);
}

TEST(DistributedTrain, FsdpAndHsdpTextLossesEqualOneProcess) {
  const std::string dir = mm::test::fresh_dir("dist_train_fsdp_text");
  const std::string cfg = text_config(dir);
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4 training.gradient_accumulation_steps=2");
  EXPECT_NEAR(one.memory_fraction, 1.0, 1e-12);
  // data_parallel_shard_size defaults to the rest of the world: FSDP.
  const TrainRun two = train(cfg, 2, dir + "/fsdp2.jsonl",
                             "training.micro_batch_size=2 training.gradient_accumulation_steps=2 "
                             "'features.recompute=[\"model.layers.{*}\"]'");
  expect_same_run(one, two, "qwen2 text, FSDP over 2 with recompute");
  const TrainRun four = train(cfg, 4, dir + "/fsdp4.jsonl",
                              "training.micro_batch_size=1 training.gradient_accumulation_steps=2 parallel.fsdp.prefetch=2");
  expect_same_run(one, four, "qwen2 text, FSDP over 4, prefetch 2");
  // A quarter, up to the padding of sizes that 4 does not divide.
  EXPECT_GE(four.memory_fraction, 0.25);
  EXPECT_LT(four.memory_fraction, 0.26);
  std::printf("FSDP over 4: parameter + gradient + optimizer bytes per rank = %.4f of one process's\n",
              four.memory_fraction);
  const TrainRun hsdp = train(cfg, 4, dir + "/hsdp.jsonl",
                              "training.micro_batch_size=1 training.gradient_accumulation_steps=2 "
                              "parallel.data_parallel_replicate_size=2 parallel.fsdp.reshard_after_forward=false");
  expect_same_run(one, hsdp, "qwen2 text, HSDP 2x2, units kept gathered after forward");
  EXPECT_NEAR(hsdp.memory_fraction, 0.5, 0.01);
  // 3 ranks: no parameter size of this model divides by 3 (48, 96, 256 x 48 ...); no prefetch.
  const TrainRun one6 = train(cfg, 1, dir + "/one6.jsonl", "training.micro_batch_size=6");
  const TrainRun three = train(cfg, 3, dir + "/fsdp3.jsonl", "training.micro_batch_size=2 parallel.fsdp.prefetch=0");
  expect_same_run(one6, three, "qwen2 text, FSDP over 3");
}

TEST(DistributedTrain, FsdpQwen2VlLossesEqualOneProcessAndBf16StaysClose) {
  const std::string dir = mm::test::fresh_dir("dist_train_fsdp_vl");
  const std::string cfg = vl_config(dir, 200);
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4");
  // Every block a unit (the vision tower's and the decoder's).
  const TrainRun two = train(cfg, 2, dir + "/fsdp2.jsonl", "training.micro_batch_size=2");
  expect_same_run(one, two, "qwen2_vl, FSDP over 2");
  // Only the decoder layers: the vision tower is part of the root unit.
  const TrainRun four = train(cfg, 4, dir + "/fsdp4.jsonl",
                              "training.micro_batch_size=1 'parallel.fsdp.units=[\"model.layers.{*}\"]'");
  expect_same_run(one, four, "qwen2_vl, FSDP over 4, decoder layers as units");
  const TrainRun hsdp = train(cfg, 4, dir + "/hsdp.jsonl", "training.micro_batch_size=1 parallel.data_parallel_replicate_size=2");
  expect_same_run(one, hsdp, "qwen2_vl, HSDP 2x2");
  // bf16 gathered parameters, fp32 gradient reduction and master weights: close, not equal.
  const TrainRun bf16 = train(cfg, 2, dir + "/bf16.jsonl", "training.micro_batch_size=2 parallel.fsdp.param_dtype=bf16");
  ASSERT_EQ(bf16.losses.size(), 20u) << bf16.output;
  double worst = 0;
  for (auto& [it, l] : one.losses) worst = std::max(worst, std::abs(bf16.losses.at(it) - l) / l);
  EXPECT_LT(worst, 1e-2);
  EXPECT_GT(worst, 1e-6);  // it really ran in bf16
  std::printf("qwen2_vl, FSDP over 2 with bf16 parameters: max relative loss difference to fp32 %.2e\n", worst);
}

TEST(DistributedTrain, DdpQwen2VlLossesEqualOneProcessPerTokenAndPerSample) {
  const std::string dir = mm::test::fresh_dir("dist_train_vl");
  const std::string cfg = vl_config(dir, 200);
  for (const std::string norm : {"per_token", "per_sample"}) {
    const std::string common = " training.loss_normalization=" + norm;
    const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4" + common);
    const TrainRun dist = train(cfg, 2, dir + "/ddp.jsonl",
                           "training.micro_batch_size=2 parallel.data_parallel_replicate_size=2" + common);
    expect_same_run(one, dist, "qwen2_vl " + norm + ", DDP over 2");
    if (norm == "per_sample") {
      // A sample's answer is 1 to 5 tokens here: the two normalisations give different losses.
      // Compared over the whole run: one batch whose answers all have the same length scores alike.
      const TrainRun per_token = train(cfg, 1, dir + "/tok.jsonl", "training.micro_batch_size=4");
      double apart = 0;
      for (auto& [it, l] : one.losses) apart = std::max(apart, std::abs(per_token.losses.at(it) - l));
      EXPECT_GT(apart, 1e-3);
    }
  }
}

TEST(DistributedTrain, MeshThatDoesNotFitTheWorldIsAClearError) {
  const std::string dir = mm::test::fresh_dir("dist_train_bad_mesh");
  const std::string cfg = text_config(dir);
  auto r = run_command(mm::test::mm_launch(2) + mm::test::mm_binary() + " train " + cfg +
                       " parallel.data_parallel_replicate_size=3 training.train_iters=1");
  EXPECT_NE(r.output.find("config: parallel.pipeline_parallel_size 1 x data_parallel_replicate_size 3 x "
                          "context_parallel_size 1 x "
                          "tensor_parallel_size 1 = 3 does not divide the world size 2"),
            std::string::npos)
      << r.output;
  // Both ranks stop with the error; the launcher exits with its code (2, a config error).
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// A 205M-parameter model (820 MB in fp32) loaded from an HF directory by FSDP over 4: the model
// is built without parameter storage and each rank reads only its slices of the file, so a
// rank's peak memory (weights, AdamW state and the runtime) stays under half of one process's,
// which holds all of them whole.
TEST(DistributedTrain, FsdpBuildsAndLoadsAModelNoRankHoldsWhole) {
  const std::string dir = fresh_dir("dist_train_big");
  const std::string cfg = text_config(dir);
  const std::string big = " model.config.hidden_size=1024 model.config.intermediate_size=2816 "
                          "model.config.num_hidden_layers=16 model.config.num_attention_heads=8 "
                          "model.config.num_key_value_heads=4 training.eval_iters=1 training.micro_batch_size=1";
  auto exported = run_command(mm_binary() + " train " + cfg + big + " training.train_iters=0 training.export_dir=" + dir + "/hf");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  // The run's own peak: resident memory at the end minus what the process held before the run
  // began (libtorch and its CUDA libraries, ~0.5 GiB whatever the model).
  auto peak = [](const std::string& metrics) {
    double v = 0;
    std::istringstream in(read_file(metrics));
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("peak_rss_bytes")) v = j["peak_rss_bytes"].get<double>() - j.value("start_rss_bytes", 0.0);
    }
    return v;
  };
  // Load and validate (no step: optimizer state would dwarf the weights in both runs).
  const std::string load = big + " training.train_iters=0 model.pretrained=" + dir + "/hf";
  // glibc's defaults (MM_HOST_ALLOCATOR=system): the peak then shows what the run held, not the
  // free heap mm's caching settings keep for the next step (up to 1 GiB).
  setenv("MM_HOST_ALLOCATOR", "system", 1);
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", load);
  const TrainRun four = train(cfg, 4, dir + "/fsdp4.jsonl", load);
  unsetenv("MM_HOST_ALLOCATOR");
  const double full = 4.0 * 205e6, p1 = peak(dir + "/one.jsonl"), p4 = peak(dir + "/fsdp4.jsonl");
  std::printf("peak resident memory of the run: one process %.0f MiB, a rank of FSDP over 4 %.0f MiB (the fp32 weights: %.0f MiB)\n",
              p1 / 1048576, p4 / 1048576, full / 1048576);
  EXPECT_GT(p1, 2.5 * full);  // one process: the weights and AdamW's two moments, whole
  EXPECT_LT(p4, 0.5 * p1);     // a rank of FSDP over 4: a quarter of each, plus the runtime
  // The same weights were loaded: the same validation loss.
  ASSERT_FALSE(one.val_losses.empty());
  ASSERT_EQ(four.val_losses.size(), one.val_losses.size()) << four.output;
  EXPECT_NEAR(four.val_losses[0], one.val_losses[0], 1e-5 * one.val_losses[0]);
}

// Under Slurm (srun starts the tasks; no mm launch): the ranks come from SLURM_PROCID and
// friends and the master from the first host of the node list; losses equal one process's.
TEST(DistributedTrain, RunsUnderSlurmVariables) {
  const std::string dir = fresh_dir("dist_train_slurm");
  const std::string cfg = text_config(dir);
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4");
  const std::string env = "SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_JOB_NODELIST=localhost MASTER_PORT=" +
                          std::to_string(free_port()) + " ";
  const std::string args = " train " + cfg + " training.micro_batch_size=2 parallel.data_parallel_replicate_size=2 ";
  auto r = run_command("(SLURM_PROCID=1 SLURM_LOCALID=1 " + env + mm_binary() + args + " > " + dir + "/rank1.log 2>&1 &) ; " +
                       "SLURM_PROCID=0 SLURM_LOCALID=0 " + env + mm_binary() + args + "training.metrics_file=" + dir +
                       "/slurm.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output << read_file(dir + "/rank1.log");
  EXPECT_NE(r.output.find("rank 0 of 2 (slurm)"), std::string::npos) << r.output;
  const auto losses = metrics_losses(dir + "/slurm.jsonl");
  ASSERT_EQ(losses.size(), 20u);
  for (auto& [it, l] : one.losses) EXPECT_NEAR(losses.at(it), l, 1e-5 * l) << "iteration " << it;
}
