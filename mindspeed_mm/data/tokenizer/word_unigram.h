// A small T5-style tokenizer made from a caption vocabulary, for text encoders trained or
// initialised here (the moving Fashion-MNIST quickstart) rather than downloaded: a SentencePiece
// Unigram model in Hugging Face's tokenizer.json layout, as T5TokenizerFast writes it —
// <pad> 0, </s> 1, <unk> 2, then each caption word as one piece "▁word" and the letters and
// digits as fallback pieces; lowercasing, Metaspace pre-tokenization, "$A </s>" appended.
// Any text tokenizes (unknown characters become <unk>); the captions' words are single ids.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mm::data {

// The words of `captions` (lowercased, split on whitespace), each once, in first-seen order.
std::vector<std::string> caption_words(const std::vector<std::string>& captions);

// tokenizer.json for `words` (each a piece; longer words score higher so they win over spelling).
nlohmann::json word_unigram_tokenizer_json(const std::vector<std::string>& words);

// Writes DIR/tokenizer.json, DIR/tokenizer_config.json and DIR/special_tokens_map.json
// (model_max_length `max_length`). Files are written atomically.
void write_word_unigram_tokenizer(const std::vector<std::string>& words, const std::string& dir, int64_t max_length = 512);

}  // namespace mm::data
