// Conformance of Qwen2ForCausalLM with Hugging Face transformers itself (PyPI's transformers,
// pinned in scripts/install_deps.sh, run by tests/conformance/hf_reference.py on tiny random
// models; nothing downloaded). Both ways:
//   HF -> mm: transformers makes and saves a model, mm loads the directory;
//   mm -> HF: mm initialises and exports a model, transformers loads it.
// Logits agree within 1e-4 of the largest logit in float32 and 1e-6 in float64 (transformers
// computes the rotary cos/sin and eager attention's softmax in float32 whatever the model dtype,
// ~3e-7 measured; mm keeps the model's dtype); greedy decoding with the KV cache gives the same
// 32 tokens; one training step gives the same loss and gradients (1e-5 relative in float64, for
// the same reason). Position ids that restart are packed documents to transformers >= 5 when no
// attention mask is given: both readings are checked (plain causal with an all-ones mask, and
// per-document attention against mm's segment mask).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/inference/generate.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/models/qwen2/qwen2.h"

namespace {

using mm::models::Qwen2Config;
using mm::models::Qwen2ForCausalLM;
using mm::test::rel_err;
using mm::test::run_hf;
using nlohmann::json;

at::Tensor read(const std::string& file, const std::string& name) {
  return mm::st::SafetensorsReader(file).get_copy(name);
}

// initializer_range 0.2 (not 0.02) makes attention scores O(1), so the softmax is far from
// uniform and rotary or mask errors are visible in the logits.
json tiny_config(bool tied, double theta, const char* dtype) {
  return json{{"model_type", "qwen2"},     {"architectures", {"Qwen2ForCausalLM"}},
              {"vocab_size", 97},          {"hidden_size", 64},
              {"intermediate_size", 112},  {"num_hidden_layers", 2},
              {"num_attention_heads", 4},  {"num_key_value_heads", 2},
              {"initializer_range", 0.2},  {"tie_word_embeddings", tied},
              {"rope_theta", theta},       {"rms_norm_eps", tied ? 1e-5 : 1e-6},
              {"dtype", dtype}};
}

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

at::Tensor token_ids(int64_t B, int64_t S, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(97, {B, S}, gen, at::TensorOptions().dtype(at::kLong));
}

// Row 0 continues a sequence from position 5; row 1 packs two documents (7 + 6 tokens).
at::Tensor packed_positions(int64_t S) {
  return at::cat({at::arange(5, 5 + S, at::kLong).unsqueeze(0),
                  at::cat({at::arange(7, at::kLong), at::arange(S - 7, at::kLong)}).unsqueeze(0)});
}

// Segment ids of packed_positions: a new document wherever a position does not follow the last.
at::Tensor segments_from_positions(const at::Tensor& pos) {
  at::Tensor starts = at::ones_like(pos);
  starts.narrow(1, 1, pos.size(1) - 1).copy_(pos.narrow(1, 1, pos.size(1) - 1).ne(pos.narrow(1, 0, pos.size(1) - 1) + 1));
  return starts.cumsum(1);
}

// Compares mm's logits with those in DIR/logits.safetensors. With positions: "logits_causal"
// (transformers with an all-ones mask) against mm's plain causal forward, and "logits"
// (transformers' packed-document reading) against mm with the documents' segment mask.
void compare_logits(mm::models::CausalLM& m, const std::string& dir, const at::Tensor& ids, const at::Tensor& pos,
                    const std::string& what, double tol) {
  at::NoGradGuard no_grad;
  mm::st::SafetensorsReader ref(dir + "/logits.safetensors");
  auto check = [&](const at::Tensor& ours, const char* key, const char* reading) {
    at::Tensor r = ref.get_copy(key);
    ASSERT_EQ(ours.sizes(), r.sizes()) << what << " " << reading;
    EXPECT_EQ(ours.scalar_type(), r.scalar_type()) << what << " " << reading;
    const double e = rel_err(ours, r);
    std::printf("[%s%s] max |ours - transformers| / max |logit| = %.3e\n", what.c_str(), reading, e);
    EXPECT_LT(e, tol) << what << reading;
  };
  if (!pos.defined()) {
    check(m.forward(ids), "logits", "");
    return;
  }
  check(m.forward(ids, pos), "logits_causal", ", causal");
  check(m.forward(ids, pos, mm::models::segment_attention_mask(segments_from_positions(pos))), "logits", ", packed");
}

struct Tol {
  at::ScalarType dtype;
  const char* name;
  double logits;
};
const Tol kTolerances[] = {{at::kDouble, "float64", 1e-6}, {at::kFloat, "float32", 1e-4}};

// HF -> mm: transformers creates the model; mm's logits on the same ids (and position ids).
void check_hf_to_mm(const char* name, bool tied, double theta, bool positions) {
  for (const Tol& t : kTolerances) {
    const std::string dir = mm::test::fresh_dir(std::string("qwen2_hf2mm_") + name + "_" + t.name);
    run_hf("create " + dir + " " + shell_quote(tiny_config(tied, theta, t.name).dump()) + " --seed 5");
    at::Tensor ids = token_ids(2, 13, 7), pos = positions ? packed_positions(13) : at::Tensor();
    std::vector<std::pair<std::string, at::Tensor>> in = {{"input_ids", ids}};
    if (positions) in.emplace_back("position_ids", pos);
    mm::st::save_safetensors(dir + "/inputs.safetensors", in);
    run_hf("logits " + dir);
    auto m = mm::test::load_hf_model_as(dir, t.dtype);
    compare_logits(*m, dir, ids, pos, std::string(name) + " hf->mm " + t.name, t.logits);
  }
}

// mm -> HF: mm initialises (norms and biases moved off their init) and exports; transformers
// loads the export.
void check_mm_to_hf(const char* name, bool tied, double theta, bool positions) {
  for (const Tol& t : kTolerances) {
    json cfg = tiny_config(tied, theta, t.name);
    cfg.erase("model_type");
    cfg.erase("architectures");
    cfg.erase("dtype");
    cfg["torch_dtype"] = t.name;
    auto model = std::make_shared<Qwen2ForCausalLM>(Qwen2Config::from_json(cfg, name, /*strict=*/true), t.dtype);
    model->init_weights(11);
    mm::test::perturb_norms_and_biases(*model, 12);
    const std::string dir = mm::test::fresh_dir(std::string("qwen2_mm2hf_") + name + "_" + t.name);
    mm::checkpoint::export_hf_directory(dir, model->hf_config(), *model);
    at::Tensor ids = token_ids(2, 13, 8), pos = positions ? packed_positions(13) : at::Tensor();
    std::vector<std::pair<std::string, at::Tensor>> in = {{"input_ids", ids}};
    if (positions) in.emplace_back("position_ids", pos);
    mm::st::save_safetensors(dir + "/inputs.safetensors", in);
    run_hf("logits " + dir);
    compare_logits(*model, dir, ids, pos, std::string(name) + " mm->hf " + t.name, t.logits);
  }
}

TEST(Qwen2Conformance, UntiedTheta1e4HFToMM) { check_hf_to_mm("untied", false, 1e4, false); }
TEST(Qwen2Conformance, TiedTheta1e6PositionIdsHFToMM) { check_hf_to_mm("tied", true, 1e6, true); }
TEST(Qwen2Conformance, UntiedTheta1e4MMToHF) { check_mm_to_hf("untied", false, 1e4, false); }
TEST(Qwen2Conformance, TiedTheta1e6PositionIdsMMToHF) { check_mm_to_hf("tied", true, 1e6, true); }

// transformers' generate() (greedy, KV cache) and mm's inference::generate give the same 32
// tokens on the same float32 model and prompt.
TEST(Qwen2Conformance, GreedyGeneration32TokensEqualTransformers) {
  const std::string dir = mm::test::fresh_dir("qwen2_generate");
  run_hf("create " + dir + " " + shell_quote(tiny_config(false, 1e6, "float32").dump()) + " --seed 9");
  at::Tensor prompt = token_ids(1, 9, 10);
  mm::st::save_safetensors(dir + "/inputs.safetensors", {{"input_ids", prompt}});
  run_hf("generate " + dir + " 32");
  at::Tensor ref = read(dir + "/generated.safetensors", "tokens");
  ASSERT_EQ(ref.numel(), 32);

  auto m = mm::test::load_hf_model(dir);
  mm::models::MultimodalInputs in;
  in.input_ids = prompt;
  mm::inference::SamplingOptions o;
  o.max_new_tokens = 32;
  auto g = mm::inference::generate(*m, in, o);
  std::vector<int64_t> want(ref.data_ptr<int64_t>(), ref.data_ptr<int64_t>() + ref.numel());
  EXPECT_EQ(g.tokens, want);
}

// One training step: transformers' loss (its own label shift, mean over labelled tokens) and the
// gradient of every parameter, against mm's forward + cross entropy (labels shifted as mm's
// collator shifts them) + backward, in float64.
TEST(Qwen2Conformance, TrainingStepLossAndGradientsEqualTransformers) {
  const std::string dir = mm::test::fresh_dir("qwen2_train_step");
  run_hf("create " + dir + " " + shell_quote(tiny_config(false, 1e6, "float64").dump()) + " --seed 13");
  at::Tensor ids = token_ids(2, 11, 14);
  at::Tensor labels = ids.clone();
  labels.index_put_({0, at::indexing::Slice(0, 4)}, -100);  // a prompt that is not trained on
  mm::st::save_safetensors(dir + "/inputs.safetensors", {{"input_ids", ids}, {"labels", labels}});
  run_hf("train_step " + dir);
  mm::st::SafetensorsReader ref(dir + "/grads.safetensors");

  auto m = mm::test::load_hf_model_as(dir, at::kDouble);
  // mm's labels: position t is scored against token t + 1 (the collator's shift).
  at::Tensor shifted = at::full_like(labels, -100);
  shifted.narrow(1, 0, labels.size(1) - 1).copy_(labels.narrow(1, 1, labels.size(1) - 1));
  at::Tensor logits = m->forward(ids);
  auto ce = mm::models::lm_cross_entropy_sum(logits, shifted);
  at::Tensor loss = ce.sum / ce.count.to(at::kDouble);
  loss.backward();
  const double ref_loss = ref.get_copy("loss").item<double>();
  std::printf("training step: loss mm %.12f, transformers %.12f\n", loss.item<double>(), ref_loss);
  EXPECT_NEAR(loss.item<double>(), ref_loss, 1e-6 * std::abs(ref_loss));
  int64_t compared = 0;
  double worst = 0;
  for (auto& [name, p] : m->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    ASSERT_TRUE(ref.has(name)) << "transformers has no gradient for " << name;
    worst = std::max(worst, rel_err(p.grad(), ref.get_copy(name)));
    ++compared;
  }
  std::printf("training step: %lld gradients, worst max |ours - transformers| / max |grad| = %.3e\n",
              static_cast<long long>(compared), worst);
  EXPECT_EQ(compared, static_cast<int64_t>(m->named_parameters().size()));
  EXPECT_LT(worst, 1e-5);
}

}  // namespace
