# Pillow reference for the image tests (run with Debian's /usr/bin/python3 and python3-pil):
# for each image, transformers' convert_to_rgb (alpha composited over white) of PIL's decode,
# and PIL's BICUBIC resize of it to each requested size, as raw RGB bytes.
#   python3 pil_reference.py OUT_DIR IMAGE... -- W1xH1 W2xH2 ...
# Writes OUT_DIR/<name>.rgb (decoded) and OUT_DIR/<name>.<W>x<H>.rgb, and OUT_DIR/index.txt
# lines "name width height". Also writes lossless WebP and BMP copies of the first image
# (OUT_DIR/<name>.webp, .bmp) for the decoder tests.
import math
import os
import sys

from PIL import Image


def convert_to_rgb(image):
    # transformers.image_transforms.convert_to_rgb
    if image.mode == "RGB":
        return image
    image_rgba = image.convert("RGBA")
    background = Image.new("RGBA", image_rgba.size, (255, 255, 255))
    return Image.alpha_composite(background, image_rgba).convert("RGB")


# transformers' Qwen2-VL smart_resize (also bench/loader_baseline.py's).
def smart_resize(height, width, factor, min_pixels, max_pixels):
    if max(height, width) / min(height, width) > 200:
        raise ValueError("aspect ratio")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def main():
    out = sys.argv[1]
    sep = sys.argv.index("--")
    paths, sizes = sys.argv[2:sep], sys.argv[sep + 1:]
    os.makedirs(out, exist_ok=True)
    index = []
    for i, path in enumerate(paths):
        name = os.path.basename(path)
        img = convert_to_rgb(Image.open(path))
        img.load()
        with open(os.path.join(out, name + ".rgb"), "wb") as f:
            f.write(img.tobytes())
        index.append(f"{name} {img.width} {img.height}")
        for s in sizes:
            w, h = (int(v) for v in s.split("x"))
            with open(os.path.join(out, f"{name}.{w}x{h}.rgb"), "wb") as f:
                f.write(img.resize((w, h), Image.BICUBIC).tobytes())
        if i == 0:
            img.save(os.path.join(out, name + ".webp"), lossless=True)
            img.save(os.path.join(out, name + ".bmp"))
    with open(os.path.join(out, "index.txt"), "w") as f:
        f.write("\n".join(index) + "\n")


if __name__ == "__main__":
    main()
