// Qwen2-VL composition (mindspeed_mm/models/qwen2vl/qwen2vl.h): text-only logits equal the Qwen2
// decoder's bit for bit (M-RoPE with equal t/h/w positions is 1-D RoPE); vision features enter
// exactly at the pad tokens (tokens before an image do not change when its pixels do); packed
// multimodal samples give the same per-sample losses as each sample alone; config round trip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/data/mllm/mllm_collator.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/sample_encoder.h"
#include "mindspeed_mm/data/tokenizer/byte_chat_tokenizer.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"
#include "mindspeed_mm/training/context_parallel.h"
#include "mindspeed_mm/training/optimizer.h"
#include "mindspeed_mm/training/plans.h"
#include "hf_model_dir.h"
#include "run_command.h"

using namespace mm::models;
using nlohmann::json;

namespace {

// The byte chat tokenizer's ids: <|vision_start|> 259, <|vision_end|> 260, <|image_pad|> 261.
json tiny_config() {
  return json::parse(R"({
    "vocab_size": 263, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
    "image_token_id": 261, "video_token_id": 262, "vision_start_token_id": 259, "vision_end_token_id": 260,
    "vision_config": {"depth": 1, "embed_dim": 16, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14}
  })");
}

std::shared_ptr<Qwen2VLForConditionalGeneration> tiny_model() {
  auto m = std::make_shared<Qwen2VLForConditionalGeneration>(Qwen2VLConfig::from_json(tiny_config(), "test", false));
  m->init_weights(5);
  return m;
}

// Three conversations, each with an image of its own size (28 x 56 .. 84 x 56), encoded as the
// loader would.
mm::data::SampleEncoder image_sample_encoder() {
  mm::data::SampleEncoderOptions o;
  o.media.min_pixels = 28 * 28;
  o.media.max_pixels = 56 * 112;
  return mm::data::SampleEncoder(mm::data::byte_chat_tokenizer(), o);
}

std::vector<mm::data::EncodedSample> three_image_samples(const std::string& dir, mm::data::SampleEncoder& enc) {
  std::string jsonl;
  for (int i = 0; i < 3; ++i) {
    mm::data::Image im(28 * (i + 1), 56);
    for (size_t k = 0; k < im.rgb.size(); ++k) im.rgb[k] = static_cast<uint8_t>((k * (i + 3)) % 251);
    mm::data::save_png(im, dir + "/" + std::to_string(i) + ".png");
    jsonl += R"({"messages":[{"role":"user","content":"<image>What is it? )" + std::string(i, 'x') +
             R"("},{"role":"assistant","content":"thing )" + std::to_string(i) + R"("}],"images":[")" +
             std::to_string(i) + ".png\"]}\n";
  }
  std::ofstream(dir + "/d.jsonl") << jsonl;
  auto records = mm::data::read_mllm_file(dir + "/d.jsonl").records;
  EXPECT_EQ(records.size(), 3u);
  std::vector<mm::data::EncodedSample> samples;
  for (auto& r : records) samples.push_back(enc.encode(r));
  return samples;
}

}  // namespace

TEST(Qwen2VL, TextOnlyLogitsEqualTheQwen2Decoder) {
  auto vl = tiny_model();
  Qwen2ForCausalLM lm(vl->vl_config.text);
  at::NoGradGuard no_grad;
  auto theirs = vl->named_parameters();
  std::map<std::string, at::Tensor> by_name(theirs.begin(), theirs.end());
  for (auto& [name, p] : lm.named_parameters()) p.copy_(by_name.at(name));
  at::Tensor ids = at::randint(0, 256, {2, 11}, at::kLong);
  MultimodalInputs in;
  in.input_ids = ids;
  EXPECT_TRUE(at::equal(vl->forward_multimodal(in), lm.forward(ids)));
}

