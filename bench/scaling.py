#!/usr/bin/env python3
"""Parallel scaling of `megatron train` on this machine: dp2, tp2 and pp2 against one process.

What it is: the same model trained by one process with one thread, then by two MPI ranks with
one thread each in three layouts, reporting tokens per second, the ratio to the single process
and the share of each step spent in communication (the `communication (all groups)` line of
`--timing-log-level 1`: time inside blocking transfers and waits, i.e. not hidden behind
compute). Per-rank work is kept equal where the layout allows:
  - dp2: each rank trains the single process's micro-batch (global batch doubles); ideal 2.0.
  - tp2: both ranks share the single process's batch (heads, MLP and vocabulary split); ideal 2.0.
  - pp2: both ranks share the single process's batch of M micro-batches (half the layers
    each, 1F1B); ideal 2 M / (M + 1) for a balanced pipeline (one fill/drain bubble).
What it is not: a correctness test (tests/parallel), or a multi-node measurement.

Usage: bench/scaling.py --megatron build/megatron [--mpiexec mpiexec] [--iters 6] [--markdown]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

# Layers dominate the FLOPs (8 x 12 h^2 = 25M weights against a 4M output layer), so that a
# pipeline split in two halves is close to balanced; the last stage still carries the output
# layer and the loss (57% of the work), which bounds pp2 at 1.75 before the bubble.
MODEL = ["--mock-data", "--vocab-size", "8192", "--num-layers", "8", "--hidden-size", "512",
         "--num-attention-heads", "8", "--seq-length", "256", "--max-position-embeddings", "256",
         "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval",
         "1", "--timing-log-level", "1", "--num-threads", "1", "--eval-iters", "0"]
# Open MPI's defaults otherwise: in particular shared-memory transfers by cross-memory attach,
# with which a receiver copies a large message straight out of the sender's memory while the
# sender computes (with copy-in/copy-out, OMPI_MCA_btl_vader_single_copy_mechanism=none, a large
# pipeline send only advances while the sender is inside an MPI call: see docs/PERFORMANCE.md).
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
ITER_RE = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+) .*tokens per second: "
                     r"([0-9.]+)")
COMM_RE = re.compile(r"communication \(all groups\) \.*: \(([0-9.]+), ([0-9.]+)\)")


def run(args, ranks, flags, mbs, gbs, iters):
    cmd = [args.megatron, "train", *MODEL, "--micro-batch-size", str(mbs),
           "--global-batch-size", str(gbs), "--train-iters", str(iters), *flags]
    if ranks > 1:
        cmd = [args.mpiexec, "-n", str(ranks), "--bind-to", "core", "--allow-run-as-root", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                          timeout=1800, check=False)
    if proc.returncode != 0:
        sys.exit(f"scaling: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    steps = [(float(ms), float(tps)) for ms, tps in ITER_RE.findall(proc.stdout)]
    comm = [float(hi) for _, hi in COMM_RE.findall(proc.stdout)]
    # The first iterations warm up caches and oneDNN primitives: drop them.
    skip = min(2, len(steps) - 1)
    ms = statistics.median(s[0] for s in steps[skip:])
    tps = statistics.median(s[1] for s in steps[skip:])
    comm_ms = statistics.median(comm[skip:]) if comm else 0.0
    return {"ms": ms, "tokens_per_s": tps, "comm_share": comm_ms / ms}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8, help="M for the pp2 comparison")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    b, m = args.micro_batch_size, args.microbatches
    rows = []
    single = run(args, 1, [], b, b, args.iters)
    rows.append(("1 process, 1 thread", single, 1.0, 1.0))
    dp2 = run(args, 2, [], b, 2 * b, args.iters)
    rows.append(("dp2 (1 thread per rank)", dp2, dp2["tokens_per_s"] / single["tokens_per_s"], 2.0))
    dpo = run(args, 2, ["--overlap-grad-reduce"], b, 2 * b, args.iters)
    rows.append(("dp2 --overlap-grad-reduce", dpo, dpo["tokens_per_s"] / single["tokens_per_s"],
                 2.0))
    tp2 = run(args, 2, ["--tensor-model-parallel-size", "2"], b, b, args.iters)
    rows.append(("tp2", tp2, tp2["tokens_per_s"] / single["tokens_per_s"], 2.0))
    accum = run(args, 1, [], b // 2, m * b // 2, args.iters)
    rows.append((f"1 process, {m} micro-batches of {b // 2}", accum, 1.0, 1.0))
    pp2 = run(args, 2, ["--pipeline-model-parallel-size", "2"], b // 2, m * b // 2, args.iters)
    rows.append((f"pp2, {m} micro-batches of {b // 2}", pp2,
                 pp2["tokens_per_s"] / accum["tokens_per_s"], 2.0 * m / (m + 1)))
    if args.markdown:
        print("| layout | ms / iteration | tokens/s | ratio | ideal | communication share |")
        print("|---|---|---|---|---|---|")
        for name, r, ratio, ideal in rows:
            print(f"| {name} | {r['ms']:.0f} | {r['tokens_per_s']:.0f} | {ratio:.2f} | "
                  f"{ideal:.2f} | {100 * r['comm_share']:.1f}% |")
    else:
        for name, r, ratio, ideal in rows:
            print(f"{name:40s} {r['ms']:8.0f} ms {r['tokens_per_s']:9.0f} tok/s  ratio "
                  f"{ratio:.2f} (ideal {ideal:.2f})  comm {100 * r['comm_share']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
