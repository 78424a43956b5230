#!/usr/bin/python3
# Independent reference of Hugging Face's Qwen2-VL vision tower (modeling_qwen2_vl:
# PatchEmbed as a real Conv3d, VisionRotaryEmbedding + rot_pos_emb, eager VisionAttention with the
# additive cu_seqlens mask, Qwen2VLVisionBlock, PatchMerger), in plain PyTorch, used only by
# tests/unit/test_qwen2vl_vision.cpp. It shares no code with the C++ model.
#
#   usage: qwen2vl_vision_reference.py DIR
#   reads  DIR/vision_config.json, DIR/weights.safetensors (names as under `visual.`),
#          DIR/inputs.safetensors (pixel_values [N, C*T*P*P], grid_thw [n, 3] int64)
#   writes DIR/features.safetensors ("features" [N / merge^2, hidden_size])
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from qwen2_reference import load_safetensors, save_safetensors  # noqa: E402


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rot_pos_emb(grid_thw, head_dim, m):
    pos_ids = []
    for t, h, w in grid_thw.tolist():
        hpos = torch.arange(h).unsqueeze(1).expand(-1, w).reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
        wpos = torch.arange(w).unsqueeze(0).expand(h, -1).reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
        pos_ids.append(torch.stack([hpos, wpos], dim=-1).repeat(t, 1))
    pos_ids = torch.cat(pos_ids, dim=0)
    dim = head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    seq = torch.arange(int(grid_thw[:, 1:].max()), dtype=inv_freq.dtype)
    full = torch.outer(seq, inv_freq)
    return full[pos_ids].flatten(1)


def apply_rotary(x, freqs):
    orig = x.dtype
    x = x.float()
    cos = freqs.cos().unsqueeze(1).repeat(1, 1, 2).unsqueeze(0).float()
    sin = freqs.sin().unsqueeze(1).repeat(1, 1, 2).unsqueeze(0).float()
    return ((x * cos) + (rotate_half(x) * sin)).to(orig)


def vision_attention(y, p, heads, hd, freqs, mask):
    """VisionAttention (eager): fused qkv, 2-D rotary in float32, additive mask, softmax in float32, proj."""
    n = y.shape[0]
    q, k, v = F.linear(y, p("attn.qkv.weight"), p("attn.qkv.bias")).reshape(n, 3, heads, -1).permute(1, 0, 2, 3).unbind(0)
    q = apply_rotary(q.unsqueeze(0), freqs).squeeze(0).transpose(0, 1)
    k = apply_rotary(k.unsqueeze(0), freqs).squeeze(0).transpose(0, 1)
    v = v.transpose(0, 1)
    a = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(hd) + mask
    a = torch.softmax(a, dim=-1, dtype=torch.float32).to(q.dtype)
    o = torch.matmul(a, v).transpose(0, 1).reshape(n, -1)
    return F.linear(o, p("attn.proj.weight"), p("attn.proj.bias"))


def act(name, x):
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    return F.gelu(x)


def load_case(d):
    """DIR's vision config, weights, pixel_values and grid_thw (shared with the Qwen2.5-VL reference)."""
    cfg = json.load(open(os.path.join(d, "vision_config.json")))
    w = load_safetensors(os.path.join(d, "weights.safetensors"))
    inp = load_safetensors(os.path.join(d, "inputs.safetensors"))
    return cfg, w, inp["pixel_values"], inp["grid_thw"]


def patch_embed(cfg, w, x, E):
    """PatchEmbed: a real Conv3d with kernel = stride = (temporal, patch, patch)."""
    C, T, P = cfg["in_chans"], cfg["temporal_patch_size"], cfg["patch_size"]
    weight = w["patch_embed.proj.weight"]
    return F.conv3d(x.view(-1, C, T, P, P).to(weight.dtype), weight, stride=(T, P, P)).view(-1, E)


def main():
    d = sys.argv[1]
    cfg, w, x, grid = load_case(d)
    E, heads, m = cfg["embed_dim"], cfg["num_heads"], cfg["spatial_merge_size"]
    hd = E // heads
    with torch.no_grad():
        h = patch_embed(cfg, w, x, E)
        freqs = rot_pos_emb(grid, hd, m)
        cu = F.pad(torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0]).cumsum(0), (1, 0), value=0)
        n = h.shape[0]
        mask = torch.full([1, n, n], torch.finfo(h.dtype).min, dtype=h.dtype)
        for i in range(1, len(cu)):
            mask[..., cu[i - 1]:cu[i], cu[i - 1]:cu[i]] = 0
        for b in range(cfg["depth"]):
            p = lambda k: w[f"blocks.{b}.{k}"]  # noqa: E731
            y = F.layer_norm(h, (E,), p("norm1.weight"), p("norm1.bias"), 1e-6)
            h = h + vision_attention(y, p, heads, hd, freqs, mask)
            y = F.layer_norm(h, (E,), p("norm2.weight"), p("norm2.bias"), 1e-6)
            y = F.linear(act(cfg["hidden_act"], F.linear(y, p("mlp.fc1.weight"), p("mlp.fc1.bias"))),
                         p("mlp.fc2.weight"), p("mlp.fc2.bias"))
            h = h + y
        y = F.layer_norm(h, (E,), w["merger.ln_q.weight"], w["merger.ln_q.bias"], 1e-6).view(-1, E * m * m)
        y = F.linear(F.gelu(F.linear(y, w["merger.mlp.0.weight"], w["merger.mlp.0.bias"])),
                     w["merger.mlp.2.weight"], w["merger.mlp.2.bias"])
    save_safetensors(os.path.join(d, "features.safetensors"), {"features": y.contiguous()})


if __name__ == "__main__":
    main()
