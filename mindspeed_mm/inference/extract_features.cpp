#include "mindspeed_mm/inference/extract_features.h"

#include <ATen/core/grad_mode.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/data/features.h"
#include "mindspeed_mm/data/media/video_clip.h"
#include "mindspeed_mm/data/media/video.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/core/file_io.h"

namespace mm::inference {

std::vector<VideoBucket> parse_buckets(const std::string& spec, const std::string& what) {
  std::vector<VideoBucket> out;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    VideoBucket b;
    char x1 = 0, x2 = 0;
    std::stringstream is(item);
    if (!(is >> b.height >> x1 >> b.width >> x2 >> b.frames) || x1 != 'x' || x2 != 'x' || !(is >> std::ws).eof())
      throw ConfigError(cat("config: ", what, ": '", item, "' is not HEIGHTxWIDTHxFRAMES (e.g. 480x832x81)"));
    if (b.height <= 0 || b.width <= 0 || b.height % 16 || b.width % 16 || b.frames < 1 || (b.frames - 1) % 4)
      throw ConfigError(cat("config: ", what, ": '", item, "': sides must be multiples of 16 and frames 1 + 4k"));
    out.push_back(b);
  }
  if (out.empty()) throw ConfigError(cat("config: ", what, " names no bucket"));
  return out;
}

ExtractReport extract_features(const WanPipeline& pipe, const std::string& jsonl, const std::string& out,
                               const ExtractOptions& o, const std::function<void(int64_t, int64_t)>& progress) {
  ExtractReport rep;
  const std::vector<data::VideoRecord> records = data::read_video_records(jsonl, o.media_root, &rep.skipped);
  const int64_t total = static_cast<int64_t>(records.size()) + rep.skipped;
  if (total == 0) throw Error(cat("data: ", jsonl, ": no records"));

  data::FeatureWriter writer(out);
  rep.per_bucket.assign(o.buckets.size(), 0);
  at::NoGradGuard no_grad;
  const at::Device device = pipe.vae->encoder->conv_in->weight.device();
  int64_t done = rep.skipped;
  for (const data::VideoRecord& r : records) {
    try {
      if (!r.has_caption) throw Error("has no \"cap\" (or \"caption\") string");
      // The bucket nearest the video's aspect ratio among those it has the frames for.
      int best = -1;
      std::vector<int64_t> indices;
      const data::DecodedVideo video = data::decode_video_frames(r.path, [&](const data::VideoInfo& info) {
        double best_score = std::numeric_limits<double>::infinity();
        for (size_t b = 0; b < o.buckets.size(); ++b) {
          const VideoBucket& k = o.buckets[b];
          const std::vector<int64_t> idx = data::clip_frame_indices(info.num_frames, info.fps, o.fps, k.frames);
          if (idx.empty()) continue;
          const double score = std::fabs(std::log(static_cast<double>(info.width) / info.height) -
                                         std::log(static_cast<double>(k.width) / static_cast<double>(k.height))) -
                               1e-6 * static_cast<double>(k.frames);
          if (score < best_score) best_score = score, best = static_cast<int>(b), indices = idx;
        }
        if (best < 0)
          throw Error(cat("has ", info.num_frames, " frames at ", info.fps, " fps: fewer than any bucket needs at ", o.fps,
                          " fps (the shortest wants ", o.buckets.front().frames, ")"));
        return indices;
      });
      const VideoBucket& k = o.buckets[static_cast<size_t>(best)];
      const at::Tensor clip = data::frames_to_clip(video.frames, k.height, k.width).unsqueeze(0);
      data::FeatureSample s;
      s.latents = pipe.vae->encode(clip.to(device))[0].cpu();
      s.caption = r.caption;
      s.prompt_embeds = encode_prompts(pipe, {s.caption}, o.max_sequence_length)[0].cpu();
      writer.add(s);
      ++rep.written;
      ++rep.per_bucket[static_cast<size_t>(best)];
    } catch (const Error& e) {
      ++rep.skipped;
      log::warn("data: skipped ", r.source, ": ", e.what());
    }
    if (progress) progress(++done, total);
  }
  if (rep.written == 0) throw Error(cat("data: ", jsonl, ": every one of its ", total, " records was skipped"));
  if (static_cast<double>(rep.skipped) > o.max_bad_fraction * static_cast<double>(total))
    throw Error(cat("data: ", jsonl, ": ", rep.skipped, " of ", total, " records skipped, more than ",
                    o.max_bad_fraction * 100, "%"));
  writer.finish(encode_prompts(pipe, {""}, o.max_sequence_length)[0].cpu());
  return rep;
}

LatentStats latent_stats(const models::AutoencoderKLWan& vae, const std::string& jsonl, const VideoBucket& bucket, double fps,
                         int64_t max_samples, const std::string& media_root) {
  LatentStats st;
  const std::vector<data::VideoRecord> records = data::read_video_records(jsonl, media_root, &st.skipped);
  const int64_t z = vae.config.z_dim;
  at::Tensor sum = at::zeros({z}, at::kDouble), sumsq = at::zeros({z}, at::kDouble);
  int64_t count = 0;
  const at::Device device = vae.quant_conv->weight.device();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < records.size() && st.samples < max_samples; ++i) {
    try {
      const at::Tensor clip = data::load_video_clip(records[i].path, bucket.height, bucket.width, bucket.frames, fps);
      const at::Tensor mean = vae.encode_moments(clip.unsqueeze(0).to(device)).narrow(1, 0, z).to(at::kDouble).cpu();
      sum += mean.sum({0, 2, 3, 4});
      sumsq += mean.square().sum({0, 2, 3, 4});
      count += mean.numel() / z;
      ++st.samples;
    } catch (const Error& e) {
      ++st.skipped;
      log::warn("data: skipped ", records[i].source, ": ", e.what());
    }
  }
  if (st.samples == 0) throw Error(cat("data: ", jsonl, ": no clip could be encoded for latent statistics"));
  const at::Tensor m = sum / static_cast<double>(count);
  const at::Tensor sd = (sumsq / static_cast<double>(count) - m.square()).clamp_min(1e-12).sqrt();
  for (int64_t c = 0; c < z; ++c) st.mean.push_back(m[c].item<double>()), st.std.push_back(sd[c].item<double>());
  return st;
}

void write_latent_stats(const std::string& vae_dir, const LatentStats& stats) {
  const std::string path = vae_dir + "/config.json";
  if (const std::string why = file_problem(path); !why.empty()) throw Error(cat("data: ", path, ": ", why));
  std::ifstream in(path);
  if (!in) throw Error(cat("data: ", path, ": cannot open"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("data: ", path, ": not JSON (", json_error_text(e.what()), ")"));
  }
  j["latents_mean"] = stats.mean;
  j["latents_std"] = stats.std;
  st::write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace mm::inference
