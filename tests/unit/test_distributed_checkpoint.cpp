// Distributed checkpoints through `mm train` on loopback ranks: a checkpoint written by FSDP over
// 4 loads into DDP over 2, one process, ZeRO-1 over 3 and FSDP over 2 with bitwise-equal weights
// and optimizer state, and training continues on the same samples (the data loader's position
// reshards); HF export from sharded state, streamed, equals the checkpoint's weights; a run killed mid-step at a random iteration, or killed while saving, resumes with
// losses bitwise equal to the uninterrupted run and the previous checkpoint intact; a rank killed
// mid-step makes every rank and mm launch exit non-zero within the collective timeout. The same
// for tensor-parallel layouts: FSDP2 x TP2 -> TP2 -> one process -> TP4 -> TP2 x DP2 ZeRO-1 -> FSDP 4.
#include <chrono>
#include <random>

#include "dist_train_runs.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"

using namespace mm::test;

namespace {

// Every model and optimizer tensor of two checkpoint folders, bitwise.
void expect_same_state(const std::string& a, const std::string& b, const std::string& what) {
  mm::checkpoint::CheckpointReader ra(a), rb(b);
  for (const char* kind : {"model", "optimizer"}) {
    ASSERT_EQ(ra.names(kind), rb.names(kind)) << what << " " << kind;
    ASSERT_FALSE(ra.names(kind).empty());
    for (const auto& name : ra.names(kind))
      EXPECT_TRUE(at::equal(ra.read_full(kind, name), rb.read_full(kind, name))) << what << ": " << kind << " " << name;
  }
  EXPECT_EQ(ra.train_state().iteration, rb.train_state().iteration) << what;
  EXPECT_EQ(ra.train_state().consumed_samples, rb.train_state().consumed_samples) << what;
}

std::string iter_dir(const std::string& save_dir, int it) {
  return save_dir + "/" + mm::checkpoint::iteration_dir_name(it);
}

}  // namespace

TEST(DistributedCheckpoint, ReshardsAcrossLayoutsBitwiseAndContinuesOnTheSameSamples) {
  const std::string dir = fresh_dir("dist_ckpt_reshard");
  const std::string cfg = text_config(dir);
  // Global batch 8 throughout: 4 x 1 x 2, 2 x 2 x 2, 1 x 4 x 2, 3 ranks x ... (8 does not split
  // over 3, so ZeRO-1 and FSDP over 2 only load and save).
  const std::string ga = " training.gradient_accumulation_steps=2";
  // FSDP over 4 for 20 iterations, saving at 10 and 20.
  const TrainRun straight = train(cfg, 4, dir + "/straight.jsonl",
                                  "training.micro_batch_size=1" + ga + " training.save_interval=10 training.save_dir=" + dir +
                                      "/a training.export_dir=" + dir + "/hf");
  ASSERT_TRUE(fs::exists(iter_dir(dir + "/a", 10) + "/metadata.json"));
  ASSERT_TRUE(fs::exists(iter_dir(dir + "/a", 10) + "/model.rank00003.safetensors"));
  // Load iteration 10 and save it again without a step: FSDP 4 -> DDP 2 -> one process ->
  // ZeRO-1 3 -> FSDP 2 (train_iters=10: the run starts at its end).
  struct Hop {
    int ranks;
    std::string name, overrides;
  };
  const Hop hops[] = {{2, "b", "training.micro_batch_size=2 parallel.data_parallel_replicate_size=2"},
                      {1, "c", "training.micro_batch_size=4"},
                      {3, "d", "training.micro_batch_size=1 parallel.data_parallel_replicate_size=3 "
                               "parallel.distributed_optimizer=true"},
                      {2, "e", "training.micro_batch_size=2"}};
  std::string prev = dir + "/a";
  for (const Hop& h : hops) {
    train(cfg, h.ranks, dir + "/" + h.name + ".jsonl",
          h.overrides + ga + " training.train_iters=10 training.resume=" + iter_dir(prev, 10) +
              " training.save_dir=" + dir + "/" + h.name);
    expect_same_state(iter_dir(dir + "/a", 10), iter_dir(dir + "/" + h.name, 10), "FSDP over 4 -> " + h.name);
    prev = dir + "/" + h.name;
  }
  EXPECT_FALSE(fs::exists(iter_dir(dir + "/b", 10) + "/metadata.json"));  // DDP writes the plain layout

  // HF export from sharded state, streamed: by the FSDP run itself (unit by unit) and by
  // `mm export` from the sharded folder (tensor by tensor); both equal the checkpoint's weights.
  auto exported = run_command(mm_binary() + " export --checkpoint " + dir + "/a --out " + dir + "/hf2");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("(sharded,"), std::string::npos) << exported.output;
  mm::checkpoint::CheckpointReader last(iter_dir(dir + "/a", 20));
  for (const std::string hf : {dir + "/hf", dir + "/hf2"}) {
    mm::st::HFWeights w(hf);
    ASSERT_EQ(w.keys().size(), last.names("model").size()) << hf;
    for (const auto& name : last.names("model"))
      EXPECT_TRUE(at::equal(w.get(name), last.read_full("model", name))) << hf << " " << name;
  }

  // Continuing: FSDP over 4 straight to 20 against FSDP over 4 to 10 then DDP over 2 to 20.
  const TrainRun resumed = train(cfg, 2, dir + "/resumed.jsonl",
                                 "training.micro_batch_size=2 parallel.data_parallel_replicate_size=2" + ga +
                                     " training.resume=" + iter_dir(dir + "/a", 10));
  ASSERT_EQ(resumed.losses.size(), 10u) << resumed.output;
  for (auto& [it, l] : resumed.losses) EXPECT_NEAR(l, straight.losses.at(it), 1e-5 * l) << "iteration " << it;
}

