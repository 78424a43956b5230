// mm eval's scoring (mindspeed_mm/inference/eval.h): VQA answer normalisation and MMMU-style
// choice parsing on hand-written cases; evaluate() scores a model's own greedy answers as
// correct and others as wrong, counts VQA multi-answer credit, choice letters, errors, and gives
// the same report for any thread count; its loss equals the training loss of the same samples.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/data/mllm/mllm_collator.h"
#include "mindspeed_mm/data/tokenizer/byte_chat_tokenizer.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/inference/eval.h"
#include "mindspeed_mm/inference/model_loader.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"
#include "run_command.h"

using namespace mm::inference;
using nlohmann::json;

TEST(EvalMetrics, NormalizeAnswerAsTheVQAEvaluation) {
  EXPECT_EQ(normalize_answer("  The T-shirt/top. "), "t shirt top");
  EXPECT_EQ(normalize_answer("Two dogs!"), "2 dogs");
  EXPECT_EQ(normalize_answer("3.5 meters"), "3.5 meters");
  EXPECT_EQ(normalize_answer("an  Ankle\tboot"), "ankle boot");
  EXPECT_EQ(normalize_answer("don't"), "dont");
  EXPECT_EQ(normalize_answer("None"), "0");
  EXPECT_EQ(normalize_answer("Yes."), normalize_answer("yes"));
}

TEST(EvalMetrics, ParseChoiceAsMMMU) {
  EXPECT_EQ(parse_choice("(B) the dog", {}), 1);
  EXPECT_EQ(parse_choice("The answer is C.", {}), 2);
  EXPECT_EQ(parse_choice("D", {"w", "x", "y", "z"}), 3);
  EXPECT_EQ(parse_choice("A: red", {"red", "blue"}), 0);
  EXPECT_EQ(parse_choice("It's a dog", {"cat", "dog", "bird"}), 1);  // option text, no letter
  EXPECT_EQ(parse_choice("Not A but B", {"x", "y", "z"}), 1);        // several: the last
  EXPECT_EQ(parse_choice("(A) or rather (C)", {"x", "y", "z"}), 2);
  EXPECT_EQ(parse_choice("no idea", {"cat", "dog"}), -1);
  EXPECT_EQ(parse_choice("E", {"a", "b"}), -1);  // only A and B exist
}

namespace {

std::shared_ptr<mm::models::Qwen2VLForConditionalGeneration> tiny_vl() {
  json j = json::parse(R"({"vocab_size": 263, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
    "image_token_id": 261, "video_token_id": 262, "vision_start_token_id": 259, "vision_end_token_id": 260,
    "vision_config": {"depth": 1, "embed_dim": 16, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14}})");
  auto m = std::make_shared<mm::models::Qwen2VLForConditionalGeneration>(
      mm::models::Qwen2VLConfig::from_json(j, "test", false));
  m->init_weights(11);
  at::NoGradGuard no_grad;
  for (auto& [n, p] : m->named_parameters())
    if (n.find("norm") == std::string::npos && n.find("ln_q") == std::string::npos) p.mul_(6.0);
  return m;
}

mm::data::MllmRecord record(const std::string& dir, int i, const std::string& answer) {
  mm::data::Image im(28, 28);
  for (size_t k = 0; k < im.rgb.size(); ++k) im.rgb[k] = static_cast<uint8_t>((k * (i + 2) * 37) % 251);
  const std::string path = dir + "/" + std::to_string(i) + ".png";
  mm::data::save_png(im, path);
  mm::data::MllmRecord r;
  r.messages = {{"user", "<image>What is it?"}, {"assistant", answer}};
  r.images = {path};
  r.source = "test:" + std::to_string(i);
  return r;
}

// Byte tokenizer, 28x28 images as one merged token.
mm::data::SampleEncoder encoder_28px() {
  mm::data::SampleEncoderOptions o;
  o.media.min_pixels = 784;
  o.media.max_pixels = 784;
  return mm::data::SampleEncoder(mm::data::byte_chat_tokenizer(), o);
}

}  // namespace