TEST(Qwen2VL, VisionFeaturesReplaceThePadTokens) {
  auto vl = tiny_model();
  at::NoGradGuard no_grad;
  // T T VS IMG x4 VE T T: grid (1, 4, 4) merges to 4 pads.
  at::Tensor ids = at::tensor(std::vector<int64_t>{'a', 'b', 259, 261, 261, 261, 261, 260, 'c', 'd'}, at::kLong).unsqueeze(0);
  MultimodalInputs in;
  in.input_ids = ids;
  in.image_grid_thw = at::tensor(std::vector<int64_t>{1, 4, 4}, at::kLong).view({1, 3});
  in.pixel_values = at::randn({16, 3 * 2 * 14 * 14});
  at::Tensor a = vl->forward_multimodal(in);
  in.pixel_values = in.pixel_values + 0.5;
  at::Tensor b = vl->forward_multimodal(in);
  EXPECT_TRUE(at::equal(a.narrow(1, 0, 3), b.narrow(1, 0, 3)));  // causal: text before the image
  EXPECT_FALSE(at::equal(a.narrow(1, 3, 7), b.narrow(1, 3, 7)));
  in.image_grid_thw = at::tensor(std::vector<int64_t>{1, 2, 4}, at::kLong).view({1, 3});  // 2 features for 4 pads
  in.pixel_values = at::randn({8, 3 * 2 * 14 * 14});
  EXPECT_THROW(vl->forward_multimodal(in), mm::Error);
}

TEST(Qwen2VL, PackedSamplesLossEqualsEachAlone) {
  mm::data::SampleEncoder enc = image_sample_encoder();
  const std::vector<mm::data::EncodedSample> samples = three_image_samples(mm::test::fresh_dir("qwen2vl_packed"), enc);

  auto vl = tiny_model();
  at::NoGradGuard no_grad;
  auto run = [&](const mm::data::Batch& b) {
    MultimodalInputs in;
    in.input_ids = b[mm::data::kInputIds];
    in.segment_ids = b[mm::data::kSegmentIds];
    in.attn_mask = b[mm::data::kSegmentIds].defined() ? segment_attention_mask(b[mm::data::kSegmentIds]) : at::Tensor();
    in.pixel_values = b[mm::data::kPixelValues];
    in.image_grid_thw = b[mm::data::kImageGridThw];
    return vl->forward_multimodal(in);
  };
  mm::data::Batch packed = mm::data::collate_samples(samples, {true, 8, enc.pad_id()});
  at::Tensor lp = run(packed);
  double max_diff = 0;
  for (int64_t i = 0; i < 3; ++i) {
    mm::data::Batch alone = mm::data::collate_samples({samples[i]}, {false, 1, enc.pad_id()});
    const double ref = lm_cross_entropy(run(alone), alone[mm::data::kLabels]).item<double>();
    const double got = lm_cross_entropy(lp, packed[mm::data::kLabels].masked_fill(packed[mm::data::kSegmentIds].ne(i), kIgnoreIndex)).item<double>();
    EXPECT_NEAR(got, ref, 1e-5) << "sample " << i;
    EXPECT_GT(ref, 1.0);
    max_diff = std::max(max_diff, std::abs(got - ref));
  }
  std::printf("qwen2_vl packed vs alone: max |loss difference| %.3g\n", max_diff);
}

