// resize_bicubic: PIL's Image.resize(size, BICUBIC) for 8-bit RGB, bit for bit (Pillow's
// libImaging/Resample.c): a separable convolution with the Keys cubic (a = -0.5) whose support
// widens by the scale factor when shrinking (antialiasing), coefficients in 22-bit fixed
// point, a horizontal pass over the rows the vertical pass needs, rounded to 8 bits, then the
// vertical pass. transformers' image processors resize through PIL, so this is their resize.
#pragma once

#include "mindspeed_mm/data/media/image.h"

namespace mm::data {

// mm::Error for a non-positive size.
Image resize_bicubic(const Image& in, int out_width, int out_height);

// Center crop to (width, height) as transformers' center_crop; pads nothing (the crop must fit).
Image center_crop(const Image& in, int width, int height);

}  // namespace mm::data
