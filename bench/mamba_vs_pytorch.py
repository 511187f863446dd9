#!/usr/bin/env python3
"""Hybrid Mamba training throughput on the CPU: megatron-cpp vs a PyTorch eager Mamba-2.

What this is: one invocation that trains the same hybrid model (Megatron's layer pattern of
Mamba-2, attention-only and MLP-only layers; RMSNorm, no biases, no positions, squared-ReLU MLP,
untied head) with the same shapes, micro-batch and threads, first with
`megatron train --model mamba --mock-data`, then with a PyTorch eager implementation of the same
model in this script, and prints per-iteration time, tokens/s, the ratio ours / PyTorch and the
model-FLOPs utilisation of both against the f32 GEMM peak our trainer measures at start-up, with
Megatron's hybrid FLOPs formula (megatron/training/training.py, hybrid_flops).

The PyTorch side runs in a child process with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from
its environment (OpenBLAS then picks its AVX-512 kernels where the CPU has them) and its thread
pools set to --threads; our trainer gets --num-threads. The PyTorch side computes the Mamba-2 scan with the chunked state-space-duality algorithm of the
Mamba-2 paper (its "minimal SSD": quadratic attention-like blocks inside chunks of 64 positions,
the recurrence between chunks), all in batched einsums: the fastest eager formulation there is
without the mamba_ssm CUDA kernels, and the one Hugging Face's torch_forward uses. Before timing,
the script checks it against the plain recurrence on a small case (1e-4 relative).

What this is not: not a convergence test, not tuned (no torch.compile), not a GPU benchmark;
a few iterations on a shared 2-core machine are noisy: read ratios, not the third digit.

Usage:
    python3 bench/mamba_vs_pytorch.py --megatron build/megatron [--threads 2] [--iters 5]
        [--warmup 2] [--pattern M-M-M*M-] [--markdown]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

SHAPE = dict(hidden=512, heads=8, groups=4, ffn=2048, vocab=8192, seq=512, batch=2,
             state=64, head_dim=64, mamba_groups=4)


def segsum(x):
    """x [..., T] -> [..., T, T]: out[..., i, j] = sum of x[..., j+1 .. i] (i >= j), else -inf."""
    T = x.size(-1)
    x = x[..., None].expand(*x.shape, T)
    x = x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1), 0)
    s = torch.cumsum(x, dim=-2)
    return s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=0), -torch.inf)


def ssd(X, A, B, C, block):
    """Chunked Mamba-2 scan. X [b, l, h, p] (dt x), A [b, l, h] (dt A), B, C [b, l, h, n]."""
    b, l, h, p = X.shape
    c = l // block
    X, A, B, C = (t.reshape(b, c, block, *t.shape[2:]) for t in (X, A, B, C))
    A = A.permute(0, 3, 1, 2)  # b h c l
    A_cumsum = torch.cumsum(A, dim=-1)
    L = torch.exp(segsum(A))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(A_cumsum[:, :, :, -1], (1, 0))))
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(A_cumsum))
    return (Y_diag + Y_off).reshape(b, l, h, p)


def recurrence(X, A, B, C):
    b, l, h, p = X.shape
    S = torch.zeros(b, h, p, B.shape[-1])
    ys = []
    for t in range(l):
        S = S * torch.exp(A[:, t])[..., None, None] + X[:, t, :, :, None] * B[:, t, :, None, :]
        ys.append((S * C[:, t, :, None, :]).sum(-1))
    return torch.stack(ys, dim=1)


class Model(torch.nn.Module):
    def __init__(self, pattern, s):
        super().__init__()
        H, V = s["hidden"], s["vocab"]
        self.pattern, self.s = pattern, s
        nh, P, G, N = H * 2 // s["head_dim"], s["head_dim"], s["mamba_groups"], s["state"]
        self.mamba = (nh, P, G, N)
        I = nh * P
        hd = H // s["heads"]
        w = lambda *shape: torch.nn.Parameter(torch.randn(*shape) * 0.02)  # noqa: E731
        self.embed = w(V, H)
        self.layers = torch.nn.ModuleList()
        for t in pattern:
            m = torch.nn.ParameterDict({"norm": torch.nn.Parameter(torch.ones(H))})
            if t == "M":
                m["in_proj"] = w(2 * I + 2 * G * N + nh, H)
                m["conv_w"] = w(I + 2 * G * N, 1, 4)
                m["conv_b"] = w(I + 2 * G * N)
                m["A_log"] = torch.nn.Parameter(torch.log(1 + 15 * torch.rand(nh)))
                m["D"] = torch.nn.Parameter(torch.ones(nh))
                m["dt_bias"] = torch.nn.Parameter(torch.rand(nh) - 4)
                m["gnorm"] = torch.nn.Parameter(torch.ones(I))
                m["out_proj"] = w(H, I)
            elif t == "*":
                m["qkv"] = w((s["heads"] + 2 * s["groups"]) * hd, H)
                m["proj"] = w(H, H)
            else:
                m["fc1"] = w(s["ffn"], H)
                m["fc2"] = w(H, s["ffn"])
            self.layers.append(m)
        self.norm_f = torch.nn.Parameter(torch.ones(H))
        self.head = w(V, H)

    @staticmethod
    def rms(x, w, eps=1e-5):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def mixer(self, m, h):
        b, l, _ = h.shape
        nh, P, G, N = self.mamba
        I = nh * P
        z, xbc, dt = torch.split(F.linear(h, m["in_proj"]), [I, I + 2 * G * N, nh], dim=-1)
        xbc = F.silu(F.conv1d(xbc.transpose(1, 2), m["conv_w"], m["conv_b"], padding=3,
                              groups=I + 2 * G * N)[..., :l].transpose(1, 2))
        x, B, C = torch.split(xbc, [I, G * N, G * N], dim=-1)
        x = x.reshape(b, l, nh, P)
        B = B.reshape(b, l, G, N).repeat_interleave(nh // G, dim=2)
        C = C.reshape(b, l, G, N).repeat_interleave(nh // G, dim=2)
        dt = F.softplus(dt + m["dt_bias"])
        A = -torch.exp(m["A_log"])
        y = ssd(x * dt[..., None], A * dt, B, C, 64) + m["D"][:, None] * x
        g = (y.reshape(b, l, I) * F.silu(z)).reshape(b, l, G, I // G)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)
        return F.linear(g.reshape(b, l, I) * m["gnorm"], m["out_proj"])

    def attention(self, m, h):
        s = self.s
        b, l, H = h.shape
        hd, nh, ng = H // s["heads"], s["heads"], s["groups"]
        q, k, v = torch.split(F.linear(h, m["qkv"]), [nh * hd, ng * hd, ng * hd], dim=-1)
        q = q.reshape(b, l, nh, hd).transpose(1, 2)
        k = k.reshape(b, l, ng, hd).transpose(1, 2).repeat_interleave(nh // ng, dim=1)
        v = v.reshape(b, l, ng, hd).transpose(1, 2).repeat_interleave(nh // ng, dim=1)
        att = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5
        att = att.masked_fill(torch.triu(torch.ones(l, l, dtype=torch.bool), 1), -torch.inf)
        o = torch.matmul(torch.softmax(att, -1), v).transpose(1, 2).reshape(b, l, H)
        return F.linear(o, m["proj"])

    def forward(self, ids):
        x = F.embedding(ids, self.embed)
        for t, m in zip(self.pattern, self.layers):
            h = self.rms(x, m["norm"])
            if t == "M":
                x = x + self.mixer(m, h)
            elif t == "*":
                x = x + self.attention(m, h)
            else:
                x = x + F.linear(torch.relu(F.linear(h, m["fc1"])) ** 2, m["fc2"])
        return F.linear(self.rms(x, self.norm_f), self.head)


def hybrid_flops(pattern, s):
    """Megatron's hybrid_flops per iteration (forward x 3) for one micro-batch."""
    b, l, H = s["batch"], s["seq"], s["hidden"]
    d_in = 2 * H
    nh = d_in // s["head_dim"]
    attn = 4 * b * l * H * (H + H * s["groups"] / s["heads"] + l / 2)
    mlp = 4 * (s["ffn"] / H) * b * l * H * H
    mamba = (2 * b * l * H * (2 * d_in + 2 * s["mamba_groups"] * s["state"] + nh) +
             7 * b * l * d_in * s["state"] + 2 * b * l * d_in * H)
    logits = 2 * b * l * H * s["vocab"]
    return 3 * (pattern.count("*") * attn + pattern.count("-") * mlp +
                pattern.count("M") * mamba + logits)


