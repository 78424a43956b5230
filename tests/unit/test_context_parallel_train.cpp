// `mm train` with context parallelism on loopback ranks (fp32): per-step losses within 1e-5
// relative of one process with the same global batch over 20 steps, and the final weights equal
// (HF export), for Ulysses 2 and 4 (key/value heads repeated), ring 2 and 3 (zigzag, causal),
// hybrid 2 x 2, CP2 with TP2, with FSDP2 and with PP2, and CP with the chunked loss: on Qwen2
// trained on packed rows of samples of unequal lengths (padded to the layout's multiple), on
// Qwen2 on plain text rows, and on the tiny Qwen2-VL (each rank handed its tokens, labels and
// M-RoPE positions, made from the whole row on the host: Ulysses 2, ring 3, hybrid 2x2, CP2 x
// TP2, CP2 x FSDP2, CP2 x PP2, ring 2 with the chunked loss; the vision tower's patches cut too,
// by the same layout or by a ring where its heads do not split, each rank handed only its pixel
// rows) and Qwen2.5-VL (window order). A killed run resumes bitwise. Bad layouts are one-line
// errors before training.
#include "dist_train_runs.h"

#include <random>

using namespace mm::test;

namespace {

struct Layout {
  int ranks;
  std::string name, overrides;
  std::string expect = "plan: context parallel over";  // in the run's output
};

// Text-only conversations of 3 to 33 words, packed 2 to a row: rows of unequal lengths, each
// holding two samples that must not see each other.
std::string packed_text_config(const std::string& dir) {
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
                         "small", "birds", "sing", "loudly", "in", "green", "trees", "near", "old", "river"};
  std::mt19937 rng(3);
  auto sentence = [&](int lo, int hi) {
    std::string s;
    for (int i = 0, n = lo + static_cast<int>(rng() % (hi - lo + 1)); i < n; ++i) s += (i ? " " : "") + std::string(words[rng() % 21]);
    return s;
  };
  std::string jsonl;
  for (int i = 0; i < 200; ++i) {
    nlohmann::json j;
    j["messages"] = {{{"role", "user"}, {"content", sentence(2, 12)}}, {{"role", "assistant"}, {"content", sentence(1, 20)}}};
    jsonl += j.dump() + "\n";
  }
  write_file(dir + "/train.jsonl", jsonl);
  write_file(dir + "/packed.yaml",
             "data:\n  dataset: mllm\n  paths: [" + dir + "/train.jsonl]\n  val_fraction: 0.05\n  cutoff_len: 512\n"
             "  num_workers: 1\n  collator: packed\n"
             "model:\n  id: qwen2\n  config:\n    hidden_size: 32\n    intermediate_size: 64\n    num_hidden_layers: 2\n"
             "    num_attention_heads: 4\n    num_key_value_heads: 2\n    vocab_size: 264\n"
             "training:\n  train_iters: 20\n  micro_batch_size: 2\n  gradient_accumulation_steps: 2\n"
             "  optimizer: {lr: 0.003}\n  eval_iters: 2\n  eval_interval: 10\n  seed: 3\n"
             "tools:\n  progress: lines\n");
  return dir + "/packed.yaml";
}

// One process (with `common` overrides) against each layout: losses, final weights, the plan's line.
void check_layouts(const std::string& dir, const std::string& cfg, const std::string& what, const Layout* begin,
                   const Layout* end, double weight_tol, const std::string& common = "") {
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", common + " training.export_dir=" + dir + "/one_hf");
  for (const Layout* l = begin; l != end; ++l) {
    const std::string hf = dir + "/hf_" + std::to_string(l - begin);
    const TrainRun run = train(cfg, l->ranks, dir + "/run.jsonl", l->overrides + " training.export_dir=" + hf);
    expect_same_run(one, run, what + ", " + l->name);
    expect_same_weights(dir + "/one_hf", hf, weight_tol, what + ", " + l->name);
    EXPECT_NE(run.output.find(l->expect), std::string::npos) << l->expect << "\n" << run.output;
  }
}

const std::string kCp2 = "parallel.context_parallel_size=2 ", kCp4 = "parallel.context_parallel_size=4 ";

}  // namespace

