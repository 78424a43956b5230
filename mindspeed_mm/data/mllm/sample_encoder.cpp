// SampleEncoder: media decode + processor, chat template, image-safe truncation.
#include "mindspeed_mm/data/mllm/sample_encoder.h"

#include <algorithm>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/image_resize.h"

namespace mm::data {

int64_t EncodedSample::num_labels() const {
  return std::count_if(labels.begin(), labels.end(), [](int64_t l) { return l != kIgnoreLabel; });
}

Image resize_shortest_and_crop(const Image& image, int size) {
  // transformers' get_resize_output_image_size(default_to_square=False): the short edge becomes
  // `size`, the long edge int(size * long / short) (truncated, not rounded).
  const bool wide = image.width >= image.height;
  const int64_t short_edge = wide ? image.height : image.width, long_edge = wide ? image.width : image.height;
  const int new_long = static_cast<int>(static_cast<int64_t>(size) * long_edge / short_edge);
  Image resized = wide ? resize_bicubic(image, new_long, size) : resize_bicubic(image, size, new_long);
  return center_crop(resized, size, size);
}

namespace {

at::Tensor patches_tensor(const VisionPatches& p) {
  return at::from_blob(const_cast<float*>(p.values.data()), {p.rows(), p.row_size}, at::kFloat).clone();
}

// Rescale by 1/255 and normalize, channel planes [3, H, W], as CLIPImageProcessor in float32.
at::Tensor normalized_planes(const Image& im, const std::array<float, 3>& mean, const std::array<float, 3>& stdev) {
  at::Tensor t = at::empty({3, im.height, im.width}, at::kFloat);
  float* out = t.data_ptr<float>();
  const size_t plane = static_cast<size_t>(im.width) * im.height;
  for (size_t i = 0; i < plane; ++i)
    for (int c = 0; c < 3; ++c)
      out[c * plane + i] = (static_cast<float>(im.rgb[i * 3 + c]) * (1.0f / 255.0f) - mean[c]) / stdev[c];
  return t;
}

struct MediaTensors {
  std::vector<at::Tensor> values;     // per image / video
  std::vector<std::array<int64_t, 3>> grids;
  std::vector<int64_t> tokens;        // pad tokens per item
  std::vector<double> second_per_grid;
};

at::Tensor stack_grids(const std::vector<std::array<int64_t, 3>>& g, size_t n) {
  at::Tensor t = at::empty({static_cast<int64_t>(n), 3}, at::kLong);
  for (size_t i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) t[i][k] = g[i][k];
  return t;
}

}  // namespace

Qwen2VLImageConfig image_processor_config(const config::ProcessorConfig& p, bool video) {
  if (p.image_mean.size() != 3 || p.image_std.size() != 3)
    throw ConfigError("config: data.processor.image_mean and image_std must hold 3 numbers (R, G, B)");
  Qwen2VLImageConfig c;
  c.patch_size = static_cast<int>(p.patch_size);
  c.temporal_patch_size = static_cast<int>(p.temporal_patch_size);
  c.merge_size = static_cast<int>(p.merge_size);
  c.min_pixels = video ? p.video_min_pixels : p.min_pixels;
  c.max_pixels = video ? p.video_max_pixels : p.max_pixels;
  for (int k = 0; k < 3; ++k) {
    c.mean[k] = static_cast<float>(p.image_mean[k]);
    c.std[k] = static_cast<float>(p.image_std[k]);
  }
  return c;
}

VideoSampling video_sampling(const config::ProcessorConfig& p) {
  VideoSampling s;
  s.fps = p.fps;
  s.min_frames = p.min_frames;
  s.max_frames = p.max_frames;
  s.frame_factor = p.temporal_patch_size;
  return s;
}

SampleEncoder::SampleEncoder(PretrainedTokenizer tokenizer, SampleEncoderOptions options)
    : tok_(std::move(tokenizer)),
      opt_(std::move(options)),
      template_(&ChatTemplate::get(opt_.chat_template)),
      image_(image_processor_config(opt_.media)),
      video_(image_processor_config(opt_.media, /*video=*/true)),
      sampling_(video_sampling(opt_.media)) {
  const auto& m = opt_.media;
  if (m.type != "qwen2vl" && m.type != "fixed")
    throw ConfigError(cat("config: data.processor.type must be qwen2vl or fixed (got '", m.type, "')"));
  if (opt_.truncation != "cut" && opt_.truncation != "skip")
    throw ConfigError(cat("config: data.truncation must be cut or skip (got '", opt_.truncation, "')"));
  if (opt_.cutoff_len < 2) throw ConfigError(cat("config: data.cutoff_len must be >= 2 (got ", opt_.cutoff_len, ")"));
  const Tokenizer& t = tok_.tokenizer;
  auto id_of = [&](const std::optional<std::string>& s) -> std::optional<int64_t> {
    return s ? t.token_to_id(*s) : std::nullopt;
  };
  const auto& spec = template_->spec();
  auto eos = id_of(spec.eos.empty() ? tok_.config.eos_token : std::optional<std::string>(spec.eos));
  MM_CHECK(eos, "data: the tokenizer (", tok_.source, ") has no end-of-turn token '", spec.eos.empty() ? "eos" : spec.eos,
           "' for chat template ", spec.name);
  eos_id_ = *eos;
  auto pad = id_of(tok_.config.pad_token);
  pad_id_ = pad ? *pad : eos_id_;
  auto get = [&](const char* s) { return t.token_to_id(s).value_or(-1); };
  if (spec.qwen_vision) {
    image_pad_ = get("<|image_pad|>");
    video_pad_ = get("<|video_pad|>");
    vision_start_ = get("<|vision_start|>");
    vision_end_ = get("<|vision_end|>");
  } else {
    image_pad_ = get("<image>");
    video_pad_ = get("<video>");
  }
}

int64_t SampleEncoder::estimate_length(const MllmRecord& rec) const {
  const auto& m = opt_.media;
  int64_t n = 0;
  for (const auto& msg : rec.messages) n += static_cast<int64_t>(tok_.tokenizer.encode(msg.content, false).size());
  try {
    for (const auto& path : rec.images) {
      if (m.type == "fixed") {
        n += m.image_tokens;
        continue;
      }
      auto [w, h] = probe_image_size(path);
      const int factor = image_.patch_size * image_.merge_size;
      auto [rh, rw] = smart_resize(h, w, factor, image_.min_pixels, image_.max_pixels);
      n += static_cast<int64_t>(rh / factor) * (rw / factor);
    }
    for (const auto& path : rec.videos) {
      VideoInfo info = probe_video(path);
      const int64_t frames = static_cast<int64_t>(sample_frame_indices(info.num_frames, info.fps, sampling_).size());
      const int factor = video_.patch_size * video_.merge_size;
      auto [rh, rw] = smart_resize(info.height, info.width, factor, video_.min_pixels, video_.max_pixels);
      const int64_t t = (frames + video_.temporal_patch_size - 1) / video_.temporal_patch_size;
      n += t * (rh / factor) * (rw / factor);
    }
  } catch (const Error&) {
    return -1;
  }
  return n;
}

EncodedSample SampleEncoder::encode(const MllmRecord& rec) const { return encode_impl(rec, false); }

EncodedSample SampleEncoder::encode_prompt(const MllmRecord& rec) const {
  MM_CHECK(!rec.messages.empty() && rec.messages.back().role == "user", rec.source,
           ": a generation prompt must end with a user message");
  return encode_impl(rec, true);
}

EncodedSample SampleEncoder::encode_impl(const MllmRecord& rec, bool prompt) const {
  const auto& m = opt_.media;
  EncodedSample out;
  out.source = rec.source;
  MediaTensors images, videos;
  const bool qwen = m.type == "qwen2vl";

  for (const auto& path : rec.images) {
    Image im;
    try {
      im = load_image(path, opt_.max_decoded_pixels);
      if (qwen) {
        VisionPatches p = process_image(im, image_);
        images.values.push_back(patches_tensor(p));
        images.grids.push_back({p.grid_t, p.grid_h, p.grid_w});
        images.tokens.push_back(p.merged_tokens(image_.merge_size));
      } else {
        images.values.push_back(
            normalized_planes(resize_shortest_and_crop(im, static_cast<int>(m.image_size)), image_.mean, image_.std));
        images.tokens.push_back(m.image_tokens);
      }
    } catch (const Error& e) {
      throw Error(cat(rec.source, ": ", e.what()));  // the decoders' messages name the file
    }
  }
  for (const auto& path : rec.videos) {
    MM_CHECK(qwen, rec.source, ": ", path, ": the fixed image processor takes no videos (use qwen2vl)");
    try {
      DecodedVideo v = decode_video(path, sampling_, opt_.max_decoded_pixels);
      VisionPatches p = process_video(v.frames, video_);
      videos.values.push_back(patches_tensor(p));
      videos.grids.push_back({p.grid_t, p.grid_h, p.grid_w});
      videos.tokens.push_back(p.merged_tokens(video_.merge_size));
      // The sampled frame rate: frames kept over the clip's duration in frames / fps.
      const double sampled_fps = v.info.fps > 0 && v.info.num_frames > 0
                                     ? static_cast<double>(v.frames.size()) * v.info.fps / v.info.num_frames
                                     : sampling_.fps;
      videos.second_per_grid.push_back(video_.temporal_patch_size / sampled_fps);
    } catch (const Error& e) {
      throw Error(cat(rec.source, ": ", e.what()));
    }
  }

  EncodedChat chat;
  try {
    ChatOptions chat_options = opt_.chat;
    chat_options.add_generation_prompt = prompt;
    chat = template_->encode(tok_.tokenizer, rec.messages, chat_options, [&](char kind, size_t i) -> int64_t {
      const auto& tokens = kind == 'i' ? images.tokens : videos.tokens;
      if (i >= tokens.size()) throw Error(cat("more <", kind == 'i' ? "image" : "video", "> placeholders than media"));
      return tokens[i];
    });
  } catch (const Error& e) {
    throw Error(cat(rec.source, ": ", e.what()));
  }

  // Every pad token must belong to a placeholder: a literal "<|image_pad|>" in the text would
  // shift which image each block of pads stands for.
  int64_t expected_pads = 0;
  for (int64_t t : images.tokens) expected_pads += t;
  const int64_t image_pads = std::count(chat.input_ids.begin(), chat.input_ids.end(), image_pad_);
  int64_t expected_video_pads = 0;
  for (int64_t t : videos.tokens) expected_video_pads += t;
  const int64_t video_pads = std::count(chat.input_ids.begin(), chat.input_ids.end(), video_pad_);
  MM_CHECK((image_pad_ < 0 || image_pads == expected_pads) && (video_pad_ < 0 || video_pads == expected_video_pads),
           rec.source, ": the text holds image/video pad tokens of its own (", image_pads + video_pads,
           " pads for ", expected_pads + expected_video_pads, " placeholder tokens)");

  // Truncation. Each image / video occupies one block of tokens: its pads, plus the
  // <|vision_start|>/<|vision_end|> around them for Qwen; a cut inside a block moves to its start
  // and the media from that block on are dropped with their pixels.
  size_t keep_images = images.tokens.size(), keep_videos = videos.tokens.size();
  const int64_t len = static_cast<int64_t>(chat.input_ids.size());
  MM_CHECK(!prompt || len <= opt_.cutoff_len, rec.source, ": the prompt has ", len, " tokens, more than data.cutoff_len ",
           opt_.cutoff_len);
  if (len > opt_.cutoff_len) {
    MM_CHECK(opt_.truncation == "cut", rec.source, ": ", len, " tokens, more than data.cutoff_len ", opt_.cutoff_len);
    int64_t cut = opt_.cutoff_len;
    size_t ni = 0, nv = 0;
    keep_images = keep_videos = 0;
    for (int64_t p = 0; p < len;) {
      const int64_t id = chat.input_ids[p];
      const bool is_img = id == image_pad_ && ni < images.tokens.size();
      const bool is_vid = !is_img && id == video_pad_ && nv < videos.tokens.size();
      if (!is_img && !is_vid) {
        ++p;
        continue;
      }
      const int64_t n = is_img ? images.tokens[ni++] : videos.tokens[nv++];
      int64_t start = p, end = p + n;
      if (vision_start_ >= 0 && start > 0 && chat.input_ids[start - 1] == vision_start_) --start;
      if (vision_end_ >= 0 && end < len && chat.input_ids[end] == vision_end_) ++end;
      if (start < cut && cut < end) cut = start;
      if (end <= cut) (is_img ? keep_images : keep_videos) += 1;
      p = p + n;
    }
    chat.input_ids.resize(static_cast<size_t>(cut));
    chat.labels.resize(static_cast<size_t>(cut));
  }
  out.input_ids = std::move(chat.input_ids);
  out.labels = std::move(chat.labels);
  MM_CHECK(prompt || out.num_labels() > 0, rec.source, ": no labeled (assistant) tokens within data.cutoff_len ", opt_.cutoff_len);

  if (keep_images > 0) {
    std::vector<at::Tensor> v(images.values.begin(), images.values.begin() + keep_images);
    out.pixel_values = qwen ? at::cat(v, 0) : at::stack(v, 0);
    if (qwen) out.image_grid_thw = stack_grids(images.grids, keep_images);
  }
  if (keep_videos > 0) {
    std::vector<at::Tensor> v(videos.values.begin(), videos.values.begin() + keep_videos);
    out.pixel_values_videos = at::cat(v, 0);
    out.video_grid_thw = stack_grids(videos.grids, keep_videos);
    out.video_second_per_grid.assign(videos.second_per_grid.begin(), videos.second_per_grid.begin() + keep_videos);
  }
  return out;
}

}  // namespace mm::data
