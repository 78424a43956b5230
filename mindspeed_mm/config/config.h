// The typed configuration of `mm train`: YAML sections parallel, data, model, features,
// training, tools. Defaults here are what a section left out of the YAML means.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config_io.h"

namespace mm::config {

// FSDP (parallel.data_parallel_shard_size > 1): which blocks are units, and mixed precision.
struct FsdpConfig {
  std::vector<std::string> units;          // module-path patterns of blocks ([] = every block); the rest is the root unit
  std::string param_dtype = "fp32";        // gathered parameters: fp32 | bf16 (shards and optimizer stay fp32)
  std::string reduce_dtype = "fp32";       // gradient reduce-scatter: fp32 | bf16
  bool reshard_after_forward = true;       // free a unit after its forward (gather again for backward)
  int64_t prefetch = 1;                    // units whose all-gather starts ahead of use, forward and backward
  template <class IO> void io(IO& io) {
    io("units", units);
    io("param_dtype", param_dtype, one_of({"fp32", "bf16"}));
    io("reduce_dtype", reduce_dtype, one_of({"fp32", "bf16"}));
    io("reshard_after_forward", reshard_after_forward);
    io("prefetch", prefetch, ge(0));
  }
};

struct ParallelConfig {
  // Sizes of the device mesh dp_replicate x dp_shard x cp x tp (TorchTitan's degrees); their
  // product must equal the world size. data_parallel_shard_size -1 takes the rest of the world:
  // world / (replicate x cp x tp). replicate > 1 with shard 1 is DDP, shard > 1 FSDP, both HSDP.
  int64_t data_parallel_replicate_size = 1;
  int64_t data_parallel_shard_size = -1;
  int64_t context_parallel_size = 1;
  int64_t tensor_parallel_size = 1;
  // Pipeline parallelism: stages (the outermost mesh dimension), model chunks per stage
  // (interleaved 1F1B when > 1), and the layers of each submodule per stage, MindSpeed-MM style:
  // {text: [1, 9, 9, 9], vision: [32, 0, 0, 0]}, with virtual chunks a list per chunk
  // ({text: [[2, 2], [2, 2]]} = [vp][pp]). Empty: the language model's layers split evenly over
  // the pp x vp chunks, the other submodules on the first. The micro-batches of a step are
  // training.gradient_accumulation_steps.
  int64_t pipeline_parallel_size = 1;
  int64_t virtual_pipeline_size = 1;
  // Megatron's --num-layers-per-virtual-pipeline-stage: when > 0, virtual_pipeline_size is the
  // language model's layers / (pipeline_parallel_size x this).
  int64_t num_layers_per_virtual_pipeline_stage = 0;
  nlohmann::json pipeline_num_layers = nlohmann::json::object();
  double timeout_s = 600;                  // a collective that takes longer fails, naming the absent ranks
  double ddp_bucket_cap_mb = 25;           // DDP gradient buckets
  // ZeRO-1 with DDP (Megatron's --use-distributed-optimizer): optimizer state sharded over the
  // data-parallel ranks, parameters and gradients replicated.
  bool distributed_optimizer = false;
  // Megatron's sequence parallelism with tensor parallelism: norms and residuals run on sequence
  // shards between the tensor-parallel regions (all-gather before, reduce-scatter after each).
  bool sequence_parallel = false;
  // Context parallelism over context_parallel_size ranks (training/context_parallel.h): each
  // holds a shard of every sequence and attention reaches the others' tokens by all-to-all
  // (ulysses: heads split instead of tokens), by passing key/value blocks round a ring (ring), or
  // both (hybrid: Ulysses over ulysses_degree_in_cp neighbouring ranks, a ring across them).
  // MindSpeed's names are accepted too: ulysses_cp_algo, megatron_cp_algo (ring), hybrid_cp_algo.
  std::string context_parallel_algo = "ulysses";
  int64_t ulysses_degree_in_cp = 0;  // hybrid only; must divide context_parallel_size
  FsdpConfig fsdp;
  template <class IO> void io(IO& io) {
    io("data_parallel_replicate_size", data_parallel_replicate_size, ge(1));
    io("data_parallel_shard_size", data_parallel_shard_size, ge(-1));
    io("context_parallel_size", context_parallel_size, ge(1));
    io("tensor_parallel_size", tensor_parallel_size, ge(1));
    io("pipeline_parallel_size", pipeline_parallel_size, ge(1));
    io("virtual_pipeline_size", virtual_pipeline_size, ge(1));
    io("num_layers_per_virtual_pipeline_stage", num_layers_per_virtual_pipeline_stage, ge(0));
    io("pipeline_num_layers", pipeline_num_layers);
    io("timeout_s", timeout_s, gt(0));
    io("ddp_bucket_cap_mb", ddp_bucket_cap_mb, gt(0));
    io("distributed_optimizer", distributed_optimizer);
    io("sequence_parallel", sequence_parallel);
    io("context_parallel_algo", context_parallel_algo,
       one_of({"ulysses", "ring", "hybrid", "ulysses_cp_algo", "megatron_cp_algo", "hybrid_cp_algo"}));
    io("ulysses_degree_in_cp", ulysses_degree_in_cp, ge(0));
    io.section("fsdp", fsdp);
  }
};

// mllm field names (LLaMA-Factory's dataset_attr): ShareGPT files set messages: conversations,
// role_tag: from, content_tag: value, user_tag: human, assistant_tag: gpt.
struct DataAttrConfig {
  std::string messages = "messages", images = "images", videos = "videos", system = "system";
  std::string role_tag = "role", content_tag = "content";
  std::string user_tag = "user", assistant_tag = "assistant", system_tag = "system";
  template <class IO> void io(IO& io) {
    io("messages", messages);
    io("images", images);
    io("videos", videos);
    io("system", system);
    io("role_tag", role_tag);
    io("content_tag", content_tag);
    io("user_tag", user_tag);
    io("assistant_tag", assistant_tag);
    io("system_tag", system_tag);
  }
};

// Image and video processing of mllm samples (see SampleEncoder).
struct ProcessorConfig {
  std::string type = "qwen2vl";            // qwen2vl | fixed (resize + center crop, CLIP/LLaVA)
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  int64_t min_pixels = 56 * 56;            // Qwen2-VL image pixel budget
  int64_t max_pixels = 28 * 28 * 1280;
  int64_t video_min_pixels = 128 * 28 * 28;  // per frame
  int64_t video_max_pixels = 768 * 28 * 28;
  double fps = 2.0;                        // video frames sampled per second
  int64_t min_frames = 4;
  int64_t max_frames = 768;
  int64_t image_size = 336;                // fixed: output side
  int64_t image_tokens = 576;              // fixed: pad tokens per image
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};  // OpenAI CLIP
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  template <class IO> void io(IO& io) {
    io("type", type, one_of({"qwen2vl", "fixed"}));
    io("patch_size", patch_size, ge(1));
    io("temporal_patch_size", temporal_patch_size, ge(1));
    io("merge_size", merge_size, ge(1));
    io("min_pixels", min_pixels, ge(1));
    io("max_pixels", max_pixels, ge(1));
    io("video_min_pixels", video_min_pixels, ge(1));
    io("video_max_pixels", video_max_pixels, ge(1));
    io("fps", fps, gt(0));
    io("min_frames", min_frames, ge(1));
    io("max_frames", max_frames, ge(1));
    io("image_size", image_size, ge(1));
    io("image_tokens", image_tokens, ge(1));
    io("image_mean", image_mean);
    io("image_std", image_std, gt(0));
  }
};

