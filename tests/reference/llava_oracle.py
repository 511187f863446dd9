#!/usr/bin/env python3
"""Numerics oracle for the C++ LLaVA model (CLIP ViT + projector + Llama decoder).

Builds a tiny LlavaForConditionalGeneration-shaped model with seeded random weights in plain
PyTorch (fp32, no dropout), re-implementing the math of Hugging Face's CLIPVisionModel (eager
attention), LlavaMultiModalProjector and LlamaForCausalLM, and writes:

  DIR/model/config.json        a Hugging Face LLaVA config (vision_feature_layer -2: the last
                               vision layer is in the files but unused, as in llava-1.5)
  DIR/model/model.safetensors  weights under the Hub's names, F32
  DIR/expected.safetensors     tokens (image token -200), labels, loss_mask, images, logits
                               [B, S, V], loss, grad.<name> for every used weight

The text of each sample has one image token, at the start, in the middle and at the end in
turn; the image's embeddings replace it (LLaVA's merge, which Megatron's _preprocess_data
restates). The loss is the masked mean over text positions: a text token keeps its label and
mask, except the one just before the image (its next position is an image embedding) and the
image's own positions. This restates the rule independently of the C++ splice.

What this is not: it does not import transformers or safetensors, and it is not a converter.

Usage: python3 tests/reference/llava_oracle.py --out DIR [--seed 1234]
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_oracle import Init, apply_rope, rms_norm, write_safetensors  # noqa: E402

IMAGE_TOKEN = -200
BATCH = 3
TEXT = 7      # tokens per sample, the image token included
IMG = 12      # image side; patches of 4 -> 9 patches (+ class token in the ViT)
PATCH = 4

CONFIG = {
    "architectures": ["LlavaForConditionalGeneration"],
    "model_type": "llava",
    "image_token_index": 95,
    "projector_hidden_act": "gelu",
    "multimodal_projector_bias": True,
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "text_config": {
        "model_type": "llama",
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "clip_vision_model",
        "hidden_size": 24,
        "intermediate_size": 40,
        "num_hidden_layers": 3,
        "num_attention_heads": 3,
        "image_size": IMG,
        "patch_size": PATCH,
        "num_channels": 3,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    },
}


def weights(init):
    t, v = CONFIG["text_config"], CONFIG["vision_config"]
    H, I, L, V = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"], t["vocab_size"]
    nh, nkv = t["num_attention_heads"], t["num_key_value_heads"]
    hd = H // nh
    hv, iv = v["hidden_size"], v["intermediate_size"]
    g = (v["image_size"] // v["patch_size"]) ** 2
    w = {}
    e = "vision_tower.vision_model.embeddings."
    w[e + "patch_embedding.weight"] = init.matrix(hv, 3, PATCH, PATCH) * 5
    w[e + "class_embedding"] = init.matrix(hv) * 20
    w[e + "position_embedding.weight"] = init.matrix(g + 1, hv) * 20
    p = "vision_tower.vision_model."
    w[p + "pre_layrnorm.weight"] = init.norm(hv)
    w[p + "pre_layrnorm.bias"] = init.bias(hv)
    for i in range(v["num_hidden_layers"]):
        x = p + f"encoder.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[x + f"self_attn.{n}.weight"] = init.matrix(hv, hv) * 5
            w[x + f"self_attn.{n}.bias"] = init.bias(hv)
        w[x + "layer_norm1.weight"] = init.norm(hv)
        w[x + "layer_norm1.bias"] = init.bias(hv)
        w[x + "mlp.fc1.weight"] = init.matrix(iv, hv) * 5
        w[x + "mlp.fc1.bias"] = init.bias(iv)
        w[x + "mlp.fc2.weight"] = init.matrix(hv, iv) * 5
        w[x + "mlp.fc2.bias"] = init.bias(hv)
        w[x + "layer_norm2.weight"] = init.norm(hv)
        w[x + "layer_norm2.bias"] = init.bias(hv)
    w[p + "post_layernorm.weight"] = init.norm(hv)
    w[p + "post_layernorm.bias"] = init.bias(hv)
    w["multi_modal_projector.linear_1.weight"] = init.matrix(H, hv) * 5
    w["multi_modal_projector.linear_1.bias"] = init.bias(H)
    w["multi_modal_projector.linear_2.weight"] = init.matrix(H, H) * 5
    w["multi_modal_projector.linear_2.bias"] = init.bias(H)
    x = "language_model."
    w[x + "model.embed_tokens.weight"] = init.matrix(V, H) * 5
    for i in range(L):
        q = x + f"model.layers.{i}."
        w[q + "input_layernorm.weight"] = init.norm(H)
        w[q + "self_attn.q_proj.weight"] = init.matrix(nh * hd, H) * 5
        w[q + "self_attn.k_proj.weight"] = init.matrix(nkv * hd, H) * 5
        w[q + "self_attn.v_proj.weight"] = init.matrix(nkv * hd, H) * 5
        w[q + "self_attn.o_proj.weight"] = init.matrix(H, nh * hd) * 5
        w[q + "post_attention_layernorm.weight"] = init.norm(H)
        w[q + "mlp.gate_proj.weight"] = init.matrix(I, H) * 5
        w[q + "mlp.up_proj.weight"] = init.matrix(I, H) * 5
        w[q + "mlp.down_proj.weight"] = init.matrix(H, I) * 5
    w[x + "model.norm.weight"] = init.norm(H)
    w[x + "lm_head.weight"] = init.matrix(V, H) * 5
    return w


def layer_norm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def clip_features(w, images):
    """CLIPVisionModel's hidden_states[vision_feature_layer], class token dropped ("default")."""
    v = CONFIG["vision_config"]
    nh, eps = v["num_attention_heads"], v["layer_norm_eps"]
    p = "vision_tower.vision_model."
    e = p + "embeddings."
    x = F.conv2d(images, w[e + "patch_embedding.weight"], stride=PATCH)  # [n, h, g, g]
    x = x.flatten(2).transpose(1, 2)
    n, hv = x.shape[0], x.shape[2]
    cls = w[e + "class_embedding"].expand(n, 1, hv)
    x = torch.cat([cls, x], dim=1) + w[e + "position_embedding.weight"][None]
    x = layer_norm(x, w[p + "pre_layrnorm.weight"], w[p + "pre_layrnorm.bias"], eps)
    hd = hv // nh
    used = v["num_hidden_layers"] + 1 + CONFIG["vision_feature_layer"]
    for i in range(used):
        q = p + f"encoder.layers.{i}."
        r = x
        h = layer_norm(x, w[q + "layer_norm1.weight"], w[q + "layer_norm1.bias"], eps)
        s = h.shape[1]

        def proj(name):
            return F.linear(h, w[q + f"self_attn.{name}.weight"], w[q + f"self_attn.{name}.bias"])

        qq = proj("q_proj").view(n, s, nh, hd).transpose(1, 2)
        kk = proj("k_proj").view(n, s, nh, hd).transpose(1, 2)
        vv = proj("v_proj").view(n, s, nh, hd).transpose(1, 2)
        att = torch.softmax(torch.matmul(qq, kk.transpose(2, 3)) * hd ** -0.5, dim=-1)
        o = torch.matmul(att, vv).transpose(1, 2).reshape(n, s, hv)
        x = r + F.linear(o, w[q + "self_attn.out_proj.weight"], w[q + "self_attn.out_proj.bias"])
        r = x
        h = layer_norm(x, w[q + "layer_norm2.weight"], w[q + "layer_norm2.bias"], eps)
        h = F.linear(h, w[q + "mlp.fc1.weight"], w[q + "mlp.fc1.bias"])
        h = h * torch.sigmoid(1.702 * h)  # quick_gelu
        x = r + F.linear(h, w[q + "mlp.fc2.weight"], w[q + "mlp.fc2.bias"])
    return x[:, 1:]


