// `mm convert wan`: Wan2.1 text-to-video checkpoints between the original release's layout and
// diffusers' pipeline layout (checkpoint/convert.h).
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include "mindspeed_mm/checkpoint/convert.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/models/umt5/umt5.h"
#include "mindspeed_mm/models/wan/wan_dit.h"
#include "mindspeed_mm/models/wan/wan_vae.h"

namespace fs = std::filesystem;

namespace mm::checkpoint {
namespace {

constexpr const char* kVaeFile = "Wan2.1_VAE.pth";
constexpr const char* kT5File = "models_t5_umt5-xxl-enc-bf16.pth";
constexpr const char* kTokenizerDir = "google/umt5-xxl";
constexpr const char* kDiffusersVersion = "0.42.1";

nlohmann::json read_json_file(const std::string& path) {
  auto bytes = read_file_bytes(path);
  if (!bytes) throw Error(cat("convert: cannot read '", path, "'"));
  nlohmann::json j = nlohmann::json::parse(*bytes, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(cat("convert: '", path, "' is not a JSON object"));
  return j;
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  st::write_file_atomic(path.string(), j.dump(2) + "\n");
}

at::ScalarType written_dtype(at::ScalarType stored, const ConvertOptions& o) {
  if (o.dtype == "keep" || !at::isFloatingType(stored)) return stored;
  return o.dtype == "bf16" ? at::kBFloat16 : o.dtype == "fp16" ? at::kHalf : at::kFloat;
}

// One part's tensors: the model's parameters in its order, each read from `weights` under the
// key match_checkpoint_names paired with it, written under out_name(parameter).
struct PartWriter {
  const st::HFWeights& weights;
  std::vector<std::pair<std::string, std::string>> order;  // (model name, checkpoint key)
  std::function<std::string(const std::string&)> out_name;
  const ConvertOptions& options;
  ConvertSummary& summary;

  std::vector<st::TensorSpec> specs() const {
    std::vector<st::TensorSpec> out;
    for (const auto& [name, key] : order) {
      const st::TensorInfo info = weights.info(key);
      out.push_back({out_name(name), written_dtype(info.dtype, options), info.shape});
    }
    return out;
  }
  // fetch(out name): the tensor in its written dtype; the previous one's mapped pages given back.
  st::TensorFetch fetch() {
    auto by_out = std::make_shared<std::map<std::string, std::string>>();
    for (const auto& [name, key] : order) (*by_out)[out_name(name)] = key;
    auto previous = std::make_shared<at::Tensor>();
    auto previous_key = std::make_shared<std::string>();
    return [this, by_out, previous, previous_key](const std::string& name) {
      if (previous->defined()) weights.release(*previous_key, previous->data_ptr(), previous->nbytes());
      const std::string& key = by_out->at(name);
      at::Tensor t = weights.get(key);
      *previous = t;
      *previous_key = key;
      const at::ScalarType dt = written_dtype(t.scalar_type(), options);
      if (dt != t.scalar_type()) t = t.to(dt);
      summary.bytes += static_cast<int64_t>(t.nbytes());
      ++summary.tensors;
      return t;
    };
  }
};

std::vector<std::pair<std::string, std::string>> match(const mm::nn::Module& model, const st::HFWeights& weights,
                                                       const std::string& source, const std::vector<std::string>& optional,
                                                       const std::function<std::string(const std::string&)>& rename) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (auto& [name, p] : model.named_parameters()) wanted.emplace_back(name, mm::nn::full_shape(p));
  const auto keys = match_checkpoint_names(
      wanted, weights.keys(), [&](const std::string& k) { return weights.info(k).shape; }, source, optional, rename);
  std::vector<std::pair<std::string, std::string>> order;
  for (const auto& [name, _] : wanted) order.emplace_back(name, keys.at(name));
  return order;
}

int64_t json_int(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || !j.at(key).is_number_integer())
    throw Error(cat("convert: ", source, ": '", key, "' missing or not an integer"));
  return j.at(key).get<int64_t>();
}

// The original release's config.json (Wan's WanModel arguments) <-> diffusers' transformer config.
nlohmann::json dit_config_to_diffusers(const nlohmann::json& o, const st::HFWeights& weights, const std::string& source) {
  const std::string type = o.value("model_type", "t2v");
  if (type != "t2v")
    throw Error(cat("convert: ", source, ": model_type '", type, "': only text-to-video (t2v) Wan2.1 models are implemented"));
  const int64_t dim = json_int(o, "dim", source), heads = json_int(o, "num_heads", source);
  if (heads <= 0 || dim % heads != 0) throw Error(cat("convert: ", source, ": dim ", dim, " does not divide by num_heads ", heads));
  nlohmann::json d = {{"num_attention_heads", heads},
                      {"attention_head_dim", dim / heads},
                      {"in_channels", json_int(o, "in_dim", source)},
                      {"out_channels", json_int(o, "out_dim", source)},
                      {"ffn_dim", json_int(o, "ffn_dim", source)},
                      {"freq_dim", json_int(o, "freq_dim", source)},
                      {"num_layers", json_int(o, "num_layers", source)},
                      {"eps", o.value("eps", 1e-6)},
                      {"cross_attn_norm", o.value("cross_attn_norm", true)}};
  // What the config leaves at Wan's defaults, read from the tensors themselves.
  if (weights.has("text_embedding.0.weight")) d["text_dim"] = weights.info("text_embedding.0.weight").shape.at(1);
  else d["text_dim"] = o.value("text_dim", 4096);
  if (weights.has("patch_embedding.weight")) {
    const auto s = weights.info("patch_embedding.weight").shape;
    if (s.size() == 5) d["patch_size"] = {s[2], s[3], s[4]};
  } else if (o.contains("patch_size")) {
    d["patch_size"] = o.at("patch_size");
  }
  return d;
}

nlohmann::json dit_config_to_original(const models::WanDiTConfig& c) {
  nlohmann::json o = {{"_class_name", "WanModel"}, {"_diffusers_version", "0.30.0"},
                      {"dim", c.dim()},            {"eps", c.eps},
                      {"ffn_dim", c.ffn_dim},      {"freq_dim", c.freq_dim},
                      {"in_dim", c.in_channels},   {"model_type", "t2v"},
                      {"num_heads", c.num_attention_heads}, {"num_layers", c.num_layers},
                      {"out_dim", c.out_channels}, {"text_len", 512}};
  if (c.patch_size != std::vector<int64_t>{1, 2, 2}) o["patch_size"] = c.patch_size;
  if (c.text_dim != 4096) o["text_dim"] = c.text_dim;
  if (!c.cross_attn_norm) o["cross_attn_norm"] = false;
  return o;
}

// umT5's configuration from the original encoder's tensors (the .pth carries no config).
models::UMT5Config umt5_config_from_tensors(const st::HFWeights& w, const std::string& source) {
  auto shape = [&](const std::string& k) {
    if (!w.has(k)) throw Error(cat("convert: ", source, " has no tensor '", k, "' (not Wan's umT5 encoder?)"));
    return w.info(k).shape;
  };
  models::UMT5Config c;
  const auto emb = shape("token_embedding.weight");
  c.vocab_size = emb.at(0);
  c.d_model = emb.at(1);
  const auto pos = shape("blocks.0.pos_embedding.embedding.weight");
  c.relative_attention_num_buckets = pos.at(0);
  c.num_heads = pos.at(1);
  c.d_kv = shape("blocks.0.attn.q.weight").at(0) / c.num_heads;
  c.d_ff = shape("blocks.0.ffn.fc1.weight").at(0);
  c.num_layers = 0;
  while (w.has(cat("blocks.", c.num_layers, ".norm1.weight"))) ++c.num_layers;
  return c;
}

std::string find_file(const fs::path& dir, const std::string& preferred, const std::string& prefix, const std::string& contains) {
  if (fs::is_regular_file(dir / preferred)) return (dir / preferred).string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && n.size() > 4 && n.compare(n.size() - 4, 4, ".pth") == 0 && n.rfind(prefix, 0) == 0 &&
        n.find(contains) != std::string::npos)
      return e.path().string();
  }
  return "";
}

