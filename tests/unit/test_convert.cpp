// `mm convert` (mindspeed_mm/checkpoint/convert.h) end to end through the binary: HF -> mm at
// TP2 x PP2 -> HF gives the input's tensors bit for bit; resplits between layouts equal a direct
// conversion byte for byte; every registered model converts; layouts that do not fit, missing,
// unknown and mis-shaped tensors are one-line errors naming them; an interrupted conversion
// leaves nothing at OUT. Wan2.1: diffusers -> original -> diffusers gives the same tensors, the
// original names are the ones diffusers' own converter reads, and diffusers' WanPipeline samples
// the round-tripped pipeline exactly as the input one.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/models/wan/wan_vae.h"
#include "run_command.h"

namespace fs = std::filesystem;
using mm::test::run_command;
using nlohmann::json;

namespace {

std::string mm_convert(const std::string& args) { return mm::test::mm_binary() + " convert " + args + " --quiet"; }

// Every tensor of a and b (HF directories, files or sharded checkpoints) has the same name,
// dtype, shape and bytes.
void expect_same_tensors(const std::string& a, const std::string& b) {
  auto load = [](const std::string& src) {
    std::map<std::string, at::Tensor> out;
    if (mm::checkpoint::is_sharded_checkpoint(src)) {
      mm::checkpoint::CheckpointReader r(src);
      for (const auto& n : r.names("model")) out[n] = r.read_full("model", n);
    } else {
      mm::st::HFWeights w(src);
      for (const auto& n : w.keys()) out[n] = w.get(n);
    }
    return out;
  };
  const auto ta = load(a), tb = load(b);
  ASSERT_EQ(ta.size(), tb.size()) << a << " vs " << b;
  for (const auto& [name, t] : ta) {
    auto it = tb.find(name);
    ASSERT_NE(it, tb.end()) << name << " missing from " << b;
    EXPECT_EQ(t.scalar_type(), it->second.scalar_type()) << name;
    ASSERT_EQ(t.sizes(), it->second.sizes()) << name;
    EXPECT_TRUE(at::equal(t.contiguous().view(at::kByte), it->second.contiguous().view(at::kByte))) << name;
  }
}

std::string read(const std::string& path) { return mm::read_file_bytes(path).value_or("<missing " + path + ">"); }

// A tiny model of `id` with random weights (norms and biases too), saved as an HF directory.
void write_random_model(const std::string& id, const json& config, const std::string& dir, uint64_t seed) {
  auto model = mm::models::model_registry().get(id, "test")(config, "test", false);
  model->init_weights(seed);
  mm::test::perturb_norms_and_biases(*model, seed);
  mm::checkpoint::export_hf_directory(dir, model->hf_config(), *model);
}

json qwen2_config() {
  return {{"model_type", "qwen2"},     {"vocab_size", 64},         {"hidden_size", 32},
          {"intermediate_size", 48},   {"num_hidden_layers", 4},   {"num_attention_heads", 4},
          {"num_key_value_heads", 2},  {"tie_word_embeddings", false}};
}

}  // namespace

