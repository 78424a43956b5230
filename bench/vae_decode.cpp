// Wan2.1 VAE decode throughput and peak memory (bench/run_vae_decode.sh): Wan2.1's VAE
// architecture (base_dim 96, z 16, random weights from a fixed seed) decoding random latents of
// `latent_frames` frames at `height` x `width` latent pixels (x8 in the video), in one of two
// modes: `chunked` (one latent frame at a time with the feature cache, frames streamed out and
// dropped) or `whole` (the whole clip in one pass). Prints one line: mode, video frames, seconds,
// frames/s, and the peak resident memory above what the model itself holds.
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/models/wan/wan_vae.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: vae_decode chunked|whole LATENT_FRAMES HEIGHT WIDTH [THREADS]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int64_t n = std::stoll(argv[2]), h = std::stoll(argv[3]), w = std::stoll(argv[4]);
  at::set_num_threads(argc > 5 ? std::stoi(argv[5]) : 1);
  mm::models::WanVAEConfig c;  // Wan2.1's defaults
  mm::models::AutoencoderKLWan vae(c);
  vae.init_weights(0);
  at::NoGradGuard no_grad;
  at::manual_seed(1);
  const at::Tensor z = at::randn({1, c.z_dim, n, h, w});
  const long long before = mm::resident_bytes();
  int64_t frames = 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (mode == "chunked") {
    vae.decode_frames(z, [&](const at::Tensor& f) { frames += f.size(2); });
  } else {
    frames = vae.decode(z, /*chunked=*/false).size(2);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double peak_mib = (static_cast<double>(ru.ru_maxrss) * 1024 - static_cast<double>(before)) / (1 << 20);
  std::printf("%s: %lld frames of %lldx%lld in %.2f s = %.2f frames/s; peak memory above the model %.0f MiB\n", mode.c_str(),
              static_cast<long long>(frames), static_cast<long long>(8 * w), static_cast<long long>(8 * h), s, frames / s,
              peak_mib);
  return 0;
}
