#!/usr/bin/env python3
"""Numerics oracle for the C++ T5 encoder-decoder: Hugging Face's T5 v1.1 and Megatron-core's T5.

Builds a tiny model with seeded random weights in plain PyTorch, re-implementing the math of
Hugging Face's T5ForConditionalGeneration (--variant hf: v1.1, gated-gelu, untied LM head) and of
Megatron-core's default T5Model (--variant megatron) with dropout off, and writes:

  DIR/model/config.json        hf: Hugging Face's T5 config; megatron: our own small config
  DIR/model/model.safetensors  F32 weights: hf under HF's names as save_pretrained writes an
                               untied T5 (shared.weight once, no embed_tokens copies); megatron
                               under Megatron-core's parameter names
  DIR/expected.safetensors     enc_tokens, dec_tokens, enc_mask, dec_mask, labels (I64),
                               loss_mask, logits [B,Sd,V], lm_loss [1], grad.<name> of lm_loss
                               for every weight (F32); hf only: buckets_bidirectional and
                               buckets_causal (I64 [2001]: [d + 1000] = bucket of key - query = d)

Forward and backward run in float64 on the float32 weights (exact widening), rounded to float32
only when written: the oracle's own error is float64 rounding, all a C++ test sees is its own.

Inputs: B = 2, Se = 12, Sd = 7, right padded: sequence 1 has 9 real encoder and 5 real decoder
tokens. Tokens from 1..V-1 at real positions, 0 at padding; labels likewise, -1 at padding;
loss_mask = dec_mask; decoder inputs given directly (no shift). Query i sees key j: encoder iff
enc_mask[b,j]; decoder iff j <= i and dec_mask[b,j]; cross iff enc_mask[b,j]. Padded query rows
are computed like any other (logits cover every position); masked scores get finfo(f32).min.
lm_loss = sum(CE_bt * loss_mask_bt) / sum(loss_mask), CE the per-token cross entropy.

hf (modeling_t5.py, eager path):  x = shared[ids] (no scaling, no positions)
  block     x = x + o(attn(rms0(x)));  decoder: x = x + o(cross(rms1(x), enc_out))
            x = x + wo(gelu_new(wi_0 n) * wi_1 n), n = rms_last(x);  final_layer_norm per stack
  rms(x)    x * rsqrt(mean(x^2) + 1e-6) * w      (no mean, no bias)
  attn      softmax(q.k + bias + mask) v, NO 1/sqrt(d_kv); bias[h,i,j] = table[bucket(j - i), h]
            from the stack's block-0 table (used by all its blocks), bidirectional in the
            encoder, causal in the decoder; cross-attention has no bias
  logits    lm_head(dec_out) (untied: no d_model^-0.5)
  bucket    HF's _relative_position_bucket run as HF runs it, in float32 (rp.float() /
            max_exact, torch.log, / math.log(...), * ..., .to(long)). With 8 buckets and max
            distance 16 the log buckets start at |d| = 2 (bidirectional) and 4 (causal). Causal
            d = -8 is exactly on a boundary (6.0): log(8 / 4) gets it in float32 and float64,
            but log(8) - log(4) in double gives 5.99999... -> bucket 5, wrong.
megatron (local spec, pre-LN, LayerNorm with bias, eps 1e-5, linears with bias):
  embed     word[ids] + position[0..S-1], one position table for both stacks
  layer     x = x + proj(attn(ln_in(x)));  decoder: x = x + proj(cross(ln_cross(x), enc_out))
            x = x + fc2(gelu_erf(fc1(ln_mlp(x))));  final_layernorm per stack
  attn      softmax(q.k / sqrt(d_kv) + mask) v; linear_qkv rows packed per head [q_g|k_g|v_g],
            cross linear_kv rows packed per head [k_g|v_g] (d_kv rows each, heads in order)
  logits    dec_out @ word_embeddings^T + lm_head.output_layer.bias (tied)

Init (normal): q/k std 0.2 (Megatron: linear_qkv, linear_q, linear_kv) so attention is far from
uniform; wi_0, wi_1, linear_fc1 std 0.3 so the GELU leaves its linear range (at 0.02 the tanh and
erf GELUs differ by ~1e-8); norm weights 1 + 0.1 noise; relative bias tables 0.5. megatron: other
matrices 0.02, biases 0.02, LN biases 0.1. hf: shared.weight 1.0 (HF's own init), other matrices
0.1 (with 0.02 the last decoder block's gradients fall to ~3e-4 of the largest).

Gradients that are zero by mathematics, not by accident:
  * key biases (megatron): the k_g rows of linear_qkv.bias and cross_attention.linear_kv.bias. A
    key bias adds q . b_k to a whole row of scores and the softmax ignores a shift of the row, so
    the exact gradient is 0; what is written is float64 noise: compare it absolutely. Every other
    gradient is checked to be non-negligible.
  * unused rows, exactly 0: rows of ids that do not occur in hf shared.weight (also the pad id 0:
    padded positions are masked as keys and in the loss), Megatron's position rows 12..15, rows
    6 and 7 of the decoder's relative_attention_bias (they need |d| >= 8, but Sd = 7) and row 4
    of the encoder's (bucket num_buckets/2 is "d > 0 with |d| = 0": HF never uses it).

What this is not: it does not import or call the transformers or safetensors packages, it is not
a checkpoint converter, and it does not test the C++ code by itself. --check recomputes logits,
loss and every gradient another way (F.multi_head_attention_forward with a boolean key padding
mask and a float bias / causal mask, weights unpacked into its layout, indexing for F.embedding,
F.gelu(approximate="tanh") / an explicit erf GELU, the norms written out, F.cross_entropy with
ignore_index) and fails beyond float64 rounding; checks the buckets against a Python-float
restatement; and reruns the oracle in float32 (error ~1e-6 of each tensor's largest entry; the
wrong GELU flavour would move logits by ~1e-4 and gradients by ~1e-3).

Usage: python3 tests/reference/t5_oracle.py --variant {hf,megatron} --out DIR [--seed 1234]
       [--check]
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_oracle  # noqa: E402  (the safetensors writer)

BATCH = 2
ENC_SEQ, DEC_SEQ = 12, 7
ENC_LENGTHS, DEC_LENGTHS = (12, 9), (7, 5)
PAD = 0
MASK_VALUE = torch.finfo(torch.float32).min
BUCKET_RANGE = 1000  # buckets_* cover d = -1000..1000

HF_CONFIG = {
    "model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "vocab_size": 128,
    "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2, "num_decoder_layers": 3,
    "num_heads": 4, "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16,
    "dropout_rate": 0.0, "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0,
    "feed_forward_proj": "gated-gelu", "is_encoder_decoder": True, "tie_word_embeddings": False,
    "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0, "torch_dtype": "float32",
}

MEGATRON_CONFIG = {
    "variant": "megatron", "vocab_size": 128, "hidden_size": 32, "num_attention_heads": 4,
    "kv_channels": 8, "ffn_hidden_size": 64, "encoder_num_layers": 2, "decoder_num_layers": 2,
    "max_position_embeddings": 16, "norm_epsilon": 1e-5,
}

VARIANTS = {"hf": HF_CONFIG, "megatron": MEGATRON_CONFIG}


# --------------------------------------------------------------------------
# weights and inputs
# --------------------------------------------------------------------------

class Init:
    def __init__(self, gen):
        self.gen = gen

    def normal(self, *shape, std):
        return torch.randn(*shape, generator=self.gen, dtype=torch.float32) * std

    def norm(self, n):
        return 1.0 + self.normal(n, std=0.1)


def hf_weights(cfg, init):
    """Hugging Face names in named_parameters order, without the embed_tokens aliases of
    shared.weight (save_pretrained drops them)."""
    V, d, ff, nh = cfg["vocab_size"], cfg["d_model"], cfg["d_ff"], cfg["num_heads"]
    inner = nh * cfg["d_kv"]
    w = {"shared.weight": init.normal(V, d, std=1.0)}

    def attention(p, relative):
        w[p + ".q.weight"] = init.normal(inner, d, std=0.2)
        w[p + ".k.weight"] = init.normal(inner, d, std=0.2)
        w[p + ".v.weight"] = init.normal(inner, d, std=0.1)
        w[p + ".o.weight"] = init.normal(d, inner, std=0.1)
        if relative:
            nb = cfg["relative_attention_num_buckets"]
            w[p + ".relative_attention_bias.weight"] = init.normal(nb, nh, std=0.5)

    for stack, L in (("encoder", cfg["num_layers"]), ("decoder", cfg["num_decoder_layers"])):
        for i in range(L):
            p = f"{stack}.block.{i}.layer."
            attention(p + "0.SelfAttention", i == 0)
            w[p + "0.layer_norm.weight"] = init.norm(d)
            if stack == "decoder":
                attention(p + "1.EncDecAttention", False)
                w[p + "1.layer_norm.weight"] = init.norm(d)
            f = p + ("2" if stack == "decoder" else "1")
            for n, shape, std in (("wi_0", (ff, d), 0.3), ("wi_1", (ff, d), 0.3),
                                  ("wo", (d, ff), 0.1)):
                w[f"{f}.DenseReluDense.{n}.weight"] = init.normal(*shape, std=std)
            w[f + ".layer_norm.weight"] = init.norm(d)
        w[f"{stack}.final_layer_norm.weight"] = init.norm(d)
    w["lm_head.weight"] = init.normal(V, d, std=0.1)
    return w


def megatron_weights(cfg, init):
    """Megatron-core's parameter names (local spec: separate input_layernorm etc.)."""
    V, h, ff, P = (cfg["vocab_size"], cfg["hidden_size"], cfg["ffn_hidden_size"],
                   cfg["max_position_embeddings"])
    w = {"embedding.word_embeddings.weight": init.normal(V, h, std=0.02),
         "embedding.position_embeddings.weight": init.normal(P, h, std=0.02)}

    def linear(name, n_out, n_in, std=0.02):
        w[name + ".weight"] = init.normal(n_out, n_in, std=std)
        w[name + ".bias"] = init.normal(n_out, std=0.02)

    def norm(name):
        w[name + ".weight"] = init.norm(h)
        w[name + ".bias"] = init.normal(h, std=0.1)

    for stack in ("encoder", "decoder"):
        for i in range(cfg[stack + "_num_layers"]):
            p = f"{stack}.layers.{i}."
            norm(p + "input_layernorm")
            linear(p + "self_attention.linear_qkv", 3 * h, h, std=0.2)
            linear(p + "self_attention.linear_proj", h, h)
            if stack == "decoder":
                norm(p + "pre_cross_attn_layernorm")
                linear(p + "cross_attention.linear_q", h, h, std=0.2)
                linear(p + "cross_attention.linear_kv", 2 * h, h, std=0.2)
                linear(p + "cross_attention.linear_proj", h, h)
            norm(p + "pre_mlp_layernorm")
            linear(p + "mlp.linear_fc1", ff, h, std=0.3)
            linear(p + "mlp.linear_fc2", h, ff)
        norm(stack + ".final_layernorm")
    w["lm_head.output_layer.bias"] = init.normal(V, std=0.02)
    return w


