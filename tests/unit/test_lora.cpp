// LoRA (mindspeed_mm/training/lora.h) against PyPI's peft (tests/conformance/peft_reference.py):
// an adapter mm writes loads into peft on the transformers model with the same logits; one peft
// makes loads into mm with the same logits; `mm convert merge-lora` equals peft's
// merge_and_unload. Then training: only the adapters train and are saved, and DDP, FSDP and
// tensor parallelism give the losses and adapters of one process.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "dist_train_runs.h"
#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/models/wan/wan_dit.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/training/lora.h"
#include "run_command.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void run_peft(const std::string& args) {
  const std::string cmd = std::string(MM_PYTHON) + " " + mm::test::source_dir() + "/tests/conformance/peft_reference.py " + args;
  auto r = mm::test::run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
}

json tiny_qwen2() {
  return {{"model_type", "qwen2"},    {"architectures", {"Qwen2ForCausalLM"}}, {"vocab_size", 97},
          {"hidden_size", 64},        {"intermediate_size", 112},             {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2},             {"initializer_range", 0.2},
          {"tie_word_embeddings", false}};
}

// A base model directory made by transformers, with input ids to score.
std::string make_base(const std::string& dir) {
  mm::test::run_hf("create " + dir + "/base '" + tiny_qwen2().dump() + "' --seed 3");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4);
  mm::st::save_safetensors(dir + "/base/inputs.safetensors",
                           {{"input_ids", at::randint(97, {2, 11}, gen, at::TensorOptions().dtype(at::kLong))}});
  return dir + "/base";
}

// The text runs' LoRA overrides; lm_head trains whole too (modules_to_save): a frozen random head
// would learn nothing in 20 steps.
const std::string kTextLora = " features.lora.target=[q_proj,v_proj,o_proj,up_proj,down_proj] features.lora.rank=4"
                              " features.lora.alpha=16 features.lora.modules_to_save=[lm_head] training.optimizer.lr=0.01"
                              " training.micro_batch_size=4";

at::Tensor ids_of(const std::string& base) { return mm::st::HFWeights(base + "/inputs.safetensors").get("input_ids"); }

}  // namespace

