// The flow_matching objective (training/objectives/flow_matching.cpp) and the features dataset
// (data/features.h): the noising and target as Wan defines them, draws that depend only on the
// seed, the step and the sample id (so any batch composition or layout draws the same), the
// shifted training schedule and MindSpeed-MM's Gaussian weights, validation at fixed timesteps
// with per-bucket sums; feature directories written and read back, bucketed by shape; and
// `mm train` of a tiny Wan DiT on features: the loss falls, validation reports per timestep
// bucket, a killed run resumes bitwise, and FSDP and DDP over 2 ranks and recompute equal one process.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <tuple>

#include "metrics_file.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/features.h"
#include "mindspeed_mm/models/wan/wan_dit.h"
#include "mindspeed_mm/training/objectives/objective.h"
#include "run_command.h"

using namespace mm;
using mm::test::run_command;

namespace {

std::unique_ptr<training::Objective> objective(double shift = 5.0, const std::string& weighting = "none",
                                               double text_dropout = 0.0) {
  config::Config cfg;
  cfg.training.flow_matching.shift = shift;
  cfg.training.flow_matching.weighting = weighting;
  cfg.training.flow_matching.text_dropout = text_dropout;
  cfg.training.seed = 11;
  return training::objective_registry().get("flow_matching")(cfg);
}

data::Batch batch(const std::vector<int64_t>& ids) {
  data::Batch b;
  std::vector<at::Tensor> lat;
  for (int64_t id : ids) lat.push_back(at::full({4, 2, 3, 3}, static_cast<double>(id)));
  b.set(data::kLatents, at::stack(lat));
  b.set(data::kPromptEmbeds, at::ones({static_cast<int64_t>(ids.size()), 3, 8}));
  b.set(data::kSampleIds, at::tensor(ids, at::kLong), true);
  return b;
}

// Four classes: a class's latents are its own pattern plus a little noise; its text features a
// one-hot row. A conditional model can learn them; an unconditional one only their mean.
std::vector<data::FeatureSample> toy_features(int n, uint64_t seed) {
  at::manual_seed(seed);
  const at::Tensor patterns = at::randn({4, 4, 2, 4, 4});
  std::vector<data::FeatureSample> out;
  for (int i = 0; i < n; ++i) {
    const int c = i % 4;
    data::FeatureSample s;
    s.latents = patterns[c] + 0.05 * at::randn({4, 2, 4, 4});
    s.prompt_embeds = at::zeros({3, 16});
    s.prompt_embeds[0][c] = 1.0;
    s.prompt_embeds[1][4 + c] = 1.0;
    s.caption = "class " + std::to_string(c);
    out.push_back(s);
  }
  return out;
}

std::string train_config(const std::string& dir, const std::string& features) {
  mm::test::write_file(dir + "/cfg.yaml",
                       "data:\n  dataset: features\n  paths: [" + features + "]\n  val_fraction: 0.15\n"
                       "model:\n  id: wan_dit\n  config:\n    num_attention_heads: 2\n    attention_head_dim: 12\n"
                       "    in_channels: 4\n    out_channels: 4\n    text_dim: 16\n    freq_dim: 16\n    ffn_dim: 48\n"
                       "    num_layers: 2\n    rope_max_seq_len: 16\n"
                       "training:\n  train_iters: 60\n  micro_batch_size: 4\n  optimizer: {lr: 0.005}\n"
                       "  lr_schedule: {id: constant}\n  eval_iters: 0\n  eval_interval: 30\n  seed: 3\n"
                       "  flow_matching: {shift: 3.0, weighting: gaussian}\n"
                       "tools:\n  progress: lines\n");
  return dir + "/cfg.yaml";
}

// The `steps` training losses and the validation losses of run `metrics` within 1e-5 relative
// of those of `reference`.
void expect_same_losses(const std::string& reference, const std::string& metrics, const std::string& name,
                        int64_t steps = 10) {
  const auto a = mm::test::metrics_losses(reference), b = mm::test::metrics_losses(metrics);
  ASSERT_EQ(b.size(), static_cast<size_t>(steps)) << name;
  double worst = 0;
  for (int64_t it = 1; it <= steps; ++it) {
    EXPECT_NEAR(b.at(it), a.at(it), 1e-5 * std::abs(a.at(it))) << name << " iteration " << it;
    worst = std::max(worst, std::abs(b.at(it) - a.at(it)) / std::abs(a.at(it)));
  }
  const auto va = mm::test::metrics_val_losses(reference), vb = mm::test::metrics_val_losses(metrics);
  ASSERT_EQ(va.size(), vb.size()) << name;
  for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(vb[i], va[i], 1e-5 * std::abs(va[i])) << name;
  std::printf("flow matching, %s: max relative loss difference over %lld steps %.2e\n", name.c_str(),
              static_cast<long long>(steps), worst);
}

}  // namespace