void copy_dir(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to, ec);
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
  if (ec) throw Error(cat("convert: cannot copy '", from.string(), "' to '", to.string(), "': ", ec.message()));
}

ConvertSummary original_to_diffusers(const fs::path& in, const fs::path& out, const WanConvertOptions& o,
                                     std::vector<std::string>& parts) {
  ConvertSummary s;
  // Transformer: config.json + diffusion_pytorch_model*.safetensors at the top.
  if (fs::is_regular_file(in / "config.json")) {
    const std::string cfg_path = (in / "config.json").string();
    const nlohmann::json orig = read_json_file(cfg_path);
    st::HFWeights weights(in.string());
    const auto cfg = models::WanDiTConfig::from_json(dit_config_to_diffusers(orig, weights, cfg_path), cfg_path, false);
    std::unique_ptr<models::WanTransformer3DModel> model;
    {
      mm::nn::DeferredInitGuard deferred;
      model = std::make_unique<models::WanTransformer3DModel>(cfg);
    }
    PartWriter w{weights, match(*model, weights, in.string(), {}, models::wan_dit_diffusers_name),
                 [](const std::string& n) { return n; }, o, s};
    st::save_hf_weights((out / "transformer").string(), w.specs(), w.fetch(), o.max_shard_bytes, "diffusion_pytorch_model");
    write_json(out / "transformer" / "config.json", cfg.to_json());
    parts.push_back("transformer");
  }
  // VAE: Wan2.1_VAE.pth, with Wan2.1's configuration unless --vae-config names another.
  if (const std::string vae = find_file(in, kVaeFile, "", "VAE"); !vae.empty()) {
    const models::WanVAEConfig cfg = o.vae_config.empty()
                                         ? models::WanVAEConfig::wan2_1()
                                         : models::WanVAEConfig::from_json(read_json_file(o.vae_config), o.vae_config);
    std::unique_ptr<models::AutoencoderKLWan> model;
    {
      mm::nn::DeferredInitGuard deferred;
      model = std::make_unique<models::AutoencoderKLWan>(cfg);
    }
    st::HFWeights weights(vae);
    PartWriter w{weights,
                 match(*model, weights, vae, {}, [&](const std::string& k) { return model->parameter_name(k); }),
                 [](const std::string& n) { return n; }, o, s};
    st::save_hf_weights((out / "vae").string(), w.specs(), w.fetch(), o.max_shard_bytes, "diffusion_pytorch_model");
    write_json(out / "vae" / "config.json", cfg.to_json());
    parts.push_back("vae");
  }
  // Text encoder: models_t5_umt5-xxl-enc-bf16.pth, its configuration read from its tensors.
  if (const std::string t5 = find_file(in, kT5File, "models_t5", ""); !t5.empty()) {
    st::HFWeights weights(t5);
    const models::UMT5Config cfg =
        o.text_encoder_config.empty()
            ? umt5_config_from_tensors(weights, t5)
            : models::UMT5Config::from_json(read_json_file(o.text_encoder_config), o.text_encoder_config, false);
    std::unique_ptr<models::UMT5EncoderModel> model;
    {
      mm::nn::DeferredInitGuard deferred;
      model = std::make_unique<models::UMT5EncoderModel>(cfg);
    }
    PartWriter w{weights, match(*model, weights, t5, models::UMT5EncoderModel::optional_checkpoint_tensors(), models::umt5_hf_name),
                 [](const std::string& n) { return n; }, o, s};
    st::save_hf_weights((out / "text_encoder").string(), w.specs(), w.fetch(), o.max_shard_bytes, "model");
    write_json(out / "text_encoder" / "config.json", cfg.to_json());
    parts.push_back("text_encoder");
  }
  std::string tokenizer_class = "T5TokenizerFast";
  if (fs::is_directory(in / kTokenizerDir)) {
    copy_dir(in / kTokenizerDir, out / "tokenizer");
    if (fs::is_regular_file(out / "tokenizer" / "tokenizer_config.json")) {
      const nlohmann::json tc = read_json_file((out / "tokenizer" / "tokenizer_config.json").string());
      if (tc.contains("tokenizer_class") && tc.at("tokenizer_class").is_string())
        tokenizer_class = tc.at("tokenizer_class").get<std::string>();
    }
    parts.push_back("tokenizer");
  }
  if (parts.empty())
    throw Error(cat("convert: '", in.string(), "' holds no original Wan2.1 part (config.json + safetensors, ", kVaeFile,
                    ", ", kT5File, ", ", kTokenizerDir, "/)"));
  // The scheduler Wan2.1's diffusers pipelines ship (UniPC on flow-matching sigmas).
  write_json(out / "scheduler" / "scheduler_config.json",
             {{"_class_name", "UniPCMultistepScheduler"}, {"_diffusers_version", kDiffusersVersion},
              {"beta_end", 0.02}, {"beta_schedule", "linear"}, {"beta_start", 0.0001},
              {"disable_corrector", nlohmann::json::array()}, {"dynamic_thresholding_ratio", 0.995},
              {"final_sigmas_type", "zero"}, {"flow_shift", o.flow_shift}, {"lower_order_final", true},
              {"num_train_timesteps", 1000}, {"predict_x0", true}, {"prediction_type", "flow_prediction"},
              {"rescale_betas_zero_snr", false}, {"sample_max_value", 1.0}, {"solver_order", 2}, {"solver_p", nullptr},
              {"solver_type", "bh2"}, {"steps_offset", 0}, {"thresholding", false}, {"timestep_spacing", "linspace"},
              {"trained_betas", nullptr}, {"use_beta_sigmas", false}, {"use_exponential_sigmas", false},
              {"use_flow_sigmas", true}, {"use_karras_sigmas", false}});
  auto entry = [&](const char* part, const char* lib, const std::string& cls) {
    return std::find(parts.begin(), parts.end(), part) != parts.end() ? nlohmann::json::array({lib, cls})
                                                                      : nlohmann::json::array({nullptr, nullptr});
  };
  write_json(out / "model_index.json", {{"_class_name", "WanPipeline"},
                                        {"_diffusers_version", kDiffusersVersion},
                                        {"boundary_ratio", nullptr},
                                        {"expand_timesteps", false},
                                        {"scheduler", {"diffusers", "UniPCMultistepScheduler"}},
                                        {"text_encoder", entry("text_encoder", "transformers", "UMT5EncoderModel")},
                                        {"tokenizer", entry("tokenizer", "transformers", tokenizer_class)},
                                        {"transformer", entry("transformer", "diffusers", "WanTransformer3DModel")},
                                        {"transformer_2", {nullptr, nullptr}},
                                        {"vae", entry("vae", "diffusers", "AutoencoderKLWan")}});
  return s;
}