TEST(LoraConformance, PeftLoadsOursAndOursLoadsPeftsWithTheSameLogits) {
  const std::string dir = mm::test::fresh_dir("lora_peft");
  const std::string base = make_base(dir);

  // mm -> peft: adapters on q, v and down projections, lm_head trained whole; lora_B drawn at
  // random (PEFT's init leaves it zero: the adapter would change nothing).
  {
    auto model = mm::test::load_hf_model(base);
    mm::config::LoraConfig c;
    c.target = {"q_proj", "v_proj", "down_proj"};
    c.rank = 4;
    c.alpha = 8;
    c.modules_to_save = {"lm_head"};
    const auto layout = mm::training::apply_lora_plan(*model, c);
    EXPECT_EQ(layout.targets.size(), 6u);
    mm::training::init_lora_weights(*model, layout, 1);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
    std::vector<std::pair<std::string, at::Tensor>> trained;
    {
      at::NoGradGuard no_grad;
      for (auto& [name, p] : model->named_parameters()) {
        EXPECT_EQ(p.requires_grad(), layout.trainable.count(name) > 0) << name;
        if (!p.requires_grad()) continue;
        if (name.find("lora_B") != std::string::npos || name == "lm_head.weight")
          p.add_(at::empty(p.sizes(), at::TensorOptions().dtype(at::kDouble)).normal_(0, 0.2, gen).to(p.scalar_type()));
        trained.emplace_back(name, p.detach().clone());
      }
    }
    EXPECT_EQ(trained.size(), 6u * 2 + 1);
    mm::training::save_peft_adapter(dir + "/ours", mm::training::peft_adapter_config(*model, layout, base), *model, trained);
    run_peft("logits " + base + " " + dir + "/ours " + dir + "/peft_on_ours.safetensors");
    at::NoGradGuard no_grad;
    const at::Tensor ours = model->forward(ids_of(base));
    const at::Tensor theirs = mm::st::HFWeights(dir + "/peft_on_ours.safetensors").get("logits");
    EXPECT_LT(mm::test::rel_err(ours, theirs), 1e-4);
    // The adapter matters: the base alone gives other logits.
    EXPECT_GT(mm::test::rel_err(mm::test::load_hf_model(base)->forward(ids_of(base)), theirs), 1e-2);
  }

  // peft -> mm: an adapter made by peft (every weight random), read with its config.
  run_peft("create " + base + " " + dir + "/theirs '" +
           json({{"r", 8}, {"lora_alpha", 4}, {"target_modules", {"k_proj", "o_proj", "gate_proj"}},
                 {"modules_to_save", {"lm_head"}}}).dump() + "' --seed 6");
  {
    auto model = mm::test::load_hf_model(base);
    const mm::config::LoraConfig c = mm::training::read_peft_adapter_config(dir + "/theirs");
    EXPECT_EQ(c.rank, 8);
    EXPECT_EQ(c.alpha, 4);
    const auto layout = mm::training::apply_lora_plan(*model, c);
    mm::training::load_peft_adapter(*model, dir + "/theirs");
    at::NoGradGuard no_grad;
    const at::Tensor ours = model->forward(ids_of(base));
    EXPECT_LT(mm::test::rel_err(ours, mm::st::HFWeights(dir + "/theirs/logits.safetensors").get("logits")), 1e-4);
  }

  // merge-lora equals peft's merge_and_unload.
  auto r = mm::test::run_command(mm::test::mm_binary() + " convert merge-lora --quiet --base " + base + " --adapter " +
                                 dir + "/theirs --out " + dir + "/merged");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  run_peft("merge " + base + " " + dir + "/theirs " + dir + "/peft_merged");
  mm::st::HFWeights mine(dir + "/merged"), peft(dir + "/peft_merged");
  auto keys = peft.keys();
  EXPECT_EQ(mine.keys().size(), keys.size());
  double worst = 0;
  for (const auto& k : keys) {
    ASSERT_TRUE(mine.has(k)) << k;
    worst = std::max(worst, (mine.get(k).to(at::kDouble) - peft.get(k).to(at::kDouble)).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-6);
  std::printf("merge-lora vs peft merge_and_unload: max abs difference %.3g\n", worst);

  // Adapters mm cannot run are named errors.
  fs::create_directories(dir + "/dora");
  mm::test::write_file(dir + "/dora/adapter_config.json",
                       R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "use_dora": true})");
  try {
    mm::training::read_peft_adapter_config(dir + "/dora");
    ADD_FAILURE() << "DoRA accepted";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_dora"), std::string::npos) << e.what();
  }
}

// Qwen2-VL: transformers' current module paths (model.language_model.*, model.visual.*) are not its
// checkpoint names (model.*, visual.*): an adapter peft makes on the vision tower and the language
// model loads into mm (every key mapped) and gives peft's logits; written back, the same keys.
TEST(LoraConformance, Qwen2VlAdapterKeysFollowTransformersModulePaths) {
  const std::string dir = mm::test::fresh_dir("lora_vl");
  const json text = {{"vocab_size", 160},       {"hidden_size", 64},        {"intermediate_size", 112},
                     {"num_hidden_layers", 2},  {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                     {"initializer_range", 0.2}, {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 3, 3}}}}};
  const json vision = {{"depth", 2}, {"num_heads", 4}, {"patch_size", 4}, {"spatial_merge_size", 2},
                       {"temporal_patch_size", 2}, {"in_chans", 3}, {"embed_dim", 32}, {"hidden_size", 64},
                       {"mlp_ratio", 2}};
  const json cfg = {{"model_type", "qwen2_vl"}, {"architectures", {"Qwen2VLForConditionalGeneration"}},
                    {"text_config", text}, {"vision_config", vision}, {"image_token_id", 151}, {"video_token_id", 152},
                    {"vision_start_token_id", 153}, {"vision_end_token_id", 154}, {"tie_word_embeddings", false}};
  mm::test::run_hf("create " + dir + "/base '" + cfg.dump() + "' --seed 3");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4);
  mm::st::save_safetensors(dir + "/base/inputs.safetensors",
                           {{"input_ids", at::randint(150, {1, 9}, gen, at::TensorOptions().dtype(at::kLong))}});
  run_peft("create " + dir + "/base " + dir + "/theirs '" +
           json({{"r", 4}, {"lora_alpha", 8}, {"target_modules", {"q_proj", "qkv", "down_proj"}}}).dump() + "' --seed 2");
  auto model = mm::test::load_hf_model(dir + "/base");
  const auto layout = mm::training::attach_peft_adapter(*model, dir + "/theirs");
  EXPECT_EQ(layout.targets.size(), 2u + 2u + 2u);  // q_proj and down_proj per text layer, qkv per vision block
  at::NoGradGuard no_grad;
  EXPECT_LT(mm::test::rel_err(model->forward(ids_of(dir + "/base")),
                              mm::st::HFWeights(dir + "/theirs/logits.safetensors").get("logits")),
            1e-4);
  std::vector<std::pair<std::string, at::Tensor>> trained;
  for (auto& [name, p] : model->named_parameters())
    if (mm::training::LoraLayout::is_adapter(name)) trained.emplace_back(name, p);
  mm::training::save_peft_adapter(dir + "/ours", mm::training::peft_adapter_config(*model, layout), *model, trained);
  auto a = mm::st::SafetensorsReader(dir + "/theirs/adapter_model.safetensors").keys();
  auto b = mm::st::SafetensorsReader(dir + "/ours/adapter_model.safetensors").keys();
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);

  // Targets as transformers' full module paths (what our adapter_config.json lists when the
  // config used plan patterns): they name our modules too.
  run_peft("create " + dir + "/base " + dir + "/paths '" +
           json({{"r", 4}, {"lora_alpha", 8},
                 {"target_modules", {"model.language_model.layers.1.self_attn.q_proj", "model.visual.blocks.0.attn.qkv"}}})
               .dump() +
           "' --seed 5");
  auto fresh = mm::test::load_hf_model(dir + "/base");
  const auto by_path = mm::training::attach_peft_adapter(*fresh, dir + "/paths");
  EXPECT_EQ(by_path.targets, (std::vector<std::string>{"model.layers.1.self_attn.q_proj", "visual.blocks.0.attn.qkv"}));
  EXPECT_LT(mm::test::rel_err(fresh->forward(ids_of(dir + "/base")),
                              mm::st::HFWeights(dir + "/paths/logits.safetensors").get("logits")),
            1e-4);
}

