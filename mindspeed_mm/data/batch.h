// Batch: what a collator hands the train step, as named tensors. A dataset says which fields
// it produces (TrainData::fields), a model which it reads and an objective which it scores, and
// the trainer checks them against each other once at start. A field a batch does not have is
// absent: b[name] is then an undefined tensor.
//
// The language-model fields: labels are already shifted (labels[b, s] is the token logits[b, s]
// must predict), so packed rows, padding and multimodal samples need no special case in the loss.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <string_view>
#include <vector>

namespace mm::data {

// Field names the built-in datasets produce and the built-in models and objectives read.
inline constexpr std::string_view kInputIds = "input_ids";            // int64 [B, S]
inline constexpr std::string_view kLabels = "labels";                 // int64 [B, S], -100 = not scored
inline constexpr std::string_view kAttentionMask = "attention_mask";  // int64 [B, S], 1 = real token (absent: all real)
inline constexpr std::string_view kPositionIds = "position_ids";      // int64 [B, S]; 0 at each packed sample's start
// Packed rows: segment_ids[b, s] = index of the sample a token belongs to within its row, -1 on
// padding; attention stays inside a segment. cu_seqlens (int32 [samples + 1]) are the same
// boundaries over the flattened B*S tokens, as flash-attention's varlen kernels take them, and
// max_seqlen (host, int64 0-dim) the longest segment.
inline constexpr std::string_view kSegmentIds = "segment_ids";
inline constexpr std::string_view kCuSeqlens = "cu_seqlens";
inline constexpr std::string_view kMaxSeqlen = "max_seqlen";
// Vision inputs, concatenated over the batch's samples in order (see SampleEncoder). The grids
// and the seconds per temporal grid (float64 [videos]) stay on the host: they size the work.
inline constexpr std::string_view kPixelValues = "pixel_values";
inline constexpr std::string_view kImageGridThw = "image_grid_thw";
inline constexpr std::string_view kPixelValuesVideos = "pixel_values_videos";
inline constexpr std::string_view kVideoGridThw = "video_grid_thw";
inline constexpr std::string_view kVideoSecondPerGrid = "video_second_per_grid";
// Context parallelism (host, any value): pixel_values and pixel_values_videos hold only this cp
// rank's rows, in the order the vision tower's blocks take them, padded with zero rows
// (training/context_parallel.h); the grids stay whole.
inline constexpr std::string_view kPixelRowsCut = "pixel_rows_cut";
// Context parallelism, made from the whole row on the host before each cp rank takes its tokens
// (models::PlanTable::context_parallel_prepare): a vision-language model's M-RoPE positions
// (int64 [3, B, S]) and the vision feature row each image / video pad token takes (int64 [B, S],
// -1 on every other token).
inline constexpr std::string_view kMropePositionIds = "mrope_position_ids";
inline constexpr std::string_view kImageFeatureIndex = "image_feature_index";
inline constexpr std::string_view kVideoFeatureIndex = "video_feature_index";

// Diffusion: a sample's clean latents (normalised per channel by the VAE's mean and std) and its
// text encoder features; sample_ids (host, int64 [B]) name each sample within its dataset so
// that what is drawn for it (noise, timestep) is the same on any parallel layout. The
// flow-matching objective adds the model's inputs (noisy_latents, timesteps) and its target.
inline constexpr std::string_view kVideo = "video";                          // [B, 3, F, H, W] in [-1, 1]
inline constexpr std::string_view kLatents = "latents";                      // [B, C, F, H, W]
inline constexpr std::string_view kPromptEmbeds = "prompt_embeds";           // [B, L, text_dim]
inline constexpr std::string_view kNullPromptEmbeds = "null_prompt_embeds";  // [1, L, text_dim]: the empty prompt's
inline constexpr std::string_view kSampleIds = "sample_ids";
inline constexpr std::string_view kNoisyLatents = "noisy_latents";           // [B, C, F, H, W]
inline constexpr std::string_view kTimesteps = "timesteps";                  // float [B], in [0, 1000)
inline constexpr std::string_view kFlowTarget = "flow_target";               // noise - latents
inline constexpr std::string_view kNoiseSeeds = "noise_seeds";               // int64 [B]: a seed per sample's draws
// Text per sample, for frozen encoders that tokenize it themselves (training/input_encoder.h):
// not a tensor but Batch::captions; a dataset that has them lists the name among its fields.
inline constexpr std::string_view kCaptions = "captions";

// Named tensors in insertion order (a handful per batch: a linear search is the fast lookup).
class TensorMap {
 public:
  struct Field {
    std::string name;
    at::Tensor tensor;
    bool host = false;  // stays on the CPU when the batch moves to a device (sizes read on the host)
  };

  // The tensor named `name`; an undefined tensor when there is none.
  const at::Tensor& operator[](std::string_view name) const;
  bool has(std::string_view name) const { return find(name) != nullptr; }
  // Sets or replaces a field; an undefined tensor removes it.
  void set(std::string_view name, at::Tensor t, bool host = false);
  const std::vector<Field>& fields() const { return fields_; }
  std::vector<std::string> names() const;
  // The tensor, or mm::Error naming the field when there is none.
  const at::Tensor& require_tensor(std::string_view name) const;

 private:
  const Field* find(std::string_view name) const;
  std::vector<Field> fields_;
};

class Batch : public TensorMap {
 public:
  // The field, or an error naming it and the batch's first sample when the batch lacks it.
  const at::Tensor& require(std::string_view name) const;
  std::vector<std::string> sources;  // where each sample came from ("train.jsonl:12")
  std::vector<std::string> captions;  // each sample's caption, when the dataset has kCaptions
  int64_t num_samples = 0;
};

// b with its fields on `device` through pinned memory and non-blocking copies, except the host
// fields (grids: the model reads them as sizes, never computes with them); b itself on the CPU.
Batch batch_to_device(const Batch& b, const at::Device& device);

// Fields `needed` that `have` lacks ("" when none): "labels, pixel_values".
std::string missing_fields(const std::vector<std::string>& needed, const std::vector<std::string>& have);

}  // namespace mm::data