TEST(Convert, HfToTp2Pp2AndBackIsBitwiseAndResplitsEqualADirectConversion) {
  const std::string dir = mm::test::fresh_dir("convert_roundtrip");
  write_random_model("qwen2", qwen2_config(), dir + "/hf", 5);
  mm::test::write_file(dir + "/hf/tokenizer_config.json", "{\"model_max_length\": 64}\n");

  // HF -> TP2 x PP2: four ranks' files, each with its own slices and layers.
  auto r = run_command(mm_convert("hf-to-mm --model-type qwen2 --in " + dir + "/hf --out " + dir + "/tp2pp2 --tp 2 --pp 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp 2 x pp 2 x dp 1 (4 ranks)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/tp2pp2.partial"));
  EXPECT_EQ(read(dir + "/tp2pp2/tokenizer_config.json"), "{\"model_max_length\": 64}\n");
  const json meta = json::parse(read(dir + "/tp2pp2/metadata.json"));
  EXPECT_EQ(meta["world"], 4);
  const json& q = meta["tensors"]["model"]["model.layers.0.self_attn.q_proj.weight"];  // stage 0, colwise
  ASSERT_EQ(q["shards"].size(), 2u);
  EXPECT_EQ(q["shards"][0]["file"], "model.rank00000.safetensors");
  EXPECT_EQ(q["shards"][1]["file"], "model.rank00001.safetensors");
  EXPECT_EQ(q["shards"][1]["offset"], json({16, 0}));
  EXPECT_EQ(q["shards"][1]["box"], json({16, 32}));
  const json& o = meta["tensors"]["model"]["model.layers.3.self_attn.o_proj.weight"];  // stage 1, rowwise
  EXPECT_EQ(o["shards"][0]["file"], "model.rank00002.safetensors");
  EXPECT_EQ(o["shards"][1]["offset"], json({0, 16}));
  const json& norm = meta["tensors"]["model"]["model.norm.weight"];  // replicated: TP rank 0 of the last stage
  ASSERT_EQ(norm["shards"].size(), 1u);
  EXPECT_EQ(norm["shards"][0]["file"], "model.rank00002.safetensors");

  // ... back to HF: the input's tensors bit for bit, its tokenizer files with them.
  r = run_command(mm_convert("mm-to-hf --in " + dir + "/tp2pp2 --out " + dir + "/back"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensors(dir + "/hf", dir + "/back");
  EXPECT_EQ(read(dir + "/back/tokenizer_config.json"), "{\"model_max_length\": 64}\n");
  EXPECT_EQ(json::parse(read(dir + "/back/config.json")), json::parse(read(dir + "/hf/config.json")));

  // TP2 x PP2 -> PP4 -> one rank equals HF -> one rank, file for file.
  ASSERT_EQ((r = run_command(mm_convert("resplit --in " + dir + "/tp2pp2 --out " + dir + "/pp4 --pp 4"))).exit_code, 0)
      << r.output;
  ASSERT_EQ((r = run_command(mm_convert("resplit --in " + dir + "/pp4 --out " + dir + "/one"))).exit_code, 0) << r.output;
  ASSERT_EQ((r = run_command(mm_convert("hf-to-mm --in " + dir + "/hf --out " + dir + "/direct"))).exit_code, 0) << r.output;
  for (const char* f : {"model.rank00000.safetensors", "metadata.json", "config.json"})
    EXPECT_EQ(read(dir + "/one/" + f), read(dir + "/direct/" + f)) << f;
  expect_same_tensors(dir + "/pp4", dir + "/hf");

  // A converted folder is a model source as it is (model.pretrained, mm generate).
  auto model = mm::test::load_hf_model(dir + "/tp2pp2");
  mm::st::HFWeights hf(dir + "/hf");
  for (auto& [name, p] : model->named_parameters()) EXPECT_TRUE(at::equal(p, hf.get(name))) << name;

  // --dtype bf16 writes bf16 copies of the same values.
  ASSERT_EQ((r = run_command(mm_convert("mm-to-hf --in " + dir + "/pp4 --out " + dir + "/bf16 --dtype bf16"))).exit_code, 0)
      << r.output;
  mm::st::HFWeights bf(dir + "/bf16");
  EXPECT_TRUE(at::equal(bf.get("lm_head.weight"), hf.get("lm_head.weight").to(at::kBFloat16)));
}

TEST(Convert, EveryRegisteredModelConvertsAndComesBackBitwise) {
  const std::string dir = mm::test::fresh_dir("convert_models");
  struct Case {
    std::string id;
    json config;
    std::string layout;
  };
  const json vl_text = {{"vocab_size", 160},       {"hidden_size", 64},         {"intermediate_size", 112},
                        {"num_hidden_layers", 4},  {"num_attention_heads", 4},  {"num_key_value_heads", 2},
                        {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 3, 3}}}}};
  const json vision25 = {{"depth", 2}, {"num_heads", 4}, {"patch_size", 4}, {"spatial_merge_size", 2},
                         {"temporal_patch_size", 2}, {"in_chans", 3}, {"hidden_size", 32}, {"intermediate_size", 40},
                         {"out_hidden_size", 64}, {"window_size", 16}, {"fullatt_block_indexes", {1}},
                         {"hidden_act", "silu"}};
  const json vision2 = {{"depth", 2}, {"num_heads", 4}, {"patch_size", 4}, {"spatial_merge_size", 2},
                        {"temporal_patch_size", 2}, {"in_chans", 3}, {"embed_dim", 32}, {"hidden_size", 64},
                        {"mlp_ratio", 2}, {"hidden_act", "quick_gelu"}};
  const std::vector<Case> cases = {
      {"qwen2", qwen2_config(), "--tp 2 --dp 2"},
      {"qwen2_vl",
       {{"model_type", "qwen2_vl"}, {"text_config", vl_text}, {"vision_config", vision2}, {"image_token_id", 151},
        {"video_token_id", 152}, {"vision_start_token_id", 153}, {"vision_end_token_id", 154}},
       "--tp 2 --pp 2 --pipeline-num-layers '{vision: [2, 0], text: [1, 3]}'"},
      {"qwen2_5_vl",
       {{"model_type", "qwen2_5_vl"}, {"text_config", vl_text}, {"vision_config", vision25}, {"image_token_id", 151},
        {"video_token_id", 152}, {"vision_start_token_id", 153}, {"vision_end_token_id", 154}},
       "--tp 2 --pp 2"},
      {"llava", json::parse(R"({"model_type": "llava", "image_token_index": 261, "projector_hidden_act": "gelu",
         "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
         "text_config": {"model_type": "llama", "vocab_size": 263, "hidden_size": 32, "intermediate_size": 64,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2},
         "vision_config": {"hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 3,
                           "num_attention_heads": 4, "image_size": 28, "patch_size": 14, "projection_dim": 16}})"),
       "--dp 3"},
      {"wan_dit",
       {{"_class_name", "WanTransformer3DModel"}, {"patch_size", {1, 2, 2}}, {"num_attention_heads", 2},
        {"attention_head_dim", 12}, {"in_channels", 4}, {"out_channels", 4}, {"text_dim", 16}, {"freq_dim", 16},
        {"ffn_dim", 32}, {"num_layers", 4}, {"rope_max_seq_len", 32}},
       "--tp 2 --pp 2 --dp 2"},
      {"wan_vae",
       {{"_class_name", "AutoencoderKLWan"}, {"base_dim", 8}, {"z_dim", 4}, {"dim_mult", {1, 2, 2, 2}},
        {"num_res_blocks", 1}, {"temperal_downsample", {false, true, true}}},
       "--dp 2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.id);
    const std::string base = dir + "/" + c.id;
    write_random_model(c.id, c.config, base + "/hf", 11);
    // The model type from config.json (model_type, or diffusers' _class_name).
    auto r = run_command(mm_convert("hf-to-mm --in " + base + "/hf --out " + base + "/split " + c.layout));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ((r = run_command(mm_convert("resplit --in " + base + "/split --out " + base + "/one"))).exit_code, 0) << r.output;
    ASSERT_EQ((r = run_command(mm_convert("mm-to-hf --in " + base + "/one --out " + base + "/back"))).exit_code, 0) << r.output;
    expect_same_tensors(base + "/hf", base + "/back");
  }
}