// Tensor-parallel layouts: a checkpoint written by FSDP2 x TP2 (every piece a box of its
// tensor-parallel slice, FSDP's range inside it) loads into TP2, one process, TP4 (the key/value
// heads replicated), TP2 x DP2 with ZeRO-1 and FSDP over 4 with bitwise-equal weights and
// optimizer state; its HF exports (the run's own, gathered slice by slice, and mm export's)
// equal the checkpoint's weights; training continues at TP2 on the same samples.
TEST(DistributedCheckpoint, TensorParallelLayoutsReshardBitwise) {
  const std::string dir = fresh_dir("dist_ckpt_tp");
  const std::string cfg = text_config(dir);
  const std::string ga = " training.gradient_accumulation_steps=2";
  const TrainRun straight = train(cfg, 4, dir + "/straight.jsonl",
                                  "parallel.tensor_parallel_size=2 training.micro_batch_size=2" + ga +
                                      " training.save_interval=10 training.save_dir=" + dir + "/a training.export_dir=" + dir +
                                      "/hf");
  ASSERT_TRUE(fs::exists(iter_dir(dir + "/a", 10) + "/model.rank00003.safetensors"));
  struct Hop {
    int ranks;
    std::string name, overrides;
  };
  const Hop hops[] = {{2, "b", "parallel.tensor_parallel_size=2 training.micro_batch_size=4"},
                      {1, "c", "training.micro_batch_size=4"},
                      {4, "d", "parallel.tensor_parallel_size=4 parallel.sequence_parallel=true training.micro_batch_size=4"},
                      {4, "e", "parallel.tensor_parallel_size=2 parallel.data_parallel_replicate_size=2 "
                               "parallel.data_parallel_shard_size=1 parallel.distributed_optimizer=true training.micro_batch_size=2"},
                      {4, "f", "training.micro_batch_size=1"}};
  std::string prev = dir + "/a";
  for (const Hop& h : hops) {
    train(cfg, h.ranks, dir + "/" + h.name + ".jsonl",
          h.overrides + ga + " training.train_iters=10 training.resume=" + iter_dir(prev, 10) + " training.save_dir=" + dir +
              "/" + h.name);
    expect_same_state(iter_dir(dir + "/a", 10), iter_dir(dir + "/" + h.name, 10), "FSDP2xTP2 -> " + h.name);
    prev = dir + "/" + h.name;
  }
  auto exported = run_command(mm_binary() + " export --checkpoint " + dir + "/a --out " + dir + "/hf2");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  mm::checkpoint::CheckpointReader last(iter_dir(dir + "/a", 20));
  for (const std::string hf : {dir + "/hf", dir + "/hf2"}) {
    mm::st::HFWeights w(hf);
    ASSERT_EQ(w.keys().size(), last.names("model").size()) << hf;
    for (const auto& name : last.names("model"))
      EXPECT_TRUE(at::equal(w.get(name), last.read_full("model", name))) << hf << " " << name;
  }
  const TrainRun resumed = train(cfg, 2, dir + "/resumed.jsonl",
                                 "parallel.tensor_parallel_size=2 training.micro_batch_size=4" + ga +
                                     " training.resume=" + iter_dir(dir + "/a", 10));
  ASSERT_EQ(resumed.losses.size(), 10u) << resumed.output;
  for (auto& [it, l] : resumed.losses) EXPECT_NEAR(l, straight.losses.at(it), 1e-5 * l) << "iteration " << it;
}

