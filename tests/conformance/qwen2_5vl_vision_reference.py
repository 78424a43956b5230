#!/usr/bin/python3
# Independent reference of Hugging Face's Qwen2.5-VL vision tower (modeling_qwen2_5_vl:
# Qwen2_5_VisionPatchEmbed as a real Conv3d, rot_pos_emb, get_window_index with its -100 padding
# and unique_consecutive, eager attention with additive cu_seqlens masks, Qwen2_5_VLVisionBlock
# with Qwen2RMSNorm and the biased SwiGLU MLP, Qwen2_5_VLPatchMerger, the final argsort), in
# plain PyTorch, used only by tests/unit/test_qwen2vl_vision.cpp. It shares no code with the C++
# model.
#
#   usage: qwen2_5vl_vision_reference.py DIR
#   reads  DIR/vision_config.json (Qwen2_5_VLVisionConfig names), DIR/weights.safetensors (names
#          as under `visual.`), DIR/inputs.safetensors (pixel_values, grid_thw)
#   writes DIR/features.safetensors ("features" [N / merge^2, out_hidden_size],
#          "window_index" [N / merge^2], "cu_window_seqlens")
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from qwen2_reference import save_safetensors  # noqa: E402
from qwen2vl_vision_reference import load_case, patch_embed, rot_pos_emb, vision_attention  # noqa: E402


def rms_norm(x, w, eps=1e-6):
    # Qwen2RMSNorm normalises in float32 and casts back; a float64 run keeps float64 here so the
    # float64 comparison is not limited by float32 rounding of the norms.
    dtype = x.dtype
    x32 = x.to(torch.promote_types(dtype, torch.float32))
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(dtype)


def get_window_index(grid_thw, window_size, patch_size, m):
    window_index, cu_window_seqlens = [], [0]
    window_index_id = 0
    vit_merger_window_size = window_size // m // patch_size
    for grid_t, grid_h, grid_w in grid_thw.tolist():
        llm_grid_h, llm_grid_w = grid_h // m, grid_w // m
        index = torch.arange(grid_t * llm_grid_h * llm_grid_w).reshape(grid_t, llm_grid_h, llm_grid_w)
        pad_h = vit_merger_window_size - llm_grid_h % vit_merger_window_size
        pad_w = vit_merger_window_size - llm_grid_w % vit_merger_window_size
        num_windows_h = (llm_grid_h + pad_h) // vit_merger_window_size
        num_windows_w = (llm_grid_w + pad_w) // vit_merger_window_size
        index_padded = F.pad(index, (0, pad_w, 0, pad_h), "constant", -100)
        index_padded = index_padded.reshape(grid_t, num_windows_h, vit_merger_window_size, num_windows_w,
                                            vit_merger_window_size)
        index_padded = index_padded.permute(0, 1, 3, 2, 4).reshape(
            grid_t, num_windows_h * num_windows_w, vit_merger_window_size, vit_merger_window_size)
        seqlens = (index_padded != -100).sum([2, 3]).reshape(-1)
        index_padded = index_padded.reshape(-1)
        index_new = index_padded[index_padded != -100]
        window_index.append(index_new + window_index_id)
        cu_seqlens_tmp = seqlens.cumsum(0) * m * m + cu_window_seqlens[-1]
        cu_window_seqlens.extend(cu_seqlens_tmp.tolist())
        window_index_id += grid_t * llm_grid_h * llm_grid_w
    return torch.cat(window_index, dim=0), cu_window_seqlens


def additive_mask(cu, n, dtype):
    mask = torch.full([1, n, n], torch.finfo(dtype).min, dtype=dtype)
    for i in range(1, len(cu)):
        mask[..., cu[i - 1]:cu[i], cu[i - 1]:cu[i]] = 0
    return mask


def main():
    d = sys.argv[1]
    cfg, w, x, grid = load_case(d)
    E, heads, m = cfg["hidden_size"], cfg["num_heads"], cfg["spatial_merge_size"]
    P = cfg["patch_size"]
    unit = m * m
    hd = E // heads
    with torch.no_grad():
        h = patch_embed(cfg, w, x, E)
        freqs = rot_pos_emb(grid, hd, m)
        window_index, cu_window = get_window_index(grid, cfg["window_size"], P, m)
        cu_window = torch.unique_consecutive(torch.tensor(cu_window, dtype=torch.int32))
        n = h.shape[0]
        h = h.reshape(n // unit, unit, -1)[window_index, :, :].reshape(n, -1)
        freqs = freqs.reshape(n // unit, unit, -1)[window_index, :, :].reshape(n, -1)
        cu = F.pad(torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0]).cumsum(0), (1, 0), value=0)
        full_mask = additive_mask(cu.tolist(), n, h.dtype)
        window_mask = additive_mask(cu_window.tolist(), n, h.dtype)
        for b in range(cfg["depth"]):
            p = lambda k: w[f"blocks.{b}.{k}"]  # noqa: E731
            mask = full_mask if b in cfg["fullatt_block_indexes"] else window_mask
            y = rms_norm(h, p("norm1.weight"))
            h = h + vision_attention(y, p, heads, hd, freqs, mask)
            y = rms_norm(h, p("norm2.weight"))
            gate = F.silu(F.linear(y, p("mlp.gate_proj.weight"), p("mlp.gate_proj.bias")))
            up = F.linear(y, p("mlp.up_proj.weight"), p("mlp.up_proj.bias"))
            h = h + F.linear(gate * up, p("mlp.down_proj.weight"), p("mlp.down_proj.bias"))
        y = rms_norm(h, w["merger.ln_q.weight"]).view(-1, E * unit)
        y = F.linear(F.gelu(F.linear(y, w["merger.mlp.0.weight"], w["merger.mlp.0.bias"])),
                     w["merger.mlp.2.weight"], w["merger.mlp.2.bias"])
        y = y[torch.argsort(window_index), :]
    save_safetensors(os.path.join(d, "features.safetensors"),
                     {"features": y.contiguous(), "window_index": window_index.to(torch.int64),
                      "cu_window_seqlens": cu_window.to(torch.int64)})


if __name__ == "__main__":
    main()