TEST(Eval, ScoresOwnAnswersCorrectAndIsThreadInvariant) {
  const std::string dir = mm::test::fresh_dir("eval_scores");
  auto model = tiny_vl();
  mm::data::SampleEncoder enc = encoder_28px();
  std::vector<mm::data::MllmRecord> recs;
  for (int i = 0; i < 6; ++i) recs.push_back(record(dir, i, "zzz"));
  EvalOptions opt;
  opt.sampling.max_new_tokens = 6;
  opt.threads = 1;
  opt.keep_predictions = -1;
  opt.loss = false;
  EvalReport first = evaluate(*model, enc, recs, opt);
  ASSERT_EQ(first.predictions.size(), 6u);
  EXPECT_EQ(first.vqa, 6);
  EXPECT_EQ(first.vqa_normalized, 0);
  // The model's own answers as references: all correct, exactly so.
  for (int i = 0; i < 6; ++i) recs[i].messages.back().content = first.predictions[i].prediction;
  // Sample 1: VQA-style answers, two of them matching: 2/3 credit. Sample 2: a broken image.
  recs[1].answers = {first.predictions[1].prediction, first.predictions[1].prediction, "other", "another"};
  recs[2].images = {dir + "/missing.png"};
  opt.loss = true;
  EvalReport r1 = evaluate(*model, enc, recs, opt);
  opt.threads = 3;
  EvalReport r3 = evaluate(*model, enc, recs, opt);
  EXPECT_EQ(r1.errors, 1);
  EXPECT_NE(r1.error_messages.at(0).find("missing.png"), std::string::npos) << r1.error_messages.at(0);
  EXPECT_EQ(r1.vqa, 5);
  EXPECT_EQ(r1.vqa_normalized, 5);
  EXPECT_NEAR(r1.vqa_accuracy_sum, 4 + 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(r1.accuracy(), 1.0, 1e-12);
  EXPECT_EQ(r1.to_json().dump(), [&] {
    json j = r3.to_json();
    j["seconds"] = r1.seconds;
    j["samples_per_second"] = r1.to_json()["samples_per_second"];
    return j.dump();
  }());
  // The loss is the training loss: the model's forward + cross-entropy over the answer tokens.
  double sum = 0;
  int64_t count = 0;
  at::NoGradGuard no_grad;
  for (int i : {0, 1, 3, 4, 5}) {
    mm::data::Batch b = mm::data::collate_samples({enc.encode(recs[i])}, {false, 1, enc.pad_id()});
    auto ce = mm::models::lm_cross_entropy_sum(model->forward(b)[mm::models::kLogits], b[mm::data::kLabels]);
    sum += ce.sum.item<double>();
    count += ce.count.item<int64_t>();
  }
  EXPECT_EQ(r1.loss_tokens, count);
  EXPECT_NEAR(r1.loss_sum, sum, 1e-6 * std::abs(sum));
  EXPECT_NE(r1.table().find("vqa normalized match"), std::string::npos);
}

TEST(Eval, MultipleChoiceByLetterAndByOptionText) {
  const std::string dir = mm::test::fresh_dir("eval_choice");
  auto model = tiny_vl();
  mm::data::SampleEncoder enc = encoder_28px();
  std::vector<mm::data::MllmRecord> recs = {record(dir, 0, "B"), record(dir, 1, "x")};
  EvalOptions opt;
  opt.sampling.max_new_tokens = 8;
  opt.loss = false;
  opt.keep_predictions = -1;
  EvalReport probe = evaluate(*model, enc, recs, opt);
  // Make the options so that the model's own answer is option B's text for record 0 and the
  // reference of record 1 names its option by text ("x" is option C).
  const std::string said = probe.predictions[0].prediction;
  recs[0].options = {"qqqq", said.empty() ? "nonempty" : said, "rrrr"};
  recs[1].options = {"a-text", "b-text", "x"};
  EvalReport r = evaluate(*model, enc, recs, opt);
  EXPECT_EQ(r.choice, 2);
  EXPECT_EQ(r.vqa, 0);
  EXPECT_EQ(r.predictions[0].task, "choice");
  // Record 0's reference is the letter B; record 1's names option C by its text.
  const int got0 = parse_choice(r.predictions[0].prediction, recs[0].options);
  const int got1 = parse_choice(r.predictions[1].prediction, recs[1].options);
  EXPECT_EQ(r.predictions[0].correct, got0 == 1) << r.predictions[0].prediction;
  EXPECT_EQ(r.predictions[1].correct, got1 == 2) << r.predictions[1].prediction;
  EXPECT_EQ(r.choice_correct, (got0 == 1) + (got1 == 2));
  EXPECT_EQ(r.choice_unparsed, (got0 < 0) + (got1 < 0));
}

TEST(Eval, PromptSettingsOfAnHFDirectory) {
  const std::string dir = mm::test::fresh_dir("eval_hf_settings");
  auto model = tiny_vl();
  mm::checkpoint::export_hf_directory(dir, model->hf_config(), *model);
  mm::test::write_file(dir + "/preprocessor_config.json",
                       R"({"min_pixels": 784, "max_pixels": 12544, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5]})");
  mm::inference::LoadedModel m = mm::inference::load_model(dir);
  EXPECT_TRUE(m.train_config.empty());
  mm::config::DataConfig d = mm::inference::inference_data_config(m, "", {"data.processor.max_pixels=3136"});
  EXPECT_EQ(d.processor.min_pixels, 784);
  EXPECT_EQ(d.processor.max_pixels, 3136);  // the user's override wins over the file
  EXPECT_EQ(d.processor.image_mean, (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_EQ(d.tokenizer, "byte");  // no tokenizer.json in the directory
  EXPECT_THROW(mm::inference::inference_data_config(m, "", {"training.lr=1"}), mm::Error);
}