TEST(Lora, PatternTargetsMatchTheEndOfAPathAsNamesDo) {
  auto model = mm::models::model_registry().get("qwen2", "test")(tiny_qwen2(), "test", false);
  mm::config::LoraConfig c;
  c.target = {"layers.{1}.self_attn.?_proj", "mlp.down_proj"};
  const auto layout = mm::training::apply_lora_plan(*model, c);
  EXPECT_EQ(layout.targets, (std::vector<std::string>{"model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj",
                                                      "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj",
                                                      "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.down_proj"}));
  // PEFT matches target_modules by suffix only: patterns are written out as the modules' paths.
  EXPECT_EQ(mm::training::peft_adapter_config(*model, layout)["target_modules"], json(layout.targets));
}

TEST(Lora, TargetsThatMatchNothingOrAreNotLinearAreConfigErrors) {
  auto model = mm::models::model_registry().get("qwen2", "test")(tiny_qwen2(), "test", false);
  mm::config::LoraConfig c;
  c.target = {"q_proj", "nonexistent_proj"};
  EXPECT_THROW(mm::training::apply_lora_plan(*model, c), mm::ConfigError);
  c.target = {"model.layers.{*}.input_layernorm"};
  try {
    mm::training::apply_lora_plan(*model, c);
    ADD_FAILURE() << "a norm accepted as a LoRA target";
  } catch (const mm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a Linear"), std::string::npos) << e.what();
  }
}

