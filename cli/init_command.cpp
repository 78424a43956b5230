// `mm init`: parts of a model made here instead of downloaded, for small experiments and the
// video quickstart.
//   mm init tokenizer --captions train.jsonl --out PIPE/tokenizer
//       a T5-style Unigram tokenizer whose pieces are the captions' words (word_unigram.h)
//   mm init text-encoder --config '{"d_model": 64, ...}' --seed 0 --out PIPE/text_encoder
//       a umT5 encoder with transformers' initialisation (vocab_size defaults to the tokenizer's
//       given by --tokenizer)
#include <cstdio>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"
#include "mindspeed_mm/data/tokenizer/word_unigram.h"
#include "mindspeed_mm/models/umt5/umt5.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/core/file_io.h"

namespace mm::cli {
namespace {

struct InitArgs {
  std::string captions, field = "cap", out, config = "{}", tokenizer;
  int64_t max_length = 512;
  uint64_t seed = 0;
} args;

int run_init_tokenizer() {
  if (const std::string why = file_problem(args.captions); !why.empty()) throw Error(cat("init: ", args.captions, ": ", why));
  std::ifstream in(args.captions);
  if (!in) throw Error(cat("init: ", args.captions, ": cannot open"));
  std::vector<std::string> captions;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw Error(cat("init: ", args.captions, ":", line_no, ": not a JSON record"));
    }
    if (!r.is_object() || !r.contains(args.field) || !r[args.field].is_string())
      throw Error(cat("init: ", args.captions, ":", line_no, ": no \"", args.field, "\" string"));
    captions.push_back(r[args.field].get<std::string>());
  }
  const std::vector<std::string> words = data::caption_words(captions);
  if (words.empty()) throw Error(cat("init: ", args.captions, ": no captions (\"", args.field, "\") to take words from"));
  data::write_word_unigram_tokenizer(words, args.out, args.max_length);
  const data::Tokenizer tok = data::load_pretrained_tokenizer(args.out).tokenizer;
  std::printf("init: wrote a %lld-token tokenizer (%zu caption words from %zu captions) to %s\n",
              static_cast<long long>(tok.vocab_size()), words.size(), captions.size(), args.out.c_str());
  return 0;
}

int run_init_text_encoder() {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(args.config);
  } catch (const nlohmann::json::exception&) {
    const std::optional<std::string> text = read_file_bytes(args.config);
    if (!text) {
      const std::string p = file_problem(args.config);
      throw ConfigError(cat("config: --config ", args.config, ": neither JSON nor a readable file",
                            p.empty() ? "" : cat(" (", p, ")")));
    }
    try {
      j = nlohmann::json::parse(*text);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(cat("config: ", args.config, ": not JSON (", json_error_text(e.what()), ")"));
    }
  }
  if (!j.is_object()) throw ConfigError("config: --config must be a JSON object of umT5 config.json fields");
  if (!args.tokenizer.empty() && !j.contains("vocab_size"))
    j["vocab_size"] = data::load_pretrained_tokenizer(args.tokenizer).tokenizer.vocab_size();
  const models::UMT5Config c = models::UMT5Config::from_json(j, "--config", true);
  models::UMT5EncoderModel m(c);
  models::init_umt5_weights(m, args.seed);
  models::save_umt5_encoder(m, args.out);
  std::printf("init: wrote a umT5 encoder with %lld parameters (d_model %lld, %lld layers, vocab %lld, seed %llu) to %s\n",
              static_cast<long long>(m.num_parameters()), static_cast<long long>(c.d_model),
              static_cast<long long>(c.num_layers), static_cast<long long>(c.vocab_size),
              static_cast<unsigned long long>(args.seed), args.out.c_str());
  return 0;
}

}  // namespace

void add_init_command(CLI::App& app) {
  auto* c = app.add_subcommand("init", "Make a model part here instead of downloading it: a caption tokenizer, a random text encoder");
  c->require_subcommand(1);
  auto* t = c->add_subcommand("tokenizer", "A T5-style Unigram tokenizer whose pieces are the words of a JSONL's captions");
  t->add_option("--captions", args.captions, "JSONL records with a caption field")->required();
  t->add_option("--field", args.field, "the caption field (cap)");
  t->add_option("--max-length", args.max_length, "model_max_length in tokenizer_config.json (512)");
  t->add_option("--out", args.out, "the tokenizer directory to write")->required();
  register_action(t, run_init_tokenizer);
  auto* e = c->add_subcommand("text-encoder", "A umT5 encoder with transformers' random initialisation");
  e->add_option("--config", args.config, "config.json fields as JSON, or a JSON file (d_model, d_kv, d_ff, num_layers, num_heads, vocab_size)");
  e->add_option("--tokenizer", args.tokenizer, "a tokenizer directory: vocab_size from it when --config has none");
  e->add_option("--seed", args.seed, "initialisation seed (0)");
  e->add_option("--out", args.out, "the encoder directory to write (config.json + model.safetensors)")->required();
  register_action(e, run_init_text_encoder);
}

}  // namespace mm::cli
