"""Baseline for bench/dit_step.cpp: the same Wan2.1 diffusion transformer in PyPI's diffusers
(WanTransformer3DModel) and torch 2.11, the same train step: forward on noisy latents, timesteps
and text features, mean squared error against the velocity target, backward, clip_grad_norm_(1.0),
torch.optim.AdamW, zero_grad.

--prepare DIR writes what both sides read: DIR/transformer (save_pretrained of a seeded random
model) and DIR/inputs.safetensors (one batch per step: noisy_latents, timesteps, prompt_embeds,
target), so both start from the same weights on the same data and loss_first agrees to rounding.

Prints: RESULT impl=diffusers precision=... tokens_per_s=... step_ms=... loss_first=... loss_last=...
"""
import argparse
import time

import torch
import torch.nn.functional as F
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file, save_file


def config(a):
    return dict(patch_size=(1, 2, 2), num_attention_heads=a.heads, attention_head_dim=a.head_dim,
                in_channels=16, out_channels=16, text_dim=a.text_dim, freq_dim=256, ffn_dim=a.ffn,
                num_layers=a.layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                rope_max_seq_len=1024)


def prepare(a):
    torch.manual_seed(a.seed)
    model = WanTransformer3DModel(**config(a))
    # A non-zero head (Wan zeroes it at init, which would give every step the same loss).
    for p in model.parameters():
        p.data.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(f"{a.prepare}/transformer")
    n = a.warmup + a.steps
    g = torch.Generator().manual_seed(a.seed + 1)
    shape = (n, a.batch, 16, a.frames, a.size, a.size)
    x0, noise = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    sigma = torch.rand((n, a.batch), generator=g)
    s = sigma.view(n, a.batch, 1, 1, 1, 1)
    save_file({"noisy_latents": ((1 - s) * x0 + s * noise).contiguous(), "timesteps": (sigma * 1000).contiguous(),
               "prompt_embeds": torch.randn((n, a.batch, a.text_len, a.text_dim), generator=g),
               "target": (noise - x0).contiguous()}, f"{a.prepare}/inputs.safetensors")


def run(a):
    torch.set_num_threads(a.threads)
    # Built from config.json with the saved weights loaded strictly (from_pretrained wants accelerate).
    import json
    with open(f"{a.dir}/transformer/config.json") as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    model = WanTransformer3DModel(**cfg)
    model.load_state_dict(load_file(f"{a.dir}/transformer/diffusion_pytorch_model.safetensors"), strict=True)
    model = model.to(a.device)
    model.train()
    inputs = {k: v.to(a.device) for k, v in load_file(f"{a.dir}/inputs.safetensors").items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            foreach=True if a.device == "cpu" else None)
    bf16 = a.precision == "bf16"

    def step(i):
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=bf16):
            pred = model(hidden_states=inputs["noisy_latents"][i], timestep=inputs["timesteps"][i],
                         encoder_hidden_states=inputs["prompt_embeds"][i], return_dict=False)[0]
        loss = F.mse_loss(pred.float(), inputs["target"][i])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    loss_first = loss_last = 0.0
    for i in range(a.warmup):
        loss = step(i)
        loss_first = loss if i == 0 else loss_first
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss_last = step(a.warmup + i)
    secs = time.perf_counter() - t0
    tokens = a.steps * a.batch * a.frames * (a.size // 2) ** 2
    print(f"RESULT impl=diffusers precision={a.precision} threads={a.threads} tokens_per_s={tokens / secs:.1f} "
          f"step_ms={1e3 * secs / a.steps:.2f} loss_first={loss_first:.6f} loss_last={loss_last:.6f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--prepare", default="")
    p.add_argument("--dir", default="")
    for k, v in dict(heads=8, head_dim=64, ffn=1536, layers=4, text_dim=512, text_len=64, batch=2, frames=5, size=16,
                     steps=5, warmup=2, threads=1, seed=0).items():
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    prepare(a) if a.prepare else run(a)
