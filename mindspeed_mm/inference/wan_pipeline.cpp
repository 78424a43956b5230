#include "mindspeed_mm/inference/wan_pipeline.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/inference/flow_schedulers.h"

namespace fs = std::filesystem;

namespace mm::inference {

WanPipeline load_wan_pipeline(const std::string& dir, at::Device device, bool with_transformer) {
  for (const char* part : {"transformer", "vae", "text_encoder", "tokenizer"})
    if ((with_transformer || std::string(part) != "transformer") && !fs::is_directory(fs::path(dir) / part))
      throw Error(cat("sample: ", dir, " has no ", part, "/ directory: not a Wan pipeline (diffusers' layout: transformer/, "
                      "vae/, text_encoder/, tokenizer/)"));
  WanPipeline p;
  p.vae = models::load_wan_vae(dir + "/vae");
  p.text_encoder = models::load_umt5_encoder(dir + "/text_encoder");
  p.tokenizer = std::make_shared<data::PretrainedTokenizer>(data::load_pretrained_tokenizer(dir + "/tokenizer"));
  p.vae->to(device);
  p.text_encoder->to(device);
  if (!with_transformer) return p;
  const std::string tdir = dir + "/transformer";
  const nlohmann::json hf = checkpoint::read_hf_config(tdir);
  p.transformer = std::make_shared<models::WanTransformer3DModel>(
      models::WanDiTConfig::from_json(hf, tdir + "/config.json", false));
  checkpoint::load_model_weights(*p.transformer, tdir, {}, [&](const std::string& k) { return p.transformer->parameter_name(k); });
  if (p.text_encoder->config.d_model != p.transformer->config.text_dim)
    throw Error(cat("sample: ", dir, ": the text encoder's width ", p.text_encoder->config.d_model,
                    " is not the transformer's text_dim ", p.transformer->config.text_dim));
  if (p.vae->config.z_dim != p.transformer->config.in_channels)
    throw Error(cat("sample: ", dir, ": the VAE's z_dim ", p.vae->config.z_dim, " is not the transformer's in_channels ",
                    p.transformer->config.in_channels));
  p.transformer->to(device);
  return p;
}

std::string clean_prompt(const std::string& text) {
  std::string s = text;
  for (int pass = 0; pass < 2; ++pass) {
    static const std::pair<const char*, const char*> kEntities[] = {
        {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&#x27;", "'"}, {"&nbsp;", " "}, {"&amp;", "&"}};
    for (const auto& [from, to] : kEntities) {
      std::string out;
      const std::string f = from;
      size_t i = 0;
      for (size_t j; (j = s.find(f, i)) != std::string::npos; i = j + f.size()) out += s.substr(i, j - i) + to;
      s = out + s.substr(i);
    }
  }
  std::string out;
  bool space = false;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
    } else {
      if (space) out += ' ';
      space = false;
      out += c;
    }
  }
  return out;
}

at::Tensor encode_prompts(const WanPipeline& pipe, const std::vector<std::string>& prompts, int64_t max_len) {
  const data::Tokenizer& tok = pipe.tokenizer->tokenizer;
  const auto& cfg = pipe.tokenizer->config;
  const int64_t pad = cfg.pad_token ? tok.token_to_id(*cfg.pad_token).value_or(0) : 0;
  const std::vector<int64_t> tail = tok.encode("", true);  // what the template appends (T5: </s>)
  const int64_t b = static_cast<int64_t>(prompts.size());
  at::Tensor ids = at::full({b, max_len}, pad, at::kLong), mask = at::zeros({b, max_len}, at::kLong);
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < b; ++i) {
    const std::string text = clean_prompt(prompts[static_cast<size_t>(i)]);
    std::vector<int64_t> t = tok.encode(text, true);
    if (static_cast<int64_t>(t.size()) > max_len) {  // truncated before the template's tail, as HF does
      t = tok.encode(text, false);
      t.resize(static_cast<size_t>(std::max<int64_t>(0, max_len - static_cast<int64_t>(tail.size()))));
      t.insert(t.end(), tail.begin(), tail.end());
      t.resize(static_cast<size_t>(max_len));
    }
    for (size_t j = 0; j < t.size(); ++j) {
      ids[i][static_cast<int64_t>(j)] = t[j];
      mask[i][static_cast<int64_t>(j)] = 1;
    }
    lengths.push_back(static_cast<int64_t>(t.size()));
  }
  const at::Device device = pipe.text_encoder->shared->weight.device();
  at::NoGradGuard no_grad;
  at::Tensor h = pipe.text_encoder->forward(ids.to(device), mask.to(device));
  for (int64_t i = 0; i < b; ++i) h[i].narrow(0, lengths[static_cast<size_t>(i)], max_len - lengths[static_cast<size_t>(i)]).zero_();
  return h;
}

double resolve_shift(const WanSampleOptions& o) {
  if (o.shift > 0) return o.shift;
  return std::min(o.height, o.width) >= 720 ? 5.0 : 3.0;
}

at::Tensor sample_latents(const WanPipeline& pipe, const std::vector<std::string>& prompts, const WanSampleOptions& o,
                          const std::function<void(int64_t, int64_t)>& progress) {
  const auto& vc = pipe.vae->config;
  const int64_t tf = vc.temporal_factor(), sf = vc.spatial_factor() * pipe.transformer->config.patch_size[1];
  if (o.frames < 1 || (o.frames - 1) % tf != 0)
    throw ConfigError(cat("config: --frames ", o.frames, ": Wan samples 1 + ", tf, "k frames (e.g. 81)"));
  if (o.height % sf != 0 || o.width % sf != 0)
    throw ConfigError(cat("config: --height ", o.height, " --width ", o.width, ": both must be multiples of ", sf));
  if (prompts.empty()) throw ConfigError("config: no prompt to sample");
  at::NoGradGuard no_grad;
  const bool cfg = o.guidance_scale > 1.0;
  const int64_t b = static_cast<int64_t>(prompts.size());
  const at::Tensor cond = encode_prompts(pipe, prompts, o.max_sequence_length);
  at::Tensor text = cond;
  if (cfg) {
    const at::Tensor uncond = encode_prompts(pipe, std::vector<std::string>(prompts.size(), o.negative_prompt), o.max_sequence_length);
    text = at::cat({cond, uncond}, 0);
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const int64_t sfv = vc.spatial_factor();
  at::Tensor latents = at::randn({b, vc.z_dim, (o.frames - 1) / tf + 1, o.height / sfv, o.width / sfv}, gen);
  const at::Device device = pipe.transformer->patch_weight.device();
  latents = latents.to(device);
  FlowSchedulerOptions so;
  so.steps = o.steps;
  so.shift = resolve_shift(o);
  auto scheduler = make_flow_scheduler(o.scheduler, so);
  for (int64_t k = 0; k < scheduler->steps(); ++k) {
    const double t = scheduler->timesteps()[static_cast<size_t>(k)];
    const at::Tensor x = cfg ? at::cat({latents, latents}, 0) : latents;
    const at::Tensor ts = at::full({x.size(0)}, t, at::TensorOptions().dtype(at::kFloat).device(device));
    at::Tensor v = pipe.transformer->forward(x, ts, text);
    if (cfg) {
      const at::Tensor vc_ = v.narrow(0, 0, b), vu = v.narrow(0, b, b);
      v = vu + o.guidance_scale * (vc_ - vu);
    }
    latents = scheduler->step(v, latents);
    if (progress) progress(k + 1, scheduler->steps());
  }
  return latents;
}

}  // namespace mm::inference
