// `mm data extract-features`: video + caption JSONL through a Wan pipeline's frozen VAE and text
// encoder, once, into a features directory (data/features.h) that training reads instead of
// running the encoders every step.
//
// Records: {"path": "clips/a.mp4", "cap": "a sandal moving left"} ("caption" is read too),
// paths relative to media_root (default: the JSONL's folder). Each video goes to a bucket
// (height x width x frames): among those whose frames it has at the target fps (frame i is
// the video's frame round(i * video_fps / fps)), the one nearest its aspect ratio, then the
// longest. Frames are resized to cover the bucket (bicubic) and centre-cropped. A video that
// cannot be opened or decoded, or is too short for every bucket, is skipped with a warning
// naming it, and counted.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "mindspeed_mm/inference/wan_pipeline.h"

namespace mm::inference {

struct VideoBucket {
  int64_t height = 480, width = 832, frames = 81;
};

// "480x832x81,832x480x81" -> buckets; ConfigError naming `what` for a malformed entry or sizes
// the VAE and the transformer cannot take (frames 1 + 4k, sides multiples of 16).
std::vector<VideoBucket> parse_buckets(const std::string& spec, const std::string& what = "--buckets");

struct ExtractOptions {
  std::vector<VideoBucket> buckets = {{}};
  double fps = 16.0;
  int64_t max_sequence_length = 512;
  std::string media_root;
  double max_bad_fraction = 0.5;  // more bad records than this is an error (after the pass)
};

struct ExtractReport {
  int64_t written = 0, skipped = 0;
  std::vector<int64_t> per_bucket;  // samples written to each bucket
};

// Reads `jsonl`, writes `out` (a new directory). progress(done, total) after each record.
ExtractReport extract_features(const WanPipeline& pipe, const std::string& jsonl, const std::string& out,
                               const ExtractOptions& o, const std::function<void(int64_t, int64_t)>& progress = {});

// Per-channel mean and standard deviation of a VAE's posterior means over the clips of a
// video JSONL (each taken at `bucket` and `fps`; at most max_samples; bad clips skipped with a
// warning): the latents_mean / latents_std a Wan VAE's config.json carries, so that the
// transformer sees latents of unit scale. For a VAE trained here (`model.id: wan_vae`).
struct LatentStats {
  std::vector<double> mean, std;
  int64_t samples = 0, skipped = 0;
};
LatentStats latent_stats(const models::AutoencoderKLWan& vae, const std::string& jsonl, const VideoBucket& bucket, double fps,
                         int64_t max_samples, const std::string& media_root = "");
// Writes them into VAE_DIR/config.json (atomically; the other fields kept).
void write_latent_stats(const std::string& vae_dir, const LatentStats& stats);

}  // namespace mm::inference
