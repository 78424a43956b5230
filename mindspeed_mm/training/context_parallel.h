// Context parallelism as a plan (parallel.context_parallel_size > 1): every rank of a cp group
// trains on its shard of each sequence. The batch is cut before the model sees it (each rank's
// tokens, labels, positions and sample ids); the model runs unchanged on its shard except for the
// self-attention modules its PlanTable::context_parallel names, whose attention this object takes
// over (models::AttentionCore): Ulysses, ring, or Ulysses inside a ring (hybrid), as
// parallel/context_parallel.h describes. Losses and token counts are per shard and summed over
// the data-parallel x cp ranks, as are the gradients (the cp ranks are data-parallel ranks for
// the reduction: DDP over dp x cp, FSDP shards over dp_shard x cp, as TorchTitan does).
#pragma once

#include <memory>
#include <string>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/model.h"
#include "mindspeed_mm/parallel/context_parallel.h"

namespace mm::training {

// The layout parallel.context_parallel_{size,algo} and ulysses_degree_in_cp ask for;
// ConfigError naming the keys when they do not fit together.
parallel::CpLayout resolve_cp_layout(const config::ParallelConfig& p);

// The batch field that carries the sample of every token of the whole padded sequence (host,
// int64 [B, S]) with a shard: what attention needs to know of the other ranks' tokens.
inline constexpr std::string_view kCpSegmentIds = "cp_segment_ids";

// Cp rank `rank`'s shard of a collated host batch (ContextParallel::shard, which `mm memory`
// also uses to size a rank's batch without a group).
// Each rank's share is a multiple of shard_multiple tokens (tensor parallelism's sequence split
// takes its share of it next). `whole`: fields every rank takes as they are
// (PlanTable::context_parallel_whole).
data::Batch shard_for_rank(const data::Batch& host, const parallel::CpLayout& layout, int rank,
                           int64_t shard_multiple = 1, const std::vector<std::string>& whole = {});

class ContextParallel : public models::AttentionCore, public std::enable_shared_from_this<ContextParallel> {
 public:
  // group: the cp group (its rank is this rank's cp coordinate). Builds the Ulysses and ring
  // subgroups (every member of the cp group calls this). Made with std::make_shared (the modules
  // it is installed on share it).
  // shard_multiple: each rank's tokens a multiple of it (the tensor-parallel degree under
  // sequence parallelism).
  ContextParallel(const parallel::CpLayout& layout, parallel::CpGroup group, int64_t shard_multiple = 1);
  // Another plan over the same layout and groups (an encoder's), each rank's share a multiple of
  // shard_multiple.
  ContextParallel(const ContextParallel& groups_of, int64_t shard_multiple);

  const parallel::CpLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  // Installs this object as the attention core of the modules `attention` names (the model's
  // PlanTable::context_parallel) and, when `blocks` names any (PlanTable::context_parallel_blocks),
  // the wrappers that cut the hidden states on entering the first of them and gather them after
  // the last. Returns how many attention modules. ConfigError when a pattern matches nothing, a
  // module cannot take a core, or the heads do not split over the Ulysses degree.
  // length: PlanTable::context_parallel_length (for a pipeline's later stages; may be unset).
  int64_t apply(mm::nn::Module& model, const std::vector<std::string>& attention, const std::vector<std::string>& blocks,
                std::function<std::pair<int64_t, int64_t>(const data::Batch&)> length = {});
  // What shard() does first and leaves whole: PlanTable::context_parallel_prepare and _whole.
  void set_batch_plan(std::function<data::Batch(const data::Batch&)> prepare, std::vector<std::string> whole) {
    prepare_ = std::move(prepare);
    whole_ = std::move(whole);
  }
  // The same for an encoder's stretch (models::PlanTable::CpStretch): its blocks take one
  // unbatched sequence [N, hidden] and name their segments by ForwardContext::cu_seqlens. Each
  // call of the encoder (an image batch, then a video batch) is cut and gathered on its own.
  int64_t apply_encoder(mm::nn::Module& model, const models::PlanTable::CpStretch& stretch);
  // Why Ulysses over `degree` ranks cannot split the heads of the attention modules `attention`
  // names (empty: it can).
  static std::string ulysses_misfit(mm::nn::Module& model, const std::vector<std::string>& attention, int degree);
  // Whether batches are cut before the model (no blocks named): then shard() is the forward's batch.
  bool shards_batches() const { return !cuts_in_model_; }
  // An encoder's (apply_encoder): this rank's rows of each of the stretch's input fields that a
  // host batch has, in block order, padded with zero rows to the layout's multiple, and
  // data::kPixelRowsCut set. The batch as it is when the stretch names no inputs.
  data::Batch shard_inputs(const data::Batch& host) const;