TEST(ContextParallelTrain, Qwen2PackedLayoutsEqualOneProcess) {
  const std::string dir = fresh_dir("cp_train_packed");
  const std::string cfg = packed_text_config(dir);
  const Layout layouts[] = {
      {2, "Ulysses 2 (FSDP over the cp ranks)", kCp2},
      {2, "Ulysses 2, DDP over the cp ranks", kCp2 + "parallel.data_parallel_shard_size=1"},
      {4, "Ulysses 4 (2 KV heads repeated)", kCp4},
      {2, "ring 2", kCp2 + "parallel.context_parallel_algo=ring"},
      {3, "ring 3", "parallel.context_parallel_size=3 parallel.context_parallel_algo=ring"},
      {4, "hybrid 2x2", kCp4 + "parallel.context_parallel_algo=hybrid parallel.ulysses_degree_in_cp=2"},
      {4, "ring 2 x TP2+SP", kCp2 + "parallel.context_parallel_algo=ring parallel.tensor_parallel_size=2 "
                             "parallel.sequence_parallel=true"},
      {4, "Ulysses 2 x FSDP2", kCp2 + "training.gradient_accumulation_steps=1"},
      {2, "ring 2, chunked loss", kCp2 + "parallel.context_parallel_algo=ring training.loss_chunk_size=16"},
      {4, "Ulysses 2 x PP2 (1F1B, DDP over the cp ranks)", kCp2 + "parallel.pipeline_parallel_size=2"},
      {4, "ring 2 x PP2, chunked loss", kCp2 + "parallel.context_parallel_algo=ring parallel.pipeline_parallel_size=2 "
                                       "training.loss_chunk_size=16"},
  };
  // Weights: fp32 sums in another order through 20 Adam steps (worst 1.2e-5 relative, hybrid); in
  // float64 the attention's outputs and gradients equal one process's to 1e-12
  // (ContextParallel.AttentionEqualsOneProcess).
  check_layouts(dir, cfg, "qwen2 packed", std::begin(layouts), std::end(layouts), 5e-5);
}

TEST(ContextParallelTrain, Qwen2TextRowsEqualOneProcess) {
  const std::string dir = fresh_dir("cp_train_text");
  const std::string cfg = text_config(dir);
  const Layout layouts[] = {
      {2, "Ulysses 2", kCp2 + "training.micro_batch_size=8"},
      {2, "ring 2", kCp2 + "parallel.context_parallel_algo=ring training.micro_batch_size=8"},
  };
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=8");
  for (const Layout& l : layouts) expect_same_run(one, train(cfg, l.ranks, dir + "/run.jsonl", l.overrides), "qwen2 text, " + l.name);
}

TEST(ContextParallelTrain, Qwen2VlEqualsOneProcess) {
  const std::string dir = fresh_dir("cp_train_vl");
  const std::string cfg = vl_config(dir, 48);
  const std::string common = " training.micro_batch_size=4 model.config.vocab_size=264";
  // Each rank's tokens cut from the batch, and the vision tower's patches inside the model: by
  // the layout where its 2 heads (1 under TP2) split, else by a ring.
  const std::string tower = "visual.blocks.{*} cut over the ";
  const Layout layouts[] = {
      {2, "Ulysses 2", kCp2 + common, "2 attention modules, sequences padded to a multiple of 2, each rank's tokens cut from the batch"},
      {3, "ring 3", "parallel.context_parallel_size=3 parallel.context_parallel_algo=ring" + common, tower + "3 ranks too (ring)"},
      {4, "hybrid 2x2", kCp4 + "parallel.context_parallel_algo=hybrid parallel.ulysses_degree_in_cp=2" + common,
       tower + "4 ranks too (hybrid)"},
      {4, "Ulysses 2 x TP2", kCp2 + "parallel.tensor_parallel_size=2" + common, tower + "2 ranks too (ring: Ulysses over 2"},
      {4, "ring 2 x FSDP2", kCp2 + "parallel.context_parallel_algo=ring training.micro_batch_size=2 model.config.vocab_size=264",
       tower + "2 ranks too (ring)"},
      {2, "ring 2, chunked loss",
       kCp2 + "parallel.context_parallel_algo=ring training.loss_chunk_size=16" + common, tower + "2 ranks too (ring)"},
      {4, "Ulysses 2 x PP2 (the vision tower on stage 0)",
       kCp2 + "parallel.pipeline_parallel_size=2 'parallel.pipeline_num_layers={vision: [2, 0], text: [0, 2]}'" + common,
       tower + "2 ranks too (Ulysses)"},
  };
  check_layouts(dir, cfg, "qwen2-vl", std::begin(layouts), std::end(layouts), 5e-4, common);
}

