"""Hugging Face transformers as the reference for mm's models (run by the project's .venv python,
transformers pinned in scripts/install_deps.sh). Nothing is downloaded: models are tiny random
ones made here with save_pretrained, or the HF directories mm exports.

  hf_reference.py create DIR CONFIG_JSON [--seed S]
      A tiny random model from CONFIG_JSON ({"model_type": "qwen2", ...} as config.json holds it),
      norm weights and biases moved away from their init so a dropped one shows, saved to DIR.
  hf_reference.py logits DIR
      Loads DIR with transformers (float32 or float64 as config.json's dtype says, eager
      attention), reads DIR/inputs.safetensors (input_ids, optional position_ids, attention_mask,
      pixel_values, image_grid_thw, ...) and writes DIR/logits.safetensors {"logits"}; with
      position ids and no mask also "logits_causal" (an all-ones mask: no packed-document
      reading); with images also "features" (the model's get_image_features).
  hf_reference.py generate DIR N
      Greedy decoding of N new tokens from DIR/inputs.safetensors' input_ids (batch 1, no EOS
      stop) with the KV cache; writes DIR/generated.safetensors {"tokens"}.
  hf_reference.py vision DIR qwen2_vl|qwen2_5_vl
      The vision tower alone (see vision() below).
  hf_reference.py encoder DIR
      A text encoder (UMT5EncoderModel) on DIR/inputs.safetensors' input_ids and attention_mask:
      writes DIR/hidden.safetensors {"last_hidden_state"}.
  hf_reference.py train_step DIR
      One training step's loss and gradients: labels from DIR/inputs.safetensors, HF's own
      shifted cross entropy (mean over labelled tokens); writes DIR/grads.safetensors with "loss"
      and one tensor per parameter under its checkpoint name.
"""
import json
import os
import sys

import torch
import transformers.utils.logging as hf_logging
import transformers
from safetensors.torch import load_file, save_file


def dtype_of(cfg):
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[name]


def model_class(cfg):
    arch = (cfg.get("architectures") or [None])[0]
    if arch and hasattr(transformers, arch):
        return getattr(transformers, arch)
    return {"qwen2": transformers.Qwen2ForCausalLM}[cfg["model_type"]]


def weights_dtype(d):
    """The dtype of the directory's floating-point weights (mm's exports may not name one)."""
    from safetensors import safe_open
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors") and f.startswith("model"))
    with safe_open(os.path.join(d, files[0]), "pt") as f:
        for k in f.keys():
            t = f.get_slice(k).get_dtype()
            if t in ("F64", "F32", "BF16", "F16"):
                return {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[t]
    return torch.float32


def load(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    dtype = weights_dtype(d)
    m = model_class(cfg).from_pretrained(d, dtype=dtype, attn_implementation="eager")
    return m.eval(), dtype


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith(".weight") and ("norm" in name or "ln_q" in name):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def create(d, cfg_json, seed):
    cfg = json.loads(cfg_json)
    dtype = dtype_of(cfg)
    config = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(seed)
    cls = model_class({"model_type": cfg["model_type"], "architectures": cfg.get("architectures")})
    model = cls(config).to(dtype)
    perturb(model, seed)
    model.save_pretrained(d)


def inputs(d):
    return load_file(os.path.join(d, "inputs.safetensors"))


def logits(d):
    model, dtype = load(d)
    x = inputs(d)
    kw = {k: x[k] for k in ("position_ids", "attention_mask", "image_grid_thw", "video_grid_thw") if k in x}
    for k in ("pixel_values", "pixel_values_videos"):
        if k in x:
            kw[k] = x[k].to(dtype)
    if "image_grid_thw" in kw or "video_grid_thw" in kw:
        # transformers >= 5 wants the processor's token types for M-RoPE: 1 image, 2 video.
        cfg = model.config
        ids = x["input_ids"]
        kw["mm_token_type_ids"] = (ids == cfg.image_token_id).long() + 2 * (ids == cfg.video_token_id).long()
    result = {}
    with torch.no_grad():
        result["logits"] = model(input_ids=x["input_ids"], use_cache=False, **kw).logits
        if "position_ids" in kw and "attention_mask" not in kw:
            # transformers >= 5 reads restarting position ids without a mask as packed documents
            # (attention kept inside each); an all-ones mask gives the plain causal reading.
            ones = torch.ones_like(x["input_ids"])
            result["logits_causal"] = model(input_ids=x["input_ids"], attention_mask=ones, use_cache=False, **kw).logits
        if "pixel_values" in kw and hasattr(model, "get_image_features"):
            fkw = {k: kw[k] for k in ("image_grid_thw",) if k in kw}
            f = model.get_image_features(pixel_values=kw["pixel_values"], **fkw)
            f = getattr(f, "pooler_output", f)
            if isinstance(f, (list, tuple)):
                f = torch.cat([t.reshape(-1, t.shape[-1]) for t in f])
            result["features"] = f
    save_file({k: v.contiguous() for k, v in result.items()}, os.path.join(d, "logits.safetensors"))


def generate(d, n):
    model, _ = load(d)
    ids = inputs(d)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=True)
    save_file({"tokens": out[:, ids.shape[1]:].contiguous()}, os.path.join(d, "generated.safetensors"))


def encoder(d):
    from torch.utils.flop_counter import FlopCounterMode

    model, _ = load(d)
    x = inputs(d)
    with torch.no_grad():
        h = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).last_hidden_state
        # The forward's FLOPs as PyTorch counts them (matmuls: 2 per multiply-add).
        with FlopCounterMode(display=False) as counter:
            model(input_ids=x["input_ids"], attention_mask=x["attention_mask"])
    save_file({"last_hidden_state": h.contiguous()}, os.path.join(d, "hidden.safetensors"))
    with open(os.path.join(d, "flops.json"), "w") as f:
        json.dump({"flops": counter.get_total_flops(), "shape": list(x["input_ids"].shape)}, f)