def key_bias_rows(cfg, name):
    """Boolean mask of the entries whose gradient is zero by mathematics (key biases), or None."""
    if cfg is not MEGATRON_CONFIG or not name.endswith(("linear_qkv.bias", "linear_kv.bias")):
        return None
    parts = 3 if name.endswith("linear_qkv.bias") else 2
    rows = torch.zeros(cfg["num_attention_heads"], parts, cfg["kv_channels"], dtype=torch.bool)
    rows[:, parts - 2] = True  # [q|k|v]: slot 1; [k|v]: slot 0
    return rows.reshape(-1)


def make_inputs(V, gen):
    def draw(S, lengths, fill):
        t = torch.full((BATCH, S), fill, dtype=torch.int64)
        for b, n in enumerate(lengths):
            t[b, :n] = torch.randint(1, V, (n,), generator=gen)
        return t

    def mask(S, lengths):
        return (torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)

    inputs = {"enc_tokens": draw(ENC_SEQ, ENC_LENGTHS, PAD),
              "dec_tokens": draw(DEC_SEQ, DEC_LENGTHS, PAD),
              "enc_mask": mask(ENC_SEQ, ENC_LENGTHS), "dec_mask": mask(DEC_SEQ, DEC_LENGTHS),
              "labels": draw(DEC_SEQ, DEC_LENGTHS, -1)}
    inputs["loss_mask"] = inputs["dec_mask"].to(torch.float32)
    return inputs


