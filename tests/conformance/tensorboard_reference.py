"""PyPI's tensorboard (pinned in scripts/install_deps.sh) as the reader of mm's event files.

  tensorboard_reference.py read DIR OUT_JSON
      Loads every event file in DIR with tensorboard's own EventAccumulator (its record reader
      checks each record's masked CRC-32C) and writes OUT_JSON:
        {"files": N, "scalars": {tag: [[step, value], ...]}, "text": {tag: [[step, "..."]]},
         "images": {tag: [[step, width, height, "DIR/image_<tag>_<step>.png"], ...]}}
      Each image's encoded bytes are written next to OUT_JSON so the test decodes them itself.
"""
import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util


def read(d, out):
    files = [f for f in os.listdir(d) if "tfevents" in f]
    acc = event_accumulator.EventAccumulator(
        d, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    result = {"files": len(files), "scalars": {}, "text": {}, "images": {}}
    for tag in tags["scalars"]:
        result["scalars"][tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
    for tag in tags["tensors"]:
        rows = []
        for e in acc.Tensors(tag):
            value = tensor_util.make_ndarray(e.tensor_proto)
            text = value.item() if value.shape == () else value.reshape(-1)[0]
            rows.append([e.step, text.decode("utf-8") if isinstance(text, bytes) else str(text)])
        result["text"][tag] = rows
    out_dir = os.path.dirname(os.path.abspath(out))
    for tag in tags["images"]:
        rows = []
        for e in acc.Images(tag):
            path = os.path.join(out_dir, "image_%s_%d.png" % (tag.replace("/", "_"), e.step))
            with open(path, "wb") as f:
                f.write(e.encoded_image_string)
            rows.append([e.step, e.width, e.height, path])
        result["images"][tag] = rows
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "read":
        sys.exit(__doc__)
    read(sys.argv[2], sys.argv[3])
