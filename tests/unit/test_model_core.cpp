// The core every model family shares: batches as named tensors, model parts (counted, frozen
// and loaded from their own directories), objectives and datasets added by registration alone
// (this file registers one of each), and train_step's gradient accumulation.
#include <gtest/gtest.h>

#include <cmath>

#include "config_error.h"
#include "corpora.h"
#include "metrics_file.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/training/model_builder.h"
#include "mindspeed_mm/training/objectives/objective.h"
#include "mindspeed_mm/training/train_step.h"
#include "mindspeed_mm/training/trainer.h"
#include "run_command.h"

namespace {

using mm::data::Batch;
using mm::test::config_error;
using nlohmann::json;
namespace data = mm::data;
namespace training = mm::training;

// An objective defined here, registered like the built-in ones: the mean squared logit over
// every input token. Its optimum (all logits 0) is reachable, so training must drive it down;
// it reads no labels, so it trains on data without any.
class SquaredLogits : public training::Objective {
 public:
  std::vector<std::string> required_fields() const override { return {}; }
  std::string normalised_by() const override { return "tokens"; }
  double count(const Batch& host) const override {
    return static_cast<double>(host.require(data::kInputIds).numel());
  }
  at::Tensor loss_sum(const mm::models::Outputs& out, const Batch&) const override {
    return out[mm::models::kLogits].to(at::kFloat).pow(2).mean(-1).sum();
  }
  training::EvalSums eval_sums(const mm::models::Outputs& out, const Batch& b) const override {
    return {loss_sum(out, b), at::scalar_tensor(static_cast<double>(b[data::kInputIds].numel()), at::kDouble)};
  }
  std::string describe(double loss) const override { return mm::cat("mean squared logit ", loss); }
};
mm::Registrar squared_logits(training::objective_registry(), "test_squared_logits",
                             [](const mm::config::Config&) -> std::unique_ptr<training::Objective> {
                               return std::make_unique<SquaredLogits>();
                             });

// A dataset defined here, without a vocabulary or labels: rows of 8 ids below 16.
class RowStream : public data::BatchStream {
 public:
  explicit RowStream(int64_t batch) : batch_(batch) {}
  Batch next() override {
    Batch b;
    b.num_samples = batch_;
    b.set(data::kInputIds, (at::arange(batch_ * 8, at::kLong).view({batch_, 8}) * 7 + n_++) % 16);
    return b;
  }
  json state() const override { return {{"n", n_}}; }
  void load_state(const json& s) override { n_ = s.at("n").get<int64_t>(); }

 private:
  int64_t batch_, n_ = 0;
};
mm::Registrar unlabelled(data::dataset_registry(), "test_unlabelled",
                         [](const mm::config::DataConfig&, const data::DataContext& ctx) {
                           data::TrainData d;
                           d.train = std::make_unique<RowStream>(ctx.micro_batch_size);
                           d.fields = {std::string(data::kInputIds)};
                           return d;
                         });

json tiny_qwen2(bool tied) {
  return {{"vocab_size", 263},       {"hidden_size", 32},        {"intermediate_size", 64},
          {"num_hidden_layers", 2},  {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"rope_theta", 10000.0},   {"tie_word_embeddings", tied}};
}

json tiny_qwen2_vl() {
  json j = tiny_qwen2(true);
  j.update(json::parse(R"({
    "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
    "image_token_id": 261, "video_token_id": 262, "vision_start_token_id": 259, "vision_end_token_id": 260,
    "vision_config": {"depth": 1, "embed_dim": 16, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14}
  })"));
  return j;
}

}  // namespace

TEST(ModelCore, BatchIsNamedTensors) {
  Batch b;
  b.sources = {"train.jsonl:3"};
  b.set(data::kInputIds, at::ones({2, 3}, at::kLong));
  b.set(data::kImageGridThw, at::tensor(std::vector<int64_t>{1, 2, 2}).view({1, 3}), /*host=*/true);
  EXPECT_TRUE(b.has(data::kInputIds));
  EXPECT_FALSE(b[data::kLabels].defined());
  EXPECT_EQ(b.names(), (std::vector<std::string>{"input_ids", "image_grid_thw"}));
  try {
    b.require(data::kLabels);
    FAIL() << "require of a missing field";
  } catch (const mm::Error& e) {
    EXPECT_EQ(std::string(e.what()), "batch of train.jsonl:3 has no field 'labels' (it has: input_ids, image_grid_thw)");
  }
  const Batch d = data::batch_to_device(b, at::kCPU);
  ASSERT_EQ(d.fields().size(), 2u);
  EXPECT_TRUE(d.fields()[1].host);
  EXPECT_EQ(d[data::kInputIds].data_ptr(), b[data::kInputIds].data_ptr());  // the CPU needs no copy
  b.set(data::kInputIds, at::Tensor());
  EXPECT_FALSE(b.has(data::kInputIds));
  EXPECT_EQ(data::missing_fields({"input_ids", "labels", "pixel_values"}, {"labels"}), "input_ids, pixel_values");
}