ConvertSummary diffusers_to_original(const fs::path& in, const fs::path& out, const WanConvertOptions& o,
                                     std::vector<std::string>& parts) {
  ConvertSummary s;
  if (fs::is_directory(in / "transformer")) {
    const std::string dir = (in / "transformer").string();
    const auto cfg = models::WanDiTConfig::from_json(read_hf_config(dir), dir + "/config.json", false);
    std::unique_ptr<models::WanTransformer3DModel> model;
    {
      mm::nn::DeferredInitGuard deferred;
      model = std::make_unique<models::WanTransformer3DModel>(cfg);
    }
    st::HFWeights weights(dir);
    PartWriter w{weights, match(*model, weights, dir, {}, models::wan_dit_diffusers_name), models::wan_dit_original_name, o, s};
    st::save_hf_weights(out.string(), w.specs(), w.fetch(), o.max_shard_bytes, "diffusion_pytorch_model");
    write_json(out / "config.json", dit_config_to_original(cfg));
    parts.push_back("transformer");
  }
  if (fs::is_directory(in / "vae")) {
    const std::string dir = (in / "vae").string();
    const auto cfg = models::WanVAEConfig::from_json(read_hf_config(dir), dir + "/config.json");
    std::unique_ptr<models::AutoencoderKLWan> model;
    {
      mm::nn::DeferredInitGuard deferred;
      model = std::make_unique<models::AutoencoderKLWan>(cfg);
    }
    st::HFWeights weights(dir);
    PartWriter w{weights, match(*model, weights, dir, {}, [&](const std::string& k) { return model->parameter_name(k); }),
                 [&](const std::string& n) { return models::wan_vae_original_name(n, cfg.num_res_blocks); }, o, s};
    st::save_torch_state_dict((out / kVaeFile).string(), w.specs(), w.fetch());
    parts.push_back("vae");
  }
  if (fs::is_directory(in / "text_encoder")) {
    const std::string dir = (in / "text_encoder").string();
    const auto cfg = models::UMT5Config::from_json(read_hf_config(dir), dir + "/config.json", false);
    std::unique_ptr<models::UMT5EncoderModel> model;
    {
      mm::nn::DeferredInitGuard deferred;
      model = std::make_unique<models::UMT5EncoderModel>(cfg);
    }
    st::HFWeights weights(dir);
    PartWriter w{weights, match(*model, weights, dir, models::UMT5EncoderModel::optional_checkpoint_tensors(), models::umt5_hf_name),
                 models::umt5_original_name, o, s};
    st::save_torch_state_dict((out / kT5File).string(), w.specs(), w.fetch());
    parts.push_back("text_encoder");
  }
  if (fs::is_directory(in / "tokenizer")) {
    copy_dir(in / "tokenizer", out / kTokenizerDir);
    parts.push_back("tokenizer");
  }
  if (parts.empty())
    throw Error(cat("convert: '", in.string(), "' holds no diffusers Wan2.1 part (transformer/, vae/, text_encoder/, tokenizer/)"));
  return s;
}

}  // namespace