// The videos dataset: clips of `frames` frames taken at `fps`, resized to cover height x width
// and centre-cropped (VAE training).
struct VideoClipConfig {
  int64_t height = 64, width = 64, frames = 17;
  double fps = 16.0;
  template <class IO> void io(IO& io) {
    io("height", height, gt(0));
    io("width", width, gt(0));
    io("frames", frames, gt(0));
    io("fps", fps, gt(0));
  }
};

struct DataConfig {
  std::string dataset = "text";            // dataset registry id: text | mllm | features | videos
  std::string collator;                    // "" = the dataset's own (text: lm_packed; mllm: padded | packed)
  std::vector<std::string> paths;          // files or directories
  std::vector<double> weights;             // mllm: mixture weight per path (empty = all 1)
  std::vector<std::string> val_paths;      // mllm, videos: validation files (else val_fraction of the records)
  std::string media_root;                  // mllm: relative media paths resolve here (default: the file's folder)
  VideoClipConfig video;                   // videos: the clips' size, length and frame rate
  DataAttrConfig attr;
  std::string format = "auto";             // text: text | fortune | jsonl | auto
  std::string text_key = "text";           // JSONL field holding the text
  std::string tokenizer = "byte";          // byte | an HF tokenizer directory or tokenizer.json
  int64_t seq_len = 256;                   // text: packed row length
  double val_fraction = 0.05;              // held-out documents / records
  int64_t seed = 1234;                     // split and shuffle seed
  int64_t max_documents = 0;               // 0 = all
  // mllm samples
  std::string chat_template = "qwen2vl";
  bool train_on_prompt = false;
  bool mask_history = false;
  std::string system;                      // system prompt when a sample has none ("" = template default)
  ProcessorConfig processor;
  int64_t cutoff_len = 2048;
  std::string truncation = "cut";          // cut (drop the tail, whole images only) | skip (a bad sample)
  int64_t pad_to_multiple_of = 8;
  bool group_by_length = false;
  // loader
  int64_t num_workers = 2;
  int64_t prefetch = 4;
  double max_bad_fraction = 0.1;           // stop when more of the samples tried were bad
  template <class IO> void io(IO& io) {
    io("dataset", dataset);
    io("collator", collator);
    io("paths", paths);
    io("weights", weights, ge(0));
    io("val_paths", val_paths);
    io("media_root", media_root);
    io.section("video", video);
    io.section("attr", attr);
    io("format", format, one_of({"auto", "text", "fortune", "jsonl"}));
    io("text_key", text_key);
    io("tokenizer", tokenizer);
    io("seq_len", seq_len, gt(1));
    io("val_fraction", val_fraction, in_range(0.0, 0.9));
    io("seed", seed, ge(0));
    io("max_documents", max_documents, ge(0));
    io("chat_template", chat_template);
    io("train_on_prompt", train_on_prompt);
    io("mask_history", mask_history);
    io("system", system);
    io.section("processor", processor);
    io("cutoff_len", cutoff_len, ge(2));
    io("truncation", truncation, one_of({"cut", "skip"}));
    io("pad_to_multiple_of", pad_to_multiple_of, ge(1));
    io("group_by_length", group_by_length);
    io("num_workers", num_workers, ge(0));
    io("prefetch", prefetch, ge(0));
    io("max_bad_fraction", max_bad_fraction, in_range(0.0, 1.0));
  }
};