# --------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------

def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5Attention._relative_position_bucket, statement for statement (float32 inside)."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def buckets(cfg, rel, bidirectional):
    return relative_position_bucket(rel, bidirectional, cfg["relative_attention_num_buckets"],
                                    cfg["relative_attention_max_distance"])


def position_bias(cfg, table, S, bidirectional):
    """compute_bias: [1, heads, S, S], bias[h,i,j] = table[bucket(j - i), h]."""
    rel = torch.arange(S)[None, :] - torch.arange(S)[:, None]
    return F.embedding(buckets(cfg, rel, bidirectional), table).permute(2, 0, 1)[None]


def additive_masks(inputs, dtype):
    """(encoder self, decoder self, cross) [B,1,Sq,Sk]: (1 - allowed) * finfo(float32).min."""
    enc, dec = inputs["enc_mask"].bool(), inputs["dec_mask"].bool()
    causal = torch.ones(DEC_SEQ, DEC_SEQ, dtype=torch.bool).tril()
    masks = (enc[:, None, :].expand(BATCH, ENC_SEQ, ENC_SEQ), causal[None] & dec[:, None, :],
             enc[:, None, :].expand(BATCH, DEC_SEQ, ENC_SEQ))
    return tuple(((1.0 - m.to(dtype)) * MASK_VALUE)[:, None] for m in masks)


