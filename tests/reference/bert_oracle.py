#!/usr/bin/env python3
"""Numerics oracle for the C++ BERT models: original post-LN BERT and Megatron's pre-LN BERT.

Builds a tiny model with seeded random weights in plain PyTorch, re-implementing the math of
Hugging Face's BertForPreTraining (--arch bert) and MegatronBertForPreTraining
(--arch megatron-bert) on their eager attention path with dropout off, and writes:

  DIR/model/config.json           Hugging Face style config
  DIR/model/model.safetensors     weights under Hugging Face names, F32, as save_pretrained
                                  writes them (tied tensors once, no buffers)
  DIR/expected.safetensors        inputs (tokens, types, padding_mask, labels, loss_mask,
                                  is_random), outputs (mlm_logits, sop_logits, pooled), the
                                  losses (lm_loss, sop_loss, loss) and grad.<name> of loss for
                                  every tensor of model.safetensors

The forward and backward passes run in float64 on the float32 weights (exact widening) and are
rounded to float32 only when written, so the oracle's own error is float64 rounding (~1e-15
relative) and all of the difference a C++ test sees is its own fp32 rounding. mlm_logits covers
the padded positions too: as in Hugging Face, a padded query still attends to the real keys, so
its row is well defined; it carries no loss.

Losses are Megatron's pretrain_bert definitions: lm_loss = sum(CE_t * loss_mask_t) /
sum(loss_mask_t), CE_t the per-token cross entropy over the vocabulary; sop_loss = mean cross
entropy of sop_logits against is_random (1: the two segments were swapped); loss = lm_loss +
sop_loss. With loss_mask = (labels != -1) this is also Hugging Face's loss (CrossEntropyLoss with
labels -100 where loss_mask is 0).

One gradient is zero by mathematics, not by accident: grad.*.attention.self.key.bias. The key
bias adds q . b_k to every score of a query's row, and the softmax does not change when a row is
shifted, so its exact gradient is 0; what is written is float64 noise (~1e-17). A C++ test must
compare it with an absolute tolerance (its own fp32 result is noise of order 1e-9). Every other
gradient is checked here to be non-negligible.

The two architectures, layer by layer (x the residual stream, LN a LayerNorm with bias):
  bert           x = LN_emb(word + position + token_type)
                 x = LN_attn(x + dense(attention(x)));  x = LN_out(x + out(gelu(inter(x))))
                 no final norm
  megatron-bert  x = word + position + token_type                    (no embedding norm)
                 x = x + dense(attention(attention.ln(x)));  x = x + out(gelu(inter(ln(x))))
                 x = bert.encoder.ln(x)
  both           pooled = tanh(pooler(x[:, 0])); sop_logits = seq_relationship(pooled)
                 mlm_logits = LN_t(gelu(transform(x))) @ word_embeddings^T + cls.predictions.bias

What this is not: it does not import or call the transformers or safetensors packages, it is not
a checkpoint converter, and it does not test the C++ code by itself; the C++ test reads its
output and compares with tolerances. --check recomputes everything through a second,
independent formulation (torch.nn.TransformerEncoderLayer and nn.Embedding / nn.Linear modules)
and fails on any disagreement beyond float64 rounding.

Usage: python3 tests/reference/bert_oracle.py --arch {bert,megatron-bert} --out DIR [--seed 1234]
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
import hf_oracle  # noqa: E402  (the safetensors writer and the weight initialiser)

BATCH = 3
SEQ = 16
# Real tokens per sequence, the rest padding: sequence 0 is full, 1 and 2 are padded, so a key
# padding mask that is ignored, transposed or applied to the wrong sequence changes the result.
LENGTHS = (16, 11, 7)
# Special ids in BERT's convention ([PAD] is 0, as pad_token_id); real words are drawn from
# FIRST_WORD..vocab_size-1 so that the pad id never appears at a real position.
PAD, CLS, SEP, MASK = 0, 1, 2, 3
FIRST_WORD = 4
MASK_FRACTION = 0.2
KEY_BIAS = "attention.self.key.bias"

# Small and odd-sized so that layout bugs show: vocab 100 is not a multiple of 128 (Megatron pads
# its vocab), intermediate 64 = 2h rather than the usual 4h, max_position_embeddings 24 > seq 16
# (the table is longer than the sequence), 4 heads of 8. Dropouts are written as 0.0 because the
# oracle computes without dropout.
BERT_CONFIG = {
    "model_type": "bert",
    "architectures": ["BertForPreTraining"],
    "vocab_size": 100,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "max_position_embeddings": 24,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": PAD,
    "position_embedding_type": "absolute",
    "tie_word_embeddings": True,
}

# MegatronBertConfig has the same keys and the same layer_norm_eps default (1e-12; Megatron-LM's
# own --layernorm-epsilon default is 1e-5, so an importer must take eps from config.json).
MEGATRON_BERT_CONFIG = dict(BERT_CONFIG, model_type="megatron-bert",
                            architectures=["MegatronBertForPreTraining"])

ARCHS = {"bert": BERT_CONFIG, "megatron-bert": MEGATRON_BERT_CONFIG}


def pre_ln(cfg):
    return cfg["model_type"] == "megatron-bert"


# --------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------

class Init(hf_oracle.Init):
    """std 0.2 matrices (with h = 32 the pre-activations are of order one, so GELU, tanh and the
    softmaxes work away from their linear range) and 0.1 biases (large enough that a dropped or
    misplaced bias shows); LayerNorm weights 1 + 0.1 noise from hf_oracle.Init."""

    def __init__(self, gen):
        super().__init__(gen, std=0.2)

    def bias(self, n):
        return 0.1 * torch.randn(n, generator=self.gen, dtype=torch.float32)


def bert_weights(cfg, init):
    """Weights under Hugging Face's names, in named_parameters order, tied tensors once:
    cls.predictions.decoder.weight is bert.embeddings.word_embeddings.weight and
    cls.predictions.decoder.bias is cls.predictions.bias; save_pretrained keeps those two
    names and drops the decoder's."""
    V, H, I, L = (cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"],
                  cfg["num_hidden_layers"])
    P, T = cfg["max_position_embeddings"], cfg["type_vocab_size"]
    w = {}

    def linear(name, n_out, n_in):
        w[name + ".weight"] = init.matrix(n_out, n_in)
        w[name + ".bias"] = init.bias(n_out)

    def norm(name):
        w[name + ".weight"] = init.norm(H)
        w[name + ".bias"] = init.bias(H)

    w["bert.embeddings.word_embeddings.weight"] = init.matrix(V, H)
    w["bert.embeddings.position_embeddings.weight"] = init.matrix(P, H)
    w["bert.embeddings.token_type_embeddings.weight"] = init.matrix(T, H)
    if not pre_ln(cfg):
        norm("bert.embeddings.LayerNorm")
    for i in range(L):
        p = f"bert.encoder.layer.{i}."
        if pre_ln(cfg):
            norm(p + "attention.ln")
        linear(p + "attention.self.query", H, H)
        linear(p + "attention.self.key", H, H)
        linear(p + "attention.self.value", H, H)
        linear(p + "attention.output.dense", H, H)
        if pre_ln(cfg):
            norm(p + "ln")
        else:
            norm(p + "attention.output.LayerNorm")
        linear(p + "intermediate.dense", I, H)
        linear(p + "output.dense", H, I)
        if not pre_ln(cfg):
            norm(p + "output.LayerNorm")
    if pre_ln(cfg):
        norm("bert.encoder.ln")
    linear("bert.pooler.dense", H, H)
    w["cls.predictions.bias"] = init.bias(V)
    linear("cls.predictions.transform.dense", H, H)
    norm("cls.predictions.transform.LayerNorm")
    linear("cls.seq_relationship", 2, H)
    return w


