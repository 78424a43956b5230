# The Python pipeline bench/loader.cpp is measured against: per sample the same work, as a
# MindSpeed-MM / LLaMA-Factory user runs it today: PIL decode + convert_to_rgb, Qwen2-VL
# smart_resize, PIL BICUBIC resize, rescale + normalize (numpy float32), patchify (the reshape /
# transpose of transformers' Qwen2VLImageProcessor); videos decoded with PyAV as
# torchvision.io.read_video did, frames sampled as qwen_vl_utils does (fps 2, linspace indices), each frame resized with
# PIL; the ChatML text byte-encoded with pad tokens expanded. torch.utils.data.DataLoader with 1 and
# 2 worker processes, batch size 1.
#   .venv/bin/python bench/loader_baseline.py DATA.jsonl KIND SAMPLES WARMUP [MAX_PIXELS]
# Prints: RESULT impl=python kind=K workers=W samples_per_s=X
import json
import os
import sys
import time

import numpy as np
import torch
import av
import torchvision  # noqa: F401  (the DataLoader stack a user has)
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "media"))
from pil_reference import convert_to_rgb, smart_resize  # noqa: E402  transformers' functions

MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
PATCH, TEMPORAL, MERGE = 14, 2, 2
VIDEO_MIN, VIDEO_MAX = 128 * 28 * 28, 768 * 28 * 28


def patchify(frames):  # list of H W C uint8 arrays of one size
    x = np.stack(frames).astype(np.float32) * np.float32(1 / 255)
    x = ((x - MEAN) / STD).transpose(0, 3, 1, 2)  # T C H W
    if x.shape[0] % TEMPORAL:
        x = np.concatenate([x, np.repeat(x[-1:], TEMPORAL - x.shape[0] % TEMPORAL, axis=0)])
    t, c, h, w = x.shape
    gt, gh, gw = t // TEMPORAL, h // PATCH, w // PATCH
    x = x.reshape(gt, TEMPORAL, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * TEMPORAL * PATCH * PATCH)), (gt, gh, gw)


def process_image(path, max_pixels):
    im = convert_to_rgb(Image.open(path))
    h, w = smart_resize(im.height, im.width, PATCH * MERGE, 56 * 56, max_pixels)
    arr = np.asarray(im.resize((w, h), Image.BICUBIC))
    return patchify([arr, arr])


def process_video(path, fps=2.0):
    # What torchvision.io.read_video did (torchvision 0.26 dropped it): every frame through PyAV.
    with av.open(path) as container:
        stream = container.streams.video[0]
        video = torch.from_numpy(np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)]))
        video_fps = float(stream.average_rate)
    total = video.shape[0]
    n = round(total / video_fps * fps / 2) * 2
    n = max(4, min(n, total // 2 * 2))
    idx = torch.linspace(0, total - 1, n).round().long()
    frames = video[idx].numpy()
    h, w = smart_resize(frames.shape[1], frames.shape[2], PATCH * MERGE, VIDEO_MIN, VIDEO_MAX)
    return patchify([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC)) for f in frames])


class Dataset(torch.utils.data.Dataset):
    def __init__(self, path, max_pixels):
        base = os.path.dirname(path)
        self.records = [json.loads(line) for line in open(path) if line.strip()]
        for r in self.records:
            r["images"] = [os.path.join(base, p) for p in r.get("images", [])]
            r["videos"] = [os.path.join(base, p) for p in r.get("videos", [])]
        self.max_pixels = max_pixels

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        images = [process_image(p, self.max_pixels) for p in r["images"]]
        videos = [process_video(p) for p in r["videos"]]
        text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        for m in r["messages"]:
            text += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
        ids = []
        for piece in text.replace("<video>", "<image>").split("<image>"):
            ids.extend(piece.encode())
            ids.append(-1)
        ids.pop()
        pads = [g[0] * g[1] * g[2] // (MERGE * MERGE) for _, g in images + videos]
        out, k = [], 0
        for t in ids:
            if t == -1:
                out.extend([259] + [261] * pads[k] + [260])
                k += 1
            else:
                out.append(t)
        pixel_values = [torch.from_numpy(p) for p, _ in images + videos]
        return {"input_ids": torch.tensor(out), "pixel_values": pixel_values}


def main():
    path, kind, samples, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    max_pixels = int(sys.argv[5]) if len(sys.argv) > 5 else 28 * 28 * 1280
    torch.set_num_threads(1)
    ds = Dataset(path, max_pixels)
    for workers in (1, 2):
        sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=samples + warmup,
                                                 generator=torch.Generator().manual_seed(1))
        loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=workers, sampler=sampler,
                                             collate_fn=lambda x: x[0], prefetch_factor=4)
        it = iter(loader)
        for _ in range(warmup):
            next(it)
        t0 = time.perf_counter()
        for _ in range(samples):
            next(it)
        dt = time.perf_counter() - t0
        print(f"RESULT impl=python kind={kind} workers={workers} samples_per_s={samples / dt:.2f}", flush=True)


if __name__ == "__main__":
    main()