// Context parallelism hands each rank only its tokens: what needs the whole row (M-RoPE
// positions, the feature row of each pad token) is made from it on the host first
// (PlanTable::context_parallel_prepare) and cut like the tokens; each rank's embeddings with the
// features placed then equal its tokens' rows of the whole row's.
TEST(Qwen2VL, ContextParallelShardsCarryTheWholeRowsPositionsAndFeatureRows) {
  using namespace mm::data;
  SampleEncoder enc = image_sample_encoder();
  const std::vector<EncodedSample> samples = three_image_samples(mm::test::fresh_dir("qwen2vl_cp_shards"), enc);
  auto vl = tiny_model();
  const PlanTable plans = vl->plans();
  ASSERT_TRUE(plans.context_parallel_blocks.empty());  // the batch is cut, not the model
  at::NoGradGuard no_grad;
  for (const bool packed : {false, true}) {
    const Batch host = collate_samples(samples, {packed, 4, enc.pad_id()});
    const Batch prepared = plans.context_parallel_prepare(host);
    const MultimodalInputs whole_in = multimodal_inputs(host, /*attention=*/false);
    const at::Tensor ids = whole_in.input_ids;
    const int64_t S = ids.size(1);
    const at::Tensor positions = vl->mrope_positions(whole_in);
    const at::Tensor features = vl->visual->forward(whole_in.pixel_values, whole_in.image_grid_thw);
    const at::Tensor embeds = place_vision_features(vl->model->embed_tokens->forward(ids), ids,
                                                    vl->vl_config.rope_index.image_token_id, features, "qwen2_vl", "image");
    for (const mm::parallel::CpLayout layout : {mm::parallel::CpLayout{2, 1}, mm::parallel::CpLayout{1, 3}}) {
      const int64_t m = layout.multiple(), padded = (S + m - 1) / m * m;
      for (int r = 0; r < layout.size(); ++r) {
        const std::string what = mm::cat(packed ? "packed" : "padded", " rows, ", layout.ulysses, "x", layout.ring, " rank ", r);
        const Batch shard = mm::training::shard_for_rank(prepared, layout, r, 1, plans.context_parallel_whole);
        const std::vector<int64_t> held = layout.token_indices(padded, r);
        // This rank's real tokens: their places in the whole row (the padding added is beyond S).
        std::vector<int64_t> at_shard, at_whole;
        for (size_t i = 0; i < held.size(); ++i)
          if (held[i] < S) {
            at_shard.push_back(static_cast<int64_t>(i));
            at_whole.push_back(held[i]);
          }
        const at::Tensor a = at::tensor(at_shard, at::kLong), w = at::tensor(at_whole, at::kLong);
        const MultimodalInputs in = multimodal_inputs(shard, /*attention=*/false);
        ASSERT_EQ(in.input_ids.size(1), padded / layout.size()) << what;
        EXPECT_TRUE(at::equal(in.input_ids.index_select(1, a), ids.index_select(1, w))) << what;
        EXPECT_TRUE(at::equal(vl->mrope_positions(in).index_select(2, a), positions.index_select(2, w))) << what;
        EXPECT_TRUE(at::equal(in.pixel_values, whole_in.pixel_values)) << what;  // whole: the tower cuts its own
        const at::Tensor mine = place_vision_features_at(vl->model->embed_tokens->forward(in.input_ids),
                                                         in.image_feature_index, features, "qwen2_vl", "image");
        EXPECT_TRUE(at::equal(mine.index_select(1, a), embeds.index_select(1, w))) << what;
      }
    }
  }
  // Pad tokens the grids do not account for: one line before any rank runs.
  Batch bad = collate_samples(samples, {false, 4, enc.pad_id()});
  bad.set(kImageGridThw, bad[kImageGridThw].narrow(0, 0, 2), /*host=*/true);
  try {
    plans.context_parallel_prepare(bad);
    ADD_FAILURE() << "no error";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("image pad tokens (id 261) but the batch's grids give"), std::string::npos) << e.what();
  }
}

TEST(Qwen2VL, ConfigRoundTripAndErrors) {
  Qwen2VLConfig c = Qwen2VLConfig::from_json(tiny_config(), "test", true);
  EXPECT_EQ(c.vision.hidden_size, 32);  // the merger maps to the text width
  Qwen2VLConfig back = Qwen2VLConfig::from_json(c.to_json(), "test", false);
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(c.to_json()["model_type"], "qwen2_vl");
  json bad = tiny_config();
  bad["rope_scaling"]["mrope_section"] = {1, 1, 1};
  EXPECT_THROW(Qwen2VLConfig::from_json(bad, "test", false), mm::ConfigError);
  bad = tiny_config();
  bad["vision_config"]["hidden_size"] = 48;
  EXPECT_THROW(Qwen2VLConfig::from_json(bad, "test", false), mm::ConfigError);
  EXPECT_TRUE(model_registry().has("qwen2_vl"));
}