# --------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------

def make_inputs(cfg, gen):
    """Megatron-style samples: [CLS] A [SEP] B [SEP] then padding, types 0 over [CLS] A [SEP] and
    1 over B [SEP] (0 at padding), ~20% of the word positions chosen for prediction (labels the
    original id, -1 elsewhere) and replaced in the input by [MASK] (80%), a random word (10%) or
    left as they were (10%), as in BERT's masking."""
    V = cfg["vocab_size"]
    tokens = torch.full((BATCH, SEQ), PAD, dtype=torch.int64)
    types = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    padding_mask = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    labels = torch.full((BATCH, SEQ), -1, dtype=torch.int64)
    for b, n in enumerate(LENGTHS):
        sep = int(torch.randint(2, n - 2, (1,), generator=gen))  # A is positions 1..sep-1
        words = torch.randint(FIRST_WORD, V, (n,), generator=gen)
        tokens[b, :n] = words
        tokens[b, 0] = CLS
        tokens[b, sep] = SEP
        tokens[b, n - 1] = SEP
        types[b, sep + 1:n] = 1
        padding_mask[b, :n] = 1
        word_pos = [t for t in range(1, n - 1) if t != sep]
        k = max(1, round(MASK_FRACTION * n))
        chosen = [word_pos[j] for j in torch.randperm(len(word_pos), generator=gen)[:k].tolist()]
        for t in chosen:
            labels[b, t] = tokens[b, t]
            u = float(torch.rand(1, generator=gen))
            if u < 0.8:
                tokens[b, t] = MASK
            elif u < 0.9:
                tokens[b, t] = int(torch.randint(FIRST_WORD, V, (1,), generator=gen))
    loss_mask = (labels != -1).to(torch.float32)
    is_random = torch.randint(0, 2, (BATCH,), generator=gen, dtype=torch.int64)
    if bool((is_random == is_random[0]).all()):  # both classes, so the SOP loss has both signs
        is_random[1] = 1 - is_random[0]
    # Hugging Face's word embedding has padding_idx = pad_token_id, which stops the lookup's
    # gradient into that row; Megatron's does not. The two agree here because the pad id only
    # appears at padded positions, whose gradient is exactly zero (masked from every key and
    # from the loss).
    assert bool((tokens[padding_mask == 1] != PAD).all())
    return {"tokens": tokens, "types": types, "padding_mask": padding_mask, "labels": labels,
            "loss_mask": loss_mask, "is_random": is_random}


