#!/usr/bin/env python3
"""Expert load balance over training on the Brown corpus: aux loss vs none vs expert bias.

What it is: three runs of the same small MoE model (Llama-style, 4 layers, hidden 128, 8 experts
of width 256, top-2, sequence 128, global batch 16) on data/brown_text_document (written by
scripts/fetch_data.sh), differing only in the balancing:
  aux loss     --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 (softmax)
  none         --moe-aux-loss-coeff 0 (softmax, nothing balances)
  expert bias  --moe-router-score-function sigmoid --moe-router-enable-expert-bias
               --moe-router-bias-update-rate 1e-3 --moe-aux-loss-coeff 0 (aux-loss-free)
Each logs `expert load max/mean` every iteration (--log-expert-load: per MoE layer the busiest
expert's tokens over the mean, averaged over the layers; 1 is perfect balance, E / k = 4 all on
the same two experts). Prints, per run, that value averaged over windows of the training, and
the final lm loss; --markdown prints the table for docs/.

What it is not: a speed benchmark (bench/moe_layer.py) or a test (tests/e2e/test_moe.py).

Usage: /usr/bin/python3 bench/moe_balance.py --megatron build/megatron [--iters 300]
       [--threads 2] [--markdown]
"""
import argparse
import os
import re
import subprocess
import sys

RUNS = [
    ("aux loss 1e-2", ["--moe-router-load-balancing-type", "aux_loss",
                       "--moe-aux-loss-coeff", "1e-2"]),
    ("none", ["--moe-aux-loss-coeff", "0"]),
    ("expert bias (sigmoid)", ["--moe-router-score-function", "sigmoid",
                               "--moe-router-enable-expert-bias",
                               "--moe-router-bias-update-rate", "1e-3",
                               "--moe-aux-loss-coeff", "0"]),
]


def model_args(iters, threads):
    data = "data/brown_text_document"
    if not os.path.exists(data + ".bin"):
        sys.exit(f"{data}.bin is missing: run scripts/fetch_data.sh first")
    return ["--data-path", data, "--split", "949,50,1", "--tokenizer-type", "GPT2BPETokenizer",
            "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt",
            "--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
            "--seq-length", "128", "--max-position-embeddings", "128",
            "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
            "--disable-bias-linear", "--untie-embeddings-and-output-weights",
            "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "256",
            "--micro-batch-size", "8", "--global-batch-size", "16", "--train-iters", str(iters),
            "--lr", "1e-3", "--lr-decay-style", "cosine", "--lr-warmup-iters", "20",
            "--eval-iters", "0", "--log-interval", "1", "--log-expert-load", "--seed", "1234",
            "--num-threads", str(threads)]


LINE = re.compile(r"iteration +(\d+)/.*?lm loss: ([0-9.E+-]+).*?expert load max/mean: ([0-9.E+-]+)")


def run(megatron, iters, threads, extra):
    proc = subprocess.run([megatron, "train", *model_args(iters, threads), *extra],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    points = [(int(m[1]), float(m[2]), float(m[3])) for m in map(LINE.search,
                                                                   proc.stdout.splitlines()) if m]
    if len(points) != iters:
        sys.exit(f"expected {iters} iteration lines, got {len(points)}")
    return points


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", required=True)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    windows = [(1, 10), (11, 50), (51, args.iters // 2), (args.iters // 2 + 1, args.iters)]
    rows = []
    for name, extra in RUNS:
        pts = run(args.megatron, args.iters, args.threads, extra)
        means = []
        for a, b in windows:
            vals = [load for it, _, load in pts if a <= it <= b]
            means.append(sum(vals) / len(vals))
        worst = max(load for _, _, load in pts[10:])
        rows.append((name, means, worst, pts[-1][1]))
        print(f"{name}: expert load max/mean by window {[f'{m:.3f}' for m in means]}, "
              f"worst after iteration 10 {worst:.3f}, final lm loss {pts[-1][1]:.4f}",
              file=sys.stderr)
    head = [f"iterations {a}-{b}" for a, b in windows]
    if args.markdown:
        print("| balancing | " + " | ".join(head) + " | worst (after 10) | final lm loss |")
        print("|---" * (len(head) + 3) + "|")
        for name, means, worst, loss in rows:
            print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in means) +
                  f" | {worst:.3f} | {loss:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