def attention(q, k, v, nh, add, scale):
    """q [B,Sq,nh*dk], k, v [B,Sk,nh*dk] -> [B,Sq,nh*dk]; softmax(scale * q.k + add) v."""
    B, Sq = q.shape[:2]
    q, k, v = (t.view(B, t.shape[1], nh, -1).transpose(1, 2) for t in (q, k, v))
    probs = torch.softmax(scale * torch.matmul(q, k.transpose(-1, -2)) + add, dim=-1)
    return torch.matmul(probs, v).transpose(1, 2).reshape(B, Sq, -1)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))


def hf_forward(cfg, w, inputs):
    """logits [B,Sd,V] of T5ForConditionalGeneration in the weights' dtype."""
    nh, eps = cfg["num_heads"], cfg["layer_norm_epsilon"]

    def rms(name, x):
        return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def attn(p, x, kv, add):
        q, k, v = (F.linear(t, w[f"{p}.{n}.weight"]) for n, t in zip("qkv", (x, kv, kv)))
        return F.linear(attention(q, k, v, nh, add, 1.0), w[p + ".o.weight"])

    def ffn(p, x):
        n, q = rms(p + ".layer_norm.weight", x), p + ".DenseReluDense."
        h = gelu_new(F.linear(n, w[q + "wi_0.weight"])) * F.linear(n, w[q + "wi_1.weight"])
        return x + F.linear(h, w[q + "wo.weight"])

    enc_self, dec_self, cross = additive_masks(inputs, w["shared.weight"].dtype)
    rel = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    enc_add = enc_self + position_bias(cfg, w["encoder." + rel], ENC_SEQ, True)
    dec_add = dec_self + position_bias(cfg, w["decoder." + rel], DEC_SEQ, False)
    x = F.embedding(inputs["enc_tokens"], w["shared.weight"])
    for i in range(cfg["num_layers"]):
        p = f"encoder.block.{i}.layer."
        n = rms(p + "0.layer_norm.weight", x)
        x = ffn(p + "1", x + attn(p + "0.SelfAttention", n, n, enc_add))
    enc = rms("encoder.final_layer_norm.weight", x)
    x = F.embedding(inputs["dec_tokens"], w["shared.weight"])
    for i in range(cfg["num_decoder_layers"]):
        p = f"decoder.block.{i}.layer."
        n = rms(p + "0.layer_norm.weight", x)
        x = x + attn(p + "0.SelfAttention", n, n, dec_add)
        n = rms(p + "1.layer_norm.weight", x)
        x = ffn(p + "2", x + attn(p + "1.EncDecAttention", n, enc, cross))
    return F.linear(rms("decoder.final_layer_norm.weight", x), w["lm_head.weight"])


