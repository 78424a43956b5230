// What a model's forward leaves in memory for its backward, estimated from a batch's shapes and a
// parallel layout before any run (`mm memory`, training/memory_estimate.h). Each model family
// counts the tensors its own code saves, block by block, so that a new family adds its estimate
// beside its forward; the training side adds parameters, gradients, optimizer state and the
// schedule. Sizes are bytes of one micro-batch on one rank.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mm::models {

// The layout one rank runs the model in.
struct MemoryQuery {
  int64_t tp = 1;                  // tensor-parallel degree (heads, MLP width and, with
  bool sequence_parallel = false;  // a vocabulary plan, the logits split over it)
  bool vocab_parallel = false;     // logits split along the vocabulary (the plan's vocab_head/vocab_tied)
  int64_t loss_chunk = 0;          // training.loss_chunk_size: the head fused with the loss in chunks
  // Context parallelism's degrees (Ulysses x ring): the batch is this rank's shard already; the
  // attention modules it takes over save their own tensors.
  int64_t cp_ulysses = 1, cp_ring = 1;
  // A model that cuts its sequence inside (PlanTable::context_parallel_blocks) sees the whole
  // batch: its blocks between the cut and the gather hold a rank's share (cp_share), the rest the
  // whole sequence. Encoders cut on their own (PlanTable::context_parallel_encoders) see the
  // whole batch's inputs either way.
  bool cp_inside = false;
  int64_t cp_size() const { return cp_ulysses * cp_ring; }
  // A rank's share of L tokens cut by a layout of these degrees (padded to its multiple).
  static int64_t cp_share(int64_t L, int64_t ulysses, int64_t ring) {
    const int64_t m = ring > 1 ? 2 * ring * ulysses : ulysses;
    return (L + m - 1) / m * m / (ulysses * ring);
  }
  // Whether this rank runs a block (pipeline stages hold some; null: every block), and whether it
  // runs the model's first piece (embeddings, vision tower) and its last (the loss head).
  std::function<bool(const std::string& block)> runs;
  bool first_stage = true, last_stage = true;
  bool runs_block(const std::string& b) const { return !runs || runs(b); }
};

struct ActivationEstimate {
  // A block's forward: the bytes it leaves for backward, its output included (the next block's
  // input). Recomputed, a block keeps only its output, and backward rebuilds the rest one block at
  // a time.
  // backward_work: the gradients alive at once inside its backward (the MLP's, widest), on top.
  // parts: submodules that selective recompute may name (features.recompute: "<path>.<name>"),
  // with the bytes they save of their own (their input, kept when they are recomputed, is counted
  // by what made it).
  struct Part {
    std::string name;
    int64_t saved = 0;
  };
  struct Block {
    std::string path;
    int64_t saved = 0, output = 0, backward_work = 0;
    std::vector<Part> parts;
  };
  std::vector<Block> blocks;  // those this rank runs, in forward order
  int64_t before = 0;         // outside the blocks, before them: embeddings, rotary tables, masks
  int64_t after = 0;          // after them: the final norm, logits and what the loss saves
  int64_t backward_extra = 0; // made at the start of backward on top (the loss's gradients)
  std::vector<std::pair<std::string, int64_t>> notes;  // named terms, for the report ("logits": bytes)
};

}  // namespace mm::models
