"""diffusers (run by the project's .venv python, pinned in scripts/install_deps.sh) as the
reference for mm's Wan2.1 models. Nothing is downloaded: models are tiny random ones made here
with save_pretrained, or the directories mm writes.

  diffusers_reference.py wan_dit create DIR CONFIG_JSON [--seed S]
      A tiny random WanTransformer3DModel from CONFIG_JSON (its config.json fields), norm weights
      and biases moved away from their init so a dropped one shows, saved in fp32 to DIR.
  diffusers_reference.py wan_dit forward DIR
      Loads DIR with diffusers (fp32), reads DIR/inputs.safetensors (latents, timesteps, text)
      and writes DIR/outputs.safetensors {"prediction"}.
  diffusers_reference.py wan_dit count CONFIG_JSON
      Prints the parameter count of the model CONFIG_JSON describes (built on the meta device).
  diffusers_reference.py wan_dit from_original FILE OUT
      diffusers' own converter of original Wan checkpoint names
      (loaders.single_file_utils.convert_wan_transformer_to_diffusers) applied to FILE's tensors,
      written to the safetensors file OUT.
  diffusers_reference.py wan_vae create DIR CONFIG_JSON [--seed S]
      A tiny random AutoencoderKLWan (norm gammas moved away from 1), saved in fp32 to DIR.
  diffusers_reference.py wan_vae from_original FILE OUT
      diffusers' own converter of the original Wan2.1 VAE names
      (loaders.single_file_utils.convert_wan_vae_to_diffusers) applied to the torch.save'd state
      dict FILE (read by torch.load with weights_only), written to the safetensors file OUT.
  diffusers_reference.py wan_vae run DIR
      From DIR/inputs.safetensors: the encoder's moments of "video" (_encode: the first frame,
      then 4 at a time) and the decoded "latents" (decode: one latent frame at a time, clamped),
      written to DIR/outputs.safetensors {"moments", "decoded"}.
  diffusers_reference.py wan_pipeline DIR SPEC_JSON
      A whole tiny random Wan text-to-video pipeline: a Unigram tokenizer (tokenizers), a
      UMT5EncoderModel, a WanTransformer3DModel, an AutoencoderKLWan and the UniPC scheduler,
      saved to DIR by WanPipeline.save_pretrained; then WanPipeline itself samples SPEC's prompt
      and writes DIR/outputs.safetensors {"latents" (before decoding), "prompt_embeds",
      "negative_prompt_embeds"}.
  diffusers_reference.py wan_pipeline_load DIR SPEC_JSON
      WanPipeline.from_pretrained(DIR) (a directory mm wrote: `mm convert wan`) samples SPEC's
      prompt as wan_pipeline does and writes DIR/outputs.safetensors {"latents", "prompt_embeds"}.
  diffusers_reference.py scheduler euler|unipc STEPS SHIFT DIR
      The scheduler as Wan's diffusers pipelines configure it, set to STEPS steps: writes
      DIR/schedule.safetensors {"timesteps", "sigmas"} and, from DIR/inputs.safetensors' "sample",
      a whole sampling loop with the stand-in velocity v = tanh(x) * t / 1000 - x / 2 (each step's
      sample as "sample_K").
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file


def config_fields(path):
    """A diffusers config.json's constructor arguments (its "_class_name" and such left out)."""
    with open(path) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def load_saved(cls, d):
    """cls built from DIR/config.json with DIR's weights loaded strictly (from_pretrained would
    want accelerate for these models)."""
    model = cls(**config_fields(os.path.join(d, "config.json"))).eval()
    model.load_state_dict(load_file(os.path.join(d, "diffusion_pytorch_model.safetensors")), strict=True)
    return model


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def wan_dit(args):
    from diffusers import WanTransformer3DModel

    cmd = args[0]
    if cmd == "create":
        out, cfg_path = args[1], args[2]
        seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
        cfg = config_fields(cfg_path)
        torch.manual_seed(seed)
        model = WanTransformer3DModel(**cfg)
        perturb(model, seed)
        model.save_pretrained(out, safe_serialization=True)
    elif cmd == "forward":
        d = args[1]
        model = load_saved(WanTransformer3DModel, d)
        x = load_file(os.path.join(d, "inputs.safetensors"))
        with torch.no_grad():
            y = model(x["latents"], x["timesteps"], x["text"], return_dict=False)[0]
        save_file({"prediction": y.contiguous()}, os.path.join(d, "outputs.safetensors"))
    elif cmd == "count":
        cfg = config_fields(args[1])
        with torch.device("meta"):
            model = WanTransformer3DModel(**cfg)
        print(sum(p.numel() for p in model.parameters()))
    elif cmd == "from_original":
        from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

        tensors = load_file(args[1])
        save_file({k: v.contiguous() for k, v in convert_wan_transformer_to_diffusers(tensors).items()}, args[2])
    else:
        raise SystemExit(f"unknown wan_dit command {cmd}")