TEST(FlowMatching, NoisesTowardTheTargetVelocity) {
  auto obj = objective();
  data::Batch b = batch({5, 9, 2});
  obj->prepare(b, 7);
  const at::Tensor x0 = b[data::kLatents], t = b[data::kTimesteps], z = b[data::kFlowTarget] + x0;
  ASSERT_EQ(t.sizes(), (std::vector<int64_t>{3}));
  const at::Tensor s = (t / 1000).view({3, 1, 1, 1, 1});
  EXPECT_TRUE(at::allclose(b[data::kNoisyLatents], (1 - s) * x0 + s * z, 1e-6, 1e-6));
  EXPECT_NEAR(z.std().item<double>(), 1.0, 0.25);  // standard normal noise
  // Each timestep is 1000 shift(1 - k / 1000) for an integer k.
  for (int64_t i = 0; i < 3; ++i) {
    const double sp = t[i].item<double>() / 1000, sigma = sp / (5 - 4 * sp);  // the inverse shift
    EXPECT_NEAR(sigma * 1000, std::round(sigma * 1000), 2e-3) << sp;
  }
  // The loss of a prediction equal to the target is 0; of zeros, the mean square of the target.
  models::Outputs out;
  out.set(models::kPrediction, b[data::kFlowTarget]);
  EXPECT_EQ(obj->loss_sum(out, b).item<double>(), 0.0);
  out.set(models::kPrediction, at::zeros_like(x0));
  const at::Tensor target = b[data::kFlowTarget];
  EXPECT_NEAR(obj->loss_sum(out, b).item<double>(), target.pow(2).flatten(1).mean(1).sum().item<double>(), 1e-4);
  EXPECT_EQ(obj->count(b), 3.0);
}

TEST(FlowMatching, DrawsDependOnlyOnSeedStepAndSample) {
  auto obj = objective();
  data::Batch a = batch({5, 9, 2}), b = batch({2, 1}), c = batch({2});
  obj->prepare(a, 7);
  obj->prepare(b, 7);
  obj->prepare(c, 8);
  // Sample 2 draws the same in another batch at the same step, and other draws at another step.
  EXPECT_TRUE(a[data::kNoisyLatents][2].equal(b[data::kNoisyLatents][0]));
  EXPECT_EQ(a[data::kTimesteps][2].item<float>(), b[data::kTimesteps][0].item<float>());
  EXPECT_FALSE(a[data::kNoisyLatents][2].equal(c[data::kNoisyLatents][0]));
  const at::Tensor noise = a[data::kFlowTarget] + a[data::kLatents];
  EXPECT_FALSE(noise[0].equal(noise[1]));  // samples draw apart
}

TEST(FlowMatching, ValidationUsesFixedTimestepsPerBucket) {
  auto obj = objective();
  data::Batch a = batch({5, 9}), b = batch({5, 9});
  obj->prepare(a, training::Objective::kValidationStep);
  obj->prepare(b, training::Objective::kValidationStep);
  EXPECT_TRUE(a[data::kNoisyLatents].equal(b[data::kNoisyLatents]));  // fixed noise
  EXPECT_TRUE(a[data::kTimesteps].equal(at::tensor({125.f, 375.f, 625.f, 875.f, 125.f, 375.f, 625.f, 875.f})));
  EXPECT_EQ(a[data::kPromptEmbeds].size(0), 8);
  EXPECT_TRUE(a[data::kSampleIds].equal(at::tensor({5, 5, 5, 5, 9, 9, 9, 9}, at::kLong)));
  models::Outputs out;
  out.set(models::kPrediction, at::zeros({8, 4, 2, 3, 3}));
  const training::EvalSums s = obj->eval_sums(out, a);
  EXPECT_EQ(s.count.item<double>(), 8.0);
  ASSERT_EQ(s.parts.numel(), 8);
  EXPECT_NEAR(s.parts.narrow(0, 0, 4).sum().item<double>(), s.sum.item<double>(), 1e-9);
  EXPECT_TRUE(s.parts.narrow(0, 4, 4).equal(at::full({4}, 2.0, at::kDouble)));
  training::Report r = obj->eval_parts({1, 2, 3, 4, 2, 2, 2, 2});
  EXPECT_EQ(r.text, "by timestep [0,250) 0.5000, [250,500) 1.0000, [500,750) 1.5000, [750,1000) 2.0000");
  EXPECT_EQ(r.record["val_loss_t750_1000"], 2.0);
}

