// Autoregressive generation for `mm generate` and `mm eval`: a prompt (tokens plus the images
// and videos a vision-language model needs) is prefilled once into a KV cache, then one token
// per step is decoded against the cache. Without the cache (use_cache = false) every step runs
// the whole sequence again: the reference the cached path is tested against.
//
// Next-token choice follows transformers' generate() order: repetition penalty over the prompt
// and what was generated (a logit > 0 is divided by the penalty, one < 0 multiplied), then
// temperature, top-k, top-p (the smallest set of tokens whose probability reaches top_p, at least
// one). temperature 0 is greedy (argmax); otherwise a token is drawn from the softmax with a
// generator seeded by `seed`, so a run is reproducible.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mindspeed_mm/models/model_registry.h"

namespace mm::inference {

struct SamplingOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0.0;         // 0: greedy
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // 1: off
  double repetition_penalty = 1.0;  // 1: off
  std::vector<int64_t> stop_token_ids;  // generation ends at the first of these (not returned)
  uint64_t seed = 0;
  bool use_cache = true;
  // mm::ConfigError naming the option for values out of range.
  void validate() const;
};

struct Generation {
  std::vector<int64_t> tokens;     // generated, without the stop token
  std::string finish_reason;       // "stop" (a stop token or the stop callback) | "length"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Logits [vocab] of the next token (any float dtype) -> the chosen token. `context` is the
// prompt plus the tokens generated so far (for the repetition penalty).
int64_t choose_next_token(const at::Tensor& logits, const std::vector<int64_t>& context, const SamplingOptions& o,
                          at::Generator& gen);

// The warped distribution choose_next_token samples from: log-probabilities [vocab] with -inf
// where top-k / top-p removed a token (greedy: the penalised logits). For tests and `--explain`.
at::Tensor processed_logits(const at::Tensor& logits, const std::vector<int64_t>& context, const SamplingOptions& o);

// Every id in `ids` (any shape, any device) is a row of the model's embedding table; else an
// Error naming `what` (a tokenizer that does not match the model), never an index error inside it.
void check_token_ids(const at::Tensor& ids, int64_t vocab_size, const std::string& what);

// prompt.input_ids [1, S] (one sequence). stop(tokens) may end generation early (e.g. a stop
// string); on_token(token) streams each accepted token.
Generation generate(models::CausalLM& model, const models::MultimodalInputs& prompt, const SamplingOptions& o,
                    const std::function<bool(const std::vector<int64_t>&)>& stop = {},
                    const std::function<void(int64_t)>& on_token = {});

}  // namespace mm::inference
