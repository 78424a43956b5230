#!/usr/bin/python3
# Independent reference of Hugging Face's LLaVA forward (modeling_clip: CLIPVisionEmbeddings with
# a real Conv2d, pre_layrnorm, CLIPEncoderLayer with QuickGELU, every layer run and
# hidden_states[vision_feature_layer] selected as transformers does; modeling_llava:
# LlavaMultiModalProjector, masked_scatter of the image features into the token embeddings),
# with the decoder of qwen2_reference.py (LLaMA = no q/k/v bias). Used only by
# tests/unit/test_llava.cpp; it shares no code with the C++ model.
#
#   usage: llava_reference.py DIR
#   reads  DIR/config.json (an HF llava config), DIR/model.safetensors (llava-hf names),
#          DIR/inputs.safetensors (input_ids [1, S], pixel_values [n, 3, S, S])
#   writes DIR/logits.safetensors ("logits", "features")
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import qwen2_reference as q  # noqa: E402


def act(name, x):
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "gelu":
        return F.gelu(x)
    raise ValueError(name)


def clip_hidden_states(vc, w, pixels):
    pre = "vision_tower.vision_model."
    E, heads = vc["hidden_size"], vc["num_attention_heads"]
    hd = E // heads
    eps = vc.get("layer_norm_eps", 1e-5)
    patch = F.conv2d(pixels.to(w[pre + "embeddings.patch_embedding.weight"].dtype),
                     w[pre + "embeddings.patch_embedding.weight"], stride=vc["patch_size"])
    patch = patch.flatten(2).transpose(1, 2)
    n = patch.shape[0]
    cls = w[pre + "embeddings.class_embedding"].expand(n, 1, -1)
    h = torch.cat([cls, patch], dim=1) + w[pre + "embeddings.position_embedding.weight"][None]
    h = F.layer_norm(h, (E,), w[pre + "pre_layrnorm.weight"], w[pre + "pre_layrnorm.bias"], eps)
    states = [h]
    for i in range(vc["num_hidden_layers"]):
        p = lambda k: w[f"{pre}encoder.layers.{i}.{k}"]  # noqa: E731
        x = F.layer_norm(h, (E,), p("layer_norm1.weight"), p("layer_norm1.bias"), eps)
        T = x.shape[1]
        qh = F.linear(x, p("self_attn.q_proj.weight"), p("self_attn.q_proj.bias")).view(n, T, heads, hd).transpose(1, 2)
        kh = F.linear(x, p("self_attn.k_proj.weight"), p("self_attn.k_proj.bias")).view(n, T, heads, hd).transpose(1, 2)
        vh = F.linear(x, p("self_attn.v_proj.weight"), p("self_attn.v_proj.bias")).view(n, T, heads, hd).transpose(1, 2)
        a = torch.softmax((qh @ kh.transpose(2, 3)) / math.sqrt(hd), dim=-1)
        o = (a @ vh).transpose(1, 2).reshape(n, T, E)
        h = h + F.linear(o, p("self_attn.out_proj.weight"), p("self_attn.out_proj.bias"))
        x = F.layer_norm(h, (E,), p("layer_norm2.weight"), p("layer_norm2.bias"), eps)
        x = F.linear(act(vc.get("hidden_act", "quick_gelu"), F.linear(x, p("mlp.fc1.weight"), p("mlp.fc1.bias"))),
                     p("mlp.fc2.weight"), p("mlp.fc2.bias"))
        h = h + x
        states.append(h)
    return states


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = q.load_safetensors(os.path.join(d, "model.safetensors"))
    inp = q.load_safetensors(os.path.join(d, "inputs.safetensors"))
    ids, pixels = inp["input_ids"], inp["pixel_values"]
    with torch.no_grad():
        feats = clip_hidden_states(cfg["vision_config"], w, pixels)[cfg["vision_feature_layer"]]
        if cfg["vision_feature_select_strategy"] == "default":
            feats = feats[:, 1:]
        feats = F.linear(act(cfg["projector_hidden_act"],
                             F.linear(feats, w["multi_modal_projector.linear_1.weight"], w["multi_modal_projector.linear_1.bias"])),
                         w["multi_modal_projector.linear_2.weight"], w["multi_modal_projector.linear_2.bias"])
        lm = {k[len("language_model."):]: v for k, v in w.items() if k.startswith("language_model.")}
        embeds = lm["model.embed_tokens.weight"][ids]
        mask = (ids == cfg["image_token_index"]).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(mask, feats.reshape(-1, feats.shape[-1]).to(embeds.dtype))
        pos = torch.arange(ids.shape[1])[None].expand_as(ids)
        logits = q.forward(cfg["text_config"], lm, ids, pos, inputs_embeds=embeds)
    q.save_safetensors(os.path.join(d, "logits.safetensors"), {"logits": logits.contiguous(), "features": feats.contiguous()})


if __name__ == "__main__":
    main()
