// `mm train` with tensor parallelism on loopback ranks (fp32): per-step losses within 1e-5
// relative of one process with the same global batch over 20 steps, for TP2, TP2+SP, TP4 (the
// two key/value heads replicated) + SP, TP2 x DP2 (DDP and ZeRO-1), FSDP2 x TP2 (+SP) and tied
// embeddings, on the Qwen2 text model and on the tiny Qwen2-VL model (vision tower, projector
// and language model all split); the final weights equal one process's (HF export); bad
// layouts are clear one-line errors before training starts.
#include <algorithm>

#include "dist_train_runs.h"

using namespace mm::test;

namespace {

struct Layout {
  int ranks;
  std::string name, overrides;
};

}  // namespace

TEST(TensorParallelTrain, Qwen2TextLayoutsEqualOneProcess) {
  const std::string dir = fresh_dir("tp_train_text");
  const std::string cfg = text_config(dir);
  // Global batch 8 rows per step in 2 accumulation micro-steps.
  const std::string ga = " training.gradient_accumulation_steps=2";
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4" + ga + " training.export_dir=" + dir + "/one_hf");
  const Layout layouts[] = {
      {2, "TP2", "parallel.tensor_parallel_size=2 training.micro_batch_size=4"},
      {2, "TP2+SP", "parallel.tensor_parallel_size=2 parallel.sequence_parallel=true training.micro_batch_size=4"},
      {4, "TP4+SP (KV heads replicated)",
       "parallel.tensor_parallel_size=4 parallel.sequence_parallel=true training.micro_batch_size=4"},
      {4, "TP2xDP2", "parallel.tensor_parallel_size=2 parallel.data_parallel_replicate_size=2 "
                     "parallel.data_parallel_shard_size=1 training.micro_batch_size=2"},
      {4, "TP2xDP2 ZeRO-1", "parallel.tensor_parallel_size=2 parallel.data_parallel_replicate_size=2 "
                            "parallel.data_parallel_shard_size=1 parallel.distributed_optimizer=true "
                            "training.micro_batch_size=2"},
      {4, "FSDP2xTP2", "parallel.tensor_parallel_size=2 training.micro_batch_size=2"},
      {4, "FSDP2xTP2+SP", "parallel.tensor_parallel_size=2 parallel.sequence_parallel=true training.micro_batch_size=2"},
  };
  for (const Layout& l : layouts) {
    const std::string hf = dir + "/hf_" + std::to_string(&l - layouts);
    const TrainRun run = train(cfg, l.ranks, dir + "/run.jsonl", l.overrides + ga + " training.export_dir=" + hf);
    expect_same_run(one, run, "qwen2 text, " + l.name);
    expect_same_weights(dir + "/one_hf", hf, 1e-5, "qwen2 text, " + l.name);
    EXPECT_NE(run.output.find("plan: tensor parallel over"), std::string::npos) << run.output;
  }
  // Tied embeddings: the embedding's rows are also the head's (vocab_tied).
  const TrainRun one_tied = train(cfg, 1, dir + "/one_tied.jsonl",
                                  "training.micro_batch_size=4 model.config.tie_word_embeddings=true" + ga);
  const TrainRun tied = train(cfg, 2, dir + "/tied.jsonl",
                              "parallel.tensor_parallel_size=2 training.micro_batch_size=4 "
                              "model.config.tie_word_embeddings=true" + ga);
  expect_same_run(one_tied, tied, "qwen2 text, tied embeddings, TP2");
}

TEST(TensorParallelTrain, Qwen2VlLayoutsEqualOneProcess) {
  const std::string dir = fresh_dir("tp_train_vl");
  const std::string cfg = vl_config(dir, 48);
  // The tokenizer's 263 ids padded to 264 so the vocabulary splits over 2 (as Megatron pads it).
  const std::string vocab = " model.config.vocab_size=264";
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4" + vocab + " training.export_dir=" + dir + "/one_hf");
  const Layout layouts[] = {
      {2, "TP2", "parallel.tensor_parallel_size=2 training.micro_batch_size=4"},
      {2, "TP2+SP", "parallel.tensor_parallel_size=2 parallel.sequence_parallel=true training.micro_batch_size=4"},
      {4, "FSDP2xTP2", "parallel.tensor_parallel_size=2 training.micro_batch_size=2"},
      {4, "TP2xDP2", "parallel.tensor_parallel_size=2 parallel.data_parallel_replicate_size=2 "
                     "parallel.data_parallel_shard_size=1 training.micro_batch_size=2"},
  };
  for (const Layout& l : layouts) {
    const std::string hf = dir + "/hf_" + std::to_string(&l - layouts);
    const TrainRun run = train(cfg, l.ranks, dir + "/run.jsonl", l.overrides + vocab + " training.export_dir=" + hf);
    expect_same_run(one, run, "qwen2-vl, " + l.name);
    // fp32 reassociation through Adam, largest on elements with near-zero gradients (the same
    // element is the worst under DDP, at 1.6e-5); in float64 the gradients equal one process's
    // to 1e-10 (TensorParallel.Qwen2VLPlanEqualsOneProcessOnTwoRanks).
    expect_same_weights(dir + "/one_hf", hf, 5e-4, "qwen2-vl, " + l.name);
  }
}

TEST(TensorParallelTrain, BadLayoutsAreClearErrorsBeforeTraining) {
  const std::string dir = fresh_dir("tp_train_errors");
  const std::string cfg = text_config(dir);
  expect_clear_layout_errors(cfg, {
      {2, "parallel.tensor_parallel_size=2 model.config.vocab_size=301",
       "model.embed_tokens has 301 rows (the vocabulary), which do not divide by 2: set model.config.vocab_size"},
      {3, "parallel.tensor_parallel_size=3 model.config.vocab_size=261",
       "model.layers.0.self_attn has 4 query heads, which do not divide by 3"},
      {2, "parallel.tensor_parallel_size=2 parallel.sequence_parallel=true data.seq_len=33",
       "parallel.sequence_parallel: data.seq_len 33 does not divide by parallel.tensor_parallel_size 2"},
      {1, "parallel.sequence_parallel=true", "parallel.sequence_parallel needs parallel.tensor_parallel_size > 1"},
      {4, "parallel.tensor_parallel_size=3", "does not divide the world size 4"},
  });
}