def train_step(d):
    model, _ = load(d)
    model.train()
    x = inputs(d)
    out = model(input_ids=x["input_ids"], labels=x["labels"], use_cache=False)
    out.loss.backward()
    grads = {"loss": out.loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grads[name] = p.grad.contiguous()
    save_file(grads, os.path.join(d, "grads.safetensors"))


def vision(d, kind):
    """The vision tower alone: DIR/vision_config.json (mm's vision config), weights.safetensors
    (the tower's parameters under HF's names without the "visual." prefix), inputs.safetensors
    (pixel_values, grid_thw) -> features.safetensors {"features"}; Qwen2.5-VL also writes
    "window_index" and "cu_window_seqlens" (consecutive duplicates removed, as its forward does)."""
    with open(os.path.join(d, "vision_config.json")) as f:
        cfg = json.load(f)
    w = load_file(os.path.join(d, "weights.safetensors"))
    x = inputs(d)
    dtype = next(iter(w.values())).dtype
    if kind == "qwen2_vl":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as mod
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig as Config
        cls = mod.Qwen2VisionTransformerPretrainedModel
    else:
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as mod
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig as Config
        cls = mod.Qwen2_5_VisionTransformerPretrainedModel
    config = Config(**cfg)
    config._attn_implementation = "eager"
    model = cls(config).to(dtype).eval()
    missing, unexpected = model.load_state_dict(w, strict=False)
    if missing or unexpected:
        raise SystemExit(f"vision weights do not match transformers: missing {missing}, unexpected {unexpected}")
    grid = x["grid_thw"]
    result = {}
    with torch.no_grad():
        out = model(x["pixel_values"].to(dtype), grid_thw=grid)
        result["features"] = getattr(out, "pooler_output", out)
        if kind == "qwen2_5_vl":
            from transformers.vision_utils import get_vision_window_index
            index, cu = get_vision_window_index(grid, config.spatial_merge_size, config.window_size, config.patch_size)
            result["window_index"] = index.to(torch.long)
            result["cu_window_seqlens"] = torch.unique_consecutive(torch.as_tensor(cu).to(torch.long))
    save_file({k: v.contiguous() for k, v in result.items()}, os.path.join(d, "features.safetensors"))


def main(argv):
    cmd, d = argv[1], argv[2]
    if cmd == "create":
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
        create(d, argv[3], seed)
    elif cmd == "logits":
        logits(d)
    elif cmd == "generate":
        generate(d, int(argv[3]))
    elif cmd == "vision":
        vision(d, argv[3])
    elif cmd == "train_step":
        train_step(d)
    elif cmd == "encoder":
        encoder(d)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    main(sys.argv)