def megatron_forward(cfg, w, inputs):
    """logits [B,Sd,V] of Megatron-core's T5Model in the weights' dtype."""
    h, nh, dk, eps = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_channels"],
                      cfg["norm_epsilon"])
    scale = 1.0 / math.sqrt(dk)

    def lin(name, x):
        return F.linear(x, w[name + ".weight"], w[name + ".bias"])

    def ln(name, x):
        return F.layer_norm(x, (h,), w[name + ".weight"], w[name + ".bias"], eps)

    def split(t, parts):  # rows per head [a_g|b_g|...] -> a, b, ... each [B,S,nh*dk]
        t = t.view(*t.shape[:2], nh, parts, dk)
        return [t[..., j, :].reshape(*t.shape[:2], nh * dk) for j in range(parts)]

    def attn(p, x, enc, add):  # self-attention (enc None) or cross-attention
        q, k, v = (split(lin(p + "linear_qkv", x), 3) if enc is None else
                   [lin(p + "linear_q", x)] + split(lin(p + "linear_kv", enc), 2))
        return lin(p + "linear_proj", attention(q, k, v, nh, add, scale))

    def mlp(p, x):
        return x + lin(p + "mlp.linear_fc2",
                       F.gelu(lin(p + "mlp.linear_fc1", ln(p + "pre_mlp_layernorm", x))))

    def embed(tokens):
        pos = torch.arange(tokens.shape[1])
        return (F.embedding(tokens, w["embedding.word_embeddings.weight"])
                + F.embedding(pos, w["embedding.position_embeddings.weight"])[None])

    enc_self, dec_self, cross = additive_masks(inputs, w["embedding.word_embeddings.weight"].dtype)
    x = embed(inputs["enc_tokens"])
    for i in range(cfg["encoder_num_layers"]):
        p = f"encoder.layers.{i}."
        x = mlp(p, x + attn(p + "self_attention.", ln(p + "input_layernorm", x), None, enc_self))
    enc = ln("encoder.final_layernorm", x)
    x = embed(inputs["dec_tokens"])
    for i in range(cfg["decoder_num_layers"]):
        p = f"decoder.layers.{i}."
        x = x + attn(p + "self_attention.", ln(p + "input_layernorm", x), None, dec_self)
        n = ln(p + "pre_cross_attn_layernorm", x)
        x = mlp(p, x + attn(p + "cross_attention.", n, enc, cross))
    x = ln("decoder.final_layernorm", x)
    return F.linear(x, w["embedding.word_embeddings.weight"], w["lm_head.output_layer.bias"])


FORWARDS = {"hf": hf_forward, "megatron": megatron_forward}


def lm_loss(logits, inputs):
    """sum(CE * loss_mask) / sum(loss_mask); labels are -1 where loss_mask is 0 (any valid id
    there gives the same masked result)."""
    loss_mask = inputs["loss_mask"].to(logits.dtype)
    target = inputs["labels"].clamp(min=0)
    ce = -torch.log_softmax(logits, dim=-1).gather(-1, target[..., None]).squeeze(-1)
    return (ce * loss_mask).sum() / loss_mask.sum()


# --------------------------------------------------------------------------
# second formulation (--check)
# --------------------------------------------------------------------------

def mha(x, kv, w_in, b_in, w_out, b_out, nh, key_pad, float_mask):
    """torch's functional MultiheadAttention, batch first; float_mask [B*nh, Sq, Sk] or None."""
    out, _ = F.multi_head_attention_forward(
        x.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1), x.shape[-1], nh, w_in, b_in,
        None, None, False, 0.0, w_out, b_out, training=True, key_padding_mask=key_pad,
        need_weights=False, attn_mask=float_mask)
    return out.transpose(0, 1)


