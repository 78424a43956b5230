"""transformers' own Qwen2-VL image processor as the reference for mm's (tests/unit/test_image.cpp).

  hf_image_processor.py OUT_PREFIX IMAGE MIN_PIXELS MAX_PIXELS [pil|torchvision]

Writes OUT_PREFIX.f32 (pixel_values, rows x row_size float32 little-endian) and OUT_PREFIX.txt
"t h w" (image_grid_thw). `pil` (default) is Qwen2VLImageProcessorPil, the Pillow backend whose
BICUBIC resize mm reproduces bit for bit; `torchvision` is transformers 5's default backend
(antialiased tensor resize: close to Pillow, not equal).
"""
import sys

import numpy as np
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil


def main(argv):
    prefix, path, min_pixels, max_pixels = argv[1], argv[2], int(argv[3]), int(argv[4])
    backend = argv[5] if len(argv) > 5 else "pil"
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    if backend == "pil":
        proc = Qwen2VLImageProcessorPil(size=size)
    else:
        from transformers import Qwen2VLImageProcessor
        proc = Qwen2VLImageProcessor(size=size)
    out = proc(images=[Image.open(path)], return_tensors="np")
    np.asarray(out["pixel_values"], dtype="<f4").tofile(prefix + ".f32")
    t, h, w = (int(v) for v in np.asarray(out["image_grid_thw"])[0])
    with open(prefix + ".txt", "w") as f:
        f.write(f"{t} {h} {w}\n")


if __name__ == "__main__":
    main(sys.argv)