ConvertSummary convert_wan(const std::string& in, const std::string& out, const WanConvertOptions& o,
                           std::vector<std::string>* parts_out) {
  if (o.from != "original" && o.from != "diffusers") throw ConfigError(cat("convert: --from '", o.from, "': original or diffusers"));
  if (o.to != "original" && o.to != "diffusers") throw ConfigError(cat("convert: --to '", o.to, "': original or diffusers"));
  if (o.from == o.to) throw ConfigError(cat("convert: --from and --to are both '", o.from, "'"));
  if (o.dtype != "keep" && o.dtype != "fp32" && o.dtype != "bf16" && o.dtype != "fp16")
    throw ConfigError(cat("convert: --dtype '", o.dtype, "': expected keep, fp32, bf16 or fp16"));
  if (!fs::is_directory(in)) throw Error(cat("convert: --in '", in, "' is not a directory"));
  StagedOutput staged(out);
  std::vector<std::string> parts;
  ConvertSummary s = o.from == "original" ? original_to_diffusers(in, staged.dir(), o, parts)
                                          : diffusers_to_original(in, staged.dir(), o, parts);
  staged.commit();
  for (const auto& e : fs::recursive_directory_iterator(out))
    if (e.is_regular_file()) {
      const std::string n = e.path().filename().string();
      if (n.size() > 12 && (n.compare(n.size() - 12, 12, ".safetensors") == 0 || n.compare(n.size() - 4, 4, ".pth") == 0)) ++s.files;
    }
  if (parts_out) *parts_out = parts;
  return s;
}

}  // namespace mm::checkpoint