# --------------------------------------------------------------------------
# forward (Hugging Face eager math)
# --------------------------------------------------------------------------

def linear(w, name, x):
    return F.linear(x, w[name + ".weight"], w[name + ".bias"])


def layer_norm(cfg, w, name, x):
    H = cfg["hidden_size"]
    return F.layer_norm(x, (H,), w[name + ".weight"], w[name + ".bias"], cfg["layer_norm_eps"])


def self_attention(cfg, w, p, x, mask_add):
    """BertSelfAttention's eager path: scores / sqrt(head_dim) + additive mask, softmax, then
    attention.output.dense (the residual and the norm are the caller's)."""
    B, S, H = x.shape
    nh = cfg["num_attention_heads"]
    hd = H // nh

    def heads(t):
        return t.view(B, S, nh, hd).permute(0, 2, 1, 3)

    q = heads(linear(w, p + "attention.self.query", x))
    k = heads(linear(w, p + "attention.self.key", x))
    v = heads(linear(w, p + "attention.self.value", x))
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
    probs = torch.softmax(scores + mask_add, dim=-1)
    ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(B, S, H)
    return linear(w, p + "attention.output.dense", ctx)


def forward(cfg, w, inputs):
    """(mlm_logits [B,S,V], sop_logits [B,2], pooled [B,H]) in the weights' dtype."""
    tokens, types, padding_mask = inputs["tokens"], inputs["types"], inputs["padding_mask"]
    B, S = tokens.shape
    dtype = w["bert.embeddings.word_embeddings.weight"].dtype
    pos = torch.arange(S, dtype=torch.int64)  # positions 0..S-1 whatever the padding
    x = (F.embedding(tokens, w["bert.embeddings.word_embeddings.weight"])
         + F.embedding(types, w["bert.embeddings.token_type_embeddings.weight"])
         + F.embedding(pos, w["bert.embeddings.position_embeddings.weight"])[None])
    if not pre_ln(cfg):
        x = layer_norm(cfg, w, "bert.embeddings.LayerNorm", x)
    # get_extended_attention_mask: (1 - mask) * finfo(float32).min over the keys, [B,1,1,S]; its
    # exp underflows to exactly 0, so padded keys get no weight (and no gradient).
    mask_add = ((1.0 - padding_mask.to(dtype)) * torch.finfo(torch.float32).min)[:, None, None, :]
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}."
        if pre_ln(cfg):
            x = x + self_attention(cfg, w, p, layer_norm(cfg, w, p + "attention.ln", x), mask_add)
            h = layer_norm(cfg, w, p + "ln", x)
            x = x + linear(w, p + "output.dense", F.gelu(linear(w, p + "intermediate.dense", h)))
        else:
            x = layer_norm(cfg, w, p + "attention.output.LayerNorm",
                           x + self_attention(cfg, w, p, x, mask_add))
            h = linear(w, p + "output.dense", F.gelu(linear(w, p + "intermediate.dense", x)))
            x = layer_norm(cfg, w, p + "output.LayerNorm", x + h)
    if pre_ln(cfg):
        x = layer_norm(cfg, w, "bert.encoder.ln", x)
    pooled = torch.tanh(linear(w, "bert.pooler.dense", x[:, 0]))
    t = F.gelu(linear(w, "cls.predictions.transform.dense", x))  # hidden_act "gelu": erf GELU
    t = layer_norm(cfg, w, "cls.predictions.transform.LayerNorm", t)
    mlm_logits = F.linear(t, w["bert.embeddings.word_embeddings.weight"], w["cls.predictions.bias"])
    sop_logits = linear(w, "cls.seq_relationship", pooled)
    return mlm_logits, sop_logits, pooled


