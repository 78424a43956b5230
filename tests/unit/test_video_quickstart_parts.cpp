// The parts the video quickstart makes here instead of downloading, and its judge:
//  - `mm init tokenizer`: the caption-word Unigram tokenizer gives the same ids as PyPI's
//    `tokenizers` reading the same tokenizer.json (captions, an unknown word, capitals);
//  - `mm init text-encoder`: a seeded random umT5 that transformers' UMT5EncoderModel loads and
//    runs to the same hidden states as mm (1e-4), initialised at T5's scales;
//  - `mm data latent-stats`: per-channel latent mean/std written into a VAE's config.json, after
//    which encode() gives zero-mean unit-std latents on the same clips;
//  - the VAE export is named as diffusers names it (diffusion_pytorch_model.safetensors);
//  - `mm judge`: trained on real Fashion-MNIST only, it reads the real moving test clips right
//    (class >= 75%, direction 100%) and names a clip whose caption is not one of its classes.
#include <gtest/gtest.h>

#include <filesystem>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/video_clip.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"
#include "mindspeed_mm/inference/video_judge.h"
#include "mindspeed_mm/models/umt5/umt5.h"
#include "mindspeed_mm/models/wan/wan_vae.h"
#include "run_command.h"

namespace {

// Moving clips shared by the tests of this file (made once per process).
std::string moving_data() {
  static const std::string dir = [] {
    const std::string d = mm::test::fresh_dir("quickstart_parts_data");
    auto r = mm::test::run_command(mm::test::mm_binary() + " data moving-fashion-mnist --out " + d +
                                   " --train 64 --test 60 --size 48 --frames 5 --speed 4");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

}  // namespace

TEST(InitCommand, CaptionTokenizerAndTextEncoderMatchTokenizersAndTransformers) {
  const std::string dir = mm::test::fresh_dir("init_parts");
  const std::string mm = mm::test::mm_binary();
  auto t = mm::test::run_command(mm + " init tokenizer --captions " + moving_data() + "/train.jsonl --out " + dir + "/tokenizer");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("caption words"), std::string::npos) << t.output;
  const std::vector<std::string> texts = {"a sandal moving left", "an ankle boot moving up", "A Zebra  moving sideways 42",
                                          "", "t-shirt"};
  std::string lines;
  for (const auto& s : texts) lines += s + "\n";
  mm::test::write_file(dir + "/texts.txt", lines);
  mm::test::write_file(dir + "/ids.py",
                       "import sys, json\nfrom tokenizers import Tokenizer\n"
                       "tok = Tokenizer.from_file(sys.argv[1])\n"
                       "for line in open(sys.argv[2]).read().split('\\n')[:-1]:\n"
                       "    print(json.dumps(tok.encode(line).ids))\n");
  auto py = mm::test::run_command(std::string(MM_PYTHON) + " " + dir + "/ids.py " + dir + "/tokenizer/tokenizer.json " + dir +
                                  "/texts.txt");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const mm::data::PretrainedTokenizer tok = mm::data::load_pretrained_tokenizer(dir + "/tokenizer");
  std::istringstream want(py.output);
  for (const auto& s : texts) {
    std::string line;
    ASSERT_TRUE(std::getline(want, line)) << py.output;
    EXPECT_EQ(nlohmann::json(tok.tokenizer.encode(s, true)).dump(), nlohmann::json::parse(line).dump()) << s;
  }
  EXPECT_EQ(tok.tokenizer.encode("a sandal moving left", false).size(), 4u);  // one id per caption word

  const int64_t vocab = tok.tokenizer.vocab_size();
  auto e = mm::test::run_command(mm + " init text-encoder --tokenizer " + dir + "/tokenizer --config " +
                                 "'{\"d_model\": 32, \"d_kv\": 8, \"num_heads\": 4, \"d_ff\": 64, \"num_layers\": 2}' --seed 3 --out " +
                                 dir + "/text_encoder");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  auto m = mm::models::load_umt5_encoder(dir + "/text_encoder");
  EXPECT_EQ(m->config.vocab_size, vocab);
  EXPECT_NEAR(m->shared->weight.std().item<double>(), 1.0, 0.1);  // T5's embedding scale
  EXPECT_NEAR(m->blocks[0]->wo->weight.std().item<double>(), 1.0 / 8.0, 0.02);  // d_ff^-1/2
  at::manual_seed(1);
  const at::Tensor ids = at::randint(0, vocab, {2, 12}, at::kLong);
  at::Tensor mask = at::ones({2, 12}, at::kLong);
  mask[1].narrow(0, 7, 5).zero_();
  mm::st::save_safetensors(dir + "/text_encoder/inputs.safetensors", {{"input_ids", ids}, {"attention_mask", mask}});
  mm::test::run_hf("encoder " + dir + "/text_encoder");
  const at::Tensor ref = mm::st::HFWeights(dir + "/text_encoder/hidden.safetensors").get("last_hidden_state");
  at::NoGradGuard no_grad;
  const double err = mm::test::rel_err(m->forward(ids, mask), ref);
  EXPECT_LT(err, 1e-4);
  std::printf("init text-encoder: transformers' hidden states of mm's random umT5 within %.2e\n", err);
  // The same seed makes the same encoder.
  auto again = mm::test::run_command(mm + " init text-encoder --tokenizer " + dir + "/tokenizer --config " +
                                     "'{\"d_model\": 32, \"d_kv\": 8, \"num_heads\": 4, \"d_ff\": 64, \"num_layers\": 2}' --seed 3 --out " +
                                     dir + "/again");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(mm::models::load_umt5_encoder(dir + "/again")->forward(ids, mask).equal(m->forward(ids, mask)));
  // Bad input: a caption file without captions, a config that is not umT5's.
  mm::test::write_file(dir + "/nocap.jsonl", "{\"path\": \"a.mp4\"}\n");
  auto bad = mm::test::run_command(mm + " init tokenizer --captions " + dir + "/nocap.jsonl --out " + dir + "/t2");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("nocap.jsonl:1: no \"cap\" string"), std::string::npos) << bad.output;
  auto bad2 = mm::test::run_command(mm + " init text-encoder --config '{\"d_modle\": 3}' --out " + dir + "/t3");
  EXPECT_EQ(bad2.exit_code, 2) << bad2.output;
  EXPECT_NE(bad2.output.find("d_modle"), std::string::npos) << bad2.output;
}