// A LoRA run trains only the adapters (and saves only them), and every layout gives one process's
// losses and adapters.
TEST(LoraTrain, DdpFsdpAndTensorParallelEqualOneProcess) {
  using namespace mm::test;
  const std::string dir = fresh_dir("lora_train");
  const std::string cfg = text_config(dir);
  const std::string lora = kTextLora;
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", lora + " training.export_dir=" + dir + "/one_adapter" +
                                                             " training.save_dir=" + dir + "/one_save training.save_interval=20");
  EXPECT_NE(one.output.find("plan: LoRA rank 4 alpha 16 on 10 Linear layers"), std::string::npos) << one.output;
  // Only the adapters train, and only they are in the checkpoint and the export.
  mm::st::HFWeights exported(dir + "/one_adapter");
  EXPECT_EQ(exported.keys().size(), 21u);
  for (const auto& k : exported.keys())
    EXPECT_TRUE(k.rfind("base_model.model.model.layers.", 0) == 0 || k == "base_model.model.lm_head.weight") << k;
  EXPECT_TRUE(fs::exists(dir + "/one_save/iter_0000020/adapter/adapter_config.json"));
  auto r = run_command(mm_binary() + " generate --prompt x --model " + dir + "/one_save");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("holds only the adapters: use --model BASE_DIR --adapter"), std::string::npos) << r.output;
  mm::st::SafetensorsReader saved(dir + "/one_save/iter_0000020/model.safetensors");
  EXPECT_EQ(saved.keys().size(), 21u);
  // A LoRA run from a pretrained base: `mm generate --adapter` on the base gives the tokens of the
  // merged model (mm convert merge-lora), and the adapter continues training from where it was.
  {
    auto base = mm::models::model_registry().get("qwen2", "test")(
        json{{"model_type", "qwen2"}, {"vocab_size", 260}, {"hidden_size", 48}, {"intermediate_size", 96},
             {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
             {"tie_word_embeddings", false}},
        "test", false);
    base->init_weights(9);
    mm::checkpoint::export_hf_directory(dir + "/base", base->hf_config(), *base);
    const TrainRun tuned = train(cfg, 1, dir + "/tuned.jsonl", lora + " model.pretrained=" + dir + "/base training.export_dir=" +
                                                                   dir + "/tuned_adapter training.train_iters=10");
    r = run_command(mm_binary() + " convert merge-lora --quiet --base " + dir + "/base --adapter " + dir +
                         "/tuned_adapter --out " + dir + "/merged");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string gen = " generate --prompt 'The quick' --max-new-tokens 12 --json";
    auto with_adapter = run_command(mm_binary() + gen + " --model " + dir + "/base --adapter " + dir + "/tuned_adapter");
    auto merged = run_command(mm_binary() + gen + " --model " + dir + "/merged");
    auto plain = run_command(mm_binary() + gen + " --model " + dir + "/base");
    ASSERT_EQ(with_adapter.exit_code, 0) << with_adapter.output;
    ASSERT_EQ(merged.exit_code, 0) << merged.output;
    auto tokens = [](const std::string& out) {
      const auto at = out.find('{');
      return at == std::string::npos ? json() : json::parse(out.substr(at))["tokens"];
    };
    EXPECT_EQ(tokens(with_adapter.output), tokens(merged.output)) << with_adapter.output << merged.output;
    EXPECT_NE(tokens(plain.output), tokens(merged.output)) << "the adapter changed nothing";
    // Continue from the adapter: the first loss is the last one of the run that made it.
    const TrainRun more = train(cfg, 1, dir + "/more.jsonl", lora + " model.pretrained=" + dir + "/base" +
                                                                " features.lora.adapter=" + dir + "/tuned_adapter training.train_iters=2");
    ASSERT_FALSE(more.val_losses.empty());
    ASSERT_FALSE(tuned.val_losses.empty());
    EXPECT_NEAR(more.val_losses.front(), tuned.val_losses.back(), 1e-5 * tuned.val_losses.back());
  }
  struct Layout {
    std::string name, overrides;
    int ranks;
  };
  for (const Layout& l : {Layout{"DDP2", " parallel.data_parallel_replicate_size=2 training.micro_batch_size=2 "
                                         "training.gradient_accumulation_steps=1", 2},
                          Layout{"FSDP2", " parallel.data_parallel_shard_size=2 training.micro_batch_size=2", 2},
                          Layout{"TP2", " parallel.tensor_parallel_size=2", 2}}) {
    const std::string out = dir + "/" + l.name;
    const TrainRun run = train(cfg, l.ranks, out + ".jsonl", lora + l.overrides + " training.export_dir=" + out);
    expect_same_run(one, run, "LoRA, " + l.name);
    expect_same_weights(dir + "/one_adapter", out, 1e-5, "LoRA adapters, " + l.name);
  }
}