def causal_float(n):
    """[n, Sd, Sd] float mask, -inf above the diagonal."""
    upper = torch.ones(DEC_SEQ, DEC_SEQ, dtype=torch.bool).triu(1)
    return torch.zeros(n, DEC_SEQ, DEC_SEQ, dtype=torch.float64).masked_fill(upper, float("-inf"))


def py_bucket(d, bidirectional, num_buckets, max_distance):
    """Restatement in Python floats: (bucket, the value truncated to a log bucket or None)."""
    ret, rp = 0, max(-d, 0)
    if bidirectional:
        num_buckets //= 2
        ret, rp = (num_buckets if d > 0 else 0), abs(d)
    max_exact = num_buckets // 2
    if rp < max_exact:
        return ret + rp, None
    v = math.log(rp / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    return ret + min(max_exact + int(v), num_buckets - 1), v


def check_buckets(cfg, tables):
    """The float32 torch buckets against py_bucket: they must agree except where the float64
    value sits on a bucket boundary (within 1e-5 of an integer); those d are printed."""
    nb, md = cfg["relative_attention_num_buckets"], cfg["relative_attention_max_distance"]
    for kind, bidirectional in (("bidirectional", True), ("causal", False)):
        differ = []
        for i, got in enumerate(tables["buckets_" + kind].tolist()):
            want, v = py_bucket(i - BUCKET_RANGE, bidirectional, nb, md)
            if got != want and (v is None or abs(v - round(v)) > 1e-5):
                raise RuntimeError(f"check: {kind} bucket({i - BUCKET_RANGE}) is {got}, the "
                                   f"float64 restatement says {want}")
            differ += [f"{i - BUCKET_RANGE}:{got}/{want}"] if got != want else []
        print(f"  buckets {kind}: float32 and float64 differ at {', '.join(differ) or 'no d'}")


def check_hf(cfg, w, inputs):
    d, nh, dkv, eps = cfg["d_model"], cfg["num_heads"], cfg["d_kv"], cfg["layer_norm_epsilon"]
    nb, md = cfg["relative_attention_num_buckets"], cfg["relative_attention_max_distance"]
    enc_pad, dec_pad = inputs["enc_mask"] == 0, inputs["dec_mask"] == 0

    def bias(table, S, bidirectional):  # [B*nh, S, S], through the Python buckets
        b = torch.tensor([[py_bucket(j - i, bidirectional, nb, md)[0] for j in range(S)]
                          for i in range(S)])
        return table.t()[:, b].repeat(BATCH, 1, 1)

    def rms(name, x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) / d + eps) * w[name]

    def attn(p, x, kv, key_pad, float_mask):
        # torch divides q by sqrt(head_dim); T5 does not scale, so undo it in the weight
        w_in = torch.cat([w[p + ".q.weight"] * math.sqrt(dkv), w[p + ".k.weight"],
                          w[p + ".v.weight"]])
        return mha(x, kv, w_in, None, w[p + ".o.weight"], None, nh, key_pad, float_mask)

    def ffn(p, x):
        n, q = rms(p + ".layer_norm.weight", x), p + ".DenseReluDense."
        g = F.gelu(n @ w[q + "wi_0.weight"].t(), approximate="tanh")
        return x + (g * (n @ w[q + "wi_1.weight"].t())) @ w[q + "wo.weight"].t()

    rel = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    enc_bias = bias(w["encoder." + rel], ENC_SEQ, True)
    dec_bias = bias(w["decoder." + rel], DEC_SEQ, False) + causal_float(1)
    x = w["shared.weight"][inputs["enc_tokens"]]
    for i in range(cfg["num_layers"]):
        p = f"encoder.block.{i}.layer."
        n = rms(p + "0.layer_norm.weight", x)
        x = ffn(p + "1", x + attn(p + "0.SelfAttention", n, n, enc_pad, enc_bias))
    enc = rms("encoder.final_layer_norm.weight", x)
    x = w["shared.weight"][inputs["dec_tokens"]]
    for i in range(cfg["num_decoder_layers"]):
        p = f"decoder.block.{i}.layer."
        n = rms(p + "0.layer_norm.weight", x)
        x = x + attn(p + "0.SelfAttention", n, n, dec_pad, dec_bias)
        n = rms(p + "1.layer_norm.weight", x)
        x = ffn(p + "2", x + attn(p + "1.EncDecAttention", n, enc, enc_pad, None))
    return rms("decoder.final_layer_norm.weight", x) @ w["lm_head.weight"].t()