TEST(Convert, BadInputsAndLayoutsAreOneLineErrorsAndLeaveNoOutput) {
  const std::string dir = mm::test::fresh_dir("convert_errors");
  write_random_model("qwen2", qwen2_config(), dir + "/hf", 3);
  auto expect_error = [&](const std::string& args, int code, const std::string& text) {
    auto r = run_command(mm_convert(args));
    EXPECT_EQ(r.exit_code, code) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(text), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_FALSE(fs::exists(dir + "/out")) << args;
    EXPECT_FALSE(fs::exists(dir + "/out.partial")) << args;
  };
  // Layouts that do not fit the model, naming what does not divide.
  expect_error("hf-to-mm --in " + dir + "/hf --out " + dir + "/out --tp 3", 2, "model.embed_tokens has 64 rows (the vocabulary), which do not divide by 3");
  expect_error("hf-to-mm --in " + dir + "/hf --out " + dir + "/out --pp 8", 2, "pipeline");
  expect_error("hf-to-mm --in " + dir + "/hf --out " + dir + "/out --pp 2 --pipeline-num-layers '{text: [1, 1]}'", 2,
               "text");
  // Missing, unknown and mis-shaped tensors, named.
  mm::st::HFWeights hf(dir + "/hf");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& k : hf.keys())
    if (k != "model.layers.2.mlp.up_proj.weight") tensors.emplace_back(k, hf.get(k));
  fs::create_directories(dir + "/missing");
  fs::copy_file(dir + "/hf/config.json", dir + "/missing/config.json");
  mm::st::save_safetensors(dir + "/missing/model.safetensors", tensors);
  expect_error("hf-to-mm --in " + dir + "/missing --out " + dir + "/out --tp 2", 1, "missing model.layers.2.mlp.up_proj.weight");
  tensors.emplace_back("model.layers.2.mlp.up_proj.weight", at::zeros({48, 31}));
  tensors.emplace_back("model.extra.weight", at::zeros({2}));
  fs::create_directories(dir + "/bad");
  fs::copy_file(dir + "/hf/config.json", dir + "/bad/config.json");
  mm::st::save_safetensors(dir + "/bad/model.safetensors", tensors);
  expect_error("hf-to-mm --in " + dir + "/bad --out " + dir + "/out", 1, "shape mismatch model.layers.2.mlp.up_proj.weight [48, 31]");
  expect_error("hf-to-mm --in " + dir + "/bad --out " + dir + "/out", 1, "unexpected model.extra.weight");
  // An existing output is never touched.
  fs::create_directories(dir + "/taken");
  mm::test::write_file(dir + "/taken/keep.txt", "mine");
  auto r = run_command(mm_convert("hf-to-mm --in " + dir + "/hf --out " + dir + "/taken"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("exists and is not empty"), std::string::npos) << r.output;
  EXPECT_EQ(read(dir + "/taken/keep.txt"), "mine");
  // Killed halfway through: nothing at OUT (only OUT.partial, which no reader takes for a checkpoint).
  r = run_command("MM_DEBUG_KILL_IN_CONVERT=20 " + mm_convert("hf-to-mm --in " + dir + "/hf --out " + dir + "/out --tp 2"));
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/out"));
  EXPECT_TRUE(fs::exists(dir + "/out.partial"));
  EXPECT_FALSE(fs::exists(dir + "/out.partial/metadata.json"));
  // ... and the next run starts over and completes.
  r = run_command(mm_convert("hf-to-mm --in " + dir + "/hf --out " + dir + "/out --tp 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/out.partial"));
  expect_same_tensors(dir + "/out", dir + "/hf");
}

