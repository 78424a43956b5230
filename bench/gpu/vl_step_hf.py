"""Baseline for bench/vl_step.cpp on a GPU: the same Qwen2-VL architecture (config.json that
vl_step wrote with MM_BENCH_DUMP) in Hugging Face transformers with torch's SDPA attention,
random weights, and the exact batches vl_step timed (batch_K.safetensors): forward, summed
cross-entropy over the labeled tokens / their count, backward, clip_grad_norm_, AdamW
(torch's CUDA default implementation), zero_grad; bf16 autocast over fp32 weights as mm's
`training.precision: bf16`. Each step is timed to its completion (torch.cuda.synchronize).

usage: python bench/gpu/vl_step_hf.py DUMP_DIR [--warmup 3] [--device cuda]
prints: RESULT impl=transformers tokens_per_s=... step_ms=... loss_first=... loss_last=...
"""
import argparse
import glob
import json
import os
import time

import torch
from safetensors.torch import load_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    a = ap.parse_args()

    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    with open(os.path.join(a.dump, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    config = Qwen2VLConfig(**cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).to(a.device, torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0, betas=(0.9, 0.999))
    files = sorted(glob.glob(os.path.join(a.dump, "batch_*.safetensors")), key=lambda p: int(p.split("_")[-1].split(".")[0]))
    batches = [{k: v.to(a.device) for k, v in load_file(p).items()} for p in files]
    if not batches:
        raise SystemExit(f"vl_step_hf: no batch_*.safetensors in {a.dump}")

    def step(b):
        with torch.autocast("cuda" if "cuda" in a.device else "cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            ids = b["input_ids"]  # transformers 5 wants the image/video token types for M-RoPE
            types = (ids == config.image_token_id).long() + 2 * (ids == config.video_token_id).long()
            out = model(input_ids=ids, attention_mask=b["attention_mask"], pixel_values=b["pixel_values"],
                        image_grid_thw=b["image_grid_thw"], mm_token_type_ids=types, use_cache=False)
        logits = out.logits.float()
        labels = b["labels"]  # already shifted by mm's collator
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100,
                                                 reduction="sum") / labels.ne(-100).sum().clamp_min(1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for i in range(a.warmup):
        step(batches[i % len(batches)])
    if "cuda" in a.device:
        torch.cuda.synchronize()
    losses, tokens, t_total = [], 0, 0.0
    for b in batches:
        t0 = time.perf_counter()
        losses.append(step(b))
        if "cuda" in a.device:
            torch.cuda.synchronize()
        t_total += time.perf_counter() - t0
        tokens += int(b["attention_mask"].ne(0).sum())
    print(f"RESULT impl=transformers tokens_per_s={tokens / t_total:.1f} step_ms={1e3 * t_total / len(batches):.2f} "
          f"loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} steps={len(batches)}")


if __name__ == "__main__":
    main()
