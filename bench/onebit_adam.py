#!/usr/bin/env python3
"""1-bit Adam against Adam on the Brown corpus: the loss curves and the data-parallel traffic.

What it is: the main job's model (scripts/quickstart.sh: 4 layers, h 256, GPT-2 BPE, s 128) on
data/brown_text_document at dp2 (two ranks), the same steps with `--optimizer adam` and with
`--optimizer onebit_adam --onebit-freeze-step F` (F = 20% of the run, DeepSpeed's guidance),
printing the lm loss every 25 iterations side by side, the mean of the last 25 losses of each,
their gap, and the trainer's traffic line (the data-parallel bytes of the first compressed step
against the last full one, counted by the process group). What it is not: a speed measurement
(on one machine the exchange is memory copies; the saving is a network's), or a test.

Needs the data (scripts/fetch_data.sh). Usage:
  bench/onebit_adam.py --megatron build/megatron [--mpiexec mpiexec] [--iters 300] [--markdown]
                       [--ranks 1 --onebit-only]   (the same optimizer without the compression)
"""
import argparse
import os
import re
import subprocess
import sys

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
LOSS_RE = re.compile(r"iteration +(\d+)/ *\d+ \|.*?lm loss: ([0-9.E+-]+)")
# Megatron's GPT recipes use beta2 0.95. It also matters to 1-bit Adam here: without bias
# correction its variance after F warm-up steps is (1 - beta2^F) of the gradients' second moment,
# 0.06 with 0.999 at F = 60 (steps four times too large, frozen for the rest of the run), 0.95 with
# 0.95; DeepSpeed's freeze steps are thousands, where the two agree.
BETA2 = 0.95
TRAFFIC_RE = re.compile(r"data-parallel bytes sent by rank 0 per step: (\d+) with the gradient "
                        r"all-reduce, (\d+) compressed")


def model(iters):
    return ["--data-path", "data/brown_text_document", "--split", "90,5,5",
            "--data-cache-path", "data/cache", "--tokenizer-type", "GPT2BPETokenizer",
            "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt",
            "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
            "--seq-length", "128", "--max-position-embeddings", "128",
            "--micro-batch-size", "8", "--global-batch-size", "16", "--train-iters", str(iters),
            "--log-interval", "1", "--eval-iters", "0", "--lr", "1e-3", "--min-lr", "1e-4",
            "--lr-decay-style", "cosine", "--lr-warmup-iters", str(iters // 10),
            "--weight-decay", "0.1", "--clip-grad", "1.0", "--adam-beta2", str(BETA2),
            "--num-threads", "1"]


def run(args, extra):
    cmd = [args.mpiexec, "-n", str(args.ranks), "--oversubscribe", "--allow-run-as-root",
           args.megatron, "train", *model(args.iters), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                          check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return {int(m[1]): float(m[2]) for m in LOSS_RE.finditer(proc.stdout)}, proc.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--markdown", action="store_true")
    # --ranks 1: one process, where the compressed exchange is the identity (a group of one keeps
    # its momentum): what is left of the gap to Adam is the optimizer's own (no bias correction,
    # the variance frozen at the freeze step), not the compression's.
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--onebit-only", action="store_true", help="skip the Adam run")
    args = p.parse_args()
    freeze = args.iters // 5
    onebit, log = run(args, ["--optimizer", "onebit_adam", "--onebit-freeze-step", str(freeze)])
    if args.onebit_only:
        tail = sorted(onebit)[-25:]
        print(f"{args.ranks} rank(s): mean lm loss of the last 25 iterations, 1-bit Adam "
              f"{sum(onebit[i] for i in tail) / len(tail):.4f}; freeze step {freeze}")
        for it in sorted(onebit):
            if it % 25 == 0 or it == 1:
                print(f"{it:6d} 1-bit {onebit[it]:.4f}")
        return
    adam, _ = run(args, [])
    rows = [it for it in sorted(adam) if it % 25 == 0 or it == 1]
    if args.markdown:
        print("| iteration | Adam | 1-bit Adam |\n|---:|---:|---:|")
    for it in rows:
        mark = " (freeze)" if it == freeze else ""
        if args.markdown:
            print(f"| {it}{mark} | {adam[it]:.4f} | {onebit[it]:.4f} |")
        else:
            print(f"{it:6d}{mark:9s} adam {adam[it]:.4f}  1-bit {onebit[it]:.4f}")
    tail = sorted(adam)[-25:]
    a = sum(adam[i] for i in tail) / len(tail)
    b = sum(onebit[i] for i in tail) / len(tail)
    print(f"\nmean lm loss of the last 25 iterations: Adam {a:.4f}, 1-bit Adam {b:.4f} "
          f"(gap {(b - a) / a:+.2%}); freeze step {freeze}")
    m = TRAFFIC_RE.search(log)
    if m:
        full, compressed = int(m[1]), int(m[2])
        print(f"data-parallel bytes per step (rank 0): {full} with the gradient all-reduce, "
              f"{compressed} compressed ({compressed / full:.4f}, 1/{full / compressed:.1f})")


if __name__ == "__main__":
    main()
