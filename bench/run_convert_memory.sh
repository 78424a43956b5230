#!/usr/bin/env bash
# Peak memory of `mm convert` on a model whose tensors total about 2 GB (a Qwen2 of random fp32
# weights, written by safetensors from the project's .venv): hf-to-mm at TP2 x PP2, resplit to
# PP4, mm-to-hf back. Each line gives the process's peak resident memory (getrusage, which counts
# the input's mapped pages too), the largest tensor, and the peak above the largest tensor (the
# goal: under 0.5 GB). The baseline is the same command on a tiny model: what the mm process
# (libtorch and its libraries) holds before any tensor.
#
# Usage: bash bench/run_convert_memory.sh [BUILD_DIR]   (default: build)
# Environment: WORK (scratch directory, default /tmp/mm_convert_bench; needs ~10 GB free).
set -euo pipefail
BUILD_DIR=${1:-build}
WORK=${WORK:-/tmp/mm_convert_bench}
MM="$BUILD_DIR/mm"
PY=${PY:-.venv/bin/python}
[[ -x "$MM" ]] || { echo "run_convert_memory: $MM not found; build first" >&2; exit 1; }
rm -rf "$WORK" && mkdir -p "$WORK"

"$PY" - "$WORK" <<'EOF'
import json, os, sys
import torch
from safetensors.torch import save_file
work = sys.argv[1]
def model(d, vocab, hidden, inter, layers, heads, kv):
    os.makedirs(d)
    cfg = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "tie_word_embeddings": False, "torch_dtype": "float32"}
    json.dump(cfg, open(f"{d}/config.json", "w"))
    g = torch.Generator().manual_seed(0)
    t, hd = {}, hidden // heads
    r = lambda *s: torch.randn(*s, generator=g) * 0.02
    t["model.embed_tokens.weight"] = r(vocab, hidden)
    t["lm_head.weight"] = r(vocab, hidden)
    t["model.norm.weight"] = torch.ones(hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"], t[p + "self_attn.q_proj.bias"] = r(hidden, hidden), r(hidden)
        t[p + "self_attn.k_proj.weight"], t[p + "self_attn.k_proj.bias"] = r(kv * hd, hidden), r(kv * hd)
        t[p + "self_attn.v_proj.weight"], t[p + "self_attn.v_proj.bias"] = r(kv * hd, hidden), r(kv * hd)
        t[p + "self_attn.o_proj.weight"] = r(hidden, hidden)
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = r(inter, hidden), r(inter, hidden)
        t[p + "mlp.down_proj.weight"] = r(hidden, inter)
        t[p + "input_layernorm.weight"], t[p + "post_attention_layernorm.weight"] = torch.ones(hidden), torch.ones(hidden)
    total = sum(x.numel() * 4 for x in t.values())
    biggest = max(x.numel() * 4 for x in t.values())
    save_file(t, f"{d}/model.safetensors")
    return total, biggest
total, biggest = model(f"{work}/big", 65536, 2048, 5632, 5, 16, 4)
model(f"{work}/tiny", 64, 32, 48, 4, 4, 2)
json.dump({"total": total, "biggest": biggest}, open(f"{work}/sizes.json", "w"))
print(f"model: {total / 1e9:.2f} GB of fp32 tensors, the largest {biggest / 1e9:.3f} GB")
EOF
BIGGEST=$("$PY" -c "import json; print(json.load(open('$WORK/sizes.json'))['biggest'])")

run() {  # name, command...: prints peak memory and the peak above the largest tensor
  local name=$1; shift
  local out; out=$("$@" --quiet)
  local peak; peak=$(sed -n 's/.*peak memory \([0-9]*\) MB.*/\1/p' <<<"$out")
  printf '%-34s peak %6d MB   above the largest tensor %6d MB\n' "$name" "$peak" $(( peak - BIGGEST / 1000000 ))
}
run "baseline (tiny model) hf-to-mm" "$MM" convert hf-to-mm --in "$WORK/tiny" --out "$WORK/tiny_mm" --tp 2 --pp 2
run "hf-to-mm --tp 2 --pp 2" "$MM" convert hf-to-mm --in "$WORK/big" --out "$WORK/big_mm" --tp 2 --pp 2
run "resplit --pp 4" "$MM" convert resplit --in "$WORK/big_mm" --out "$WORK/big_pp4" --pp 4
run "mm-to-hf" "$MM" convert mm-to-hf --in "$WORK/big_pp4" --out "$WORK/big_hf"
cmp "$WORK/big/model.safetensors" "$WORK/big_hf/model.safetensors" >/dev/null 2>&1 \
  && echo "round trip: byte-identical model.safetensors" \
  || "$PY" -c "
from safetensors.torch import load_file
import torch
a, b = load_file('$WORK/big/model.safetensors'), load_file('$WORK/big_hf/model.safetensors')
assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
print('round trip: identical tensors')"
[[ -n "${KEEP:-}" ]] || rm -rf "$WORK"
