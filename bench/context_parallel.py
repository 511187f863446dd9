#!/usr/bin/env python3
"""Context parallelism on this machine: peak memory per rank, and exposed communication.

What it is: one model at a long sequence (default 8192 tokens) trained by 1, 2 and 4 ranks with
--context-parallel-size 1, 2, 4 (p2p), reporting each rank's peak resident memory (the memory
report after the first iteration) and, from the same layouts at 64 tokens, the rest of the
process, so that the activation part per rank reads as the difference; then cp 2 with each
--cp-comm-type at --timing-log-level 2, reporting the exposed context-parallel communication
per iteration next to the step. At cp 2 the all-gather variant moves the same bytes as the ring
(each rank's K/V one way, dK/dV back) without overlapping them, so its exposed time is the
transfers' cost and 1 - p2p / allgather the share the ring hides behind compute.
What it is not: a correctness test (tests/e2e/test_context_parallel.py).

Usage: bench/context_parallel.py --megatron build/megatron [--mpiexec mpiexec] [--seq 8192]
       [--markdown]
"""
import argparse
import os
import re
import subprocess
import sys

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
MEM_RE = re.compile(r"\[Rank (\d+)\] \(after 1 iterations\) memory \(MB\) \| resident: [0-9.]+ "
                    r"\| max resident: ([0-9.]+)")
EST_RE = re.compile(r"Theoretical memory footprints: .*activation=([0-9.]+) MB")
STEP_RE = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
EXPOSED_RE = re.compile(r"context-parallel communication \(exposed\) \.*: \(([0-9.]+), ([0-9.]+)\)")


def model(seq):
    return ["--mock-data", "--vocab-size", "1024", "--num-layers", "4", "--hidden-size", "256",
            "--num-attention-heads", "4", "--seq-length", str(seq), "--max-position-embeddings",
            str(max(seq, 64)), "--micro-batch-size", "1", "--global-batch-size", "1", "--lr",
            "1e-4", "--eval-iters", "0", "--eval-interval", "1000"]


def train(args, ranks, flags):
    cmd = [args.megatron, "train", *flags]
    if ranks > 1:
        cmd = [args.mpiexec, "-n", str(ranks), "--oversubscribe", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                          check=False)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def peak(out):
    return max(float(m[2]) for m in MEM_RE.finditer(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()

    rows = []
    for cp in (1, 2, 4):
        par = [] if cp == 1 else ["--context-parallel-size", str(cp)]
        threads = ["--num-threads", "2" if cp == 1 else "1"]
        common = ["--train-iters", "2", "--log-interval", "1", *threads, *par]
        long_out = train(args, cp, model(args.seq) + common)
        base_out = train(args, cp, model(64) + common)
        rows.append((cp, peak(long_out), peak(base_out), float(EST_RE.search(long_out)[1])))
    act1 = rows[0][1] - rows[0][2]
    print(f"| cp | max resident per rank, s {args.seq} (MB) | s 64 (MB) | activation part (MB) "
          f"| vs cp 1 | start-up activation estimate (MB) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for cp, long_peak, base, est in rows:
        act = long_peak - base
        print(f"| {cp} | {long_peak:.1f} | {base:.1f} | {act:.1f} | {act / act1:.2f} | {est:.1f} |")

    print()
    print("| cp 2 comm type | ms / iteration | exposed CP communication (ms, min-max over ranks) |")
    print("|---|---:|---:|")
    exposed = {}
    for comm in ("p2p", "allgather", "a2a"):
        out = train(args, 2, model(args.seq) + [
            "--train-iters", "4", "--log-interval", "2", "--timing-log-level", "2",
            "--num-threads", "1", "--context-parallel-size", "2", "--cp-comm-type", comm])
        step = [float(m[1]) for m in STEP_RE.finditer(out)][-1]
        lo, hi = [float(x) for x in EXPOSED_RE.findall(out)[-1]]
        exposed[comm] = hi
        print(f"| {comm} | {step:.1f} | {lo:.1f}-{hi:.1f} |")
    if exposed["allgather"] > 0:
        print(f"\nhidden by the ring: {100 * (1 - exposed['p2p'] / exposed['allgather']):.0f}% "
              f"of the all-gather variant's exposed time")


if __name__ == "__main__":
    main()