// Frozen encoders run on each batch before the objective (online encoding, as MindSpeed-MM's
// video models do with their ae and text_encoder): model.encoders {id: wan, path: PIPE} turns a
// videos dataset's clips and captions into the VAE's normalised latents and umT5's text features
// on the training device, instead of reading them from `mm data extract-features`' output.
struct EncodersConfig {
  std::string id;                          // input-encoder registry id ("" = none): wan
  std::string path;                        // wan: a pipeline directory with vae/, text_encoder/, tokenizer/
  int64_t max_sequence_length = 512;       // text tokens per caption (padded; as extract-features)
  template <class IO> void io(IO& io) {
    io("id", id);
    io("path", path);
    io("max_sequence_length", max_sequence_length, gt(0));
  }
};

struct ModelConfig {
  std::string id = "qwen2";                // model registry id
  std::string pretrained;                  // HF directory: config.json + safetensors weights
  std::string config_path;                 // an HF config.json to build from (random init)
  nlohmann::json config = nlohmann::json::object();  // HF config.json fields, on top of the above
  // Per-part weights and training, by the model's part names (Model::parts(): vision_tower,
  // projector, language_model, ...): {language_model: {pretrained: DIR, trainable: false}}, or
  // {language_model: DIR}. A part's DIR holds its tensors under the names below the part's prefix
  // (a Qwen2 directory for Qwen2-VL's language_model, a CLIP vision directory for LLaVA's
  // vision_tower); it is loaded after model.pretrained. trainable false freezes the part.
  nlohmann::json parts = nlohmann::json::object();
  EncodersConfig encoders;
  template <class IO> void io(IO& io) {
    io("id", id);
    io("pretrained", pretrained);
    io("config_path", config_path);
    io("config", config);
    io("parts", parts);
    io.section("encoders", encoders);
  }
};