TEST(ConvertConformance, WanOriginalAndDiffusersRoundTripAndDiffusersSamplesTheResult) {
  const std::string dir = mm::test::fresh_dir("convert_wan");
  mm::test::write_file(dir + "/spec.json",
                       R"({"prompt": "a shirt moving left", "negative_prompt": "", "height": 16, "width": 16,
                           "frames": 5, "steps": 2, "guidance_scale": 5.0, "seed": 3, "shift": 3.0,
                           "max_sequence_length": 8})");
  const std::string py = std::string(MM_PYTHON) + " " + mm::test::source_dir() + "/tests/conformance/diffusers_reference.py ";
  auto r = run_command(py + "wan_pipeline " + dir + "/pipe " + dir + "/spec.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  ASSERT_EQ((r = run_command(mm_convert("wan --from diffusers --to original --in " + dir + "/pipe --out " + dir + "/orig")))
                .exit_code, 0) << r.output;
  for (const char* f : {"config.json", "diffusion_pytorch_model.safetensors", "Wan2.1_VAE.pth",
                        "models_t5_umt5-xxl-enc-bf16.pth", "google/umt5-xxl/tokenizer.json"})
    EXPECT_TRUE(fs::exists(dir + "/orig/" + f)) << f;
  const json orig_cfg = json::parse(read(dir + "/orig/config.json"));
  EXPECT_EQ(orig_cfg["_class_name"], "WanModel");
  EXPECT_EQ(orig_cfg["dim"], 24);
  EXPECT_EQ(orig_cfg["num_heads"], 2);
  // The original DiT names are the ones diffusers' own converter reads back.
  ASSERT_EQ((r = run_command(py + "wan_dit from_original " + dir + "/orig/diffusion_pytorch_model.safetensors " + dir +
                             "/dit_by_diffusers.safetensors")).exit_code, 0) << r.output;
  expect_same_tensors(dir + "/pipe/transformer", dir + "/dit_by_diffusers.safetensors");

  ASSERT_EQ((r = run_command(mm_convert("wan --from original --to diffusers --in " + dir + "/orig --out " + dir +
                                        "/again --vae-config " + dir + "/pipe/vae/config.json"))).exit_code, 0)
      << r.output;
  for (const char* part : {"transformer", "vae", "text_encoder"}) expect_same_tensors(dir + "/pipe/" + part, dir + "/again/" + part);
  // original -> diffusers -> original: the same files.
  ASSERT_EQ((r = run_command(mm_convert("wan --from diffusers --to original --in " + dir + "/again --out " + dir + "/orig2")))
                .exit_code, 0) << r.output;
  for (const char* f : {"config.json", "diffusion_pytorch_model.safetensors", "Wan2.1_VAE.pth",
                        "models_t5_umt5-xxl-enc-bf16.pth", "google/umt5-xxl/tokenizer.json"})
    EXPECT_EQ(read(dir + "/orig/" + f), read(dir + "/orig2/" + f)) << f;
  // diffusers loads the converted pipeline (model_index.json, every config) and samples the same latents.
  ASSERT_EQ((r = run_command(py + "wan_pipeline_load " + dir + "/again " + dir + "/spec.json")).exit_code, 0) << r.output;
  mm::st::HFWeights want(dir + "/pipe/outputs.safetensors"), got(dir + "/again/outputs.safetensors");
  for (const char* k : {"latents", "prompt_embeds"}) EXPECT_TRUE(at::equal(want.get(k), got.get(k))) << k;

  // Without --vae-config the VAE is Wan2.1's: diffusers' defaults, latent statistics included.
  r = run_command(std::string(MM_PYTHON) +
                  " -c \"import json, inspect, diffusers; p = inspect.signature(diffusers.AutoencoderKLWan).parameters; "
                  "print(json.dumps({k: p[k].default for k in ('base_dim', 'z_dim', 'dim_mult', 'num_res_blocks', "
                  "'temperal_downsample', 'latents_mean', 'latents_std')}))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json defaults = json::parse(r.output);
  ASSERT_EQ((r = run_command(mm_convert("wan --from original --to diffusers --in " + dir + "/orig --out " + dir +
                                        "/default_vae"))).exit_code, 1)
      << r.output;  // the tiny VAE is not Wan2.1's: its tensors do not fit, named
  EXPECT_NE(r.output.find("Wan2.1_VAE.pth' does not fit the model"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/default_vae"));
  const json wan21 = mm::models::WanVAEConfig::wan2_1().to_json();
  for (auto& [k, v] : defaults.items()) EXPECT_EQ(wan21[k], v) << k;
}