def run_pytorch(pattern, s, iters, warmup, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Model(pattern, s)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"] + 1))
    times = []
    for it in range(warmup + iters):
        t0 = time.perf_counter()
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, s["vocab"]), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def run_ours(binary, pattern, s, iters, warmup, threads):
    args = [binary, "train", "--model", "mamba", "--mock-data", "--vocab-size", str(s["vocab"]),
            "--num-layers", str(len(pattern)), "--hybrid-override-pattern", pattern,
            "--hidden-size", str(s["hidden"]), "--ffn-hidden-size", str(s["ffn"]),
            "--num-attention-heads", str(s["heads"]), "--group-query-attention",
            "--num-query-groups", str(s["groups"]), "--mamba-state-dim", str(s["state"]),
            "--mamba-head-dim", str(s["head_dim"]), "--mamba-num-groups", str(s["mamba_groups"]),
            "--normalization", "RMSNorm", "--disable-bias-linear", "--squared-relu",
            "--position-embedding-type", "none", "--untie-embeddings-and-output-weights",
            "--seq-length", str(s["seq"]), "--micro-batch-size", str(s["batch"]),
            "--global-batch-size", str(s["batch"]), "--train-iters", str(warmup + iters),
            "--log-interval", "1", "--lr", "1e-4", "--clip-grad", "1.0", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--eval-iters", "0", "--num-threads", str(threads)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"megatron failed:\n{proc.stderr[-3000:]}")
    ms = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)",
                                       proc.stdout)]
    peak = re.search(r"measured f32 GEMM peak with \d+ threads:\s*([0-9.]+) GFLOP/s", proc.stdout)
    return statistics.median(ms[warmup:]), float(peak.group(1))