def check_megatron(cfg, w, inputs):
    nh, dk, eps = cfg["num_attention_heads"], cfg["kv_channels"], cfg["norm_epsilon"]
    enc_pad, dec_pad = inputs["enc_mask"] == 0, inputs["dec_mask"] == 0

    def unpack(t, parts):  # per-head rows [a_g|b_g|...] -> [a_all; b_all; ...]
        return t.reshape(nh, parts, dk, -1).transpose(0, 1).reshape(t.shape)

    def ln(name, x):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def attn(p, x, kv, key_pad, mask):
        if kv is x:
            w_in, b_in = (unpack(w[p + "linear_qkv." + n], 3) for n in ("weight", "bias"))
        else:
            w_in, b_in = (torch.cat([w[p + "linear_q." + n], unpack(w[p + "linear_kv." + n], 2)])
                          for n in ("weight", "bias"))
        return mha(x, kv, w_in, b_in, w[p + "linear_proj.weight"], w[p + "linear_proj.bias"],
                   nh, key_pad, mask)

    def mlp(p, x):
        a = ln(p + "pre_mlp_layernorm", x) @ w[p + "mlp.linear_fc1.weight"].t()
        a = a + w[p + "mlp.linear_fc1.bias"]
        a = 0.5 * a * (1.0 + torch.erf(a / math.sqrt(2.0)))
        return x + a @ w[p + "mlp.linear_fc2.weight"].t() + w[p + "mlp.linear_fc2.bias"]

    def embed(tokens):
        return (w["embedding.word_embeddings.weight"][tokens]
                + w["embedding.position_embeddings.weight"][:tokens.shape[1]])

    x = embed(inputs["enc_tokens"])
    for i in range(cfg["encoder_num_layers"]):
        p = f"encoder.layers.{i}."
        n = ln(p + "input_layernorm", x)
        x = mlp(p, x + attn(p + "self_attention.", n, n, enc_pad, None))
    enc = ln("encoder.final_layernorm", x)
    x = embed(inputs["dec_tokens"])
    for i in range(cfg["decoder_num_layers"]):
        p = f"decoder.layers.{i}."
        n = ln(p + "input_layernorm", x)
        x = x + attn(p + "self_attention.", n, n, dec_pad, causal_float(BATCH * nh))
        n = ln(p + "pre_cross_attn_layernorm", x)
        x = mlp(p, x + attn(p + "cross_attention.", n, enc, enc_pad, None))
    x = ln("decoder.final_layernorm", x)
    return x @ w["embedding.word_embeddings.weight"].t() + w["lm_head.output_layer.bias"]


CHECKS = {"hf": check_hf, "megatron": check_megatron}


def compare(cfg, results, grads, got, got_grads, tol):
    """Largest error relative to each tensor's largest entry (key-bias rows: absolutely, against
    the largest gradient). Raises beyond tol; returns (worst output, worst gradient)."""
    scale = max(g.abs().max().item() for g in grads.values())
    worst = [0.0, 0.0]
    for kind, name, a, b in [(0, n, got[n], results[n]) for n in results] + [
            (1, "grad." + n, got_grads[n], grads[n]) for n in grads]:
        a, b = a.detach().to(torch.float64), b.detach()
        zero = key_bias_rows(cfg, name)
        if zero is not None:
            if not (a[zero] - b[zero]).abs().max().item() <= max(tol, 1e-12) * scale:
                raise RuntimeError(f"{name}: the key-bias rows differ")
            a, b = a[~zero], b[~zero]
        err = (a - b).abs().max().item() / b.abs().max().item()
        worst[kind] = max(worst[kind], err)
        if not err < tol:
            raise RuntimeError(f"{name} differs: {err:.3e} relative to its largest entry")
    return worst