// `mm eval --adapter` on a vision-language base: the adapter of a LoRA run whose targets were plan
// patterns (so adapter_config.json lists transformers' module paths) scores what the merged model
// scores, and differently from the base alone.
TEST(LoraTrain, EvalWithTheAdapterEqualsTheMergedModel) {
  using namespace mm::test;
  const std::string dir = fresh_dir("lora_eval");
  const std::string cfg = vl_config(dir, 24);
  train(cfg, 1, dir + "/base.jsonl", "training.train_iters=10 training.export_dir=" + dir + "/base");
  const TrainRun lora = train(cfg, 1, dir + "/lora.jsonl",
                              "training.train_iters=10 model.pretrained=" + dir + "/base features.lora.target=[q_proj,qkv,"
                              "'merger.mlp.{0,2}'] features.lora.rank=4 features.lora.alpha=8 training.optimizer.lr=0.05 "
                              "training.export_dir=" + dir + "/adapter");
  EXPECT_NE(lora.output.find("plan: LoRA rank 4 alpha 8 on 6 Linear layers"), std::string::npos) << lora.output;
  const json targets = json::parse(read_file(dir + "/adapter/adapter_config.json"))["target_modules"];
  EXPECT_NE(std::find(targets.begin(), targets.end(), "model.visual.merger.mlp.0"), targets.end()) << targets;
  auto r = run_command(mm_binary() + " convert merge-lora --quiet --base " + dir + "/base --adapter " + dir +
                       "/adapter --out " + dir + "/merged");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto eval = [&](const std::string& model, const std::string& extra, const std::string& report) {
    auto e = run_command(mm_binary() + " eval --model " + model + " --config " + cfg + " --data " + dir +
                         "/train.jsonl --max-new-tokens 6 --keep-predictions -1 --report " + dir + "/" + report + extra);
    EXPECT_EQ(e.exit_code, 0) << e.output;
    return json::parse(read_file(dir + "/" + report));
  };
  const json adapted = eval(dir + "/base", " --adapter " + dir + "/adapter", "adapter.json");
  const json merged = eval(dir + "/merged", "", "merged.json");
  const json plain = eval(dir + "/base", "", "plain.json");
  const double a = adapted["loss"]["mean"], m = merged["loss"]["mean"], p = plain["loss"]["mean"];
  EXPECT_NEAR(a, m, 1e-5 * m);
  EXPECT_GT(std::abs(a - p), 1e-3 * p) << "the adapter changed nothing";
  ASSERT_EQ(adapted["predictions"].size(), 24u);
  for (size_t i = 0; i < 24; ++i)
    EXPECT_EQ(adapted["predictions"][i]["prediction"], merged["predictions"][i]["prediction"]) << i;
  std::printf("mm eval --adapter: loss %.6f, merged %.6f, base alone %.6f\n", a, m, p);
}