  // This rank's shard of a collated host batch: every [B, S] token field (input ids, labels,
  // positions, sample ids) padded to a multiple of layout().multiple() (labels -100, padding its
  // own sample) and cut to this rank's tokens; kCpSegmentIds added. Position ids are added
  // (0..S-1) when the batch has none, so each shard keeps its tokens' true positions. The batch
  // plan's prepare runs first on the whole batch (M-RoPE positions [3, B, S] and feature indices
  // are cut like the tokens), and its whole fields pass as they are. mm::Error naming the field
  // for a field it cannot split.
  data::Batch shard(const data::Batch& host) const;
  // Before a forward (the batch on the device): a shard's kCpSegmentIds, or for a model that cuts
  // inside, the samples of its token fields (segment_ids, attention_mask) if it has them, and
  // the cut of its sequence when the plan says how long it is (a pipeline stage after the cut).
  void begin(const data::Batch& batch);

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                    c10::optional<double> scale) override;

 private:
  parallel::CpLayout layout_;
  int64_t shard_multiple_ = 1;  // each rank's share of a sequence divides by this
  int64_t multiple_ = 1;        // and the padded sequence by this (the layout's multiple x shard_multiple_)
  parallel::CpGroup group_, ulysses_, ring_;
  int rank_ = 0;
  bool cuts_in_model_ = false, encoder_ = false;
  std::function<data::Batch(const data::Batch&)> prepare_;
  std::vector<std::string> whole_;
  std::vector<std::pair<std::string, std::string>> inputs_;  // an encoder's: PlanTable::CpStretch
  std::function<at::Tensor(const at::Tensor&)> order_;
  // Of the current sequence: its sample ids (undefined: one sample per row, no padding), their
  // varlen boundaries (Ulysses without a ring), the samples as a [B, 1, S, S] mask (Ulysses off
  // CUDA), and the ring's view of it, non-causal and causal (made on first use).
  struct Sequence {
    at::Tensor segment_ids, cu_seqlens, mask;
    int64_t max_seqlen = 0;
    std::shared_ptr<const parallel::RingSpec> rings[2];
  };
  std::shared_ptr<Sequence> seq_;
  int64_t seq_len_ = 0;  // its padded length
  // An encoder's: the sequences of the segment bounds its blocks have named since entering.
  std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<Sequence>>> by_bounds_;
  // Cutting inside the model: the batch's samples per token (undefined: none given), the real
  // length of the sequence cut on entering, this rank's token indices in it, and the rotary
  // tables cut to them (by the whole table they came from).
  at::Tensor batch_segments_, index_, inverse_;
  int64_t real_len_ = 0;
  std::function<std::pair<int64_t, int64_t>(const data::Batch&)> length_;
  std::pair<int64_t, int64_t> prepared_{0, 0};  // (rows, length) begin() prepared the cut for
  void prepare_cut(int64_t B, int64_t L, at::Device device);
  std::vector<std::pair<const void*, at::Tensor>> cut_tables_;

  // The sequence's samples [B, padded length] (padding -1) -> seq_, seq_len_.
  void set_sequence(const at::Tensor& segments, at::Device device);
  // An encoder block's segments: bounds over the real tokens (undefined: one), padding its own.
  void use_bounds(const at::Tensor& cu_seqlens, at::Device device);
  int64_t install_core(mm::nn::Module& model, const std::vector<std::string>& attention);  // -> modules
  void install_cut(mm::nn::Module& model, const std::vector<std::string>& blocks);  // the enter/leave wrappers
  // [B, L, ...] -> this rank's [B, P / n, ...]; x already this rank's rows (shard_inputs) when
  // its length is not L.
  at::Tensor enter(const at::Tensor& x, int64_t L);
  at::Tensor leave(const at::Tensor& y);  // the inverse: every rank's tokens, in order, unpadded
  at::Tensor cut_table(const at::Tensor& t);  // a rotary table's rows (dim -2) for this rank's tokens
};

}  // namespace mm::training