// LoRA (training/lora.h): low-rank adapters on the Linear layers `target` names (PEFT's
// target_modules: a module name such as q_proj matches every module whose path ends with it; a
// path pattern with {*}, * or ? matches as plans do), the rest of the model frozen.
struct LoraConfig {
  std::vector<std::string> target;           // [] = no LoRA
  int64_t rank = 8;
  double alpha = 16;                         // scaling alpha / rank
  double dropout = 0;                        // on the adapter's input, in training
  std::vector<std::string> modules_to_save;  // modules trained whole beside the adapters (lm_head)
  std::string adapter;                       // a PEFT adapter directory to start from (continue training)
  // The frozen base's storage: bf16 halves its memory (needs training.precision: bf16; adapters
  // and modules_to_save stay fp32, their optimizer too).
  std::string base_dtype = "fp32";
  bool enabled() const { return !target.empty(); }
  template <class IO> void io(IO& io) {
    io("target", target);
    io("rank", rank, gt(0));
    io("alpha", alpha, gt(0));
    io("dropout", dropout, in_range(0.0, 0.999));
    io("modules_to_save", modules_to_save);
    io("adapter", adapter);
    io("base_dtype", base_dtype, one_of({"fp32", "bf16"}));
  }
};

struct FeaturesConfig {
  std::vector<std::string> freeze;         // module-path patterns whose parameters are frozen
  std::vector<std::string> recompute;      // blocks (or attention / MLP modules) recomputed in backward
  // Blocks recomputed in backward whose one kept input waits in pinned host memory (CUDA only):
  // copied out on a side stream in forward, brought back a block ahead of backward.
  std::vector<std::string> offload;
  LoraConfig lora;
  template <class IO> void io(IO& io) {
    io("freeze", freeze);
    io("recompute", recompute);
    io("offload", offload);
    io.section("lora", lora);
  }
};

struct OptimizerConfig {
  std::string id = "adamw";
  double lr = 1e-3;
  double weight_decay = 0.1;
  std::vector<double> betas = {0.9, 0.95};
  double eps = 1e-8;
  std::vector<std::string> lr_multipliers;  // "PATTERN=MULT", first match wins: ["visual.merger=10"]
  // for_loop: one parameter at a time (torch.optim's single-tensor path); fused: ATen's
  // _fused_adamw_ (one kernel over all parameters); auto: fused on CUDA, for_loop on the CPU.
  std::string implementation = "auto";
  template <class IO> void io(IO& io) {
    io("id", id);
    io("lr", lr, gt(0));
    io("weight_decay", weight_decay, ge(0));
    io("betas", betas, in_range(0.0, 0.999999));
    io("eps", eps, gt(0));
    io("lr_multipliers", lr_multipliers);
    io("implementation", implementation, one_of({"auto", "for_loop", "fused"}));
  }
};

struct LRScheduleConfig {
  std::string id = "cosine";               // cosine | linear | constant
  int64_t warmup_iters = 0;
  double min_lr = 0.0;
  int64_t decay_iters = 0;                 // 0 = train_iters
  template <class IO> void io(IO& io) {
    io("id", id);
    io("warmup_iters", warmup_iters, ge(0));
    io("min_lr", min_lr, ge(0));
    io("decay_iters", decay_iters, ge(0));
  }
};

// The flow_matching objective (Wan2.1 and MindSpeed-MM): training noise levels
// sigma_k = shift(linspace(1, 0, num_train_timesteps + 1)[k]), k drawn uniformly per sample,
// timestep 1000 sigma_k; x_t = (1 - sigma) x0 + sigma noise; the model predicts noise - x0.
struct FlowMatchingConfig {
  double shift = 5.0;                      // sigma' = s sigma / (1 + (s - 1) sigma)
  int64_t num_train_timesteps = 1000;
  // none: plain MSE; gaussian: MindSpeed-MM's weights exp(-2 ((t - T/2) / T)^2), shifted to 0 at
  // their minimum and scaled to mean 1 over the training timesteps.
  std::string weighting = "none";
  // The probability that a sample's text is replaced by the empty prompt's features (the batch's
  // null_prompt_embeds; zeros when the data has none) so the model learns the unconditional
  // prediction classifier-free guidance needs.
  double text_dropout = 0.0;
  template <class IO> void io(IO& io) {
    io("shift", shift, gt(0));
    io("num_train_timesteps", num_train_timesteps, ge(1));
    io("weighting", weighting, one_of({"none", "gaussian"}));
    io("text_dropout", text_dropout, in_range(0.0, 1.0));
  }
};

