#!/usr/bin/env python3
"""Megatron-FSDP memory per rank: what each sharding strategy keeps, measured, against the
expected 1/dp shares.

What it is: a GPT of 29.4M parameters (8 layers, h 512, ffn 2048, vocabulary 8192, s 64, one
sequence per micro-batch: the weights and their state dominate the activations) on mock data,
2 iterations under `mpiexec -n DP` for DP in 2 and 4, fp32 and bf16, with
`--use-megatron-fsdp --data-parallel-sharding-strategy S` for every S. From rank 0's memory
report (after the first iteration) it prints:
  held      the weights, gradients and optimizer state this rank's buffers hold (the sizes of the
            tensors, measured, not estimated)
  expected  the bytes per parameter of the strategy x parameters (+ padding is the difference):
            fp32 no_shard 16, optim 8 + 8/dp, optim_grads 4 + 12/dp, optim_grads_params 16/dp;
            bf16 18, 6 + 12/dp, 2 + 16/dp, 18/dp (the fp32 main weights shard with the moments,
            the 2-byte compute copy with the weights)
  lent      the most the FSDP runtime lent at once on top (gathered weights, gradient buffers)
  peak      the most bytes all tensors took at once during training (activations included)
  max RSS   the process's peak resident set
With --fp8: bf16 with FP8 hybrid GEMMs (--fp8-format hybrid), strategies optim and
optim_grads_params at dp2 and dp4, without and with --fp8-param-gather (the FP8 GEMMs' weights
kept as one-byte codes: expected 1 byte per parameter less for those weights, 1/dp less under
ZeRO-3; 25,165,824 of the 29,447,168 parameters are FP8 GEMM weights).
What it is not: a speed measurement, or a test (tests/e2e/test_fsdp.py checks the shares).

Usage: bench/fsdp_memory.py --megatron build/megatron [--mpiexec mpiexec] [--fp8] [--markdown]
"""
import argparse
import os
import re
import subprocess
import sys

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
MODEL = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "8192",
         "--num-layers", "8", "--hidden-size", "512", "--ffn-hidden-size", "2048",
         "--num-attention-heads", "8", "--seq-length", "64", "--max-position-embeddings", "64",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2",
         "--lr", "1e-4", "--lr-warmup-iters", "1", "--log-interval", "1", "--eval-iters", "0",
         "--num-threads", "1"]
STRATEGIES = ["no_shard", "optim", "optim_grads", "optim_grads_params"]
FSDP_RE = re.compile(r"\[Rank 0\] \(after \d+ iterations\) FSDP memory \(MB\) \| weights, "
                     r"gradients and optimizer state: ([\d.]+) \| lent at most: ([\d.]+) \| peak "
                     r"of all tensors: ([\d.]+)")
RSS_RE = re.compile(r"\[Rank 0\] \(after \d+ iterations\) memory \(MB\) \| resident: [\d.]+ \| "
                    r"max resident: ([\d.]+)")
PARAMS_RE = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank "
                       r"\(0, 0\): (\d+)")


def expected_bytes_per_param(strategy, dp, bf16):
    if not bf16:
        return {"no_shard": 16, "optim": 8 + 8 / dp, "optim_grads": 4 + 12 / dp,
                "optim_grads_params": 16 / dp}[strategy]
    # Mixed precision: the fp32 main weights shard with the moments whenever those do.
    return {"no_shard": 18, "optim": 6 + 12 / dp, "optim_grads": 2 + 16 / dp,
            "optim_grads_params": 18 / dp}[strategy]


# The FP8 GEMM weights of MODEL: qkv 3 h^2, proj h^2, fc1 and fc2 h x ffn, in each of 8 layers.
FP8_WEIGHTS = 8 * (4 * 512 * 512 + 2 * 512 * 2048)


def run(megatron, mpiexec, dp, strategy, bf16, extra=()):
    cmd = [mpiexec, "-n", str(dp), "--oversubscribe", megatron, "train", *MODEL,
           "--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, *extra]
    if bf16:
        cmd.append("--bf16")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, **MPI_ENV), check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    m, r, p = FSDP_RE.search(proc.stdout), RSS_RE.search(proc.stdout), PARAMS_RE.search(proc.stdout)
    if not (m and r and p):
        sys.exit(f"no memory report in:\n{proc.stdout[-3000:]}")
    return int(p[1]), float(m[1]), float(m[2]), float(m[3]), float(r[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megatron", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--fp8", action="store_true", help="FP8 rows, without and with "
                    "--fp8-param-gather")
    args = ap.parse_args()
    if args.fp8:
        return fp8_rows(args)
    rows = []
    for bf16 in (False, True):
        for dp in (2, 4):
            for s in STRATEGIES:
                n, held, lent, peak, rss = run(args.megatron, args.mpiexec, dp, s, bf16)
                want = expected_bytes_per_param(s, dp, bf16) * n / 1048576
                rows.append(("bf16" if bf16 else "fp32", dp, s, held, want, lent, peak, rss))
                print(f"{rows[-1][0]} dp{dp} {s}: held {held:.1f} MB (expected {want:.1f}), lent "
                      f"{lent:.1f}, peak {peak:.1f}, max RSS {rss:.1f}", file=sys.stderr)
    if args.markdown:
        print("| dtype | dp | strategy | held (MB) | expected (MB) | held / expected | lent at "
              "most (MB) | peak of all tensors (MB) | max RSS (MB) |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
        for d, dp, s, held, want, lent, peak, rss in rows:
            print(f"| {d} | {dp} | {s} | {held:.1f} | {want:.1f} | {held / want:.3f} | "
                  f"{lent:.1f} | {peak:.1f} | {rss:.1f} |")


def fp8_rows(args):
    rows = []
    for dp in (2, 4):
        for s in ("optim", "optim_grads_params"):
            for gather in (False, True):
                extra = ["--fp8-format", "hybrid", *(["--fp8-param-gather"] if gather else [])]
                n, held, lent, peak, rss = run(args.megatron, args.mpiexec, dp, s, True, extra)
                saved = FP8_WEIGHTS * (1 / dp if s == "optim_grads_params" else 1) if gather else 0
                want = (expected_bytes_per_param(s, dp, True) * n - saved) / 1048576
                rows.append((dp, s, "yes" if gather else "no", held, want, lent, peak, rss))
                print(f"fp8 dp{dp} {s} param gather {gather}: held {held:.1f} MB (expected "
                      f"{want:.1f}), lent {lent:.1f}, peak {peak:.1f}, max RSS {rss:.1f}",
                      file=sys.stderr)
    if args.markdown:
        print("| dp | strategy | --fp8-param-gather | held (MB) | expected (MB) | held / expected "
              "| lent at most (MB) | peak of all tensors (MB) | max RSS (MB) |")
        print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
        for dp, s, g, held, want, lent, peak, rss in rows:
            print(f"| {dp} | {s} | {g} | {held:.1f} | {want:.1f} | {held / want:.3f} | "
                  f"{lent:.1f} | {peak:.1f} | {rss:.1f} |")


if __name__ == "__main__":
    main()
