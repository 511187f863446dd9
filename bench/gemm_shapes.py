#!/usr/bin/env python3
"""The GEMMs of one training step of a benchmark model, timed in our GEMM and in PyTorch's.

What this is: the fifteen GEMM shapes of a GPT step (QKV, attention projection, the two MLP
linears and the output layer, each forward NT, input gradient NN and weight gradient TN, with the
tokens of one micro-batch as rows), each timed by `megatron bench gemm --shapes` (oneDNN, as the
trainer calls it) and by torch.matmul on the same shapes and transposes (PyTorch's CPU BLAS, run
with the environment bench/compare_pytorch.py gives PyTorch), both with the same thread count
and the best of repeated runs over the same time. Prints both rates per shape and the time the
whole step's GEMMs take in each (layer shapes x layers, the output layer once), which bounds from
below what any trainer built on that GEMM can reach on this machine: compare it with the step
times of bench/compare_pytorch.py.

What this is not: not the trainer's own GEMM time (`--timing-log-level 2` prints that), and not a
bf16 comparison (f32 only: the fp32 targets are the ones the GEMMs decide).

Usage:
    python3 bench/gemm_shapes.py --megatron build/megatron [--config a|b] [--threads 2]
        [--seconds 1] [--markdown]
Exit status: 0 on success, 1 if a run fails or its output cannot be parsed, 2 on bad arguments.
"""

import argparse
import json
import os
import re
import subprocess
import sys

import compare_pytorch as cp

TORCH_TIMER = r"""
import json, sys, time, torch
threads, seconds, shapes = int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
torch.set_num_threads(threads)
out = []
for m, n, k, ta, tb in shapes:
    a = torch.full((k, m) if ta else (m, k), 0.5)
    b = torch.full((n, k) if tb else (k, n), 0.25)
    a, b = (a.t() if ta else a), (b.t() if tb else b)
    c = torch.matmul(a, b)  # warm-up; then into the same output, as our GEMM writes its C
    best, t_end = 0.0, time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        torch.matmul(a, b, out=c)
        best = max(best, 2.0 * m * n * k / (time.perf_counter() - t0) / 1e9)
        if time.perf_counter() >= t_end:
            break
    out.append(best)
print(json.dumps(out))
"""

RATE_RE = re.compile(r"^gemm f32\s+(\S+)\s+threads=\d+:\s+([0-9.]+) GFLOP/s$", re.M)


def step_gemms(cfg):
    """(name, m, n, k, ta, tb, count) of every GEMM in one step of the config's model."""
    t, h, v, layers = cp.SEQ * cfg["batch"], cfg["hidden"], cp.VOCAB, cfg["layers"]
    out = []
    for name, n_out, n_in, count in (("qkv", 3 * h, h, layers), ("proj", h, h, layers),
                                     ("fc1", 4 * h, h, layers), ("fc2", h, 4 * h, layers),
                                     ("output", v, h, 1)):
        out.append((f"{name} forward", t, n_out, n_in, False, True, count))
        out.append((f"{name} input grad", t, n_in, n_out, False, False, count))
        out.append((f"{name} weight grad", n_out, n_in, t, True, False, count))
    return out


def shape_text(m, n, k, ta, tb):
    return f"{m}x{n}x{k}:{'T' if ta else 'N'}{'T' if tb else 'N'}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megatron", required=True, help="the megatron binary")
    ap.add_argument("--config", choices=sorted(cp.CONFIGS), default="b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0, help="seconds per shape and engine")
    ap.add_argument("--python", default=sys.executable, help="the Python that has torch")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not (os.path.isfile(args.megatron) and os.access(args.megatron, os.X_OK)):
        ap.error(f"--megatron {args.megatron}: not an executable file")
    if args.threads < 1 or args.seconds <= 0:
        ap.error("--threads must be >= 1 and --seconds > 0")

    gemms = step_gemms(cp.CONFIGS[args.config])
    texts = [shape_text(*g[1:6]) for g in gemms]
    cp.log(f"megatron bench gemm: {len(texts)} shapes x {args.seconds} s ...")
    rc, text = cp.run([args.megatron, "bench", "gemm", "--dtypes", "f32", "--seconds",
                       str(args.seconds), "--num-threads", str(args.threads), "--shapes", *texts])
    ours = dict(RATE_RE.findall(text))
    if rc != 0 or any(t not in ours for t in texts):
        print(f"megatron bench gemm failed (exit {rc}):\n{cp.tail(text)}", file=sys.stderr)
        return 1
    cp.log("torch.matmul: the same shapes ...")
    env, removed = cp.pytorch_env(args.threads)
    shapes = [list(g[1:6]) for g in gemms]
    rc, text = cp.run([args.python, "-c", TORCH_TIMER, str(args.threads), str(args.seconds),
                       json.dumps(shapes)], env=env)
    try:
        theirs = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        theirs = None
    if rc != 0 or not isinstance(theirs, list) or len(theirs) != len(gemms):
        print(f"the PyTorch timer failed (exit {rc}):\n{cp.tail(text)}", file=sys.stderr)
        return 1

    rows, ms_ours, ms_theirs = [], 0.0, 0.0
    for g, t, r_theirs in zip(gemms, texts, theirs):
        name, m, n, k, _, _, count = g
        r_ours = float(ours[t])
        flops = 2.0 * m * n * k * count
        ms_ours += flops / r_ours / 1e6
        ms_theirs += flops / r_theirs / 1e6
        rows.append([name, t, str(count), f"{r_ours:.1f}", f"{r_theirs:.1f}",
                     f"{r_ours / r_theirs:.2f}"])
    rows.append(["whole step (ms)", "", "", f"{ms_ours:.0f}", f"{ms_theirs:.0f}",
                 f"{ms_theirs / ms_ours:.2f}"])
    cfg = cp.CONFIGS[args.config]
    print(f"config {args.config} ({cfg['desc']}, {cp.SEQ * cfg['batch']} tokens per micro-batch), "
          f"{args.threads} threads, f32, best of {args.seconds} s per shape; PyTorch with "
          f"{', '.join(removed) or 'nothing'} removed from its environment")
    header = ["GEMM", "MxNxK:op", "per step", "ours GFLOP/s", "PyTorch GFLOP/s", "ratio"]
    print(cp.render_table(header, rows, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