# --------------------------------------------------------------------------

def run_model(cfg, weights, inputs, forward, dtype, second=False):
    """(outputs, gradients) of forward in dtype; the second formulation takes its loss from
    F.cross_entropy with ignore_index (Hugging Face's form)."""
    params = {n: t.to(dtype).requires_grad_() for n, t in weights.items()}
    logits = forward(cfg, params, inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), inputs["labels"].reshape(-1),
                           ignore_index=-1) if second else lm_loss(logits, inputs)
    loss.backward()
    return {"logits": logits, "lm_loss": loss}, {n: params[n].grad for n in weights}


def run(variant, out_dir, seed, check):
    torch.set_num_threads(1)
    cfg = VARIANTS[variant]
    gen = torch.Generator().manual_seed(seed)
    weights = (hf_weights if variant == "hf" else megatron_weights)(cfg, Init(gen))
    inputs = make_inputs(cfg["vocab_size"], gen)

    os.makedirs(os.path.join(out_dir, "model"), exist_ok=True)
    with open(os.path.join(out_dir, "model", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    hf_oracle.write_safetensors(os.path.join(out_dir, "model", "model.safetensors"), weights)

    results, grads = run_model(cfg, weights, inputs, FORWARDS[variant], torch.float64)
    for name, t in list(results.items()) + [("grad." + n, g) for n, g in grads.items()]:
        if t is None or not bool(torch.isfinite(t).all()):
            raise RuntimeError(f"{name}: missing or not finite")
    scale = max(g.abs().max().item() for g in grads.values())
    for n, g in grads.items():
        zero = key_bias_rows(cfg, n)
        if zero is not None:
            # Mathematically zero (see the module docstring): only float64 noise is allowed.
            if not g[zero].abs().max().item() <= 1e-12 * scale:
                raise RuntimeError(f"grad.{n} key rows should be zero: {g[zero].abs().max():.3e}")
            g = g[~zero]
        if not g.abs().max().item() > 1e-3 * scale:
            raise RuntimeError(f"grad.{n} is (nearly) zero: that weight is not exercised")

    expected = dict(inputs)
    expected["logits"] = results["logits"].detach().to(torch.float32)
    expected["lm_loss"] = results["lm_loss"].detach().to(torch.float32).reshape(1)
    for n in weights:
        expected["grad." + n] = grads[n].to(torch.float32)
    d = torch.arange(-BUCKET_RANGE, BUCKET_RANGE + 1, dtype=torch.int64)
    tables = {"buckets_" + k: buckets(cfg, d, k == "bidirectional")
              for k in ("bidirectional", "causal")} if variant == "hf" else {}
    expected.update(tables)
    hf_oracle.write_safetensors(os.path.join(out_dir, "expected.safetensors"), expected)

    print(f"t5_oracle {variant}: lm_loss={results['lm_loss'].item():.6f} "
          f"(log V={math.log(cfg['vocab_size']):.3f}) predicted={int(inputs['loss_mask'].sum())} "
          f"tensors={len(weights)} -> {out_dir}")
    if check:
        if variant == "hf":
            check_buckets(cfg, tables)
        got, got_grads = run_model(cfg, weights, inputs, CHECKS[variant], torch.float64, True)
        out, grad = compare(cfg, results, grads, got, got_grads, 1e-12)
        print(f"  check: second formulation agrees, largest relative difference {out:.1e} "
              f"(outputs), {grad:.1e} (gradients)")
        got, got_grads = run_model(cfg, weights, inputs, FORWARDS[variant], torch.float32)
        out, grad = compare(cfg, results, grads, got, got_grads, 1.0)
        print(f"  float32 rerun of the oracle: largest relative error {out:.1e} (outputs), "
              f"{grad:.1e} (gradients)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--check", action="store_true",
                    help="also recompute through a second formulation and compare")
    args = ap.parse_args()
    try:
        run(args.variant, args.out, args.seed, args.check)
    except Exception as e:  # noqa: BLE001 - report any failure as one line
        print(f"t5_oracle: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