TEST(FlowMatching, GaussianWeightsPeakMidwayAndAverageOne) {
  // Uniform draws over the table: the mean weight is 1; early (noisy) and late timesteps weigh
  // less than those near t = 500.
  auto obj = objective(1.0, "gaussian");
  double sum = 0, near = 0, far = 0;
  int n_near = 0, n_far = 0;
  for (int64_t step = 0; step < 400; ++step) {
    data::Batch b = batch({step});
    obj->prepare(b, step);
    models::Outputs out;
    out.set(models::kPrediction, b[data::kFlowTarget] + 1);  // per-sample MSE exactly 1: the loss is the weight
    const double w = obj->loss_sum(out, b).item<double>();
    const double t = b[data::kTimesteps][0].item<double>();
    sum += w;
    if (std::abs(t - 500) < 100) near += w, ++n_near;
    if (std::abs(t - 500) > 400) far += w, ++n_far;
  }
  EXPECT_NEAR(sum / 400, 1.0, 0.06);
  EXPECT_GT(near / n_near, 1.2);
  EXPECT_LT(far / n_far, 0.4);
}

TEST(FlowMatching, TextDropoutUsesTheEmptyPromptsFeatures) {
  auto obj = objective(5.0, "none", 1.0);
  data::Batch b = batch({1, 2});
  b.set(data::kNullPromptEmbeds, at::full({1, 3, 8}, 7.0));
  obj->prepare(b, 0);
  EXPECT_TRUE(b[data::kPromptEmbeds].equal(at::full({2, 3, 8}, 7.0)));
  data::Batch z = batch({1, 2});  // no null features: zeros
  obj->prepare(z, 0);
  EXPECT_EQ(z[data::kPromptEmbeds].abs().sum().item<double>(), 0.0);
}

TEST(Features, WrittenShardsReadBackByShape) {
  const std::string dir = mm::test::fresh_dir("features_rw");
  auto samples = toy_features(10, 1);
  samples[3].latents = at::randn({4, 1, 4, 4});  // another frame count: its own bucket
  samples[7].prompt_embeds = at::randn({5, 16});  // a longer text: padded in its batch
  data::write_features(dir + "/f", samples, at::full({2, 16}, 0.5), /*max_shard_bytes=*/2000);
  EXPECT_THROW(data::write_features(dir + "/f", samples), mm::Error);  // never over finished features
  config::DataConfig c;
  c.dataset = "features";
  c.paths = {dir + "/f"};
  c.val_fraction = 0;
  data::DataContext ctx;
  ctx.micro_batch_size = 4;
  data::TrainData d = data::make_features_data(c, ctx);
  EXPECT_FALSE(d.val);
  std::multiset<int64_t> seen;
  for (int k = 0; k < 4; ++k) {  // 4 same-shape batches make an epoch: 4 + 4 + 1 of one shape, 1 of the other
    data::Batch b = d.train->next();
    const at::Tensor ids = b[data::kSampleIds];
    for (int64_t i = 0; i < ids.numel(); ++i) {
      const int64_t id = ids[i].item<int64_t>();
      seen.insert(id);
      EXPECT_TRUE(b[data::kLatents][i].equal(samples[static_cast<size_t>(id)].latents)) << id;
      const at::Tensor text = samples[static_cast<size_t>(id)].prompt_embeds;
      EXPECT_TRUE(b[data::kPromptEmbeds][i].narrow(0, 0, text.size(0)).equal(text)) << id;
    }
    EXPECT_EQ(b[data::kNullPromptEmbeds].size(1), b[data::kPromptEmbeds].size(1));
    if (ids.numel() == 1 && ids[0].item<int64_t>() == 3) EXPECT_EQ(b[data::kLatents].size(2), 1);
  }
  EXPECT_EQ(seen.size(), 10u);  // every sample once

  // A directory that is not features, and a sample missing from the index, are clear errors.
  c.paths = {dir};
  EXPECT_THROW(data::make_features_data(c, ctx), mm::Error);
  std::string index = mm::test::read_file(dir + "/f/features.safetensors.index.json");
  index.replace(index.find("\"latents.9\""), 11, "\"latentz.9\"");
  mm::test::write_file(dir + "/f/features.safetensors.index.json", index);
  c.paths = {dir + "/f"};
  try {
    data::make_features_data(c, ctx);
    ADD_FAILURE() << "a missing sample accepted";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 9 has no tensor latents.9"), std::string::npos) << e.what();
  }
}

