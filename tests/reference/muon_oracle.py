#!/usr/bin/env python3
"""Muon's optimizer step in PyTorch: the oracle of tests/optim/test_muon.cpp.

Restates, on one process, Megatron core 0.19's --optimizer muon: TensorParallelMuon over
emerging_optimizers 0.2 (the version Megatron pins): OrthogonalizedOptimizer.step (decoupled
weight decay, the momentum's lerp, Nesterov), newton_schulz (Frobenius normalisation with eps
1e-7, the smaller side as rows, a X + (b A + c A A) X with A = X X^T; under torch's "medium"
matmul precision the matrix cast to bf16 and every product a bf16 GEMM, emulated as a GPU's:
see newton_schulz), get_muon_scale_factor,
Megatron's QKV split (the rows of every query group split into query, key and value, each kind
orthogonalised as one matrix) and its default parameter override (torch.optim.AdamW for the
embeddings and every parameter that is not 2-D in Megatron's shapes, no weight decay on biases),
or emerging_optimizers' Lion in its place (--muon-scalar-optimizer lion); and --optimizer lion as
Megatron builds it (Lion with Adam's betas for the same matrices, AdamW for the rest; torch's lerp
in both of its forms).

Writes DIR/muon.safetensors:
  init.<p>                  the initial weights
  grad.<step>.<p>           each step's gradient (before the clipping factor GRAD_SCALE[step],
                            which the step applies)
  <variant>.w.<p>           the weights after STEPS steps
  <variant>.m.<p>           Muon's momentum_buffer, or AdamW's or Lion's exp_avg
  <variant>.v.<p>           AdamW's exp_avg_sq (AdamW parameters only)
Variants and parameters are listed below; the C++ test lists the same.

What it is not: it imports no Megatron or emerging_optimizers code (neither is installed here),
and it runs no tensor parallelism (test_muon.cpp checks the TP modes against one process).

Usage: python3 tests/reference/muon_oracle.py --out DIR
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_oracle import write_safetensors  # noqa: E402

# name, shape, kind: muon (a matrix), qkv (a fused QKV matrix), adam (decayed), adam_nowd (a
# bias); "embedding" is Megatron's is_embedding_or_output_parameter, "conv" a 3-D weight stored
# [channels, d_conv] (Mamba's conv1d): both AdamW.
PARAMS = [
    ("tall", (48, 16), "muon"),
    ("wide", (16, 40), "muon"),
    ("square", (24, 24), "muon"),
    ("qkv", (32, 24), "qkv"),
    ("bias", (16,), "adam_nowd"),
    ("embedding", (20, 16), "adam"),
    ("conv", (12, 4), "adam"),
]
QKV_SPLIT = (8, 4, 4)  # per query group: 2 query heads of 4, a key, a value; 2 groups
STEPS = 3
GRAD_SCALE = (1.0, 0.7, 0.5)
LR, WD, BETAS, EPS = 0.02, 0.1, (0.9, 0.95), 1e-8

VARIANTS = {
    "high_quintic": dict(bf16=False, coeff="quintic", ns_steps=5, scale="spectral",
                         nesterov=False, split=True, extra=1.0, momentum=0.9),
    "medium_nesterov": dict(bf16=True, coeff="quintic", ns_steps=5, scale="spectral",
                            nesterov=True, split=True, extra=1.0, momentum=0.9),
    "high_nesterov": dict(bf16=False, coeff="quintic", ns_steps=5, scale="spectral",
                          nesterov=True, split=True, extra=1.0, momentum=0.9),
    "high_polar_unit_nosplit": dict(bf16=False, coeff="polar_express", ns_steps=10,
                                    scale="unit_rms_norm", nesterov=False, split=False,
                                    extra=0.5, momentum=0.95),
    "medium_aol_shape": dict(bf16=True, coeff="aol", ns_steps=6, scale="shape_scaling",
                             nesterov=True, split=True, extra=1.0, momentum=0.9),
    "high_simple": dict(bf16=False, coeff="simple", ns_steps=3, scale="spectral",
                        nesterov=True, split=True, extra=2.0, momentum=0.5),
    # --muon-scalar-optimizer lion (Lion's default betas) for the parameters Muon leaves out.
    "high_scalar_lion": dict(bf16=False, coeff="quintic", ns_steps=5, scale="spectral",
                             nesterov=False, split=True, extra=1.0, momentum=0.9, scalar="lion",
                             lion_betas=(0.95, 0.98)),
}
# --optimizer lion with --adam-beta1/2 (betas under 0.5 too: torch's other lerp form).
LION_VARIANTS = {"lion": (0.9, 0.99), "lion_small_betas": (0.3, 0.4)}

COEFFICIENTS = {
    "simple": [(3.4445, -4.7750, 2.0315)],
    "quintic": [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)],
    "polar_express": [(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184),
                      (3.9096, -2.8234, 0.5250), (3.2856, -2.4153, 0.4853),
                      (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                      (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)],
    "aol": [(4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
            (2.7215, -3.0494, 1.3169)],
}


def coefficients(kind, steps):
    sets = COEFFICIENTS[kind]
    if kind == "polar_express":  # repeat the last
        return [sets[min(i, len(sets) - 1)] for i in range(steps)]
    return [sets[i % len(sets)] for i in range(steps)]


def newton_schulz(x, v):
    transpose = x.size(0) > x.size(1)
    if transpose:
        x = x.T
    X = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=1e-7)
    if v["bf16"]:
        X = bf16(X)
    for a, b, c in coefficients(v["coeff"], v["ns_steps"]):
        A = X @ X.T
        if v["bf16"]:
            # cuBLAS's bf16 GEMM, what Megatron's GPUs run: exact products of the bf16 inputs
            # summed in f32, alpha and beta applied in f32, one rounding to bf16. torch's CPU
            # addmm in bf16 differs for small shapes (measured on 16 x 16 x 16: 174 of 256
            # outputs off by up to 0.5), so it is emulated in f32 here instead.
            A = bf16(A)
            B = bf16(b * A + c * (A @ A))
            X = bf16(a * X + B @ X)
        else:
            B = torch.addmm(A, A, A, alpha=c, beta=b)
            X = torch.addmm(X, B, X, alpha=1.0, beta=a)
    return X.T if transpose else X


def bf16(t):
    """t rounded to bf16, kept in f32."""
    return t.to(torch.bfloat16).to(torch.float32)


def scale(v, out, inp):
    if v["scale"] == "shape_scaling":
        return max(1, out / inp) ** 0.5
    if v["scale"] == "spectral":
        return max(out, inp) ** 0.5
    return (out / inp) ** 0.5


def orthogonalize(u, kind, v):
    def one(m):
        return newton_schulz(m, v) * scale(v, m.size(0), m.size(1)) * v["extra"]

    if kind != "qkv" or not v["split"]:
        return one(u)
    per = sum(QKV_SPLIT)
    groups = u.size(0) // per
    parts = torch.split(u.view(groups, per, -1), list(QKV_SPLIT), dim=1)
    outs = [one(p.reshape(-1, u.size(1))).view(groups, -1, u.size(1)) for p in parts]
    return torch.cat(outs, dim=1).view(u.shape)


def lion_step(p, g, m, lr, wd, betas):
    """emerging_optimizers' Lion (decoupled decay) on one tensor, in place."""
    p.add_(p, alpha=-wd * lr)
    u = m.lerp(g, 1 - betas[0])
    m.lerp_(g, 1 - betas[1])
    p.add_(torch.sign(u), alpha=-lr)