TEST(Qwen2VL, HFDirectoryRoundTripInBothNamings) {
  auto vl = tiny_model();
  at::NoGradGuard no_grad;
  MultimodalInputs in;
  in.input_ids = at::tensor(std::vector<int64_t>{'a', 259, 261, 261, 261, 261, 260, 'b'}, at::kLong).unsqueeze(0);
  in.image_grid_thw = at::tensor(std::vector<int64_t>{1, 4, 4}, at::kLong).view({1, 3});
  in.pixel_values = at::randn({16, 3 * 2 * 14 * 14});
  at::Tensor ref = vl->forward_multimodal(in);
  const std::string dir = mm::test::fresh_dir("qwen2vl_hf");
  mm::checkpoint::export_hf_directory(dir + "/old", vl->hf_config(), *vl);
  // The same weights under transformers' newer names.
  std::vector<std::pair<std::string, at::Tensor>> renamed;
  for (auto& [name, p] : vl->named_parameters()) {
    std::string n = name.rfind("visual.", 0) == 0  ? "model." + name
                    : name.rfind("model.", 0) == 0 ? "model.language_model." + name.substr(6)
                                                    : name;
    renamed.emplace_back(n, p);
  }
  mm::checkpoint::export_hf_directory(dir + "/new", vl->hf_config(), *vl);
  mm::st::save_hf_weights(dir + "/new", renamed);
  for (const char* sub : {"/old", "/new"}) {
    auto back = mm::test::load_hf_model(dir + sub);
    EXPECT_TRUE(at::equal(back->forward_multimodal(in), ref)) << sub;
  }
  // A checkpoint that does not fit names its own spelling of the offenders.
  auto other = std::make_shared<Qwen2ForCausalLM>(vl->vl_config.text);
  try {
    mm::checkpoint::load_model_weights(*other, dir + "/new");
    FAIL() << "a Qwen2-VL checkpoint loaded into a text model";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.language_model."), std::string::npos) << e.what();
  }
}

TEST(Qwen2VL, FreezePlanAndLearningRateMultipliers) {
  auto vl = tiny_model();
  auto groups = mm::training::default_param_groups(vl->named_parameters(), {"visual.merger=10", "visual=0.5"});
  int64_t merger = 0, tower = 0, lm = 0;
  for (auto& g : groups)
    for (size_t k = 0; k < g.names.size(); ++k) {
      const std::string& n = g.names[k];
      const double want = n.rfind("visual.merger.", 0) == 0 ? 10 : n.rfind("visual.", 0) == 0 ? 0.5 : 1.0;
      EXPECT_EQ(g.lr_scale, want) << n;
      EXPECT_EQ(g.weight_decay, g.params[k].dim() >= 2) << n;
      (want == 10 ? merger : want == 0.5 ? tower : lm) += 1;
    }
  EXPECT_EQ(merger, 6);
  EXPECT_GT(tower, 6);
  EXPECT_GT(lm, 6);
  EXPECT_THROW(mm::training::default_param_groups(vl->named_parameters(), {"visual"}), mm::ConfigError);
  EXPECT_THROW(mm::training::default_param_groups(vl->named_parameters(), {"visual=-1"}), mm::ConfigError);
  EXPECT_THROW(mm::training::default_param_groups(vl->named_parameters(), {"vision.merger=2"}), mm::ConfigError);

  // A multiplier of 0 holds the tower still while the language model learns; freezing it takes
  // it out of the optimizer altogether.
  auto opt = mm::training::optimizer_registry().get("adamw", "optimizer")(
      mm::training::default_param_groups(vl->named_parameters(), {"visual=0"}), mm::config::OptimizerConfig{});
  at::Tensor tower_before = vl->visual->merger->fc_out->weight.clone(), lm_before = vl->model->norm->weight.clone();
  MultimodalInputs in;
  in.input_ids = at::tensor(std::vector<int64_t>{'a', 259, 261, 261, 261, 261, 260, 'b'}, at::kLong).unsqueeze(0);
  in.image_grid_thw = at::tensor(std::vector<int64_t>{1, 4, 4}, at::kLong).view({1, 3});
  in.pixel_values = at::randn({16, 3 * 2 * 14 * 14});
  vl->forward_multimodal(in).pow(2).mean().backward();
  EXPECT_TRUE(vl->visual->merger->fc_out->weight.grad().defined());
  opt->step(1e-2);
  EXPECT_TRUE(at::equal(vl->visual->merger->fc_out->weight, tower_before));
  EXPECT_FALSE(at::equal(vl->model->norm->weight, lm_before));
  EXPECT_GT(mm::training::apply_freeze_plan(*vl, {"visual"}), 0);
  for (auto& g : mm::training::default_param_groups(vl->named_parameters()))
    for (auto& n : g.names) EXPECT_NE(n.rfind("visual.", 0), 0u) << n;
}