def losses(mlm_logits, sop_logits, inputs):
    """Megatron's (lm_loss, sop_loss): the masked mean of the per-token cross entropy, and the
    mean cross entropy of the sentence-order logits."""
    labels, loss_mask = inputs["labels"], inputs["loss_mask"].to(mlm_logits.dtype)
    # Labels are -1 where loss_mask is 0; any valid id there gives the same (masked) result.
    target = labels.clamp(min=0)
    ce = -torch.log_softmax(mlm_logits, dim=-1).gather(-1, target[..., None]).squeeze(-1)
    lm = (ce * loss_mask).sum() / loss_mask.sum()
    sop = F.cross_entropy(sop_logits, inputs["is_random"])
    return lm, sop


# --------------------------------------------------------------------------
# second formulation (--check)
# --------------------------------------------------------------------------

def check_against_modules(cfg, weights, inputs, results, grads):
    """The same model through torch.nn modules in float64: nn.TransformerEncoderLayer
    (norm_first selects post- or pre-LN; fused in_proj, the scale applied to q, and a -inf
    boolean key padding mask), nn.Embedding, nn.LayerNorm, nn.Linear; the loss through
    F.cross_entropy with ignore_index (Hugging Face's form). Outputs and every gradient must
    agree with the oracle's to float64 rounding."""
    V, H, I = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    nh, eps, L = cfg["num_attention_heads"], cfg["layer_norm_eps"], cfg["num_hidden_layers"]
    dd = {"dtype": torch.float64}
    w = {n: t.to(torch.float64) for n, t in weights.items()}

    def set_(param, value):
        with torch.no_grad():
            param.copy_(value)

    def set_linear(mod, name):
        set_(mod.weight, w[name + ".weight"])
        set_(mod.bias, w[name + ".bias"])

    word = torch.nn.Embedding(V, H, **dd)
    set_(word.weight, w["bert.embeddings.word_embeddings.weight"])
    position = torch.nn.Embedding(cfg["max_position_embeddings"], H, **dd)
    set_(position.weight, w["bert.embeddings.position_embeddings.weight"])
    token_type = torch.nn.Embedding(cfg["type_vocab_size"], H, **dd)
    set_(token_type.weight, w["bert.embeddings.token_type_embeddings.weight"])
    mods = {}  # HF name prefix -> module, to read the gradients back
    if not pre_ln(cfg):
        mods["bert.embeddings.LayerNorm"] = torch.nn.LayerNorm(H, eps=eps, **dd)
    layers = []
    for i in range(L):
        p = f"bert.encoder.layer.{i}."
        layer = torch.nn.TransformerEncoderLayer(
            H, nh, dim_feedforward=I, dropout=0.0, activation="gelu", layer_norm_eps=eps,
            batch_first=True, norm_first=pre_ln(cfg), **dd)
        layer.train()  # the training path: the inference fast path zeroes padded rows
        set_(layer.self_attn.in_proj_weight, torch.cat(
            [w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")]))
        set_(layer.self_attn.in_proj_bias, torch.cat(
            [w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")]))
        mods[p + "attention.output.dense"] = layer.self_attn.out_proj
        mods[p + "intermediate.dense"] = layer.linear1
        mods[p + "output.dense"] = layer.linear2
        if pre_ln(cfg):
            mods[p + "attention.ln"] = layer.norm1
            mods[p + "ln"] = layer.norm2
        else:
            mods[p + "attention.output.LayerNorm"] = layer.norm1
            mods[p + "output.LayerNorm"] = layer.norm2
        layers.append(layer)
    if pre_ln(cfg):
        mods["bert.encoder.ln"] = torch.nn.LayerNorm(H, eps=eps, **dd)
    mods["bert.pooler.dense"] = torch.nn.Linear(H, H, **dd)
    mods["cls.predictions.transform.dense"] = torch.nn.Linear(H, H, **dd)
    mods["cls.predictions.transform.LayerNorm"] = torch.nn.LayerNorm(H, eps=eps, **dd)
    mods["cls.seq_relationship"] = torch.nn.Linear(H, 2, **dd)
    for name, mod in mods.items():
        set_linear(mod, name)
    mlm_bias = torch.nn.Parameter(w["cls.predictions.bias"].clone())

    tokens = inputs["tokens"]
    S = tokens.shape[1]
    x = word(tokens) + position(torch.arange(S))[None] + token_type(inputs["types"])
    if not pre_ln(cfg):
        x = mods["bert.embeddings.LayerNorm"](x)
    pad = inputs["padding_mask"] == 0
    for layer in layers:
        x = layer(x, src_key_padding_mask=pad)
    if pre_ln(cfg):
        x = mods["bert.encoder.ln"](x)
    pooled = torch.tanh(mods["bert.pooler.dense"](x[:, 0]))
    t = mods["cls.predictions.transform.LayerNorm"](
        F.gelu(mods["cls.predictions.transform.dense"](x)))
    mlm_logits = t @ word.weight.t() + mlm_bias
    sop_logits = mods["cls.seq_relationship"](pooled)
    labels = inputs["labels"]
    lm = F.cross_entropy(mlm_logits.reshape(-1, V), labels.reshape(-1), ignore_index=-1)
    sop = F.cross_entropy(sop_logits, inputs["is_random"])
    (lm + sop).backward()

    got = {"mlm_logits": mlm_logits, "sop_logits": sop_logits, "pooled": pooled,
           "lm_loss": lm, "sop_loss": sop}
    got_grads = {"bert.embeddings.word_embeddings.weight": word.weight.grad,
                 "bert.embeddings.position_embeddings.weight": position.weight.grad,
                 "bert.embeddings.token_type_embeddings.weight": token_type.weight.grad,
                 "cls.predictions.bias": mlm_bias.grad}
    for name, mod in mods.items():
        got_grads[name + ".weight"] = mod.weight.grad
        got_grads[name + ".bias"] = mod.bias.grad
    for i, layer in enumerate(layers):
        p = f"bert.encoder.layer.{i}."
        for n, gw, gb in zip(("query", "key", "value"),
                             layer.self_attn.in_proj_weight.grad.split(H),
                             layer.self_attn.in_proj_bias.grad.split(H)):
            got_grads[p + f"attention.self.{n}.weight"] = gw
            got_grads[p + f"attention.self.{n}.bias"] = gb
    if sorted(got_grads) != sorted(grads):
        raise RuntimeError(f"check: parameter names differ: {sorted(set(got_grads) ^ set(grads))}")

    worst = 0.0
    scale = max(g.abs().max().item() for g in grads.values())
    pairs = [(n, got[n], results[n]) for n in got] + [
        ("grad." + n, got_grads[n], grads[n]) for n in grads]
    for name, a, b in pairs:
        diff = (a.detach() - b.detach()).abs().max().item()
        if name.endswith(KEY_BIAS):  # zero up to float64 noise in both: compare absolutely
            if not diff <= 1e-12 * scale:
                raise RuntimeError(f"check: {name} differs from the module formulation: {diff:.3e}")
            continue
        err = diff / b.detach().abs().max().item()  # relative to the tensor's largest entry
        worst = max(worst, err)
        if not err < 1e-12:
            raise RuntimeError(f"check: {name} differs from the module formulation: {err:.3e}")
    return worst


# --------------------------------------------------------------------------

def run(arch, out_dir, seed, check):
    torch.set_num_threads(1)
    cfg = ARCHS[arch]
    gen = torch.Generator().manual_seed(seed)
    weights = bert_weights(cfg, Init(gen))
    inputs = make_inputs(cfg, gen)

    os.makedirs(os.path.join(out_dir, "model"), exist_ok=True)
    with open(os.path.join(out_dir, "model", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    hf_oracle.write_safetensors(os.path.join(out_dir, "model", "model.safetensors"), weights)

    # float64 leaves holding the float32 values exactly.
    params = {n: t.to(torch.float64).requires_grad_() for n, t in weights.items()}
    mlm_logits, sop_logits, pooled = forward(cfg, params, inputs)
    lm, sop = losses(mlm_logits, sop_logits, inputs)
    loss = lm + sop
    loss.backward()
    results = {"mlm_logits": mlm_logits, "sop_logits": sop_logits, "pooled": pooled,
               "lm_loss": lm, "sop_loss": sop}
    grads = {n: params[n].grad for n in weights}

    for name, t in list(results.items()) + [("grad." + n, g) for n, g in grads.items()]:
        if t is None or not bool(torch.isfinite(t).all()):
            raise RuntimeError(f"{name}: missing or not finite")
    scale = max(g.abs().max().item() for g in grads.values())
    for n, g in grads.items():
        if n.endswith(KEY_BIAS):
            # Mathematically zero (see the module docstring): only float64 noise is allowed.
            if not g.abs().max().item() <= 1e-12 * scale:
                raise RuntimeError(f"grad.{n} should be zero: {g.abs().max().item():.3e}")
        elif not g.abs().max().item() > 1e-3 * scale:
            raise RuntimeError(f"grad.{n} is (nearly) zero: that weight is not exercised")

    def f32(t):
        return t.detach().to(torch.float32)

    expected = dict(inputs)
    expected["mlm_logits"] = f32(mlm_logits)
    expected["sop_logits"] = f32(sop_logits)
    expected["pooled"] = f32(pooled)
    expected["lm_loss"] = f32(lm).reshape(1)
    expected["sop_loss"] = f32(sop).reshape(1)
    expected["loss"] = f32(loss).reshape(1)
    for n in weights:
        expected["grad." + n] = f32(grads[n])
    hf_oracle.write_safetensors(os.path.join(out_dir, "expected.safetensors"), expected)

    note = ""
    if check:
        worst = check_against_modules(cfg, weights, inputs, results, grads)
        note = f" (check: largest relative difference {worst:.1e})"
    print(f"bert_oracle {arch}: lm_loss={lm.item():.6f} sop_loss={sop.item():.6f} "
          f"predicted={int(inputs['loss_mask'].sum())} -> {out_dir}{note}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True, choices=sorted(ARCHS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--check", action="store_true",
                    help="also recompute through torch.nn modules and compare")
    args = ap.parse_args()
    try:
        run(args.arch, args.out, args.seed, args.check)
    except Exception as e:  # noqa: BLE001 - report any failure as one line
        print(f"bert_oracle: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