def run_lion(betas, init, grads):
    """Megatron's --optimizer lion: emerging_optimizers' registry Lion for the matrices, built
    with betas = (adam_beta1, adam_beta2), and AdamW with the same betas for the rest (the
    registry's default parameter override)."""
    params = {n: init[n].clone() for n, _, _ in PARAMS}
    matrices = [n for n, _, k in PARAMS if k in ("muon", "qkv")]
    moments = {n: torch.zeros_like(params[n]) for n in matrices}
    adam_params = {n: torch.nn.Parameter(params[n]) for n, _, k in PARAMS
                   if k.startswith("adam")}
    kinds = {n: k for n, _, k in PARAMS}
    adam = torch.optim.AdamW(
        [{"params": [p for n, p in adam_params.items() if kinds[n] == "adam"],
          "weight_decay": WD},
         {"params": [p for n, p in adam_params.items() if kinds[n] == "adam_nowd"],
          "weight_decay": 0.0}],
        lr=LR, betas=betas, eps=EPS)
    for step in range(STEPS):
        for n in adam_params:
            adam_params[n].grad = grads[step][n] * GRAD_SCALE[step]
        adam.step()
        with torch.no_grad():
            for n in matrices:
                lion_step(params[n], grads[step][n] * GRAD_SCALE[step], moments[n], LR, WD,
                          betas)
    out = {}
    for n in matrices:
        out["w." + n] = params[n]
        out["m." + n] = moments[n]
    for n, p in adam_params.items():
        out["w." + n] = p.detach()
        out["m." + n] = adam.state[p]["exp_avg"]
        out["v." + n] = adam.state[p]["exp_avg_sq"]
    return out