// Issue 18 part 5 with pipelines: a run saved at TP2xPP2 (each stage writes only the layers it
// owns, each TP rank its slices) resumes at one process, at FSDP over 4 and at PP4 with bitwise
// weights and optimizer state and the data position carried over; `mm export` of the TP2xPP2
// checkpoint and the run's own export equal the checkpoint.
TEST(DistributedCheckpoint, PipelineLayoutsReshardBitwise) {
  const std::string dir = fresh_dir("dist_ckpt_pp");
  const std::string cfg = text_config(dir);
  const std::string common = " model.config.num_hidden_layers=4";
  const TrainRun straight = train(cfg, 4, dir + "/straight.jsonl",
                                  "parallel.tensor_parallel_size=2 parallel.pipeline_parallel_size=2 "
                                  "training.micro_batch_size=2 training.gradient_accumulation_steps=4" +
                                      common + " training.save_interval=10 training.save_dir=" + dir +
                                      "/a training.export_dir=" + dir + "/hf");
  ASSERT_TRUE(fs::exists(iter_dir(dir + "/a", 10) + "/model.rank00003.safetensors")) << straight.output;
  {  // metadata.json: the mesh and each piece's (pp, dp, cp, tp); layer 3 lives on stage 1 only, in two TP halves.
    const auto meta = nlohmann::json::parse(read_file(iter_dir(dir + "/a", 10) + "/metadata.json"));
    EXPECT_EQ(meta["mesh"]["pp"], 2);
    EXPECT_EQ(meta["mesh"]["tp"], 2);
    const auto& shards = meta["tensors"]["model"]["model.layers.3.mlp.up_proj.weight"]["shards"];
    ASSERT_EQ(shards.size(), 2u) << shards.dump();
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(shards[t]["placement"], nlohmann::json({{"pp", 1}, {"dp", 0}, {"cp", 0}, {"tp", t}})) << shards.dump();
      EXPECT_EQ(shards[t]["offset"], nlohmann::json({48 * t, 0})) << shards.dump();
    }
  }
  struct Hop {
    int ranks;
    std::string name, overrides;
  };
  const Hop hops[] = {
      {1, "one", "training.micro_batch_size=4 training.gradient_accumulation_steps=2"},
      {4, "fsdp4", "training.micro_batch_size=1 training.gradient_accumulation_steps=2"},
      {4, "pp4", "parallel.pipeline_parallel_size=4 training.micro_batch_size=2 training.gradient_accumulation_steps=4"}};
  std::string prev = dir + "/a";
  for (const Hop& h : hops) {
    const TrainRun run = train(cfg, h.ranks, dir + "/" + h.name + ".jsonl",
                               h.overrides + common + " training.train_iters=10 training.resume=" + iter_dir(prev, 10) +
                                   " training.save_dir=" + dir + "/" + h.name);
    expect_same_state(iter_dir(dir + "/a", 10), iter_dir(dir + "/" + h.name, 10), "TP2xPP2 -> " + h.name);
    prev = dir + "/" + h.name;
  }
  auto exported = run_command(mm_binary() + " export --checkpoint " + dir + "/a --out " + dir + "/hf2");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  mm::checkpoint::CheckpointReader last(iter_dir(dir + "/a", 20));
  for (const std::string hf : {dir + "/hf", dir + "/hf2"}) {
    mm::st::HFWeights w(hf);
    ASSERT_EQ(w.keys().size(), last.names("model").size()) << hf;
    for (const auto& name : last.names("model"))
      EXPECT_TRUE(at::equal(w.get(name), last.read_full("model", name))) << hf << " " << name;
  }
  // PP4 resumed from the TP2xPP2 checkpoint at iteration 10 goes on as the straight run did.
  const TrainRun resumed = train(cfg, 4, dir + "/resumed.jsonl",
                                 "parallel.pipeline_parallel_size=4 training.micro_batch_size=2 "
                                 "training.gradient_accumulation_steps=4" +
                                     common + " training.resume=" + iter_dir(dir + "/a", 10));
  ASSERT_EQ(resumed.losses.size(), 10u) << resumed.output;
  for (auto& [it, l] : resumed.losses) EXPECT_NEAR(l, straight.losses.at(it), 1e-5 * l) << "iteration " << it;
}

