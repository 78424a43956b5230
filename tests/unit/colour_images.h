// Synthetic "which colour is this" images for the VLM training tests.
#pragma once

#include <string>

#include "mindspeed_mm/data/media/image.h"

namespace mm::test {

// Writes media/<i>.png under dir: a size that varies with i, one dominant channel (i % 3).
// Returns the path relative to dir; the dominant channel is i % 3.
inline std::string write_colour_image(const std::string& dir, int i) {
  const int w = 28 + (i * 7) % 40, h = 28 + (i * 11) % 30, c = i % 3;
  mm::data::Image im(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < 3; ++k) im.row(y)[3 * x + k] = static_cast<uint8_t>(k == c ? 200 + (x + y) % 50 : (x * y) % 60);
  const std::string name = "media/" + std::to_string(i) + ".png";
  mm::data::save_png(im, dir + "/" + name);
  return name;
}

}  // namespace mm::test