def run_variant(v, init, grads):
    params = {n: init[n].clone() for n, _, _ in PARAMS}
    muon = [n for n, _, k in PARAMS if k in ("muon", "qkv")]
    buffers = {n: torch.zeros_like(params[n]) for n in muon}
    kinds = {n: k for n, _, k in PARAMS}
    scalar_lion = v.get("scalar") == "lion"
    lion_moments = {n: torch.zeros_like(params[n]) for n, _, k in PARAMS
                    if k.startswith("adam") and scalar_lion}
    adam_params = {n: torch.nn.Parameter(params[n]) for n, _, k in PARAMS
                   if k.startswith("adam") and not scalar_lion}
    adam = torch.optim.AdamW(
        [{"params": [p for n, p in adam_params.items() if kinds[n] == "adam"],
          "weight_decay": WD},
         {"params": [p for n, p in adam_params.items() if kinds[n] == "adam_nowd"],
          "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS) if adam_params else None
    for step in range(STEPS):
        for n in adam_params:
            adam_params[n].grad = grads[step][n] * GRAD_SCALE[step]
        if adam:
            adam.step()
        for n in lion_moments:
            lion_step(params[n], grads[step][n] * GRAD_SCALE[step], lion_moments[n], LR,
                      0.0 if kinds[n] == "adam_nowd" else WD, v["lion_betas"])
        with torch.no_grad():
            for n in muon:
                p, g, buf = params[n], grads[step][n] * GRAD_SCALE[step], buffers[n]
                p.add_(p, alpha=-WD * LR)
                buf.lerp_(g, 1 - v["momentum"])
                u = g.lerp(buf, v["momentum"]) if v["nesterov"] else buf
                p.add_(orthogonalize(u, kinds[n], v), alpha=-LR)
    out = {}
    for n in muon:
        out["w." + n] = params[n]
        out["m." + n] = buffers[n]
    for n, m in lion_moments.items():
        out["w." + n] = params[n]
        out["m." + n] = m
    for n, p in adam_params.items():
        out["w." + n] = p.detach()
        out["m." + n] = adam.state[p]["exp_avg"]
        out["v." + n] = adam.state[p]["exp_avg_sq"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(2026)
    init = {n: torch.randn(s, generator=gen) * 0.5 for n, s, _ in PARAMS}
    grads = [{n: torch.randn(s, generator=gen) for n, s, _ in PARAMS} for _ in range(STEPS)]
    tensors = {"init." + n: t for n, t in init.items()}
    for step in range(STEPS):
        tensors.update({f"grad.{step}.{n}": t for n, t in grads[step].items()})
    for name, v in VARIANTS.items():
        for key, t in run_variant(v, init, grads).items():
            tensors[f"{name}.{key}"] = t.contiguous().to(torch.float32)
    for name, betas in LION_VARIANTS.items():
        for key, t in run_lion(betas, init, grads).items():
            tensors[f"{name}.{key}"] = t.contiguous().to(torch.float32)
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "muon.safetensors"), tensors)


if __name__ == "__main__":
    main()
