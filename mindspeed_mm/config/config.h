// The typed configuration of `mm train`: YAML sections parallel, data, model, features,
// training, tools. Defaults here are what a section left out of the YAML means.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config_io.h"

namespace mm::config {

struct ParallelConfig {
  // Sizes of the device mesh dp_replicate x dp_shard x cp x tp. Only 1 is supported until the
  // distributed runtime lands; larger values are rejected with a clear message.
  int64_t data_parallel_replicate_size = 1;
  int64_t data_parallel_shard_size = 1;
  int64_t context_parallel_size = 1;
  int64_t tensor_parallel_size = 1;
  template <class IO> void io(IO& io) {
    io("data_parallel_replicate_size", data_parallel_replicate_size, ge(1));
    io("data_parallel_shard_size", data_parallel_shard_size, ge(1));
    io("context_parallel_size", context_parallel_size, ge(1));
    io("tensor_parallel_size", tensor_parallel_size, ge(1));
  }
};

struct DataConfig {
  std::string dataset = "text";            // dataset registry id
  std::string collator = "lm_packed";      // collator registry id
  std::vector<std::string> paths;          // files or directories
  std::string format = "auto";             // text | fortune | jsonl | auto
  std::string text_key = "text";           // JSONL field holding the text
  std::string tokenizer = "byte";
  int64_t seq_len = 256;
  double val_fraction = 0.05;              // held-out documents
  int64_t seed = 1234;                     // split and shuffle seed
  int64_t max_documents = 0;               // 0 = all
  template <class IO> void io(IO& io) {
    io("dataset", dataset);
    io("collator", collator);
    io("paths", paths);
    io("format", format, one_of({"auto", "text", "fortune", "jsonl"}));
    io("text_key", text_key);
    io("tokenizer", tokenizer, one_of({"byte"}));
    io("seq_len", seq_len, gt(1));
    io("val_fraction", val_fraction, in_range(0.0, 0.9));
    io("seed", seed, ge(0));
    io("max_documents", max_documents, ge(0));
  }
};

struct ModelConfig {
  std::string id = "qwen2";                // model registry id
  std::string pretrained;                  // HF directory: config.json + safetensors weights
  std::string config_path;                 // an HF config.json to build from (random init)
  nlohmann::json config = nlohmann::json::object();  // HF config.json fields, on top of the above
  template <class IO> void io(IO& io) {
    io("id", id);
    io("pretrained", pretrained);
    io("config_path", config_path);
    io("config", config);
  }
};

struct FeaturesConfig {
  std::vector<std::string> freeze;         // module-path patterns whose parameters are frozen
  std::vector<std::string> recompute;      // blocks whose activations are recomputed in backward
  template <class IO> void io(IO& io) {
    io("freeze", freeze);
    io("recompute", recompute);
  }
};

struct OptimizerConfig {
  std::string id = "adamw";
  double lr = 1e-3;
  double weight_decay = 0.1;
  std::vector<double> betas = {0.9, 0.95};
  double eps = 1e-8;
  template <class IO> void io(IO& io) {
    io("id", id);
    io("lr", lr, gt(0));
    io("weight_decay", weight_decay, ge(0));
    io("betas", betas, in_range(0.0, 0.999999));
    io("eps", eps, gt(0));
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

struct TrainingConfig {
  int64_t train_iters = 100;
  int64_t micro_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  OptimizerConfig optimizer;
  LRScheduleConfig lr_schedule;
  double clip_grad = 1.0;                  // 0 = off
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
  std::string device = "cpu";              // cpu | cuda
  template <class IO> void io(IO& io) {
    io("train_iters", train_iters, ge(0));
    io("micro_batch_size", micro_batch_size, ge(1));
    io("gradient_accumulation_steps", gradient_accumulation_steps, ge(1));
    io.section("optimizer", optimizer);
    io.section("lr_schedule", lr_schedule);
    io("clip_grad", clip_grad, ge(0));
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
    io("device", device, one_of({"cpu", "cuda"}));
  }
};

struct SampleConfig {
  std::string prompt;                      // greedy sample printed after training
  int64_t max_new_tokens = 64;
  template <class IO> void io(IO& io) {
    io("prompt", prompt);
    io("max_new_tokens", max_new_tokens, ge(0));
  }
};

struct ToolsConfig {
  double peak_tflops = 0;                  // for MFU; 0 = not reported
  std::string progress = "auto";           // auto (bar on a terminal) | bar | lines
  SampleConfig sample;
  template <class IO> void io(IO& io) {
    io("peak_tflops", peak_tflops, ge(0));
    io("progress", progress, one_of({"auto", "bar", "lines"}));
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
Config load_config(const std::string& path, const std::vector<std::string>& overrides);
// Same, from YAML text (tests).
Config parse_config(const std::string& yaml_text, const std::string& name, const std::vector<std::string>& overrides);
// The resolved config as YAML.
std::string to_yaml(const Config& c);

}  // namespace mm::config