// A Qwen2 language model saved as an HF directory becomes the language_model part of a Qwen2-VL
// (model.parts), frozen, while the vision tower keeps its own initialisation and trains.
TEST(ModelCore, PartsCountFreezeAndLoadTheirOwnWeights) {
  const std::string dir = mm::test::fresh_dir("model_core_parts");
  auto text = mm::models::model_registry().get("qwen2")(tiny_qwen2(true), "test", true);
  text->init_weights(5);
  mm::checkpoint::export_hf_directory(dir + "/qwen2", text->hf_config(), *text);

  mm::config::ModelConfig mc;
  mc.id = "qwen2_vl";
  mc.config = tiny_qwen2_vl();
  auto plain = training::build_model(mc, 0, 9);
  mc.parts = {{"language_model", {{"pretrained", dir + "/qwen2"}, {"trainable", false}}}};
  auto vl = training::build_model(mc, 0, 9);

  const auto counts = mm::models::parameters_by_part(*vl);
  ASSERT_EQ(counts.size(), 3u);
  int64_t sum = 0;
  for (const auto& [name, n] : counts) {
    EXPECT_GT(n, 0) << name;
    sum += n;
  }
  EXPECT_EQ(sum, vl->num_parameters());
  EXPECT_EQ(counts[2].first, "language_model");
  EXPECT_EQ(counts[2].second, text->num_parameters());

  std::map<std::string, at::Tensor> lm;
  for (auto& [name, p] : text->named_parameters()) lm[name] = p;
  const auto plain_params = plain->named_parameters(), vl_params = vl->named_parameters();
  ASSERT_EQ(plain_params.size(), vl_params.size());
  int64_t loaded = 0, initialised = 0;
  for (size_t i = 0; i < plain_params.size(); ++i) {
    const auto& [name, p] = vl_params[i];
    if (lm.count(name)) {
      EXPECT_TRUE(at::equal(p, lm[name])) << name;
      ++loaded;
    } else {
      EXPECT_TRUE(at::equal(p, plain_params[i].second)) << name;  // the seed's values, untouched
      ++initialised;
    }
  }
  EXPECT_EQ(loaded, static_cast<int64_t>(lm.size()));
  EXPECT_GT(initialised, 0);

  EXPECT_EQ(training::freeze_parts(*vl, mc), loaded);
  for (auto& [name, p] : vl->named_parameters()) EXPECT_EQ(p.requires_grad(), name.rfind("visual.", 0) == 0) << name;

  mc.parts = {{"decoder", dir + "/qwen2"}};
  EXPECT_NE(config_error([&] { training::build_model(mc, 0, 9); })
                .find("model.parts.decoder: model qwen2_vl has no part 'decoder' (its parts: vision_tower, projector, "
                      "language_model)"),
            std::string::npos);
  mc.parts = {{"language_model", 3}};
  EXPECT_NE(config_error([&] { training::build_model(mc, 0, 9); }).find("model.parts.language_model must be"),
            std::string::npos);
  // A part directory that does not fit names the offending tensors.
  mc.parts = {{"vision_tower", dir + "/qwen2"}};
  try {
    training::build_model(mc, 0, 9);
    FAIL() << "a language model as the vision tower";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit the model: missing visual."), std::string::npos) << e.what();
  }
}

