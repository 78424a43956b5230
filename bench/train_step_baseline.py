"""Baseline for bench/train_step.cpp: the same tiny Qwen2 LM and train step in idiomatic eager
PyTorch 2.11 (modules as in HF transformers' modeling_qwen2 with its default SDPA attention,
causal without a mask), torch.optim.AdamW, clip_grad_norm_, F.cross_entropy.

Weights and token batches are drawn from seeded CPU generators in the same order as our engine
(mm::models::Qwen2ForCausalLM::init_weights walks named modules; normal(0, 0.02) for Linear and
Embedding weights, zero biases, unit norms), so loss_first should match train_step's.

Run with the project's venv (PyPI torch 2.11, mm's own engine): .venv/bin/python bench/train_step_baseline.py --threads 1
Prints: RESULT impl=pytorch tokens_per_s=... step_ms=... loss_first=... loss_last=...
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Qwen2RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Qwen2RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids.float()[:, :, None] * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states, n_rep):
    if n_rep == 1:
        return hidden_states
    return hidden_states.repeat_interleave(n_rep, dim=1)


class Qwen2Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_heads = cfg.heads
        self.num_key_value_heads = cfg.kv_heads
        self.head_dim = cfg.hidden // cfg.heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.q_proj = nn.Linear(cfg.hidden, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(cfg.hidden, self.num_key_value_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(cfg.hidden, self.num_key_value_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden, bias=False)

    def forward(self, hidden_states, cos, sin, causal_mask):
        bsz, q_len, _ = hidden_states.size()
        q = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, self.num_key_value_groups)
        v = repeat_kv(v, self.num_key_value_groups)

        # transformers' default attention on torch 2.x: SDPA, causal without a materialised mask.
        attn_output = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)


class Qwen2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = Qwen2RMSNorm(cfg.hidden)
        self.self_attn = Qwen2Attention(cfg)
        self.post_attention_layernorm = Qwen2RMSNorm(cfg.hidden)
        self.mlp = Qwen2MLP(cfg)

    def forward(self, hidden_states, cos, sin, causal_mask):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin, causal_mask)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Qwen2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([Qwen2DecoderLayer(cfg) for _ in range(cfg.layers)])
        self.norm = Qwen2RMSNorm(cfg.hidden)
        self.rotary_emb = Qwen2RotaryEmbedding(cfg.hidden // cfg.heads)

    def forward(self, input_ids):
        bsz, seq_len = input_ids.shape
        hidden_states = self.embed_tokens(input_ids)
        position_ids = torch.arange(seq_len, device=input_ids.device).unsqueeze(0).expand(bsz, -1)
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        causal_mask = None
        for layer in self.layers:
            hidden_states = layer(hidden_states, cos, sin, causal_mask)
        return self.norm(hidden_states)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.model = Qwen2Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tie_word_embeddings

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))

    @torch.no_grad()
    def init_weights(self, seed, std=0.02):
        # Same draw order as our engine: named modules in order, the tied lm_head skipped.
        gen = torch.Generator().manual_seed(seed)
        for name, m in self.named_modules():
            if name == "lm_head":
                continue
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std, generator=gen)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
            elif isinstance(m, Qwen2RMSNorm):
                m.weight.fill_(1.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", dest="kv_heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--vocab", type=int, default=260)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--phases", type=int, default=0, help="1: also print mean ms per phase")
    p.add_argument("--trace", default="", help="Chrome trace of the timed steps (autograd profiler)")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    bf16 = a.precision == "bf16"
    model = Qwen2ForCausalLM(a)
    model.init_weights(a.seed)
    model.train()

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    gen = torch.Generator().manual_seed(a.seed + 1)
    batches = []
    for _ in range(a.warmup + a.steps):
        t = torch.randint(a.vocab, (a.batch, a.seq + 1), generator=gen)
        batches.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))

    # Seconds per phase over the timed steps (CPU ops are synchronous, so wall clock is exact).
    phase_names = ["forward", "loss", "backward", "clip", "adamw", "zero_grad"]
    phase_s = [0.0] * len(phase_names)
    timing = False
    clock = [0.0]

    def lap(i):
        if a.phases:
            now = time.perf_counter()
            if timing and i >= 0:
                phase_s[i] += now - clock[0]
            clock[0] = now

    def train_step(input_ids, labels):
        lap(-1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids)
        lap(0)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1))
        lap(1)
        loss.backward()
        lap(2)
        loss_value = loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        lap(3)
        optimizer.step()
        lap(4)
        optimizer.zero_grad(set_to_none=True)
        lap(5)
        return loss_value

    loss_first = loss_last = float("nan")
    for i in range(a.warmup):
        loss = train_step(*batches[i])
        if i == 0:
            loss_first = loss
    timing = True
    profile = torch.autograd.profiler.profile(enabled=bool(a.trace), use_kineto=False)
    with profile:
        t0 = time.perf_counter()
        for i in range(a.steps):
            loss_last = train_step(*batches[a.warmup + i])
            if a.warmup == 0 and i == 0:
                loss_first = loss_last
        secs = time.perf_counter() - t0
    if a.trace:
        profile.export_chrome_trace(a.trace)

    tokens = a.steps * a.batch * a.seq
    print(f"RESULT impl=pytorch precision={a.precision} threads={a.threads} tokens_per_s={tokens / secs:.1f} "
          f"step_ms={1e3 * secs / a.steps:.2f} loss_first={loss_first:.4f} loss_last={loss_last:.4f}")
    if a.phases:
        print("PHASES impl=pytorch " + " ".join(
            f"{n}_ms={1e3 * t / a.steps:.2f}" for n, t in zip(phase_names, phase_s)))


if __name__ == "__main__":
    main()
