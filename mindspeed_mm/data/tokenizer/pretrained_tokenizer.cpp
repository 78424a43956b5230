#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"

#include <filesystem>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_model.h"

namespace mm::data {

namespace fs = std::filesystem;

namespace {

// transformers' LlamaTokenizerFast / GemmaTokenizerFast (and CodeLlama's) rebuild their
// post-processor from add_bos_token / add_eos_token in __init__.
bool rebuilds_post_processor(const std::string& tokenizer_class) {
  for (const char* c : {"LlamaTokenizer", "LlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast",
                        "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"})
    if (tokenizer_class == c) return true;
  return false;
}

}  // namespace

PretrainedTokenizer load_pretrained_tokenizer(const std::string& path) {
  fs::path p(path);
  if (!fs::exists(p)) throw Error(cat(path, ": no such tokenizer file or directory"));
  fs::path dir = fs::is_directory(p) ? p : p.parent_path();
  TokenizerConfig config;
  if (fs::exists(dir / "tokenizer_config.json")) config = load_tokenizer_config((dir / "tokenizer_config.json").string());

  auto load = [&]() -> std::pair<Tokenizer, std::string> {
    if (!fs::is_directory(p)) return {Tokenizer::from_file(path), path};
    if (fs::exists(dir / "tokenizer.json")) {
      std::string f = (dir / "tokenizer.json").string();
      return {Tokenizer::from_file(f), f};
    }
    if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"))
      return {Tokenizer::from_gpt2_files((dir / "vocab.json").string(), (dir / "merges.txt").string()),
              (dir / "vocab.json").string()};
    if (fs::exists(dir / "vocab.txt")) {
      std::string f = (dir / "vocab.txt").string();
      return {Tokenizer::from_bert_vocab(f, config.do_lower_case.value_or(true)), f};
    }
    if (fs::exists(dir / "tokenizer.model")) {
      std::string f = (dir / "tokenizer.model").string();
      return {Tokenizer::from_json_text(SentencePieceModel::from_file(f).unigram_tokenizer_json(f), f), f};
    }
    throw Error(cat(path, ": holds no tokenizer.json, vocab.json + merges.txt, vocab.txt or tokenizer.model"));
  };
  auto [tokenizer, source] = load();

  if (rebuilds_post_processor(config.tokenizer_class)) {
    bool bos = config.has_add_bos_token ? config.add_bos_token : true;
    bool eos = config.has_add_eos_token ? config.add_eos_token : false;
    std::string cfg = (dir / "tokenizer_config.json").string();
    if (bos && !config.bos_token) throw Error(cat(cfg, ": add_bos_token is true but bos_token is not set"));
    if (eos && !config.eos_token) throw Error(cat(cfg, ": add_eos_token is true but eos_token is not set"));
    try {
      tokenizer = tokenizer.with_bos_eos(bos ? config.bos_token : std::nullopt, eos ? config.eos_token : std::nullopt);
    } catch (const Error& e) {
      throw Error(cat(cfg, ": ", e.what()));
    }
  }
  return {std::move(tokenizer), std::move(config), std::move(source)};
}

}  // namespace mm::data
