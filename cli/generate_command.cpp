// `mm generate` and `mm eval`.
//   mm generate --model DIR [--image P]... [--video P]... --prompt TEXT [sampling options]
//   mm generate --model DIR --interactive           one user turn per stdin line, history kept
//   mm eval --model DIR --data test.jsonl [--report report.json] [--max-samples N]
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/mllm/mllm_options.h"
#include "mindspeed_mm/inference/eval.h"
#include "mindspeed_mm/inference/generate.h"
#include "mindspeed_mm/inference/model_loader.h"
#include "mindspeed_mm/training/lora.h"

namespace mm::cli {
namespace {

struct CommonArgs {
  std::string model, config, adapter;
  std::vector<std::string> set;
  std::string device = "auto";
  inference::SamplingOptions sampling;
  bool no_cache = false;
};

struct GenerateArgs {
  CommonArgs c;
  std::vector<std::string> images, videos, stop;
  std::string prompt, system;
  bool interactive = false, json = false;
} gen_args;

struct EvalArgs {
  CommonArgs c;
  std::string data, media_root, report, metrics = "generate,loss";
  int64_t max_samples = 0, keep_predictions = 20;
  int threads = 0;
} eval_args;

void add_common(CLI::App* c, CommonArgs& a, int64_t default_new_tokens) {
  a.sampling.max_new_tokens = default_new_tokens;
  c->add_option("--model", a.model, "HF model directory, training checkpoint (save/iter_N) or save dir")->required();
  c->add_option("--adapter", a.adapter, "a PEFT LoRA adapter directory run on the model without merging");
  c->add_option("--config", a.config, "YAML whose data section sets tokenizer, chat template and processor "
                                      "(default: the checkpoint's training config)");
  c->add_option("--device", a.device, "auto (a GPU when there is one), cpu, cuda or cuda:N");
  c->add_option("--set", a.set, "data.key=value overrides of the prompt settings, e.g. data.system=\"Be brief.\"");
  c->add_option("--max-new-tokens", a.sampling.max_new_tokens, "tokens to generate at most");
  c->add_option("--temperature", a.sampling.temperature, "0 = greedy; > 0 samples");
  c->add_option("--top-k", a.sampling.top_k, "keep the k most likely tokens (0 = off)");
  c->add_option("--top-p", a.sampling.top_p, "nucleus sampling mass (1 = off)");
  c->add_option("--repetition-penalty", a.sampling.repetition_penalty, "CTRL-style penalty on seen tokens (1 = off)");
  c->add_option("--stop-token-id", a.sampling.stop_token_ids, "extra token ids that end generation (eos always does)");
  c->add_option("--seed", a.sampling.seed, "sampling seed");
  c->add_flag("--no-cache", a.no_cache, "recompute the whole sequence every step (the KV cache's reference)");
}

struct Session {
  inference::LoadedModel loaded;
  std::unique_ptr<data::SampleEncoder> encoder;
  config::DataConfig data;
};

Session open_session(const CommonArgs& a) {
  Session s;
  const at::Device device = resolve_device(a.device, 0, "--device");
  set_current_device(device);
  s.loaded = inference::load_model(a.model, device);
  if (!a.adapter.empty()) {
    const auto lora = training::attach_peft_adapter(*s.loaded.model, a.adapter);
    std::fprintf(stderr, "adapter: %s (LoRA rank %lld on %zu layers)\n", a.adapter.c_str(),
                 static_cast<long long>(lora.config.rank), lora.targets.size());
  }
  s.data = inference::inference_data_config(s.loaded, a.config, a.set);
  s.encoder = std::make_unique<data::SampleEncoder>(data::mllm_tokenizer(s.data), data::encoder_options(s.data));
  return s;
}

// The user's text with one placeholder per image and video in front, unless it places them.
std::string with_placeholders(const std::string& text, size_t images, size_t videos) {
  std::string p;
  if (data::count_placeholder(text, "<image>") == 0)
    for (size_t i = 0; i < images; ++i) p += "<image>";
  if (data::count_placeholder(text, "<video>") == 0)
    for (size_t i = 0; i < videos; ++i) p += "<video>";
  return p + text;
}

int run_generate() {
  GenerateArgs& g = gen_args;
  MM_CHECK(g.interactive || !g.prompt.empty(), "generate: give --prompt TEXT or --interactive");
  Session s = open_session(g.c);
  inference::SamplingOptions o = g.c.sampling;
  o.use_cache = !g.c.no_cache;
  o.stop_token_ids.push_back(s.encoder->eos_id());
  if (!s.loaded.model->has_vision() && (!g.images.empty() || !g.videos.empty()))
    throw Error(cat("generate: ", s.loaded.dir, " is a text model (", s.loaded.model->type_name(),
                    "): it takes no --image / --video"));
  data::MllmRecord rec;
  rec.source = "command line";
  rec.images = g.images;
  rec.videos = g.videos;
  if (!g.system.empty()) rec.messages.push_back({"system", g.system});
  const auto& tok = s.encoder->tokenizer();
  auto stop_strings = [&](const std::vector<int64_t>& t) {
    if (g.stop.empty()) return false;
    const std::string text = tok.decode(t, true);
    for (const auto& st : g.stop)
      if (text.size() >= st.size() && text.compare(text.size() - st.size(), st.size(), st) == 0) return true;
    return false;
  };
  auto answer = [&](const std::string& user_text) {
    rec.messages.push_back({"user", rec.messages.size() <= 1 ? with_placeholders(user_text, g.images.size(), g.videos.size())
                                                            : user_text});
    inference::Generation out = inference::generate(*s.loaded.model, inference::sample_inputs(s.encoder->encode_prompt(rec)), o, stop_strings);
    std::string text = tok.decode(out.tokens, true);
    for (const auto& st : g.stop)
      if (text.size() >= st.size() && text.compare(text.size() - st.size(), st.size(), st) == 0) text.resize(text.size() - st.size());
    rec.messages.push_back({"assistant", text});
    const double tps = out.decode_seconds > 0 ? static_cast<double>(out.tokens.size()) / out.decode_seconds : 0;
    if (g.json) {
      nlohmann::json j = {{"text", text},
                          {"tokens", out.tokens},
                          {"finish_reason", out.finish_reason},
                          {"prompt_tokens", out.prompt_tokens},
                          {"prefill_seconds", out.prefill_seconds},
                          {"decode_seconds", out.decode_seconds}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s\n", text.c_str());
      std::fprintf(stderr, "[%zu tokens, %s; prompt %lld tokens, prefill %.3f s, decode %.1f tokens/s%s]\n",
                   out.tokens.size(), out.finish_reason.c_str(), static_cast<long long>(out.prompt_tokens),
                   out.prefill_seconds, tps, o.use_cache ? "" : ", no cache");
    }
    std::fflush(stdout);
  };
  if (!g.interactive) {
    answer(g.prompt);
    return 0;
  }
  if (!g.prompt.empty()) answer(g.prompt);
  std::string line;
  while (std::fprintf(stderr, "> "), std::getline(std::cin, line)) {
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    answer(line);
  }
  return 0;
}

int run_eval() {
  EvalArgs& e = eval_args;
  Session s = open_session(e.c);
  inference::EvalOptions o;
  o.sampling = e.c.sampling;
  o.sampling.use_cache = !e.c.no_cache;
  o.max_samples = e.max_samples;
  o.threads = e.threads;
  o.keep_predictions = e.keep_predictions;
  o.generate = e.metrics.find("generate") != std::string::npos;
  o.loss = e.metrics.find("loss") != std::string::npos;
  MM_CHECK(o.generate || o.loss, "eval: --metrics must name generate, loss or both (got '", e.metrics, "')");
  data::MllmFile file = data::read_mllm_file(e.data, s.data.attr, e.media_root);
  for (size_t i = 0; i < file.bad.size() && i < 5; ++i)
    std::fprintf(stderr, "warning: skipping bad record %s: %s\n", file.bad[i].source.c_str(), file.bad[i].reason.c_str());
  MM_CHECK(!file.records.empty(), "eval: ", e.data, " holds no usable records");
  const int64_t total = o.max_samples > 0 ? std::min<int64_t>(o.max_samples, file.records.size()) : file.records.size();
  std::fprintf(stderr, "eval: %lld samples of %s with %s (%lld parameters)\n", static_cast<long long>(total),
               e.data.c_str(), s.loaded.model->type_name().c_str(), static_cast<long long>(s.loaded.model->num_parameters()));
  const int64_t step = std::max<int64_t>(1, total / 10);
  inference::EvalReport rep = inference::evaluate(*s.loaded.model, *s.encoder, file.records, o, [&](int64_t done, int64_t n) {
    if (done % step == 0 || done == n) std::fprintf(stderr, "eval: %lld/%lld\n", static_cast<long long>(done), static_cast<long long>(n));
  });
  for (const auto& m : rep.error_messages) std::fprintf(stderr, "warning: not scored: %s\n", m.c_str());
  std::printf("%s", rep.table().c_str());
  if (!e.report.empty()) {
    nlohmann::json j = rep.to_json();
    j["model"] = s.loaded.dir;
    j["data"] = e.data;
    j["bad_records"] = file.bad.size();
    const std::string tmp = e.report + ".tmp";
    {
      std::ofstream f(tmp);
      MM_CHECK(f.good(), "eval: cannot write ", tmp);
      f << j.dump(2) << "\n";
      MM_CHECK(f.good(), "eval: writing ", tmp, " failed");
    }
    MM_CHECK(std::rename(tmp.c_str(), e.report.c_str()) == 0, "eval: cannot rename ", tmp, " to ", e.report);
    std::printf("report: %s\n", e.report.c_str());
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* c = app.add_subcommand("generate", "Chat with a model from the command line (images and video too)");
  add_common(c, gen_args.c, 128);
  c->add_option("--prompt,-p", gen_args.prompt, "the user's message");
  c->add_option("--image", gen_args.images, "image files, in order (a <image> is put before the prompt for each)");
  c->add_option("--video", gen_args.videos, "video files, in order");
  c->add_option("--system", gen_args.system, "system prompt (default: the chat template's)");
  c->add_option("--stop", gen_args.stop, "strings that end generation (removed from the reply)");
  c->add_flag("--interactive,-i", gen_args.interactive, "read further user turns from stdin (/exit ends)");
  c->add_flag("--json", gen_args.json, "print one JSON object per reply (text, tokens, finish_reason, timings)");
  c->footer(
      "Examples:\n"
      "  mm generate --model out/quickstart_vl/hf --image shoe.png --prompt \"What is shown in this picture?\"\n"
      "  mm generate --model out/run --prompt \"Hello\" --temperature 0.7 --top-p 0.9 --seed 1\n"
      "Exit codes: 0 done, 1 runtime error (model, media), 2 configuration error.");
  register_action(c, run_generate);
}

void add_eval_command(CLI::App& app) {
  auto* c = app.add_subcommand("eval", "Score a model on an mllm-format test file: VQA / multiple-choice accuracy, loss");
  add_common(c, eval_args.c, 32);
  c->add_option("--data", eval_args.data, "mllm JSON/JSONL whose records end with the reference answer")->required();
  c->add_option("--media-root", eval_args.media_root, "relative media paths resolve here (default: the file's folder)");
  c->add_option("--metrics", eval_args.metrics, "generate (accuracy), loss (teacher-forced), or both: generate,loss");
  c->add_option("--max-samples", eval_args.max_samples, "score the first N records (0 = all)");
  c->add_option("--threads", eval_args.threads, "samples evaluated in parallel (0 = one per core); results do not change");
  c->add_option("--report", eval_args.report, "write the JSON report here");
  c->add_option("--keep-predictions", eval_args.keep_predictions, "per-sample predictions in the report (-1 = all)");
  c->footer(
      "Examples:\n"
      "  mm eval --model out/quickstart_vl --data out/fashion_mnist/test.jsonl --report out/eval.json\n"
      "Exit codes: 0 done, 1 runtime error, 2 configuration error.");
  register_action(c, run_eval);
}

}  // namespace mm::cli
