"""Synthetic vision-language data for the GPU benchmarks (no files to download or carry):
N images (24-bit BMP, SIZE x SIZE, a coloured rectangle and a disc on a gradient, written with the
standard library only) and an mllm JSONL whose assistant answer names the shapes' colours, so
every sample has one image and ~20 answer tokens.

usage: python3 bench/gpu/make_vl_data.py OUT_DIR [--n 64] [--size 448]
"""
import argparse
import json
import os
import random
import struct

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40),
           "purple": (140, 50, 170), "orange": (240, 140, 30)}


def bmp(path, w, h, pixel):
    row = (3 * w + 3) & ~3
    data = bytearray()
    for y in range(h - 1, -1, -1):  # bottom-up rows
        line = bytearray()
        for x in range(w):
            r, g, b = pixel(x, y)
            line += bytes((b, g, r))
        line += b"\0" * (row - 3 * w)
        data += line
    header = struct.pack("<2sIHHI", b"BM", 54 + len(data), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(data), 2835, 2835, 0, 0)
    with open(path, "wb") as f:
        f.write(header + info + data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=int, default=448)
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "images"), exist_ok=True)
    rng = random.Random(7)
    names = list(COLOURS)
    with open(os.path.join(a.out, "train.jsonl"), "w") as f:
        for i in range(a.n):
            c1, c2 = rng.sample(names, 2)
            s = a.size
            x0, y0 = rng.randrange(s // 2), rng.randrange(s // 2)
            cx, cy, r = rng.randrange(s), rng.randrange(s), s // 6

            def pixel(x, y):
                if (x - cx) ** 2 + (y - cy) ** 2 < r * r:
                    return COLOURS[c2]
                if x0 <= x < x0 + s // 3 and y0 <= y < y0 + s // 4:
                    return COLOURS[c1]
                return (x * 255 // s, y * 255 // s, 128)

            rel = f"images/{i:05d}.bmp"
            bmp(os.path.join(a.out, rel), s, s, pixel)
            rec = {"id": f"synthetic-{i}", "images": [rel], "messages": [
                {"role": "user", "content": "<image>Describe the shapes in this picture."},
                {"role": "assistant", "content": f"A {c1} rectangle and a {c2} disc on a gradient background."}]}
            f.write(json.dumps(rec) + "\n")
    print(f"make_vl_data: {a.n} images of {a.size}x{a.size} in {a.out}")


if __name__ == "__main__":
    main()
