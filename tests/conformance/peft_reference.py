"""PyPI's peft (pinned in scripts/install_deps.sh) as the reference for mm's LoRA: adapters in
PEFT's format loaded onto transformers models, made by peft itself, and merged by it. Nothing
is downloaded: the base models are tiny random ones in HF directories the tests make.

  peft_reference.py logits BASE ADAPTER OUT
      PeftModel.from_pretrained(base, ADAPTER) in fp32 (eval: no dropout) on BASE/inputs.safetensors'
      input_ids (and pixel inputs, as hf_reference.py logits reads them): writes OUT {"logits"}.
  peft_reference.py create BASE OUT CONFIG_JSON [--seed S]
      get_peft_model(base, LoraConfig(**CONFIG_JSON)) with every adapter weight drawn at random
      (lora_B too, so the adapter changes the logits), saved to OUT by save_pretrained; then its
      logits on BASE/inputs.safetensors to OUT/logits.safetensors.
  peft_reference.py merge BASE ADAPTER OUT
      merge_and_unload() of the adapter onto the base, the merged model saved to OUT by
      save_pretrained (under the names the base directory's files use).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402


def base_model(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return hf_reference.model_class(cfg).from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()


def run_logits(model, base, out):
    x = load_file(os.path.join(base, "inputs.safetensors"))
    kw = {k: x[k] for k in ("attention_mask", "image_grid_thw", "video_grid_thw") if k in x}
    for k in ("pixel_values", "pixel_values_videos"):
        if k in x:
            kw[k] = x[k].float()
    if "image_grid_thw" in kw or "video_grid_thw" in kw:
        cfg = model.config
        ids = x["input_ids"]
        kw["mm_token_type_ids"] = (ids == cfg.image_token_id).long() + 2 * (ids == cfg.video_token_id).long()
    with torch.no_grad():
        logits = model(input_ids=x["input_ids"], use_cache=False, **kw).logits
    save_file({"logits": logits.contiguous()}, out)


def main(argv):
    from peft import LoraConfig, PeftModel, get_peft_model

    cmd = argv[0]
    if cmd == "logits":
        base, adapter, out = argv[1], argv[2], argv[3]
        model = PeftModel.from_pretrained(base_model(base), adapter).eval()
        run_logits(model, base, out)
    elif cmd == "create":
        base, out, cfg = argv[1], argv[2], json.loads(argv[3])
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
        model = get_peft_model(base_model(base), LoraConfig(**cfg))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name or "modules_to_save" in name:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))
        model.save_pretrained(out)
        run_logits(model.eval(), base, os.path.join(out, "logits.safetensors"))
    elif cmd == "merge":
        base, adapter, out = argv[1], argv[2], argv[3]
        merged = PeftModel.from_pretrained(base_model(base), adapter).merge_and_unload()
        # Under the names the base directory's files use (transformers maps its current module
        # paths back to them when saving).
        merged.save_pretrained(out)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