TEST(LatentStats, NormaliseTheVaeLatentsAndExportIsDiffusersNamed) {
  const std::string dir = mm::test::fresh_dir("latent_stats");
  const std::string mm = mm::test::mm_binary();
  mm::test::write_file(dir + "/vae.yaml",
                       "data:\n  dataset: videos\n  paths: [" + moving_data() + "/train.jsonl]\n  val_fraction: 0.1\n"
                       "  video: {height: 48, width: 48, frames: 5, fps: 16}\n"
                       "model:\n  id: wan_vae\n  config:\n    base_dim: 8\n    z_dim: 4\n    dim_mult: [1, 2, 2, 2]\n"
                       "    num_res_blocks: 1\n    temperal_downsample: [false, true, true]\n"
                       "training:\n  train_iters: 4\n  micro_batch_size: 4\n  eval_interval: 0\n  eval_iters: 0\n"
                       "  vae: {kl_weight: 1.0e-6, l1_weight: 0.0, mse_weight: 1.0}\n"
                       "  export_dir: " + dir + "/vae\n"
                       "tools:\n  progress: lines\n");
  auto t = mm::test::run_command(mm + " train " + dir + "/vae.yaml");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_EQ(t.output.find("reads no"), std::string::npos) << t.output;  // sample ids seed the posterior's noise
  EXPECT_TRUE(std::filesystem::exists(dir + "/vae/diffusion_pytorch_model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/vae/model.safetensors"));
  auto s = mm::test::run_command(mm + " data latent-stats --model " + dir + "/vae --data " + moving_data() +
                                 "/test.jsonl --size 48x48x5 --max-samples 20");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("latent-stats: 20 clips"), std::string::npos) << s.output;
  auto vae = mm::models::load_wan_vae(dir + "/vae");
  ASSERT_EQ(vae->config.latents_mean.size(), 4u);
  // The same 20 clips through encode(): per channel mean 0 and std 1.
  std::vector<at::Tensor> lat;
  std::istringstream in(mm::test::read_file(moving_data() + "/test.jsonl"));
  at::NoGradGuard no_grad;
  for (std::string line; lat.size() < 20 && std::getline(in, line);) {
    const std::string path = moving_data() + "/" + nlohmann::json::parse(line)["path"].get<std::string>();
    lat.push_back(vae->encode(mm::data::load_video_clip(path, 48, 48, 5, 16).unsqueeze(0)));
  }
  const at::Tensor all = at::cat(lat).transpose(0, 1).flatten(1).to(at::kDouble);
  EXPECT_LT(all.mean(1).abs().max().item<double>(), 1e-3) << all.mean(1);
  EXPECT_LT((all.std(1, /*unbiased=*/false) - 1).abs().max().item<double>(), 1e-3) << all.std(1);
}

TEST(Judge, ReadsRealMovingClipsAndNamesABadCaption) {
  const std::string dir = mm::test::fresh_dir("judge");
  mm::inference::JudgeOptions o;
  o.epochs = 1;
  const mm::inference::FashionJudge judge(o);
  EXPECT_GT(judge.test_accuracy(), 0.78);  // the classifier on the 10,000 real test images
  const mm::inference::JudgeReport r = judge.judge_jsonl(moving_data() + "/test.jsonl");
  EXPECT_EQ(r.clips, 60);
  EXPECT_EQ(r.direction_right, 60);
  EXPECT_GE(r.class_right, 45);
  std::printf("judge: classifier %.1f%% on real images; real moving clips: class %lld/60, direction %lld/60\n",
              100 * judge.test_accuracy(), static_cast<long long>(r.class_right), static_cast<long long>(r.direction_right));
  // A still clip (the first frame repeated) has no direction.
  at::Tensor still = at::zeros({5, 48, 48});
  still.narrow(1, 10, 20).narrow(2, 10, 20).fill_(1.0);
  EXPECT_EQ(judge.judge_frames(still).direction, -1);
  EXPECT_EQ(mm::inference::parse_moving_caption("an ankle boot moving up"), std::make_pair(9, 2));
  const std::string first = mm::test::read_file(moving_data() + "/test.jsonl").substr(0, 0);
  mm::test::write_file(dir + "/bad.jsonl", "{\"path\": \"" + moving_data() + "/clips/test/00000.mp4\", \"cap\": \"a cat moving left\"}\n");
  try {
    judge.judge_jsonl(dir + "/bad.jsonl");
    ADD_FAILURE() << "no error";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:1: \"a cat moving left\" is not a moving Fashion-MNIST caption"),
              std::string::npos) << e.what();
  }
}