// Qwen2.5-VL: the vision tower's window order (windows of one merged unit, one block over whole
// frames) cut among the ranks; each rank is handed only its pixel rows.
TEST(ContextParallelTrain, Qwen2_5VlEqualsOneProcess) {
  const std::string dir = fresh_dir("cp_train_vl25");
  const std::string cfg = vl_config(dir, 48);
  std::string yaml = read_file(cfg);
  auto swap = [&](const std::string& from, const std::string& to) {
    const size_t at = yaml.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    yaml.replace(at, from.size(), to);
  };
  swap("id: qwen2_vl", "id: qwen2_5_vl");
  swap("vision_config: {depth: 2, embed_dim: 32, num_heads: 2, mlp_ratio: 2, patch_size: 14}",
       "vision_config: {depth: 2, hidden_size: 32, out_hidden_size: 32, intermediate_size: 48, num_heads: 2, "
       "window_size: 28, fullatt_block_indexes: [1]}");
  write_file(cfg, yaml);
  const std::string common = " training.micro_batch_size=4 model.config.vocab_size=264";
  const Layout layouts[] = {
      {2, "Ulysses 2", kCp2 + common, "visual.blocks.{*} cut over the 2 ranks too (Ulysses)"},
      {3, "ring 3", "parallel.context_parallel_size=3 parallel.context_parallel_algo=ring" + common,
       "visual.blocks.{*} cut over the 3 ranks too (ring)"},
  };
  check_layouts(dir, cfg, "qwen2.5-vl", std::begin(layouts), std::end(layouts), 5e-4, common);
}

TEST(ContextParallelTrain, BadLayoutsAreClearErrorsBeforeTraining) {
  const std::string dir = fresh_dir("cp_train_errors");
  const std::string cfg = packed_text_config(dir);
  const std::string vl = vl_config(fresh_dir("cp_train_errors_vl"), 8);
  struct Case {
    int ranks;
    std::string overrides, message, config;
  } bad[] = {
      {3, "parallel.context_parallel_size=3", "Ulysses over 3 ranks splits the attention heads"},
      {4, kCp4 + "parallel.context_parallel_algo=hybrid parallel.ulysses_degree_in_cp=3",
       "needs parallel.ulysses_degree_in_cp between 2"},
      {2, kCp2 + "parallel.ulysses_degree_in_cp=2", "ulysses_degree_in_cp applies to context_parallel_algo: hybrid"},
      {2, kCp2 + "training.loss_normalization=per_sample", "per_sample with parallel.context_parallel_size > 1"},
      {2, kCp2 + "training.loss_normalization=per_sample model.config.vocab_size=264",
       "per_sample with parallel.context_parallel_size > 1", vl},
      {4, kCp2 + "parallel.pipeline_parallel_size=2 model.config.vocab_size=264 "
                 "'parallel.pipeline_num_layers={vision: [1, 1], text: [0, 2]}'",
       "the pipeline spreads those blocks over 2 stages", vl},
  };
  for (const Case& c : bad) {
    auto r = run_command(mm_launch(c.ranks) + mm_binary() + " train " + (c.config.empty() ? cfg : c.config) + " " + c.overrides);
    EXPECT_NE(r.exit_code, 0) << c.overrides;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.overrides << "\n" << r.output;
    EXPECT_EQ(r.output.find("iter 1/"), std::string::npos) << c.overrides;
  }
}

// A context-parallel run killed mid-run resumes from its last checkpoint to the same losses as
// the uninterrupted one, bitwise (FSDP over the cp ranks: every rank's shard and the loader
// position written once per data-parallel rank); the checkpoint also resumes on one process.
TEST(ContextParallelTrain, KilledRunResumesBitwise) {
  const std::string dir = fresh_dir("cp_train_resume");
  const std::string cfg = packed_text_config(dir);
  const std::string common = kCp2 + "parallel.context_parallel_algo=ring training.save_interval=5 training.resume=auto ";
  const TrainRun straight = train(cfg, 2, dir + "/straight.jsonl", common + "training.save_dir=" + dir + "/straight");
  ASSERT_EQ(straight.losses.size(), 20u);
  const std::string save = dir + "/killed", metrics = dir + "/killed.jsonl";
  auto killed = run_command("MM_DEBUG_KILL_AT_ITER=13 MM_DEBUG_KILL_RANK=1 " + mm_launch(2) + mm_binary() + " train " +
                            cfg + " " + common + "training.save_dir=" + save + " training.metrics_file=" + metrics);
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  auto resumed = run_command(mm_launch(2) + mm_binary() + " train " + cfg + " " + common + "training.save_dir=" + save +
                             " training.metrics_file=" + metrics);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto losses = metrics_losses(metrics);
  ASSERT_EQ(losses.size(), 20u);
  for (auto& [it, l] : straight.losses) EXPECT_EQ(losses.at(it), l) << "iteration " << it;
  // The same checkpoint on one process (any layout reads any other's): iterations 16-20 as the
  // cp run within fp32 reassociation.
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl",
                             "training.resume=" + dir + "/straight/iter_0000015 training.save_dir=" + dir + "/one_save");
  for (int64_t it = 16; it <= 20; ++it) EXPECT_NEAR(one.losses.at(it), straight.losses.at(it), 1e-5 * straight.losses.at(it)) << it;
}