TEST(DistributedCheckpoint, KilledMidStepOrDuringSaveResumesBitwise) {
  const std::string dir = fresh_dir("dist_ckpt_kill");
  const std::string cfg = text_config(dir);
  const std::string common = "training.micro_batch_size=2 training.save_interval=5 training.resume=auto ";
  const TrainRun straight = train(cfg, 2, dir + "/straight.jsonl", common + "training.save_dir=" + dir + "/straight");
  ASSERT_EQ(straight.losses.size(), 20u);

  // Killed at a random iteration (printed, so a failure can be replayed), rank 1 mid-step.
  const unsigned seed = static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  const int kill_at = 6 + static_cast<int>(std::mt19937(seed)() % 14);  // 6..19
  std::printf("killing rank 1 of FSDP over 2 in iteration %d (seed %u)\n", kill_at, seed);
  const std::string save = dir + "/killed";
  const std::string metrics = dir + "/killed.jsonl";
  auto killed = run_command("MM_DEBUG_KILL_AT_ITER=" + std::to_string(kill_at) + " MM_DEBUG_KILL_RANK=1 " + mm_launch(2) +
                            mm_binary() + " train " + cfg + " " + common + "training.save_dir=" + save +
                            " training.metrics_file=" + metrics);
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("rank 1"), std::string::npos) << killed.output;
  auto resumed = run_command(mm_launch(2) + mm_binary() + " train " + cfg + " " + common + "training.save_dir=" + save +
                             " training.metrics_file=" + metrics);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto losses = metrics_losses(metrics);  // the resumed run's records replace the killed one's
  ASSERT_EQ(losses.size(), 20u);
  for (auto& [it, l] : straight.losses) EXPECT_EQ(losses.at(it), l) << "iteration " << it << " (killed at " << kill_at << ")";

  // Killed while saving iteration 10 (rank 1, after writing its files): iteration 5 stays the
  // latest and intact, and the resumed run is again bitwise the uninterrupted one.
  const std::string save2 = dir + "/killed_in_save";
  auto in_save = run_command("MM_DEBUG_KILL_IN_SAVE=10 MM_DEBUG_KILL_RANK=1 " + mm_launch(2) + mm_binary() + " train " +
                             cfg + " " + common + "training.save_dir=" + save2 + " training.metrics_file=" + dir +
                             "/in_save.jsonl");
  EXPECT_NE(in_save.exit_code, 0) << in_save.output;
  EXPECT_EQ(read_file(save2 + "/latest"), "iter_0000005\n");
  EXPECT_FALSE(fs::exists(iter_dir(save2, 10)));
  expect_same_state(iter_dir(dir + "/straight", 5), iter_dir(save2, 5), "the checkpoint before the crash");
  auto again = run_command(mm_launch(2) + mm_binary() + " train " + cfg + " " + common + "training.save_dir=" + save2 +
                           " training.metrics_file=" + dir + "/in_save.jsonl");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const auto losses2 = metrics_losses(dir + "/in_save.jsonl");
  for (auto& [it, l] : straight.losses) EXPECT_EQ(losses2.at(it), l) << "iteration " << it;
  expect_same_state(iter_dir(dir + "/straight", 20), iter_dir(save2, 20), "the final checkpoint");
}

TEST(DistributedCheckpoint, RankKilledMidStepStopsEveryRankWithinTheTimeout) {
  const std::string dir = fresh_dir("dist_ckpt_dead_rank");
  const std::string cfg = text_config(dir);
  const std::string args = " train " + cfg + " training.micro_batch_size=2 parallel.timeout_s=4 "
                           "parallel.data_parallel_replicate_size=2";
  // Under mm launch: the launcher names the dead rank, stops the other and exits with its code.
  auto t0 = std::chrono::steady_clock::now();
  auto r = run_command("MM_DEBUG_KILL_AT_ITER=3 MM_DEBUG_KILL_RANK=1 " + mm_launch(2) + mm_binary() + args);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 137) << r.output;
  EXPECT_LT(s, 20.0) << r.output;
  EXPECT_NE(r.output.find("launch: rank 1 exited with code 137; stopping the other ranks"), std::string::npos) << r.output;

  // Without a launcher to stop it (ranks started by hand, as a scheduler would): the survivor
  // reports the collective that the dead rank never reached, within the 4 s timeout.
  const std::string env = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) + " ";
  t0 = std::chrono::steady_clock::now();
  r = run_command("(MM_DEBUG_KILL_AT_ITER=3 MM_DEBUG_KILL_RANK=1 RANK=1 " + env + mm_binary() + args +
                  " > /dev/null 2>&1 &) ; RANK=0 " + env + mm_binary() + args);
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(s, 20.0) << r.output;
  EXPECT_NE(r.output.find("error: distributed: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed on rank 0 of 2"), std::string::npos) << r.output;
}
