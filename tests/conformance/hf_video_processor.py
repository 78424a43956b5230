"""transformers' own Qwen2VLVideoProcessor as the reference for mm's video processing
(tests/unit/test_video.cpp).

  hf_video_processor.py PREFIX T H W MIN_PIXELS MAX_PIXELS

Reads PREFIX.u8 (T frames of H x W RGB, uint8, as mm decoded them), runs the processor with
frame sampling off (mm samples frames itself, qwen-vl-utils' rule) and writes PREFIX.f32
(pixel_values_videos, float32 little-endian) and PREFIX.txt "t h w" (video_grid_thw).
"""
import sys

import numpy as np
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor


def main(argv):
    prefix = argv[1]
    t, h, w, min_pixels, max_pixels = (int(v) for v in argv[2:7])
    frames = np.fromfile(prefix + ".u8", dtype=np.uint8).reshape(t, h, w, 3)
    proc = Qwen2VLVideoProcessor(size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, do_sample_frames=False)
    out = proc(videos=[frames], return_tensors="np")
    np.asarray(out["pixel_values_videos"], dtype="<f4").tofile(prefix + ".f32")
    gt, gh, gw = (int(v) for v in np.asarray(out["video_grid_thw"])[0])
    with open(prefix + ".txt", "w") as f:
        f.write(f"{gt} {gh} {gw}\n")


if __name__ == "__main__":
    main(sys.argv)
