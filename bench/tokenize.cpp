// Tokenizer throughput: our C++ tokenizer on the conformance corpus (tests/tokenizer), as
// bench/run_tokenize.sh compares it with Hugging Face's Rust library (npm `tokenizers`,
// bench/tokenize_baseline.js) on the same lines, the same tokenizer file and thread count.
//
//   tokenize --tokenizer FILE_OR_DIR --corpus FILE [--threads N] [--repeat R] [--rounds K]
//   tokenize --export-json OUT --bert-vocab VOCAB_TXT | --spm-model MODEL
//     writes the tokenizer.json we build from a BERT vocab.txt or a Unigram SentencePiece
//     model, so the baseline runs exactly the same pipeline.
//
// The corpus is read as lines (split on '\n'), repeated R times, and encoded K times with
// encode_batch (add_special_tokens=true); the first round (cold word cache) and the best of the
// others are reported. Prints one line:
//   RESULT impl=mm threads=N lines=L bytes=B tokens=T cold_s=X warm_s=Y warm_mb_s=Z
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_model.h"

int main(int argc, char** argv) {
  std::string tokenizer, corpus, export_json, bert_vocab, spm_model;
  int threads = 1, repeat = 1, rounds = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tokenize: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokenizer") tokenizer = next();
    else if (a == "--corpus") corpus = next();
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--repeat") repeat = std::atoi(next().c_str());
    else if (a == "--rounds") rounds = std::atoi(next().c_str());
    else if (a == "--export-json") export_json = next();
    else if (a == "--bert-vocab") bert_vocab = next();
    else if (a == "--spm-model") spm_model = next();
    else {
      std::fprintf(stderr, "tokenize: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (!export_json.empty()) {
    try {
      std::string j = !bert_vocab.empty() ? mm::data::Tokenizer::bert_tokenizer_json(bert_vocab)
                      : !spm_model.empty() ? mm::data::SentencePieceModel::from_file(spm_model).unigram_tokenizer_json(spm_model)
                                           : throw mm::Error("--export-json needs --bert-vocab or --spm-model");
      std::ofstream(export_json) << j;
      return 0;
    } catch (const mm::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  if (tokenizer.empty() || corpus.empty() || threads < 1 || repeat < 1 || rounds < 2) {
    std::fprintf(stderr, "usage: tokenize --tokenizer FILE_OR_DIR --corpus FILE [--threads N] [--repeat R] [--rounds K>=2]\n");
    return 2;
  }
  try {
    mm::data::Tokenizer tok = mm::data::load_pretrained_tokenizer(tokenizer).tokenizer;
    std::ifstream f(corpus, std::ios::binary);
    if (!f) throw mm::Error(mm::cat(corpus, ": cannot open"));
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    std::vector<std::string> base;
    for (size_t b = 0; b < text.size();) {
      size_t e = text.find('\n', b);
      if (e == std::string::npos) e = text.size();
      base.push_back(text.substr(b, e - b));
      b = e + 1;
    }
    std::vector<std::string> lines;
    size_t bytes = 0;
    for (int r = 0; r < repeat; ++r)
      for (const auto& l : base) {
        lines.push_back(l);
        bytes += l.size();
      }
    double cold = 0, warm = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < rounds; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto ids = tok.encode_batch(lines, true, threads);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tokens = 0;
      for (const auto& v : ids) tokens += v.size();
      if (r == 0) cold = s;
      else warm = std::min(warm, s);
    }
    std::printf("RESULT impl=mm threads=%d lines=%zu bytes=%zu tokens=%zu cold_s=%.4f warm_s=%.4f warm_mb_s=%.2f\n",
                threads, lines.size(), bytes, tokens, cold, warm, bytes / 1e6 / warm);
  } catch (const mm::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