TEST(FlowMatchingTrain, TinyWanDiTLearnsAndResumesBitwise) {
  const std::string dir = mm::test::fresh_dir("flow_train");
  data::write_features(dir + "/features", toy_features(64, 2));
  const std::string cfg = train_config(dir, dir + "/features");
  const std::string mm = mm::test::mm_binary();
  auto a = run_command(mm + " train " + cfg + " training.save_dir=" + dir + "/a training.save_interval=10");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("validation before training: loss"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("by timestep [0,250)"), std::string::npos) << a.output;
  auto losses = mm::test::metrics_losses(dir + "/a/metrics.jsonl");
  auto val = mm::test::metrics_val_losses(dir + "/a/metrics.jsonl");
  ASSERT_EQ(losses.size(), 60u);
  ASSERT_GE(val.size(), 2u);
  // Validation at fixed timesteps and noise falls from the zero head's 1 + E|x0|^2 (measured
  // 2.01 -> 1.69 in 60 steps).
  EXPECT_LT(val.back(), 0.9 * val.front()) << a.output;
  std::printf("tiny wan_dit: validation loss %.4f -> %.4f\n", val.front(), val.back());

  // Killed as iteration 14 begins, resumed from iteration 10: the same losses bitwise.
  auto k = run_command("MM_DEBUG_KILL_AT_ITER=14 " + mm + " train " + cfg + " training.save_dir=" + dir +
                       "/b training.save_interval=10");
  ASSERT_EQ(k.exit_code, 137) << k.output;
  auto r = run_command(mm + " train " + cfg + " training.save_dir=" + dir + "/b training.save_interval=10 training.resume=auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto resumed = mm::test::metrics_losses(dir + "/b/metrics.jsonl");
  ASSERT_EQ(resumed.size(), 60u);
  for (int64_t it = 1; it <= 60; ++it) EXPECT_EQ(losses[it], resumed[it]) << "iteration " << it;
}

TEST(FlowMatchingTrain, FsdpDdpAndRecomputeEqualOneProcess) {
  const std::string dir = mm::test::fresh_dir("flow_ddp");
  data::write_features(dir + "/features", toy_features(64, 3));
  const std::string cfg = train_config(dir, dir + "/features");
  const std::string mm = mm::test::mm_binary();
  const std::string common = " training.train_iters=10 training.eval_interval=0 ";
  auto one = run_command(mm + " train " + cfg + common + "training.micro_batch_size=4 training.metrics_file=" + dir + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(mm::test::metrics_losses(dir + "/one.jsonl").size(), 10u);
  const std::pair<std::string, std::string> layouts[] = {
      {"FSDP2 (blocks.{*} by the model's plan)", mm::test::mm_launch(2) + mm + " train " + cfg + " training.micro_batch_size=2"},
      {"DDP2", mm::test::mm_launch(2) + mm + " train " + cfg + " training.micro_batch_size=2 "
               "parallel.data_parallel_replicate_size=2 parallel.data_parallel_shard_size=1"},
      {"recompute blocks.{*}", mm + " train " + cfg + " training.micro_batch_size=4 'features.recompute=[blocks.{*}]'"},
  };
  for (const auto& [name, cmd] : layouts) {
    const std::string metrics = dir + "/run" + std::to_string(&name - &layouts[0].first) + ".jsonl";
    auto r = run_command(cmd + common + "training.metrics_file=" + metrics);
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    expect_same_losses(dir + "/one.jsonl", metrics, name);
  }
}

// The DiT under the model's tensor-parallel plan (heads split, q/k RMSNorm across the split
// heads, MLP split) and pipeline parallelism (the blocks over stages, the text features and
// modulation carried between them), alone and together: the same losses as one process.
TEST(FlowMatchingTrain, TensorAndPipelineParallelEqualOneProcess) {
  const std::string dir = mm::test::fresh_dir("flow_tp_pp");
  data::write_features(dir + "/features", toy_features(64, 3));
  const std::string cfg = train_config(dir, dir + "/features");
  const std::string mm = mm::test::mm_binary();
  const std::string common = " training.train_iters=10 training.eval_interval=5 training.micro_batch_size=2 "
                             "training.gradient_accumulation_steps=2 ";
  auto one = run_command(mm + " train " + cfg + common + "training.metrics_file=" + dir + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(mm::test::metrics_losses(dir + "/one.jsonl").size(), 10u);
  const std::tuple<std::string, int, std::string> layouts[] = {
      {"TP2", 2, "parallel.tensor_parallel_size=2"},
      {"PP2", 2, "parallel.pipeline_parallel_size=2"},
      {"TP2xPP2", 4, "parallel.tensor_parallel_size=2 parallel.pipeline_parallel_size=2"},
  };
  for (const auto& [name, ranks, overrides] : layouts) {
    const std::string metrics = dir + "/" + name + ".jsonl";
    auto r = run_command(mm::test::mm_launch(ranks) + mm + " train " + cfg + common + overrides +
                         " training.metrics_file=" + metrics);
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    expect_same_losses(dir + "/one.jsonl", metrics, name);
  }
}

// The DiT under context parallelism: the patches cut among the ranks between the first and the
// last block (padded to the layout's multiple, the padding a sample of its own that no real
// patch attends to), the self-attention over all of them by Ulysses, a ring (3 ranks: 8 patches
// padded to 12), both, and with FSDP, tensor or pipeline parallelism beside; the cross-attention's text
// whole on every rank. The same losses as one process over 20 steps.
TEST(FlowMatchingTrain, ContextParallelEqualsOneProcess) {
  const std::string dir = mm::test::fresh_dir("flow_cp");
  data::write_features(dir + "/features", toy_features(64, 3));
  const std::string cfg = train_config(dir, dir + "/features");
  const std::string mm = mm::test::mm_binary();
  const std::string common = " training.train_iters=20 training.eval_interval=10 training.micro_batch_size=4 ";
  auto one = run_command(mm + " train " + cfg + common + "training.metrics_file=" + dir + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(mm::test::metrics_losses(dir + "/one.jsonl").size(), 20u);
  const std::tuple<std::string, int, std::string> layouts[] = {
      {"Ulysses2", 2, "parallel.context_parallel_size=2"},
      {"Ring2", 2, "parallel.context_parallel_size=2 parallel.context_parallel_algo=ring"},
      {"Ring3", 3, "parallel.context_parallel_size=3 parallel.context_parallel_algo=ring"},
      {"Hybrid2x2", 4, "parallel.context_parallel_size=4 parallel.context_parallel_algo=hybrid parallel.ulysses_degree_in_cp=2"},
      {"Ulysses2xFSDP2", 4, "parallel.context_parallel_size=2 training.micro_batch_size=2"},
      {"Ring2xTP2", 4, "parallel.context_parallel_size=2 parallel.context_parallel_algo=ring parallel.tensor_parallel_size=2"},
      {"Ulysses2xPP2", 4, "parallel.context_parallel_size=2 parallel.pipeline_parallel_size=2"},
  };
  for (const auto& [name, ranks, overrides] : layouts) {
    const std::string metrics = dir + "/" + name + ".jsonl";
    auto r = run_command(mm::test::mm_launch(ranks) + mm + " train " + cfg + common + overrides +
                         " training.metrics_file=" + metrics);
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    EXPECT_NE(r.output.find("cut inside the model"), std::string::npos) << r.output;
    expect_same_losses(dir + "/one.jsonl", metrics, name, 20);
  }
}