// Gradient accumulation: two micro-batches of two rows give the update of one micro-batch of
// the four rows, because the loss is divided by the step's whole token count, not per micro-batch.
TEST(ModelCore, TrainStepAccumulationEqualsOneBatch) {
  mm::config::Config cfg;
  training::TrainParallel par(cfg.parallel, mm::parallel::DistEnv{});
  auto make = [&] {
    auto m = mm::models::model_registry().get("qwen2")(tiny_qwen2(false), "test", true);
    m->init_weights(3);
    return m;
  };
  auto a = make(), b = make();
  training::DataParallelModel dpa(*a, par, cfg.parallel), dpb(*b, par, cfg.parallel);
  auto objective = training::make_objective(cfg, *a);
  training::AdamW opta(dpa.param_groups({}), 0.9, 0.95, 1e-8, 0.1), optb(dpb.param_groups({}), 0.9, 0.95, 1e-8, 0.1);
  training::StepEnv ea{*a, *objective, dpa, opta, par, false, 1.0}, eb{*b, *objective, dpb, optb, par, false, 1.0};

  at::Tensor ids = at::randint(263, {4, 12}, at::kLong);
  at::Tensor labels = at::randint(263, {4, 12}, at::kLong);
  labels.narrow(1, 0, 9)[0].fill_(-100);  // unequal token counts per row
  labels.narrow(1, 0, 2)[3].fill_(-100);
  auto batch = [&](int64_t row, int64_t rows) {
    Batch x;
    x.num_samples = rows;
    x.set(data::kInputIds, ids.narrow(0, row, rows));
    x.set(data::kLabels, labels.narrow(0, row, rows));
    return training::MicroBatch{x, x};
  };
  // The gradients as the update sees them (after the step's backward passes and clipping).
  std::vector<at::Tensor> ga, gb;
  ea.before_update = [&] {
    for (auto& p : a->parameters()) ga.push_back(p.grad().clone());
  };
  eb.before_update = [&] {
    for (auto& p : b->parameters()) gb.push_back(p.grad().clone());
  };
  const auto ra = training::train_step(ea, {batch(0, 2), batch(2, 2)}, 1e-2, 0);
  const auto rb = training::train_step(eb, {batch(0, 4)}, 1e-2, 0);
  EXPECT_EQ(ra.normaliser, 4 * 12 - 9 - 2);
  EXPECT_EQ(ra.normaliser, rb.normaliser);
  EXPECT_EQ(ra.input_tokens, 48);
  EXPECT_NEAR(ra.loss, rb.loss, 1e-6);
  EXPECT_GT(ra.loss, 5.0);  // about ln(263) = 5.57 before any training
  EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-5 * rb.grad_norm);
  ASSERT_EQ(ga.size(), gb.size());
  double max_diff = 0, max_grad = 0;
  for (size_t i = 0; i < ga.size(); ++i) {
    max_diff = std::max(max_diff, (ga[i] - gb[i]).abs().max().item<double>());
    max_grad = std::max(max_grad, gb[i].abs().max().item<double>());
  }
  EXPECT_LT(max_diff, 1e-5 * max_grad);
  EXPECT_GT(max_grad, 1e-3);
  EXPECT_GT((a->parameters()[0] - make()->parameters()[0]).abs().max().item<double>(), 1e-3);  // the step did update
}

// `mm train` with an objective and a dataset that are registrations in this file: the objective
// goes down and validation uses it; on the dataset without vocabulary or labels it trains too,
// and the built-in objective, which needs labels, is refused before any step.
TEST(ModelCore, ObjectiveAndDatasetAreRegistrations) {
  const std::string dir = mm::test::fresh_dir("model_core_objective");
  mm::test::write_file(dir + "/corpus.txt", mm::test::make_corpus(3));
  auto cfg = mm::config::parse_config(
      "data: {paths: [" + dir + "/corpus.txt], format: text, seq_len: 16, val_fraction: 0.1}\n"
      "model: {id: qwen2, config: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, "
      "num_attention_heads: 4, num_key_value_heads: 2}}\n"
      "training: {train_iters: 12, micro_batch_size: 4, objective: test_squared_logits, eval_iters: 2, "
      "optimizer: {lr: 0.01}, metrics_file: " + dir + "/m.jsonl}\n"
      "tools: {progress: lines}\n",
      "objective.yaml", {});
  const training::TrainSummary s = training::train(cfg);
  const auto losses = mm::test::metrics_losses(dir + "/m.jsonl");
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.at(12), 0.3 * losses.at(1)) << losses.at(1) << " -> " << losses.at(12);
  EXPECT_LT(s.val_loss_after, 0.3 * s.val_loss_before);

  auto unlabelled_cfg = mm::config::parse_config(
      "data: {dataset: test_unlabelled}\n"
      "model: {id: qwen2, config: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, "
      "num_attention_heads: 4, num_key_value_heads: 2}}\n"
      "training: {train_iters: 3, micro_batch_size: 2, objective: test_squared_logits}\n"
      "tools: {progress: lines}\n",
      "unlabelled.yaml", {});
  EXPECT_EQ(training::train(unlabelled_cfg).iterations, 3);
  unlabelled_cfg.training.objective = "auto";  // causal_lm: next-token labels
  EXPECT_EQ(config_error([&] { training::train(unlabelled_cfg); }),
            "config: data.dataset test_unlabelled produces no labels (model qwen2 with objective causal_lm needs it)");
  unlabelled_cfg.training.objective = "ctc";
  EXPECT_NE(config_error([&] { training::train(unlabelled_cfg); })
                .find("training.objective: unknown objective id 'ctc' (known: causal_lm, flow_matching, test_squared_logits, vae)"),
            std::string::npos);
}