def pytorch_subprocess(a):
    """PyTorch's run in a child process whose environment lets OpenBLAS pick its best kernels
    (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed) with a pool of --threads, as
    bench/compare_pytorch.py runs its baseline."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    proc = subprocess.run([sys.executable, __file__, "--megatron", a.megatron, "--pytorch-only",
                           "--threads", str(a.threads), "--iters", str(a.iters), "--warmup",
                           str(a.warmup), "--pattern", a.pattern],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.exit(f"the PyTorch run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--pattern", default="M-M-M*M-")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--pytorch-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.pytorch_only:  # the child process of pytorch_subprocess()
        print(json.dumps({"ms": run_pytorch(a.pattern, SHAPE, a.iters, a.warmup, a.threads)}))
        return
    if set(a.pattern) - set("M*-"):
        ap.error("--pattern takes M, * and - only")
    # The chunked scan against the plain recurrence (both float64).
    torch.manual_seed(1)
    X, B, C = (torch.randn(2, 128, 4, k, dtype=torch.float64) for k in (8, 16, 16))
    A = -torch.rand(2, 128, 4, dtype=torch.float64) * 0.2
    want = recurrence(X, A, B, C)
    err = ((ssd(X, A, B, C, 64) - want).abs().max() / want.abs().max()).item()
    if err > 1e-4:
        sys.exit(f"the chunked scan differs from the recurrence by {err:.1e}")
    s = SHAPE
    ours, peak = run_ours(a.megatron, a.pattern, s, a.iters, a.warmup, a.threads)
    theirs = pytorch_subprocess(a)
    flops = hybrid_flops(a.pattern, s)
    tokens = s["batch"] * s["seq"]
    rows = [("megatron-cpp", ours), ("PyTorch eager", theirs)]
    result = {"pattern": a.pattern, "shape": s, "threads": a.threads, "peak_gflops": peak,
              "ms": {n: t for n, t in rows}, "ratio": theirs / ours}
    if a.markdown:
        print("| side | ms/iter | tokens/s | MFU |\n|---|---:|---:|---:|")
        for n, t in rows:
            print(f"| {n} | {t:.0f} | {tokens / t * 1000:.0f} | "
                  f"{flops / (t / 1000) / (peak * 1e9) * 100:.1f}% |")
        print(f"\nours / PyTorch speed: {theirs / ours:.2f}x (pattern {a.pattern}, f32 GEMM peak "
              f"{peak:.0f} GFLOP/s, {a.threads} threads)")
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
