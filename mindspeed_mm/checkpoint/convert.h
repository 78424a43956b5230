// Offline checkpoint conversion (`mm convert`), streamed tensor by tensor: memory stays at about
// the largest tensor (the input's mapped pages are given back as they are read, in windows of
// 64 MiB), whatever the model's size.
//
//   hf-to-mm   an HF model directory -> a sharded checkpoint already split for a layout
//              (tensor-parallel slices as the model's TP plan cuts them, pipeline stages as
//              parallel.pipeline_num_layers places them, data-parallel ranges as FSDP shards):
//              the folder training writes, without optimizer state. model.pretrained, `mm
//              generate` and `mm export` load it; HF's tokenizer and processor files travel with it.
//   mm-to-hf   any checkpoint folder (sharded or not, any layout) -> an HF directory: safetensors
//              shards + index as save_pretrained writes them, config.json, tokenizer files.
//   resplit    a checkpoint folder -> the same tensors in another layout, optimizer state, RNG,
//              loader positions and train state carried over (resumes as the input would).
//
// Every output is written under OUT.partial and renamed to OUT only when complete, so an
// interrupted conversion leaves nothing at OUT; an OUT that exists and is not empty is refused.
// Errors (mm::Error, ConfigError for a layout that does not fit) name the tensor or the key.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mm::checkpoint {

struct ConvertLayout {
  int tp = 1, pp = 1, dp = 1, vp = 1;
  // MindSpeed-MM's per-submodule layer counts ({"vision": [32, 0], "text": [1, 27]}); null: the
  // language model's layers evenly over the stages (parallel.pipeline_num_layers).
  nlohmann::json pipeline_num_layers;
  int world() const { return tp * pp * dp; }
  std::string describe() const;  // "tp 2 x pp 2 x dp 1 (4 ranks)"
};

struct ConvertOptions {
  std::string dtype = "keep";  // keep, fp32, bf16, fp16: the written tensors' dtype
  uint64_t max_shard_bytes = 5ull << 30;  // mm-to-hf's safetensors shards
  bool progress = true;        // a progress bar on stderr
  std::string copy_from;       // mm-to-hf: tokenizer/processor files from this directory too
};

struct ConvertSummary {
  int64_t tensors = 0, bytes = 0;  // tensors and bytes written
  int files = 0;                   // weight files written
};

// The model id of an HF / diffusers config.json: its model_type, or the registry id of its
// diffusers "_class_name" (WanTransformer3DModel: wan_dit, AutoencoderKLWan: wan_vae).
std::string model_type_of(const nlohmann::json& hf_config, const std::string& source);

// model_type "" takes model_type_of(config.json).
ConvertSummary convert_hf_to_mm(const std::string& model_type, const std::string& hf_dir, const std::string& out,
                                const ConvertLayout& layout, const ConvertOptions& options = {});
// `in`: a checkpoint folder or a save dir (its latest).
ConvertSummary convert_mm_to_hf(const std::string& in, const std::string& out, const ConvertOptions& options = {});
ConvertSummary resplit_checkpoint(const std::string& in, const std::string& out, const ConvertLayout& layout,
                                  const ConvertOptions& options = {});

// Wan2.1 text-to-video checkpoints between the original release's layout and diffusers':
//   original: config.json + diffusion_pytorch_model*.safetensors (the DiT, Wan's names),
//             Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth (torch.save state dicts),
//             google/umt5-xxl/ (the tokenizer)
//   diffusers: model_index.json, transformer/, vae/, text_encoder/, tokenizer/, scheduler/
// Whatever parts the input has are converted (names, configs); the original VAE carries no
// configuration (Wan2.1's unless vae_config names a diffusers vae/config.json), the original umT5's
// is read from its tensors (or text_encoder_config). diffusers -> original drops the scheduler.
struct WanConvertOptions : ConvertOptions {
  std::string from, to;  // "original" / "diffusers"
  std::string vae_config, text_encoder_config;
  double flow_shift = 3.0;  // the scheduler's (Wan2.1's 480p value; 5.0 for 720p)
};
// parts: the parts converted ("transformer", "vae", "text_encoder", "tokenizer").
ConvertSummary convert_wan(const std::string& in, const std::string& out, const WanConvertOptions& options,
                           std::vector<std::string>* parts = nullptr);

// A PEFT LoRA adapter merged into its base: every adapted weight W + (alpha / r) B A (in W's dtype,
// as peft's merge_and_unload), modules_to_save replaced by the adapter's; the base's names, order,
// config and tokenizer files. mm::Error naming an adapter tensor that adapts nothing in the base.
ConvertSummary merge_lora(const std::string& base, const std::string& adapter, const std::string& out,
                          const ConvertOptions& options = {});

// An output directory written under OUT.partial and renamed to OUT by commit(); removed when
// abandoned (an exception, an interrupted run leaves only OUT.partial). mm::Error for an OUT
// that exists and is not empty.
class StagedOutput {
 public:
  explicit StagedOutput(const std::string& out);
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;
  const std::string& dir() const { return tmp_; }
  void commit();

 private:
  std::string out_, tmp_;
  bool committed_ = false;
};

// The process's peak resident memory so far, in bytes (getrusage), for the summary line.
int64_t peak_rss_bytes();

}  // namespace mm::checkpoint
