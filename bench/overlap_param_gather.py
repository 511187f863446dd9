#!/usr/bin/env python3
"""--overlap-param-gather on this machine: the distributed optimizer's weight all-gather moved
from the optimizer step into the next forward.

What it is: the same dp2 run (distributed optimizer, --overlap-grad-reduce, several buckets)
with and without --overlap-param-gather at --timing-log-level 1, reporting per iteration the step
time, the optimizer phase and the time the step waits for the gather ("params-all-gather
(exposed)": without overlap all of it, inside the optimizer phase; with it, what the forward did
not hide), max over ranks, each the median of the log intervals after the first. The two runs' losses are identical (tests/e2e/
test_training_flags.py checks it); only where the transfer sits changes.
What it is not: a correctness test, or a model of what NCCL on GPUs would hide.

Usage: bench/overlap_param_gather.py --megatron build/megatron [--mpiexec mpiexec] [--markdown]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
STEP_RE = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
PHASE_RE = r"    {} \.*: \(([0-9.]+), ([0-9.]+)\)"
FLAGS = ["--mock-data", "--vocab-size", "4096", "--num-layers", "4", "--hidden-size", "512",
         "--num-attention-heads", "8", "--seq-length", "128", "--micro-batch-size", "2",
         "--global-batch-size", "8", "--log-interval", "5", "--eval-iters", "0",
         "--train-iters", "30", "--lr", "1e-4", "--use-distributed-optimizer",
         "--overlap-grad-reduce", "--ddp-bucket-size", "1000000", "--timing-log-level", "1",
         "--num-threads", "1"]


def run(args, extra):
    cmd = [args.mpiexec, "-n", "2", "--oversubscribe", "--allow-run-as-root", args.megatron,
           "train", *FLAGS, *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True,
                         env=dict(os.environ, **MPI_ENV)).stdout
    # findall gives (min, max) pairs: m[1] is the slowest rank. The first interval holds the start-up (first touches, bucket allocation): left out.
    steps = [float(x) for x in STEP_RE.findall(out)][1:]
    def phase(name):
        return [float(m[1]) for m in re.findall(PHASE_RE.format(re.escape(name)), out)][1:]
    exposed = phase("params-all-gather (exposed)")
    return (statistics.median(steps), statistics.median(phase("optimizer")),
            statistics.median(exposed) if exposed else None)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    rows = [("without", *run(args, [])), ("--overlap-param-gather", *run(args, ["--overlap-param-gather"]))]
    if args.markdown:
        print("| run | step (ms) | optimizer phase (ms, max over ranks) | exposed gather (ms) |")
        print("|---|---|---|---|")
    for name, step, opt, exposed in rows:
        ex = "-" if exposed is None else f"{exposed:.2f}"
        if args.markdown:
            print(f"| {name} | {step:.1f} | {opt:.2f} | {ex} |")
        else:
            print(f"{name:24s} step {step:8.1f} ms  optimizer {opt:7.2f} ms  exposed gather {ex}")
    print(f"step ratio (overlap / without): {rows[1][1] / rows[0][1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