// The vae objective: each sample's l1_weight x mean absolute plus mse_weight x mean squared
// reconstruction error, plus kl_weight times its posterior's mean KL divergence from N(0, 1) per
// latent element. (L1 alone, Wan's pixel loss, sits at an all-background reconstruction for a
// long time on sparse frames such as moving Fashion-MNIST; the squared error leaves it at once.)
struct VaeLossConfig {
  double kl_weight = 1e-6;
  double l1_weight = 1.0;
  double mse_weight = 0.0;
  // Decode a sample of the posterior (noise from the run's seed, the step and the sample id) or,
  // when false, its mean: a plain autoencoder that the KL term still keeps near N(0, 1).
  bool sample_posterior = true;
  template <class IO> void io(IO& io) {
    io("kl_weight", kl_weight, ge(0));
    io("sample_posterior", sample_posterior);
    io("l1_weight", l1_weight, ge(0));
    io("mse_weight", mse_weight, ge(0));
  }
};

struct TrainingConfig {
  int64_t train_iters = 100;
  int64_t micro_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  // Megatron's --global-batch-size: when > 0, gradient_accumulation_steps is this /
  // (micro_batch_size x data-parallel size), which must divide it.
  int64_t global_batch_size = 0;
  OptimizerConfig optimizer;
  LRScheduleConfig lr_schedule;
  double clip_grad = 1.0;                  // 0 = off
  // per_token: the step's loss is the mean over every labeled token of the global batch (all
  // micro-batches and data-parallel ranks); per_sample: the mean over samples of each sample's
  // mean token loss. Either is the same for any DP size and accumulation count.
  std::string loss_normalization = "per_token";
  // > 0: a language model's head and cross-entropy run in chunks of this many tokens, the full
  // [tokens, vocab] logits never made (backward recomputes each chunk's); 0: whole logits.
  int64_t loss_chunk_size = 0;
  // The objective registry's id (training/objectives/): auto = the model's own (causal_lm for
  // language and vision-language models).
  std::string objective = "auto";
  FlowMatchingConfig flow_matching;
  VaeLossConfig vae;
  std::string precision = "fp32";          // fp32 | bf16 (bf16 compute, fp32 weights)
  int64_t seed = 42;                       // weight init and everything random in training
  int64_t eval_interval = 0;               // 0 = only before and after training
  int64_t eval_iters = 20;                 // validation batches per evaluation (0 = all)
  int64_t save_interval = 0;               // 0 = never (a final save still happens if save_dir set)
  std::string save_dir;
  std::string resume;                      // "" | auto | path to save/iter_XXXXXXX
  std::string export_dir;                  // write an HF directory at the end
  int64_t log_interval = 1;
  std::string metrics_file;                // JSONL; default save_dir/metrics.jsonl
  int64_t threads = 0;                     // intra-op threads (0 = libtorch's default)
  // auto: the CUDA device of this rank (LOCAL_RANK) when one is visible, else the CPU.
  std::string device = "auto";             // auto | cpu | cuda
  template <class IO> void io(IO& io) {
    io("train_iters", train_iters, ge(0));
    io("micro_batch_size", micro_batch_size, ge(1));
    io("gradient_accumulation_steps", gradient_accumulation_steps, ge(1));
    io("global_batch_size", global_batch_size, ge(0));
    io.section("optimizer", optimizer);
    io.section("lr_schedule", lr_schedule);
    io("clip_grad", clip_grad, ge(0));
    io("loss_normalization", loss_normalization, one_of({"per_token", "per_sample"}));
    io("loss_chunk_size", loss_chunk_size, ge(0));
    io("objective", objective);
    io.section("flow_matching", flow_matching);
    io.section("vae", vae);
    io("precision", precision, one_of({"fp32", "bf16"}));
    io("seed", seed, ge(0));
    io("eval_interval", eval_interval, ge(0));
    io("eval_iters", eval_iters, ge(0));
    io("save_interval", save_interval, ge(0));
    io("save_dir", save_dir);
    io("resume", resume);
    io("export_dir", export_dir);
    io("log_interval", log_interval, ge(1));
    io("metrics_file", metrics_file);
    io("threads", threads, ge(0));
    io("device", device, one_of({"auto", "cpu", "cuda"}));
  }
};

