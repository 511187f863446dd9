#!/usr/bin/env python3
"""What Megatron's result validation costs a training step (the rerun state machine's checks).

What it is: GPT-2 small's shape (12 layers, h 768, vocabulary 50304, s 256, micro-batch 4) for a
few iterations with the default validations (each micro-batch's local loss sum; each gradient
bucket's norm before its reduction: one pass over the gradients), with the spiky-loss and
large-gradient checks added, and with every check off (--no-check-for-nan-in-loss-and-grad),
the variants alternated run by run; the median iteration time after the warm-up iterations of
each, and the ratio to the unchecked run. Iteration 1 is never validated (as Megatron), so the
medians are over validated iterations only.
What it is not: a correctness test (tests/train/test_rerun_state_machine, tests/e2e/test_rerun).

Usage: bench/result_validation.py --megatron build/megatron [--iters 6] [--rounds 2] [--dtype bf16]
"""
import argparse
import re
import statistics
import subprocess
import sys

MODEL = ["--mock-data", "--vocab-size", "50257", "--num-layers", "12", "--hidden-size", "768",
         "--num-attention-heads", "12", "--seq-length", "256", "--max-position-embeddings",
         "1024", "--micro-batch-size", "4", "--global-batch-size", "4", "--lr", "1e-4",
         "--log-interval", "1", "--eval-iters", "0", "--num-threads", "2"]
VARIANTS = {
    "no checks": ["--no-check-for-nan-in-loss-and-grad"],
    "default (NaN/Inf)": [],
    "+ spiky loss, large grads": ["--check-for-spiky-loss", "--check-for-large-grads"],
}
ITERATION_MS = re.compile(r"iteration\s+(\d+)/.*elapsed time per iteration \(ms\): ([\d.]+)")


def times(megatron, iters, dtype, extra):
    cmd = [megatron, "train", *MODEL, "--train-iters", str(iters), *dtype, *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    # Iterations 1 and 2 warm up (primitives, caches; 1 is not validated).
    return [float(ms) for it, ms in ITERATION_MS.findall(out) if int(it) > 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron", required=True)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args()
    dtype = ["--bf16"] if a.dtype == "bf16" else []
    got = {name: [] for name in VARIANTS}
    for _ in range(a.rounds):
        for name, extra in VARIANTS.items():
            got[name] += times(a.megatron, a.iters, dtype, extra)
    base = statistics.median(got["no checks"])
    print(f"| {a.dtype} | median ms / iteration | / no checks |")
    print("|---|---:|---:|")
    for name, ms in got.items():
        m = statistics.median(ms)
        print(f"| {name} | {m:.1f} | {m / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