// A frozen base in bf16 (features.lora.base_dtype: bf16, under bf16 autocast): the base's bytes
// halve, the adapters stay fp32 and train to the losses of the fp32 base within bf16's rounding,
// TP2 gives one process's run, and the layouts it cannot serve are one-line config errors.
TEST(LoraTrain, Bf16BaseHalvesTheBaseAndTracksTheFp32Base) {
  using namespace mm::test;
  const std::string dir = fresh_dir("lora_bf16_base");
  const std::string cfg = text_config(dir);
  const std::string lora = kTextLora + " training.precision=bf16";
  const TrainRun fp32 = train(cfg, 1, dir + "/fp32.jsonl", lora + " training.export_dir=" + dir + "/fp32_adapter");
  const TrainRun bf16 = train(cfg, 1, dir + "/bf16.jsonl", lora + " features.lora.base_dtype=bf16 training.export_dir=" +
                                                              dir + "/bf16_adapter");
  EXPECT_NE(bf16.output.find("plan: LoRA base held in bf16 ("), std::string::npos) << bf16.output;
  ASSERT_EQ(fp32.losses.size(), 20u) << fp32.output;
  ASSERT_EQ(bf16.losses.size(), 20u) << bf16.output;
  double worst = 0;
  for (auto& [it, l] : fp32.losses) worst = std::max(worst, std::abs(bf16.losses.at(it) - l) / l);
  EXPECT_LT(worst, 2e-2) << "bf16 base against fp32 base";
  EXPECT_LT(bf16.losses.rbegin()->second, 0.8 * bf16.losses.begin()->second) << "the adapters did not learn";
  // Parameter bytes: the frozen base (embeddings, norms, every base weight) at 2 bytes, the
  // adapters and lm_head at 4; gradients and optimizer state unchanged.
  auto params_mib = [](const std::string& out) {
    const auto at = out.find("memory per rank: parameters ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 28));
  };
  const double p32 = params_mib(fp32.output), p16 = params_mib(bf16.output);
  mm::st::HFWeights adapter(dir + "/bf16_adapter");
  double trainable = 0;
  for (const auto& k : adapter.keys()) {
    EXPECT_EQ(adapter.get(k).scalar_type(), at::kFloat) << k;
    trainable += adapter.get(k).numel() * 4.0 / (1 << 20);
  }
  EXPECT_NEAR(p16, trainable + (p32 - trainable) / 2, 0.02) << "fp32 " << p32 << " MiB, bf16 base " << p16 << " MiB";
  std::printf("LoRA bf16 base: parameters %.2f MiB (fp32 base %.2f MiB), max relative loss difference %.2e\n", p16, p32,
              worst);
  // Tensor parallelism splits the bf16 base as it does the fp32 one.
  const TrainRun tp = train(cfg, 2, dir + "/tp2.jsonl", lora + " features.lora.base_dtype=bf16 parallel.tensor_parallel_size=2");
  ASSERT_EQ(tp.losses.size(), 20u) << tp.output;
  double tp_worst = 0;
  for (auto& [it, l] : bf16.losses) tp_worst = std::max(tp_worst, std::abs(tp.losses.at(it) - l) / l);
  EXPECT_LT(tp_worst, 2e-2) << "TP2 bf16 base against one process";

  auto r = run_command(mm_binary() + " train " + cfg + lora + " features.lora.base_dtype=bf16 training.precision=fp32");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("features.lora.base_dtype: bf16 needs training.precision: bf16"), std::string::npos) << r.output;
  r = run_command(mm_launch(2) + mm_binary() + " train " + cfg + lora +
                  " features.lora.base_dtype=bf16 parallel.data_parallel_shard_size=2 training.micro_batch_size=2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("use parallel.fsdp.param_dtype: bf16"), std::string::npos) << r.output;
}

// LoRA on the Wan DiT (diffusers' module names: to_q, to_v, the FFN's first projection): the
// adapted transformer predicts what the same transformer with W + (alpha / r) B A merged into
// each targeted weight predicts, and only the adapters take gradients.
TEST(Lora, WanDiTAdaptersEqualMergedWeights) {
  const json cfg = {{"_class_name", "WanTransformer3DModel"}, {"patch_size", {1, 2, 2}}, {"num_attention_heads", 2},
                    {"attention_head_dim", 12}, {"in_channels", 4}, {"out_channels", 4}, {"text_dim", 16},
                    {"freq_dim", 16}, {"ffn_dim", 32}, {"num_layers", 2}, {"rope_max_seq_len", 32}};
  auto make = [&] {
    auto m = mm::models::model_registry().get("wan_dit", "test")(cfg, "test", false);
    m->init_weights(3);
    mm::test::perturb_norms_and_biases(*m, 3);
    return std::static_pointer_cast<mm::models::WanTransformer3DModel>(m);
  };
  auto adapted = make(), merged = make();
  mm::config::LoraConfig c;
  c.target = {"to_q", "attn2.to_v", "ffn.net.0.proj"};
  c.rank = 4;
  c.alpha = 6;
  const auto layout = mm::training::apply_lora_plan(*adapted, c);
  EXPECT_EQ(layout.targets.size(), 2u * (2 + 1 + 1));  // per block: attn1.to_q, attn2.to_q, attn2.to_v, ffn
  mm::training::init_lora_weights(*adapted, layout, 5);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(8);
  std::map<std::string, at::Tensor> params;
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : adapted->named_parameters()) {
      if (name.find("lora_B") != std::string::npos) p.normal_(0, 0.3, gen);
      params.emplace(name, p);
    }
    for (auto& [name, p] : merged->named_parameters()) {
      const std::string module = name.substr(0, name.size() - 7);
      if (params.count(module + ".lora_A.weight"))
        p.add_(at::matmul(params.at(module + ".lora_B.weight"), params.at(module + ".lora_A.weight")) * layout.scaling);
    }
  }
  at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor latents = at::randn({1, 4, 2, 4, 4}, g2), text = at::randn({1, 5, 16}, g2);
  const at::Tensor t = at::tensor({500.0f});
  const at::Tensor want = merged->forward(latents, t, text).detach();
  const at::Tensor got = adapted->forward(latents, t, text);
  EXPECT_LT(mm::test::rel_err(got.detach(), want), 1e-5);
  got.square().sum().backward();
  for (auto& [name, p] : adapted->named_parameters())
    EXPECT_EQ(p.grad().defined(), mm::training::LoraLayout::is_adapter(name)) << name;
}
