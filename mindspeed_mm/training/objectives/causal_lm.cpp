// causal_lm: next-token cross-entropy of a language model's logits against the batch's shifted
// labels (-100 = not scored), for text and vision-language models alike. Normalised by the
// labeled tokens of the step (training.loss_normalization per_token) or by its samples, each
// sample's mean token loss counting once (per_sample; a packed row's segments are samples).
// Validation is always the mean per labeled token; reports show perplexity exp(loss), the
// unigram baseline of text data, and a greedy sample after training.
#include <cmath>
#include <cstdio>

#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/data/text_dataset.h"
#include "mindspeed_mm/inference/generate.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/training/objectives/objective.h"
#include "mindspeed_mm/training/train_step.h"

namespace mm::training {
namespace {

using log::fixed;

class CausalLMObjective : public Objective {
 public:
  explicit CausalLMObjective(const config::Config& cfg)
      : per_sample_(cfg.training.loss_normalization == "per_sample"), sample_(cfg.tools.sample) {}

  std::vector<std::string> required_fields() const override { return {std::string(data::kLabels)}; }
  std::string normalised_by() const override { return per_sample_ ? "samples" : "tokens"; }

  double count(const data::Batch& host) const override {
    const at::Tensor& labels = host.require(data::kLabels);
    if (per_sample_) return static_cast<double>(models::scored_samples(labels, host[data::kSegmentIds]));
    return static_cast<double>(labels.ne(models::kIgnoreIndex).sum().item<int64_t>());
  }

  at::Tensor loss_sum(const models::Outputs& out, const data::Batch& b) const override {
    const at::Tensor& labels = b.require(data::kLabels);
    if (out.has(models::kTokenLosses)) {  // the model fused its head with the loss (loss_chunk_size)
      const at::Tensor& per_token = out[models::kTokenLosses];
      return per_sample_ ? models::per_sample_sum(per_token, labels, b[data::kSegmentIds]).sum : per_token.sum();
    }
    const at::Tensor logits = out[models::kLogits].to(at::kFloat);
    if (vocab_) {  // split logits: never gathered
      at::Tensor per_token = parallel::vocab_parallel_token_losses(logits, labels, vocab_);
      return per_sample_ ? models::per_sample_sum(per_token, labels, b[data::kSegmentIds]).sum : per_token.sum();
    }
    return per_sample_ ? models::lm_cross_entropy_per_sample_sum(logits, labels, b[data::kSegmentIds]).sum
                       : models::lm_cross_entropy_sum(logits, labels).sum;
  }

  EvalSums eval_sums(const models::Outputs& out, const data::Batch& b) const override {
    const at::Tensor logits = out[models::kLogits].to(at::kFloat);
    if (vocab_) {
      auto [sum, count] = parallel::vocab_parallel_cross_entropy_sum(logits, b.require(data::kLabels), vocab_);
      return {sum, count};
    }
    auto ce = models::lm_cross_entropy_sum(logits, b.require(data::kLabels));
    return {ce.sum, ce.count};
  }

  void set_vocab_parallel(parallel::TpGroup group) override { vocab_ = std::move(group); }

  std::string describe(double loss) const override {
    return cat("loss ", fixed(loss, 4), " (ppl ", fixed(std::exp(loss), 2), ")");
  }

  nlohmann::json eval_record(double loss) const override { return {{"val_ppl", std::exp(loss)}}; }

  // The entropy of the validation tokens under the training split's unigram frequencies: what a
  // model that ignores context scores (text data only).
  Report baseline(const data::TrainData& d) const override {
    if (d.val_token_counts.empty()) return {};
    const double h = data::unigram_entropy_nats(d.train_token_counts, d.val_token_counts);
    return {cat("unigram baseline ", fixed(h, 4), " (ppl ", fixed(std::exp(h), 2), ")"), {{"unigram_baseline", h}}};
  }

  // Greedy decoding needs the whole vocabulary's logits on one rank: not under tensor parallelism
  // (mm generate on the exported model gives the sample instead).
  bool reports_after_training() const override {
    return !vocab_ && !sample_.prompt.empty() && sample_.max_new_tokens > 0;
  }

  Report after_training(models::Model& model, const data::TrainData& d) const override {
    auto* lm = dynamic_cast<models::CausalLM*>(&model);
    if (!reports_after_training() || !lm || !d.encode) return {};
    models::MultimodalInputs prompt;
    prompt.input_ids = at::tensor(d.encode(sample_.prompt), at::kLong).unsqueeze(0).to(model_device(model));
    inference::SamplingOptions o;
    o.max_new_tokens = sample_.max_new_tokens;  // temperature 0: greedy
    o.stop_token_ids = {d.eos_id};
    const std::string text = d.decode(inference::generate(*lm, prompt, o).tokens);
    return {cat("sample (greedy): ", sample_.prompt, text), {{"sample_prompt", sample_.prompt}, {"sample", text}}};
  }

 private:
  bool per_sample_;
  config::SampleConfig sample_;
  parallel::TpGroup vocab_;  // set when the logits are split along the vocabulary
};

Registrar causal_lm(objective_registry(), "causal_lm",
                    [](const config::Config& cfg) -> std::unique_ptr<Objective> {
                      return std::make_unique<CausalLMObjective>(cfg);
                    });

}  // namespace
}  // namespace mm::training