def wan_vae(args):
    from diffusers import AutoencoderKLWan

    cmd, d = args[0], args[1]
    if cmd == "from_original":
        from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

        sd = torch.load(d, map_location="cpu", weights_only=True)
        save_file({k: v.contiguous() for k, v in convert_wan_vae_to_diffusers(sd).items()}, args[2])
    elif cmd == "create":
        cfg = config_fields(args[2])
        seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
        torch.manual_seed(seed)
        model = AutoencoderKLWan(**cfg)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("gamma"):
                    p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        model.save_pretrained(d, safe_serialization=True)
    elif cmd == "flops":
        # PyTorch's FlopCounterMode over the encoder (with quant_conv) and the decoder (with
        # post_quant_conv) of one clip per pair of args: video T,H,W then latents t,h,w.
        from torch.utils.flop_counter import FlopCounterMode

        model = load_saved(AutoencoderKLWan, d)
        out = []
        for video, latent in zip(args[2::2], args[3::2]):
            t, h, w = (int(v) for v in video.split(","))
            lt, lh, lw = (int(v) for v in latent.split(","))
            row = {}
            with torch.no_grad():
                with FlopCounterMode(display=False) as counter:
                    model._encode(torch.zeros(1, 3, t, h, w))
                row["encode"] = counter.get_total_flops()
                with FlopCounterMode(display=False) as counter:
                    model.decode(torch.zeros(1, model.config.z_dim, lt, lh, lw))
                row["decode"] = counter.get_total_flops()
            out.append(row)
        print(json.dumps(out))
    else:
        model = load_saved(AutoencoderKLWan, d)
        x = load_file(os.path.join(d, "inputs.safetensors"))
        with torch.no_grad():
            out = {"moments": model._encode(x["video"]), "decoded": model.decode(x["latents"]).sample}
        save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(d, "outputs.safetensors"))


def wan_pipeline(args):
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    d = args[0]
    with open(args[1]) as f:
        spec = json.load(f)
    torch.manual_seed(0)
    words = "a an the sandal sneaker shirt bag moving left right up down slowly on white black".split()
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + w, -1.0 - 0.1 * i) for i, w in enumerate(words)]
    vocab += [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz,.'"]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(vocab), d_model=16, d_kv=8, d_ff=24, num_layers=2,
                                               num_heads=2, feed_forward_proj="gated-gelu"))
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                        in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32,
                                        num_layers=2, rope_max_seq_len=32)
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                           latents_std=[1.5, 0.5, 2.0, 1.0])
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in (transformer, vae, text_encoder):
            for name, p in m.named_parameters():
                if name.endswith("gamma") or ("norm" in name and name.endswith(".weight")):
                    p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
                elif name.endswith(".bias"):
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
        transformer.proj_out.weight.mul_(3)
    scheduler = UniPCMultistepScheduler(
        num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=spec["shift"],
        solver_order=2, solver_type="bh2", predict_x0=True, lower_order_final=True, final_sigmas_type="zero")
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                       transformer=transformer)
    pipe.save_pretrained(d)
    for m in (text_encoder, transformer, vae):
        m.eval()  # made here, not by from_pretrained: still in training mode (umT5's dropout)
    sample(pipe, spec, d)


def sample(pipe, spec, d):
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        cond, neg = pipe.encode_prompt(spec["prompt"], spec["negative_prompt"], do_classifier_free_guidance=True,
                                       max_sequence_length=spec["max_sequence_length"])
        out = pipe(prompt=spec["prompt"], negative_prompt=spec["negative_prompt"], height=spec["height"],
                   width=spec["width"], num_frames=spec["frames"], num_inference_steps=spec["steps"],
                   guidance_scale=spec["guidance_scale"], generator=torch.Generator().manual_seed(spec["seed"]),
                   output_type="latent", max_sequence_length=spec["max_sequence_length"]).frames
    save_file({"latents": out.contiguous(), "prompt_embeds": cond.contiguous(), "negative_prompt_embeds": neg.contiguous()},
              os.path.join(d, "outputs.safetensors"))


def wan_pipeline_load(args):
    """Each part loaded as from_pretrained would (without accelerate, which this venv lacks):
    the classes model_index.json names, built from each part's config.json, weights strict."""
    import diffusers
    import transformers
    from diffusers import WanPipeline

    d = args[0]
    with open(args[1]) as f:
        spec = json.load(f)
    with open(os.path.join(d, "model_index.json")) as f:
        index = json.load(f)
    parts = {}
    for name in ("transformer", "vae"):
        lib, cls = index[name]
        parts[name] = load_saved(getattr(diffusers, cls), os.path.join(d, name))
    lib, cls = index["text_encoder"]
    parts["text_encoder"] = getattr(transformers, cls).from_pretrained(os.path.join(d, "text_encoder")).eval()
    parts["tokenizer"] = transformers.AutoTokenizer.from_pretrained(os.path.join(d, "tokenizer"))
    lib, cls = index["scheduler"]
    parts["scheduler"] = getattr(diffusers, cls).from_pretrained(os.path.join(d, "scheduler"))
    sample(WanPipeline(**parts), spec, d)


def scheduler(args):
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    name, steps, shift, d = args[0], int(args[1]), float(args[2]), args[3]
    if name == "euler":
        s = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    else:  # Wan2.1-T2V-*-Diffusers' scheduler/scheduler_config.json
        s = UniPCMultistepScheduler(
            num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift,
            solver_order=2, solver_type="bh2", predict_x0=True, lower_order_final=True, final_sigmas_type="zero",
            timestep_spacing="linspace", beta_schedule="linear", beta_start=0.0001, beta_end=0.02)
    s.set_timesteps(steps)
    out = {"timesteps": s.timesteps.double().contiguous(), "sigmas": s.sigmas.double().contiguous()}
    x = load_file(os.path.join(d, "inputs.safetensors"))["sample"]
    for k, t in enumerate(s.timesteps):
        v = torch.tanh(x) * (t / 1000.0) - x / 2
        x = s.step(v, t, x, return_dict=False)[0]
        out[f"sample_{k}"] = x.contiguous()
    save_file(out, os.path.join(d, "schedule.safetensors"))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    commands = {"wan_dit": wan_dit, "wan_vae": wan_vae, "wan_pipeline": wan_pipeline,
                "wan_pipeline_load": wan_pipeline_load, "scheduler": scheduler}
    commands[sys.argv[1]](sys.argv[2:])
