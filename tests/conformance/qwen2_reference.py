#!/usr/bin/python3
# Independent reference of Hugging Face's modeling_qwen2 (Qwen2ForCausalLM, eager attention),
# written in plain PyTorch and used only by tests/unit/test_qwen2_conformance.cpp. It shares no
# code with the C++ model: it reads an HF model directory the way transformers would and computes
# logits the way HF's Qwen2 modules do, so the test can compare the two to a stated tolerance.
#
#   usage: qwen2_reference.py DIR
#   reads  DIR/config.json, DIR/model.safetensors, DIR/inputs.safetensors (input_ids [B, S] int64,
#          optional position_ids [B, S])
#   writes DIR/logits.safetensors ("logits" [B, S, vocab], in the checkpoint's dtype)
#
# The model runs in the checkpoint's dtype. Where HF upcasts to float32 (RMSNorm variance, rotary
# angles, softmax), this reference does the same, except that a float64 model stays in float64
# (HF would round those steps to float32); that is the one deviation, and it is what lets the test
# hold a float64 model to 1e-10.
import json
import math
import struct
import sys

import torch

ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32}


def load_safetensors(path):
    # 8-byte little-endian header length, JSON header, then the raw little-endian data section.
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = bytearray(blob[8 + n:])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = ST_DTYPES[info["dtype"]]
        t = torch.frombuffer(data[begin:end], dtype=dtype) if end > begin else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out


def save_safetensors(path, tensors):
    names = {v: k for k, v in ST_DTYPES.items()}
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def upcast_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm(x, weight, eps):
    # Qwen2RMSNorm: variance in fp32, then weight * hidden.to(input_dtype).
    h = x.to(upcast_dtype(x.dtype))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotary_cos_sin(position_ids, head_dim, theta, dtype):
    # Qwen2RotaryEmbedding: inv_freq = 1 / theta^(2i/d); emb = cat(freqs, freqs).
    f = upcast_dtype(dtype)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(f) / head_dim))
    freqs = position_ids.to(f)[:, :, None] * inv_freq[None, None, :]  # [B, S, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def linear(x, w, b=None):
    y = x @ w.t()
    return y + b if b is not None else y


def attention(x, p, cfg, cos, sin):
    B, S, _ = x.shape
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    hd = cfg["hidden_size"] // nh
    q = linear(x, p["q_proj.weight"], p.get("q_proj.bias")).view(B, S, nh, hd).transpose(1, 2)
    k = linear(x, p["k_proj.weight"], p.get("k_proj.bias")).view(B, S, nkv, hd).transpose(1, 2)
    v = linear(x, p["v_proj.weight"], p.get("v_proj.bias")).view(B, S, nkv, hd).transpose(1, 2)
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    # repeat_kv: each key/value head serves nh / nkv consecutive query heads.
    k = k[:, :, None].expand(B, nkv, nh // nkv, S, hd).reshape(B, nh, S, hd)
    v = v[:, :, None].expand(B, nkv, nh // nkv, S, hd).reshape(B, nh, S, hd)
    scores = (q @ k.transpose(2, 3)) / math.sqrt(hd)
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)  # causal over sequence index, as HF
    scores = scores.masked_fill(causal, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=upcast_dtype(q.dtype)).to(q.dtype)
    o = (probs @ v).transpose(1, 2).reshape(B, S, nh * hd)
    return linear(o, p["o_proj.weight"])


def mlp(x, p):
    return linear(torch.nn.functional.silu(linear(x, p["gate_proj.weight"])) * linear(x, p["up_proj.weight"]),
                  p["down_proj.weight"])


def forward(cfg, w, input_ids, position_ids, inputs_embeds=None):
    eps = cfg.get("rms_norm_eps", 1e-6)
    embed = w["model.embed_tokens.weight"]
    h = embed[input_ids] if inputs_embeds is None else inputs_embeds
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    cos, sin = rotary_cos_sin(position_ids, hd, cfg.get("rope_theta", 10000.0), h.dtype)
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        layer = {k[len(pre):]: v for k, v in w.items() if k.startswith(pre)}
        attn_p = {k[len("self_attn."):]: v for k, v in layer.items() if k.startswith("self_attn.")}
        mlp_p = {k[len("mlp."):]: v for k, v in layer.items() if k.startswith("mlp.")}
        h = h + attention(rms_norm(h, layer["input_layernorm.weight"], eps), attn_p, cfg, cos, sin)
        h = h + mlp(rms_norm(h, layer["post_attention_layernorm.weight"], eps), mlp_p)
    h = rms_norm(h, w["model.norm.weight"], eps)
    head = embed if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return linear(h, head)


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    w = load_safetensors(f"{d}/model.safetensors")
    inputs = load_safetensors(f"{d}/inputs.safetensors")
    ids = inputs["input_ids"]
    pos = inputs.get("position_ids")
    if pos is None:
        pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    with torch.no_grad():
        logits = forward(cfg, w, ids, pos)
    save_safetensors(f"{d}/logits.safetensors", {"logits": logits})
    print(f"qwen2_reference: logits {list(logits.shape)} {logits.dtype} written to {d}/logits.safetensors")


if __name__ == "__main__":
    main()