// ---- Qwen2.5-VL: the same decoder, the windowed tower, tokens_per_second ----

namespace {

json tiny25_config() {
  json j = tiny_config();
  j["vision_config"] = json::parse(R"({"depth": 2, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2,
      "patch_size": 14, "window_size": 56, "fullatt_block_indexes": [1], "tokens_per_second": 2})");
  return j;
}

}  // namespace

TEST(Qwen2_5VL, ConfigRegistryAndHFRoundTripWithVideo) {
  auto built = model_registry().get("qwen2_5_vl", "model.id")(tiny25_config(), "test", false);
  auto vl = std::dynamic_pointer_cast<Qwen2VLForConditionalGeneration>(built);
  ASSERT_TRUE(vl);
  EXPECT_TRUE(vl->vl_config.qwen2_5);
  EXPECT_EQ(vl->vl_config.rope_index.tokens_per_second, 2);
  EXPECT_EQ(vl->vl_config.vision.hidden_size, 32);  // out_hidden_size defaults to the text width
  EXPECT_EQ(vl->hf_config().at("model_type"), "qwen2_5_vl");
  EXPECT_EQ(vl->hf_config().at("architectures")[0], "Qwen2_5_VLForConditionalGeneration");
  EXPECT_EQ(vl->num_parameters(), vl->vl_config.vision.num_parameters() + Qwen2ForCausalLM(vl->vl_config.text).num_parameters());
  // transformers >= 4.52 nests the text fields in text_config: the same model.
  json nested = tiny25_config();
  json text = json::object();
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "rope_theta"}) {
    text[k] = nested.at(k);
    nested.erase(k);
  }
  nested["text_config"] = text;
  EXPECT_EQ(Qwen2VLConfig::from_json(nested, "test", false, true).to_json(), vl->hf_config());
  json bad = tiny25_config();
  bad["vision_config"]["out_hidden_size"] = 48;
  EXPECT_THROW(Qwen2VLConfig::from_json(bad, "test", false, true), mm::ConfigError);

  vl->init_weights(7);
  at::NoGradGuard no_grad;
  // An image (1, 4, 4) -> 4 pads and a two-frame video (2, 4, 4) -> 8 pads.
  std::vector<int64_t> ids = {'a', 259};
  ids.insert(ids.end(), 4, 261);
  ids.insert(ids.end(), {260, 'b', 259});
  ids.insert(ids.end(), 8, 262);
  ids.insert(ids.end(), {260, 'c'});
  MultimodalInputs in;
  in.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
  in.image_grid_thw = at::tensor(std::vector<int64_t>{1, 4, 4}, at::kLong).view({1, 3});
  in.pixel_values = at::randn({16, 3 * 2 * 14 * 14});
  in.video_grid_thw = at::tensor(std::vector<int64_t>{2, 4, 4}, at::kLong).view({1, 3});
  in.pixel_values_videos = at::randn({32, 3 * 2 * 14 * 14});
  in.video_second_per_grid = {1.0};
  at::Tensor ref = vl->forward_multimodal(in);
  // tokens_per_second moves the video's temporal positions 2 apart: the second frame's pads differ.
  at::Tensor pos = vl->mrope_positions(in);
  EXPECT_EQ(pos[0][0][13].item<int64_t>() - pos[0][0][9].item<int64_t>(), 2);  // pads 9..12, 13..16
  const std::string dir = mm::test::fresh_dir("qwen2_5vl_hf");
  mm::checkpoint::export_hf_directory(dir, vl->hf_config(), *vl);
  auto back = mm::test::load_hf_model(dir);
  EXPECT_TRUE(at::equal(back->forward_multimodal(in), ref));
}
