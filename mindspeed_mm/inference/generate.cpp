// Generation: prefill, cached decoding, logits processing and sampling.
#include "mindspeed_mm/inference/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <limits>
#include <set>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/kv_cache.h"

namespace mm::inference {

void SamplingOptions::validate() const {
  if (max_new_tokens < 0) throw ConfigError(cat("generate: --max-new-tokens must be >= 0 (got ", max_new_tokens, ")"));
  if (!(temperature >= 0)) throw ConfigError(cat("generate: --temperature must be >= 0 (got ", temperature, ")"));
  if (top_k < 0) throw ConfigError(cat("generate: --top-k must be >= 0 (got ", top_k, ")"));
  if (!(top_p > 0 && top_p <= 1)) throw ConfigError(cat("generate: --top-p must be in (0, 1] (got ", top_p, ")"));
  if (!(repetition_penalty > 0))
    throw ConfigError(cat("generate: --repetition-penalty must be > 0 (got ", repetition_penalty, ")"));
}

at::Tensor processed_logits(const at::Tensor& logits_in, const std::vector<int64_t>& context, const SamplingOptions& o) {
  at::Tensor logits = logits_in.to(at::kFloat).reshape({-1}).clone();
  const int64_t V = logits.size(0);
  if (o.repetition_penalty != 1.0 && !context.empty()) {
    std::set<int64_t> seen;
    for (int64_t t : context)
      if (t >= 0 && t < V) seen.insert(t);
    float* l = logits.data_ptr<float>();
    const auto p = static_cast<float>(o.repetition_penalty);
    for (int64_t t : seen) l[t] = l[t] < 0 ? l[t] * p : l[t] / p;
  }
  if (o.temperature == 0) return logits;
  logits.div_(o.temperature);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (o.top_k > 0 && o.top_k < V) {
    const float kth = std::get<0>(logits.topk(o.top_k)).min().item<float>();
    logits.masked_fill_(logits.lt(kth), neg_inf);
  }
  if (o.top_p < 1.0) {
    auto [sorted, order] = logits.sort(/*dim=*/0, /*descending=*/false);
    at::Tensor cumulative = sorted.softmax(0).cumsum(0);
    at::Tensor remove = cumulative.le(1.0 - o.top_p);
    remove[V - 1] = false;  // keep at least the most likely token
    logits.index_put_({order.masked_select(remove)}, neg_inf);
  }
  return logits.log_softmax(0);
}

int64_t choose_next_token(const at::Tensor& logits, const std::vector<int64_t>& context, const SamplingOptions& o,
                          at::Generator& gen) {
  at::Tensor l = processed_logits(logits, context, o);
  if (o.temperature == 0) return l.argmax().item<int64_t>();
  return at::multinomial(l.exp(), 1, /*replacement=*/false, gen).item<int64_t>();
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

void check_token_ids(const at::Tensor& ids, int64_t vocab_size, const std::string& what) {
  if (!ids.defined() || ids.numel() == 0) return;
  const at::Tensor flat = ids.to(at::kCPU, at::kLong).flatten();
  const int64_t lo = flat.min().item<int64_t>(), hi = flat.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size)
    throw Error(cat(what, ": token id ", lo < 0 ? lo : hi, " is outside the model's vocabulary of ", vocab_size,
                    " (the tokenizer or chat template does not match the model)"));
}

Generation generate(models::CausalLM& model, const models::MultimodalInputs& prompt, const SamplingOptions& o,
                    const std::function<bool(const std::vector<int64_t>&)>& stop,
                    const std::function<void(int64_t)>& on_token) {
  o.validate();
  MM_CHECK(prompt.input_ids.dim() == 2 && prompt.input_ids.size(0) == 1 && prompt.input_ids.size(1) > 0,
           "generate: the prompt must be one non-empty sequence [1, S] (got ", prompt.input_ids.sizes(), ")");
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const at::Tensor prompt_ids = prompt.input_ids.to(at::kCPU, at::kLong).contiguous();
  check_token_ids(prompt_ids, model.vocab_size(), "generate: the prompt");
  // The prompt goes to the model's device; grids stay on the host (sizes the model reads there).
  at::Device device = at::kCPU;
  for (auto& p : model.parameters()) {
    device = p.device();
    break;
  }
  std::vector<int64_t> context(prompt_ids.data_ptr<int64_t>(), prompt_ids.data_ptr<int64_t>() + prompt_ids.numel());
  Generation g;
  g.prompt_tokens = static_cast<int64_t>(context.size());
  g.finish_reason = "length";
  const std::set<int64_t> stops(o.stop_token_ids.begin(), o.stop_token_ids.end());

  mm::nn::KVCache cache;
  models::MultimodalInputs in = prompt;
  for (at::Tensor* t : {&in.input_ids, &in.attention_mask, &in.pixel_values, &in.pixel_values_videos})
    if (t->defined()) *t = t->to(device);
  in.position_ids = at::Tensor();
  in.attn_mask = at::Tensor();
  in.kv_cache = o.use_cache ? &cache : nullptr;
  auto t0 = Clock::now();
  at::Tensor logits = model.forward_multimodal(in);
  g.prefill_seconds = seconds_since(t0);
  t0 = Clock::now();
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    // The sampling rules run on the host with the CPU generator: the same draws on any device.
    const int64_t next = choose_next_token(logits[0][-1].to(at::kCPU), context, o, gen);
    if (stops.count(next)) {
      g.finish_reason = "stop";
      break;
    }
    context.push_back(next);
    g.tokens.push_back(next);
    if (on_token) on_token(next);
    if (stop && stop(g.tokens)) {
      g.finish_reason = "stop";
      break;
    }
    if (step + 1 == o.max_new_tokens) break;
    if (o.use_cache) {
      // Only the new token: its keys join the cache; no vision inputs after the prompt.
      models::MultimodalInputs step_in;
      step_in.input_ids = at::tensor(std::vector<int64_t>{next}, at::kLong).view({1, 1}).to(device);
      step_in.kv_cache = &cache;
      logits = model.forward_multimodal(step_in);
    } else {
      in.input_ids = at::tensor(context, at::kLong).unsqueeze(0).to(device);
      logits = model.forward_multimodal(in);
    }
  }
  g.decode_seconds = seconds_since(t0);
  return g;
}

}  // namespace mm::inference
