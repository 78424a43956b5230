// The "mllm" dataset format of MindSpeed-MM / LLaMA-Factory (ShareGPT style), read into plain
// records: one conversation with <image>/<video> placeholders and the media files they refer to.
//
//   {"messages": [{"role": "user", "content": "<image>What is this?"},
//                 {"role": "assistant", "content": "A cat."}],
//    "images": ["cats/1.jpg"], "videos": [], "system": "optional system prompt"}
//
// Files are JSONL (one object per line) or JSON (one array of objects). Field names and role
// values are remappable (MllmAttr, LLaMA-Factory's dataset_attr / ShareGPT tags), so the
// `conversations` / `from` / `value` / `human` / `gpt` spelling reads with no conversion.
// Media paths resolve against a media root (the data file's folder unless one is configured).
//
// A record that cannot be a sample (malformed JSON, missing fields, a placeholder count that
// differs from the media list) is a BadRecord naming file and line, not an exception: reading
// goes on. Media are not opened here; the sample encoder does that on loader threads.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/chat_template.h"

namespace mm::data {

// The field names and role tags (data.attr): one definition, the config's.
using MllmAttr = config::DataAttrConfig;

struct MllmRecord {
  std::vector<ChatMessage> messages;  // roles normalised to system/user/assistant
  std::vector<std::string> images, videos;  // resolved paths
  std::string source;  // "train.jsonl:12" or "train.json[3]"
  // Optional, for `mm eval`: "answers" (several reference answers, VQA-style) and "options"
  // (the texts of a multiple-choice question's choices A, B, ...).
  std::vector<std::string> answers, options;
};

struct BadRecord {
  std::string source, reason;
};

struct MllmFile {
  std::vector<MllmRecord> records;
  std::vector<BadRecord> bad;
  std::string media_root;  // the folder media paths were resolved against
};

// Reads one data file. mm::Error naming the path when it cannot be read at all (missing, or a
// .json file that is not valid JSON); per-record problems become `bad`.
MllmFile read_mllm_file(const std::string& path, const MllmAttr& attr = {}, const std::string& media_root = "");

// One record from its JSON object; returns why it cannot be a sample, or "" with `out` filled
// (media paths resolved against root; `source` left to the caller).
std::string parse_mllm_record(const nlohmann::json& j, const MllmAttr& attr, const std::filesystem::path& root,
                              MllmRecord& out);

// A stable content key of a record for the train/val split: its texts and its media paths relative
// to the media root, so the split is the same wherever the dataset is stored.
std::string record_key(const MllmRecord& r, const std::string& media_root);

// Placeholder occurrences of "<image>" / "<video>" in the text.
int64_t count_placeholder(const std::string& text, const std::string& placeholder);

// One mixture entry: record `index` of dataset `dataset`.
struct MixEntry {
  int32_t dataset = 0;
  int64_t index = 0;
};

// The samples one epoch draws from several datasets. A weight is how many times over one epoch
// sees its dataset: dataset i contributes n_i = round(w_i * size_i) entries, all of its records
// floor(n_i / size_i) times plus a seeded subset (without replacement) of n_i mod size_i more.
// Weights 1 (the default) concatenate the datasets; 2 oversamples one twice, 0.5 takes half.
// The result is grouped by dataset; the sampler shuffles it. mm::Error for a weight < 0, a
// size/weight count mismatch, or an empty result.
std::vector<MixEntry> build_mixture(const std::vector<int64_t>& sizes, const std::vector<double>& weights,
                                    uint64_t seed);

// `mm data convert-llava IN OUT`: LLaVA's JSON (a list of {"id", "image", "conversations":
// [{"from": "human"|"gpt"|"system", "value"}]}) to mllm JSONL. An image whose conversation has
// no <image> gets one at the start of the first user turn, as LLaVA's preprocessing does.
// Malformed entries are skipped and reported. Writes OUT atomically (temporary name, rename).
struct ConvertSummary {
  int64_t written = 0;
  std::vector<BadRecord> bad;
};
ConvertSummary convert_llava(const std::string& in_path, const std::string& out_path);

}  // namespace mm::data
