// SampleEncoder: one mllm record -> the tensors of one training sample. It decodes the record's
// images and videos, runs the image processor (Qwen2-VL's patches with a (t, h, w) grid, or a
// fixed-size resize + center crop for CLIP/LLaVA-style towers), renders the conversation with a
// chat template so each placeholder expands to as many pad tokens as its image has merged
// patches, and truncates to cutoff_len without ever cutting through an image's tokens.
//
// Everything a bad record can do wrong (missing or corrupt media, a conversation the template
// rejects, nothing left to learn after truncation) is an mm::Error whose message starts with
// the record's source and names the file ("train.jsonl:12: /data/a.png: corrupt PNG (...)"): the loader skips and counts it.
// encode() is const and thread-safe: loader workers share one encoder.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/chat_template.h"
#include "mindspeed_mm/data/media/qwen2vl_image_processor.h"
#include "mindspeed_mm/data/media/video.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"

namespace mm::data {

struct SampleEncoderOptions {
  std::string chat_template = "qwen2vl";
  ChatOptions chat;
  // Image and video processing: the config's data.processor section itself (config/config.h:
  // qwen2vl patches with their pixel budgets and frame sampling, or a fixed CLIP-style resize).
  config::ProcessorConfig media;
  int64_t max_decoded_pixels = int64_t(1) << 28;  // decompression-bomb guard per image / frame
  int64_t cutoff_len = 2048;
  std::string truncation = "cut";  // cut: drop the tail (whole images only) | skip: a bad sample
};

struct EncodedSample {
  std::vector<int64_t> input_ids, labels;  // labels aligned with input_ids, -100 = not scored
  // qwen2vl: pixel_values float [patches, 3 * temporal * patch^2], image_grid_thw int64 [n, 3];
  // fixed: pixel_values float [n, 3, size, size], no grid. Undefined when the sample has none.
  at::Tensor pixel_values, image_grid_thw;
  at::Tensor pixel_values_videos, video_grid_thw;
  std::vector<double> video_second_per_grid;  // seconds one temporal patch spans, per video
  std::string source;
  int64_t num_labels() const;
};

// data.processor in the image processor's terms (video: the per-frame pixel budget), and its
// frame sampling. ConfigError when image_mean / image_std do not hold 3 numbers.
Qwen2VLImageConfig image_processor_config(const config::ProcessorConfig& p, bool video = false);
VideoSampling video_sampling(const config::ProcessorConfig& p);

class SampleEncoder {
 public:
  // Checks the options (ConfigError) and that the template's tokens exist in the tokenizer.
  SampleEncoder(PretrainedTokenizer tokenizer, SampleEncoderOptions options);

  EncodedSample encode(const MllmRecord& record) const;
  // A generation prompt: the record's messages must end with a user turn; the assistant header
  // follows it. No labels are required; longer than cutoff_len is an mm::Error.
  EncodedSample encode_prompt(const MllmRecord& record) const;
  // The sample's length in tokens without decoding any media: the messages' text tokens plus
  // each image's pad count from its header size (exact for images; the chat template's few
  // role tokens are not counted). For length-grouped batching. -1 when a file is unreadable.
  int64_t estimate_length(const MllmRecord& record) const;

  const Tokenizer& tokenizer() const { return tok_.tokenizer; }
  const SampleEncoderOptions& options() const { return opt_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t eos_id() const { return eos_id_; }
  // The token ids image / video placeholders expand to.
  int64_t image_pad_id() const { return image_pad_; }
  int64_t video_pad_id() const { return video_pad_; }

 private:
  EncodedSample encode_impl(const MllmRecord& record, bool prompt) const;
  PretrainedTokenizer tok_;
  SampleEncoderOptions opt_;
  const ChatTemplate* template_;
  Qwen2VLImageConfig image_, video_;  // from opt_.media
  VideoSampling sampling_;
  int64_t pad_id_ = 0, eos_id_ = 0, image_pad_ = -1, video_pad_ = -1, vision_start_ = -1, vision_end_ = -1;
};

// CLIPImageProcessor's resize (shortest edge to `size`, the long edge int(size * long / short))
// then center crop to size x size. Exposed for tests.
Image resize_shortest_and_crop(const Image& image, int size);

}  // namespace mm::data
