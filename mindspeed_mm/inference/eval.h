// `mm eval`: a benchmark harness over an mllm-format test file. Each record's last message is
// the assistant's reference answer; the conversation before it is the prompt.
//
//   generation metrics (the model answers greedily, or as SamplingOptions say):
//     vqa     exact: the trimmed answer equals the reference; normalized: equal after VQA
//             normalisation (normalize_answer); vqa_accuracy: with a record's "answers" list,
//             min(1, matching answers / 3) as the VQA benchmark scores, else = normalized
//     choice  a record with "options", or whose reference is one letter (MMMU / AI2D style):
//             the letter parse_choice reads from the answer equals the reference letter
//   loss      teacher-forced cross-entropy over the reference answer's tokens (the training
//             labels), and its perplexity
//
// Records whose media fail to load are counted as errors and reported, not scored.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/mllm/sample_encoder.h"
#include "mindspeed_mm/inference/generate.h"

namespace mm::inference {

// The VQA evaluation's answer normalisation: lower case; punctuation removed (a mark between
// two letters or digits becomes a space, a period inside a number stays); the articles a, an,
// the dropped; number words zero..ten as digits; whitespace collapsed.
std::string normalize_answer(const std::string& answer);

// The choice a free-form answer picks, as MMMU's parse_multi_choice_response: "(B)", a lone
// "B", "B." / "B:" / "B)" count as letters among the n = options.size() letters (A..J when no
// options are given); failing that, an option's text found in the answer (case-insensitive).
// Several candidates: the one appearing last. -1 when nothing matches.
int parse_choice(const std::string& answer, const std::vector<std::string>& options);

struct EvalOptions {
  bool generate = true;  // vqa / choice metrics
  bool loss = true;      // teacher-forced loss / perplexity
  int64_t max_samples = 0;  // 0 = all
  int threads = 0;          // samples in flight (0: hardware threads); results do not depend on it
  SamplingOptions sampling;  // max_new_tokens, stop tokens (eos is added), greedy by default
  int64_t keep_predictions = 20;  // how many per-sample predictions the report lists (-1: all)
};

struct EvalSample {
  std::string source, task, prediction, reference;  // task: "vqa" | "choice"
  bool correct = false;
  double loss = 0;      // summed over the reference tokens
  int64_t tokens = 0;   // reference tokens scored
};

struct EvalReport {
  int64_t samples = 0, errors = 0;
  int64_t vqa = 0, vqa_exact = 0, vqa_normalized = 0;
  double vqa_accuracy_sum = 0;
  int64_t choice = 0, choice_correct = 0, choice_unparsed = 0;
  double loss_sum = 0;
  int64_t loss_tokens = 0;
  double seconds = 0;
  int64_t generated_tokens = 0;
  std::vector<EvalSample> predictions;  // the first keep_predictions, in file order
  std::vector<std::string> error_messages;  // the first few

  double accuracy() const;  // (vqa normalized + choice correct) / scored samples
  nlohmann::json to_json() const;
  std::string table() const;  // the printed summary
};

// The model inputs of one encoded sample: input_ids [1, S] and its pixels and grids.
models::MultimodalInputs sample_inputs(const data::EncodedSample& s);

// progress(done, total) after each sample.
EvalReport evaluate(models::CausalLM& model, const data::SampleEncoder& encoder,
                    const std::vector<data::MllmRecord>& records, const EvalOptions& options,
                    const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace mm::inference
