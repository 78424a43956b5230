"""Chat templates rendered by transformers' own apply_chat_template (the project's .venv,
transformers pinned in scripts/install_deps.sh), offline from a local tokenizer.json.

  hf_chat_template.py CASES_JSON OUT_JSONL

CASES_JSON: {"template": "...", "tokenizer": "path/tokenizer.json", "bos_token": "...",
             "eos_token": "...", "cases": [{"messages": [...], "add_generation_prompt": false,
             "image_pad_counts": [n, ...], "video_pad_counts": [n, ...]}]}
Each case is rendered to text; its <|image_pad|> / <|video_pad|> are repeated n times as
Qwen2VLProcessor does with the image processor's token counts; the text is encoded with
add_special_tokens=False, as apply_chat_template(tokenize=True) does (checked equal where no pad
is expanded). OUT_JSONL: one {"case": i, "text": "...", "ids": [...]} per case.
"""
import json
import sys

import transformers.utils.logging as hf_logging
from transformers import PreTrainedTokenizerFast


def expand(text, token, counts):
    if not counts:
        return text
    parts = text.split(token)
    out = parts[0]
    for k, part in enumerate(parts[1:]):
        out += token * (counts[k] if k < len(counts) else 1) + part
    return out


def main(cases_path, out_path):
    hf_logging.set_verbosity_error()
    with open(cases_path, encoding="utf-8") as f:
        spec = json.load(f)
    tok = PreTrainedTokenizerFast(tokenizer_file=spec["tokenizer"], bos_token=spec.get("bos_token") or None,
                                  eos_token=spec.get("eos_token") or None)
    tok.chat_template = spec["template"]
    lines = []
    for i, c in enumerate(spec["cases"]):
        gen = bool(c.get("add_generation_prompt"))
        text = tok.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=gen)
        expanded = expand(expand(text, "<|image_pad|>", c.get("image_pad_counts")), "<|video_pad|>",
                          c.get("video_pad_counts"))
        ids = tok.encode(expanded, add_special_tokens=False)
        if expanded == text:
            direct = tok.apply_chat_template(c["messages"], tokenize=True, add_generation_prompt=gen)
            direct = direct["input_ids"] if isinstance(direct, dict) or hasattr(direct, "keys") else direct
            if list(direct) != ids:
                raise SystemExit(f"case {i}: apply_chat_template(tokenize=True) differs from encode(text)")
        lines.append(json.dumps({"case": i, "text": expanded, "ids": ids}, ensure_ascii=False))
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