def llama_embeds_forward(w, embeds):
    """LlamaForCausalLM from inputs_embeds [B, S, H]: logits [B, S, V]."""
    t = CONFIG["text_config"]
    B, S, H = embeds.shape
    nh, nkv, eps = t["num_attention_heads"], t["num_key_value_heads"], t["rms_norm_eps"]
    hd, rep = H // nh, nh // nkv
    inv_freq = 1.0 / (t["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = (inv_freq[:, None] @ torch.arange(S, dtype=torch.float32)[None, :]).transpose(0, 1)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    causal = torch.full((S, S), torch.finfo(torch.float32).min).triu(1)[None, None]
    x = embeds
    pre = "language_model.model."
    for i in range(t["num_hidden_layers"]):
        p = pre + f"layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = F.linear(h, w[p + "self_attn.q_proj.weight"]).view(B, S, nh, hd).transpose(1, 2)
        k = F.linear(h, w[p + "self_attn.k_proj.weight"]).view(B, S, nkv, hd).transpose(1, 2)
        v = F.linear(h, w[p + "self_attn.v_proj.weight"]).view(B, S, nkv, hd).transpose(1, 2)
        q = apply_rope(q, cos, sin, hd, False)
        k = apply_rope(k, cos, sin, hd, False)
        k = k[:, :, None].expand(B, nkv, rep, S, hd).reshape(B, nh, S, hd)
        v = v[:, :, None].expand(B, nkv, rep, S, hd).reshape(B, nh, S, hd)
        att = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + causal, dim=-1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(B, S, nh * hd)
        x = x + F.linear(o, w[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = F.linear(h, w[p + "mlp.gate_proj.weight"])
        u = F.linear(h, w[p + "mlp.up_proj.weight"])
        x = x + F.linear(F.silu(g) * u, w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w[pre + "norm.weight"], eps)
    return F.linear(x, w["language_model.lm_head.weight"])


def run(out_dir, seed):
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    init = Init(gen)
    w0 = weights(init)
    V = CONFIG["text_config"]["vocab_size"]
    tokens = torch.randint(0, V - 1, (BATCH, TEXT), generator=gen, dtype=torch.int64)
    where = [0, TEXT // 2, TEXT - 1]  # the image token at the start, middle and end
    for b in range(BATCH):
        tokens[b, where[b % 3]] = IMAGE_TOKEN
    labels = torch.randint(0, V - 1, (BATCH, TEXT), generator=gen, dtype=torch.int64)
    loss_mask = (torch.rand(BATCH, TEXT, generator=gen) > 0.2).to(torch.float32)
    images = torch.randn(BATCH, 3, IMG, IMG, generator=gen, dtype=torch.float32)

    os.makedirs(os.path.join(out_dir, "model"), exist_ok=True)
    with open(os.path.join(out_dir, "model", "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model", "model.safetensors"), w0)

    unused = [n for n in w0 if "post_layernorm" in n or "encoder.layers.2." in n]
    params = {n: torch.nn.Parameter(t.clone()) for n, t in w0.items()}
    feats = clip_features(params, images)  # [B, img_seq, hv]
    p = "multi_modal_projector."
    img = F.linear(F.gelu(F.linear(feats, params[p + "linear_1.weight"],
                                   params[p + "linear_1.bias"])),
                   params[p + "linear_2.weight"], params[p + "linear_2.bias"])
    img_seq = img.shape[1]
    text_ids = tokens.clamp(min=0)  # the image token embedded as id 0, then replaced
    text = F.embedding(text_ids, params["language_model.model.embed_tokens.weight"])
    rows, tgt, msk = [], [], []
    for b in range(BATCH):
        k = where[b % 3]
        rows.append(torch.cat([text[b, :k], img[b], text[b, k + 1:]], dim=0))
        lab = torch.zeros(TEXT - 1 + img_seq, dtype=torch.int64)
        m = torch.zeros(TEXT - 1 + img_seq)
        for j in range(TEXT):
            if j == k or j == k - 1:
                continue  # the image's positions and the token predicting its first embedding
            pos = j if j < k else j + img_seq - 1
            lab[pos], m[pos] = labels[b, j], loss_mask[b, j]
        tgt.append(lab)
        msk.append(m)
    embeds = torch.stack(rows)
    target, mask = torch.stack(tgt), torch.stack(msk)
    logits = llama_embeds_forward(params, embeds)
    ce = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), reduction="none")
    loss = (ce * mask.reshape(-1)).sum() / mask.sum()
    loss.backward()

    expected = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "images": images,
                "logits": logits.detach(), "loss": loss.detach().reshape(1)}
    for n, prm in params.items():
        if n in unused:
            continue
        if prm.grad is None:
            raise RuntimeError(f"no gradient for {n}")
        expected["grad." + n] = prm.grad.detach().clone()
    write_safetensors(os.path.join(out_dir, "expected.safetensors"), expected)
    print(f"llava_oracle: loss={loss.item():.6f} S={embeds.shape[1]} -> {out_dir}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    run(args.out, args.seed)


if __name__ == "__main__":
    main()
