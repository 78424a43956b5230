# Reference pixel_values for Qwen2-VL images, following transformers' Qwen2VLImageProcessor
# step by step with numpy and Pillow (transformers itself is not packaged in Debian):
# convert_to_rgb, smart_resize (factor 28), PIL BICUBIC resize, rescale (float64 product cast
# to float32), normalize with OPENAI_CLIP_MEAN/STD in float32, repeat to temporal_patch_size,
# then the reshape/transpose of _preprocess.
#   python3 qwen2vl_reference.py OUT_PREFIX IMAGE MIN_PIXELS MAX_PIXELS
# Writes OUT_PREFIX.f32 (rows x row_size float32, little-endian) and OUT_PREFIX.txt "t h w".
import sys

import numpy as np
from PIL import Image

from pil_reference import convert_to_rgb, smart_resize  # same folder: transformers' functions

MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


def main():
    prefix, path, min_pixels, max_pixels = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    patch, temporal, merge = 14, 2, 2
    image = convert_to_rgb(Image.open(path))
    h, w = smart_resize(image.height, image.width, patch * merge, min_pixels, max_pixels)
    image = image.resize((w, h), Image.BICUBIC)
    x = np.array(image)                                   # H W C uint8
    x = (x.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array(MEAN, dtype=np.float32)
    std = np.array(STD, dtype=np.float32)
    x = (x - mean) / std
    x = x.transpose(2, 0, 1)                              # C H W
    patches = np.repeat(x[np.newaxis], temporal, axis=0)  # T C H W
    c = patches.shape[1]
    gt, gh, gw = patches.shape[0] // temporal, h // patch, w // patch
    patches = patches.reshape(gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(gt * gh * gw, c * temporal * patch * patch).astype("<f4")
    flat.tofile(prefix + ".f32")
    with open(prefix + ".txt", "w") as f:
        f.write(f"{gt} {gh} {gw}\n")


main()