struct SampleConfig {
  std::string prompt;                      // greedy sample printed after training (language models)
  int64_t max_new_tokens = 64;
  template <class IO> void io(IO& io) {
    io("prompt", prompt);
    io("max_new_tokens", max_new_tokens, ge(0));
  }
};

// tools.profile: a Chrome trace of steps [start_step, start_step + steps) on the listed ranks
// (trace_rank{r}.json in dir, default SAVE_DIR/profile or ./profile) and a summary table.
struct ProfileConfig {
  int64_t start_step = 2;            // 1-based; the first step pays for warm-up
  int64_t steps = 0;                 // 0 = no profile
  std::vector<double> ranks = {0};   // [] = every rank
  bool record_shapes = false;        // operators' input shapes in their args
  bool with_stack = false;           // operators' enclosing module ("model.layers.3") in their args
  // libtorch's profiler (Kineto) in the window: its CUDA kernels, copies and memsets join the
  // trace. auto: on CUDA devices; on: also on the CPU (its CPU operators beside ours); off.
  std::string kineto = "auto";
  bool memory_snapshot = false;      // CUDA: the caching allocator's history over the window (.pickle)
  std::string dir;
  bool enabled() const { return steps > 0; }
  template <class IO> void io(IO& io) {
    io("start_step", start_step, ge(1));
    io("steps", steps, ge(0));
    io("ranks", ranks, ge(0));
    io("record_shapes", record_shapes);
    io("with_stack", with_stack);
    io("kineto", kineto, one_of({"auto", "on", "off"}));
    io("memory_snapshot", memory_snapshot);
    io("dir", dir);
  }
};

struct ToolsConfig {
  double peak_tflops = 0;                  // for MFU; 0 = not reported
  std::string progress = "auto";           // auto (bar on a terminal) | bar | lines
  SampleConfig sample;
  bool print_schedule = false;             // pipeline parallelism: print one step's per-stage timeline
  std::string tensorboard_dir;             // TensorBoard event files of the run ("" = none)
  ProfileConfig profile;
  template <class IO> void io(IO& io) {
    io.section("profile", profile);
    io("peak_tflops", peak_tflops, ge(0));
    io("tensorboard_dir", tensorboard_dir);
    io("progress", progress, one_of({"auto", "bar", "lines"}));
    io("print_schedule", print_schedule);
    io.section("sample", sample);
  }
};

struct Config {
  ParallelConfig parallel;
  DataConfig data;
  ModelConfig model;
  FeaturesConfig features;
  TrainingConfig training;
  ToolsConfig tools;
  std::string source_file;  // not part of the YAML
  template <class IO> void io(IO& io) {
    io.section("parallel", parallel);
    io.section("data", data);
    io.section("model", model);
    io.section("features", features);
    io.section("training", training);
    io.section("tools", tools);
  }
};

// Reads `path`, applies `overrides` ("training.lr=3e-4"), checks every key, type and range, and
// the cross-field rules. Throws ConfigError (exit code 2) with a one-line message.
// for_training = false (mm generate / eval: only the data section matters) skips the rules only
// training needs (data.paths, a model source, resume's save_dir).
Config load_config(const std::string& path, const std::vector<std::string>& overrides, bool for_training = true);
// Same, from YAML text (tests).
Config parse_config(const std::string& yaml_text, const std::string& name, const std::vector<std::string>& overrides,
                    bool for_training = true);
// The resolved config as YAML.
std::string to_yaml(const Config& c);

}  // namespace mm::config
