// `mm data`: dataset tools.
//   mm data convert-llava IN.json OUT.jsonl     LLaVA format -> mllm JSONL
//   mm data fashion-mnist --out DIR              Debian's Fashion-MNIST as PNGs + train/test JSONL
//   mm data inspect FILE [...]                   counts, token lengths, image sizes, bad samples
//   mm data extract-features --model PIPE --data videos.jsonl --out DIR   Wan VAE latents + text features
//   mm data moving-fashion-mnist --out DIR       garments sliding left/right/up/down as captioned MP4 clips
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#include "cli/commands.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/parallel_for.h"
#include "mindspeed_mm/data/fashion_mnist.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/mllm_options.h"
#include "mindspeed_mm/data/mllm/sample_encoder.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/inference/extract_features.h"
#include "mindspeed_mm/data/moving_fashion_mnist.h"

namespace mm::cli {
namespace {

struct ExtractArgs {
  std::string model, data, out, buckets = "480x832x81", device = "auto";
  inference::ExtractOptions o;
} extract_args;

struct LatentStatsArgs {
  std::string model, data, bucket = "64x64x17", media_root, device = "auto";
  double fps = 16.0;
  int64_t max_samples = 512;
} stats_args;

int run_latent_stats() {
  LatentStatsArgs& a = stats_args;
  const std::vector<inference::VideoBucket> b = inference::parse_buckets(a.bucket, "--size");
  if (b.size() != 1) throw ConfigError("config: --size: give one HEIGHTxWIDTHxFRAMES");
  const std::string vae_dir = std::filesystem::is_directory(a.model + "/vae") ? a.model + "/vae" : a.model;
  auto vae = models::load_wan_vae(vae_dir);
  vae->to(resolve_device(a.device, 0, "--device"));
  const inference::LatentStats st = inference::latent_stats(*vae, a.data, b[0], a.fps, a.max_samples, a.media_root);
  inference::write_latent_stats(vae_dir, st);
  std::string m, s;
  for (size_t c = 0; c < st.mean.size(); ++c) m += cat(c ? " " : "", std::lround(st.mean[c] * 1000) / 1000.0), s += cat(c ? " " : "", std::lround(st.std[c] * 1000) / 1000.0);
  std::printf("latent-stats: %lld clips (%lld skipped): latents_mean [%s], latents_std [%s] written to %s/config.json\n",
              static_cast<long long>(st.samples), static_cast<long long>(st.skipped), m.c_str(), s.c_str(), vae_dir.c_str());
  return 0;
}

int run_extract_features() {
  ExtractArgs& a = extract_args;
  a.o.buckets = inference::parse_buckets(a.buckets);
  const at::Device device = resolve_device(a.device, 0, "--device");
  const inference::WanPipeline pipe = inference::load_wan_pipeline(a.model, device, /*with_transformer=*/false);
  const inference::ExtractReport r = inference::extract_features(pipe, a.data, a.out, a.o, [](int64_t done, int64_t n) {
    if (done == n || done % 100 == 0) std::printf("extract-features: %lld/%lld records\n", static_cast<long long>(done),
                                                  static_cast<long long>(n));
  });
  std::string buckets;
  for (size_t b = 0; b < r.per_bucket.size(); ++b)
    buckets += cat(b ? ", " : "", a.o.buckets[b].height, "x", a.o.buckets[b].width, "x", a.o.buckets[b].frames, ": ",
                   r.per_bucket[b]);
  std::printf("extract-features: wrote %lld samples to %s (%s); skipped %lld bad record(s)\n", static_cast<long long>(r.written),
              a.out.c_str(), buckets.c_str(), static_cast<long long>(r.skipped));
  return 0;
}

data::MovingFashionMnistOptions moving_args;

int run_moving_fashion_mnist() {
  const data::MovingFashionMnistSummary s = data::write_moving_fashion_mnist(moving_args);
  std::printf("moving-fashion-mnist: %lld train clips (%s), %lld test clips (%s), %d frames of %dx%d at %.0f fps\n",
              static_cast<long long>(s.train), s.train_jsonl.c_str(), static_cast<long long>(s.test), s.test_jsonl.c_str(),
              moving_args.frames, moving_args.size, moving_args.size, moving_args.fps);
  return 0;
}

struct DataArgs {
  std::string in, out;
  data::FashionMnistOptions fmnist;
  // inspect
  std::string file, tokenizer = "byte", chat_template = "qwen2vl", media_root;
  int64_t cutoff_len = 1 << 20;
  int64_t max_samples = 0;
  int threads = 2;
  bool headers_only = false;
} args;

int run_convert_llava() {
  data::ConvertSummary s = data::convert_llava(args.in, args.out);
  for (size_t i = 0; i < s.bad.size() && i < 10; ++i)
    std::fprintf(stderr, "warning: skipped %s: %s\n", s.bad[i].source.c_str(), s.bad[i].reason.c_str());
  std::printf("wrote %lld samples to %s (%zu skipped)\n", static_cast<long long>(s.written), args.out.c_str(),
              s.bad.size());
  return 0;
}

int run_fashion_mnist() {
  args.fmnist.out_dir = args.out;
  data::FashionMnistSummary s = data::write_fashion_mnist(args.fmnist);
  std::printf("wrote %lld train and %lld test samples: %s, %s\n", static_cast<long long>(s.train),
              static_cast<long long>(s.test), s.train_jsonl.c_str(), s.test_jsonl.c_str());
  return 0;
}

// Power-of-two buckets [2^k, 2^(k+1)) of token lengths, printed with bars.
void print_histogram(const std::vector<int64_t>& lengths) {
  std::map<int, int64_t> buckets;
  for (int64_t n : lengths) buckets[n <= 1 ? 0 : static_cast<int>(std::floor(std::log2(static_cast<double>(n))))]++;
  int64_t peak = 0;
  for (auto& [_, c] : buckets) peak = std::max(peak, c);
  std::printf("token lengths (chat template applied, images expanded):\n");
  for (auto& [k, c] : buckets) {
    const int width = static_cast<int>(std::lround(40.0 * c / std::max<int64_t>(1, peak)));
    std::printf("  %7lld - %-7lld %8lld  %s\n", k == 0 ? 0LL : 1LL << k, (1LL << (k + 1)) - 1,
                static_cast<long long>(c), std::string(std::max(1, width), '#').c_str());
  }
}

int run_inspect() {
  data::MllmFile f = data::read_mllm_file(args.file, {}, args.media_root);
  if (args.max_samples > 0 && static_cast<int64_t>(f.records.size()) > args.max_samples)
    f.records.resize(static_cast<size_t>(args.max_samples));
  config::DataConfig dc;
  dc.tokenizer = args.tokenizer;
  dc.chat_template = args.chat_template;
  dc.cutoff_len = args.cutoff_len;
  dc.truncation = "skip";  // a sample over --cutoff-len is reported, not cut
  const data::SampleEncoder enc(data::mllm_tokenizer(dc), data::encoder_options(dc));

  const size_t n = f.records.size();
  std::vector<int64_t> lengths(n, -1);
  std::vector<std::string> errors(n);
  std::vector<std::pair<int, int>> sizes;
  std::mutex mu;
  int64_t images = 0, videos = 0, turns = 0, text_only = 0;
  for (auto& r : f.records) {
    images += static_cast<int64_t>(r.images.size());
    videos += static_cast<int64_t>(r.videos.size());
    turns += static_cast<int64_t>(r.messages.size());
    text_only += r.images.empty() && r.videos.empty();
  }
  parallel_for(n, args.threads, [&](size_t i) {
    const auto& r = f.records[i];
    std::vector<std::pair<int, int>> local;
    try {
      for (auto& p : r.images) local.push_back(data::probe_image_size(p));
      if (args.headers_only) lengths[i] = enc.estimate_length(r);
      else lengths[i] = static_cast<int64_t>(enc.encode(r).input_ids.size());
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
    std::lock_guard<std::mutex> lock(mu);
    sizes.insert(sizes.end(), local.begin(), local.end());
  });

  std::printf("%s: %zu records (%zu malformed), %lld messages, %lld images, %lld videos, %lld text-only\n",
              args.file.c_str(), n + f.bad.size(), f.bad.size(), static_cast<long long>(turns),
              static_cast<long long>(images), static_cast<long long>(videos), static_cast<long long>(text_only));
  std::vector<int64_t> good;
  for (int64_t l : lengths)
    if (l >= 0) good.push_back(l);
  if (!good.empty()) {
    std::sort(good.begin(), good.end());
    double mean = 0;
    for (int64_t l : good) mean += static_cast<double>(l) / good.size();
    std::printf("tokens per sample: min %lld, median %lld, mean %.1f, p99 %lld, max %lld\n",
                static_cast<long long>(good.front()), static_cast<long long>(good[good.size() / 2]), mean,
                static_cast<long long>(good[std::min(good.size() - 1, good.size() * 99 / 100)]),
                static_cast<long long>(good.back()));
    print_histogram(good);
  }
  if (!sizes.empty()) {
    std::map<std::pair<int, int>, int64_t> by_size;
    for (auto& s : sizes) by_size[s]++;
    std::vector<std::pair<int64_t, std::pair<int, int>>> top;
    for (auto& [s, c] : by_size) top.push_back({c, s});
    std::sort(top.rbegin(), top.rend());
    int wmin = INT32_MAX, wmax = 0, hmin = INT32_MAX, hmax = 0;
    for (auto& s : sizes) {
      wmin = std::min(wmin, s.first), wmax = std::max(wmax, s.first);
      hmin = std::min(hmin, s.second), hmax = std::max(hmax, s.second);
    }
    std::printf("image sizes: width %d-%d, height %d-%d; most common:", wmin, wmax, hmin, hmax);
    for (size_t i = 0; i < top.size() && i < 5; ++i)
      std::printf(" %dx%d (%lld)", top[i].second.first, top[i].second.second, static_cast<long long>(top[i].first));
    std::printf("\n");
  }
  int64_t bad = static_cast<int64_t>(f.bad.size());
  for (auto& e : errors) bad += !e.empty();
  std::printf("bad samples: %lld\n", static_cast<long long>(bad));
  int shown = 0;
  for (auto& b : f.bad)
    if (shown++ < 20) std::printf("  %s: %s\n", b.source.c_str(), b.reason.c_str());
  for (auto& e : errors)
    if (!e.empty() && shown++ < 20) std::printf("  %s\n", e.c_str());
  if (shown > 20) std::printf("  ... and %d more\n", shown - 20);
  std::fflush(stdout);
  // The report is on stdout; a file with bad samples (or none at all) also fails, so a script
  // or CI step that inspects a dataset stops on it.
  const int64_t total = static_cast<int64_t>(n + f.bad.size());
  if (total == 0) throw Error(cat("data: ", args.file, ": holds no records"));
  if (bad > 0) throw Error(cat("data: ", args.file, ": ", bad, " of ", total, " samples are bad (listed above)"));
  return 0;
}

}  // namespace

void add_data_command(CLI::App& app) {
  auto* c = app.add_subcommand("data", "Dataset tools: convert, prepare and inspect mllm datasets; extract video features");
  c->require_subcommand(1);

  auto* llava = c->add_subcommand("convert-llava", "Convert a LLaVA JSON file to mllm JSONL");
  llava->add_option("in", args.in, "LLaVA JSON (a list of {image, conversations})")->required();
  llava->add_option("out", args.out, "mllm JSONL to write")->required();
  register_action(llava, run_convert_llava);

  auto* fm = c->add_subcommand("fashion-mnist", "Write Debian's Fashion-MNIST as PNGs plus train/test mllm JSONL");
  fm->add_option("--out", args.out, "output directory")->required();
  fm->add_option("--source", args.fmnist.source_dir, "folder of the IDX .gz files (package dataset-fashion-mnist)");
  fm->add_option("--max-train", args.fmnist.max_train, "write at most N training images (0 = all 60000)");
  fm->add_option("--max-test", args.fmnist.max_test, "write at most N test images (0 = all 10000)");
  fm->add_option("--threads", args.fmnist.threads, "PNG encoding threads (0 = all cores)");
  fm->add_option("--question", args.fmnist.question, "the user's question of every sample");
  fm->add_option("--answers", args.fmnist.answers, "the 10 answers by label, comma-separated (default: the class names)")
      ->delimiter(',');
  fm->add_option("--jsonl-prefix", args.fmnist.jsonl_prefix,
                 "prefix of the JSONL names (PREFIXtrain.jsonl): a second task on the same images");
  register_action(fm, run_fashion_mnist);

  auto* in = c->add_subcommand("inspect", "Counts, token-length histogram, image sizes and bad samples of an mllm file");
  in->add_option("file", args.file, "mllm JSON or JSONL")->required();
  in->add_option("--tokenizer", args.tokenizer, "byte, or an HF tokenizer directory");
  in->add_option("--template", args.chat_template, "chat template (qwen2vl, llama3, mistral, llava, default)");
  in->add_option("--media-root", args.media_root, "folder relative media paths resolve against (default: the file's)");
  in->add_option("--cutoff-len", args.cutoff_len, "flag samples longer than this many tokens as bad");
  in->add_option("--max-samples", args.max_samples, "inspect only the first N records");
  in->add_option("--threads", args.threads, "decoding threads");
  in->add_flag("--headers-only", args.headers_only, "read image headers only (fast; lengths from header sizes)");
  register_action(in, run_inspect);

  auto* ex = c->add_subcommand("extract-features",
                               "Video + caption JSONL through a Wan pipeline's VAE and text encoder into feature shards");
  ex->add_option("--model", extract_args.model, "Wan pipeline directory (vae/, text_encoder/, tokenizer/; transformer/ is not needed)")->required();
  ex->add_option("--data", extract_args.data, "JSONL of {\"path\": video, \"cap\": caption}")->required();
  ex->add_option("--out", extract_args.out, "a new features directory (data.dataset: features reads it)")->required();
  ex->add_option("--buckets", extract_args.buckets, "HEIGHTxWIDTHxFRAMES[,...]: each video goes to the nearest aspect it is long enough for");
  ex->add_option("--fps", extract_args.o.fps, "frames are taken at this rate (16)");
  ex->add_option("--max-sequence-length", extract_args.o.max_sequence_length, "text tokens (512)");
  ex->add_option("--media-root", extract_args.o.media_root, "folder relative video paths resolve against (default: the JSONL's)");
  ex->add_option("--max-bad-fraction", extract_args.o.max_bad_fraction, "error when more records than this are skipped (0.5)");
  ex->add_option("--device", extract_args.device, "auto (a GPU when there is one), cpu, cuda or cuda:N");
  register_action(ex, run_extract_features);

  auto* ls = c->add_subcommand("latent-stats", "Measure a trained Wan VAE's per-channel latent mean and std and write them into its config.json");
  ls->add_option("--model", stats_args.model, "a vae/ directory, or a pipeline directory holding one")->required();
  ls->add_option("--data", stats_args.data, "JSONL of {\"path\": video}")->required();
  ls->add_option("--size", stats_args.bucket, "HEIGHTxWIDTHxFRAMES each clip is taken at (64x64x17)");
  ls->add_option("--fps", stats_args.fps, "frames are taken at this rate (16)");
  ls->add_option("--max-samples", stats_args.max_samples, "clips to measure (512)");
  ls->add_option("--media-root", stats_args.media_root, "folder relative video paths resolve against (default: the JSONL's)");
  ls->add_option("--device", stats_args.device, "auto (a GPU when there is one), cpu, cuda or cuda:N");
  register_action(ls, run_latent_stats);

  auto* mv = c->add_subcommand("moving-fashion-mnist",
                               "Fashion-MNIST garments sliding left, right, up or down as captioned H.264 clips + JSONL");
  mv->add_option("--out", moving_args.out_dir, "output directory")->required();
  mv->add_option("--source", moving_args.source_dir, "folder of the IDX .gz files (package dataset-fashion-mnist)");
  mv->add_option("--train", moving_args.train, "training clips (2000)");
  mv->add_option("--test", moving_args.test, "test clips (200)");
  mv->add_option("--size", moving_args.size, "canvas side in pixels (64)");
  mv->add_option("--frames", moving_args.frames, "frames per clip, 1 + 4k (17)");
  mv->add_option("--speed", moving_args.speed, "pixels per frame (2)");
  mv->add_option("--fps", moving_args.fps, "frame rate (16)");
  mv->add_option("--seed", moving_args.seed, "which garments, directions and positions (0)");
  register_action(mv, run_moving_fashion_mnist);
}

}  // namespace mm::cli
