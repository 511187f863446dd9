#!/usr/bin/env python3
"""Generation speed: `megatron generate` against a PyTorch eager KV-cache loop, side by side.

For each batch size and dtype, bench/pytorch_generate.py writes a GPT-2-style model with random
weights as a Hugging Face directory plus (repeats + 1) batches of prompts of one length, and times
its own eager KV-cache loop on them; then `megatron generate --pretrained-checkpoint` runs the same
weights and prompts greedily (--top_k 1) with the same threads, batch size and number of new
tokens, and its per-batch stderr line gives the prefill and decode times. Both sides return the
log-probabilities (Megatron's default) and never stop early; the first batch of each side is a
warm-up and the report is the median of the others.

  prefill tokens/s = b x prompt length / (first forward through the first new token)
  decode tokens/s  = b x (new tokens - 1) / (every later step)

What this is not: a server benchmark (HTTP and queueing are not timed) or a test of the tokens
(tests/inference/test_generate_cli.py checks them against PyTorch); it reports how many of the
warm-up batch's fp32 tokens agree, as a sanity line only (random weights leave near-ties).

Usage: /usr/bin/python3 bench/generate_speed.py --megatron build/megatron [--config b]
    [--batches 1 8] [--dtype fp32|bf16|both] [--prompt-len 128] [--new-tokens 64]
    [--repeats 3] [--threads 2] [--markdown]
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import compare_pytorch as cp

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {  # name: (layers, hidden, heads, vocab, positions)
    "a": (4, 256, 4, 50257, 1024),
    "b": (12, 768, 12, 50257, 1024),  # GPT-2 124M
}
BATCH_RE = re.compile(
    r"batch (\d+) \((\d+) prompts\): prefill (\d+) positions in ([0-9.]+) s .*?decode (\d+) "
    r"positions in ([0-9.]+) s")


def log(msg):
    print(f"[generate_speed] {msg}", file=sys.stderr, flush=True)


def run_pytorch(args, cfg, batch, bf16, out, env):
    layers, hidden, heads, vocab, positions = cfg
    cmd = [args.python, os.path.join(HERE, "pytorch_generate.py"), "--out", out,
           "--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads),
           "--vocab", str(vocab), "--positions", str(positions),
           "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
           "--batch", str(batch), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    if bf16:
        cmd.append("--bf16")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        raise cp.BenchError(f"PyTorch side failed:\n{cp.tail(p.stdout + p.stderr)}")
    return json.loads(lines[-1])


def run_megatron(args, batch, bf16, out):
    cmd = [args.megatron, "generate", "--pretrained-checkpoint", os.path.join(out, "model"),
           "--tokenizer-type", "NullTokenizer", "--prompt-file", os.path.join(out, "prompts.txt"),
           "--num-tokens-to-generate", str(args.new_tokens), "--top_k", "1",
           "--inference-max-batch-size", str(batch), "--num-threads", str(args.threads)]
    if bf16:
        cmd.append("--bf16")
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise cp.BenchError(f"megatron generate failed:\n{cp.tail(p.stderr)}")
    batches = [m.groups() for m in BATCH_RE.finditer(p.stderr)]
    if len(batches) != args.repeats + 1:
        raise cp.BenchError(f"expected {args.repeats + 1} batch lines:\n{cp.tail(p.stderr)}")
    want_decode = batch * (args.new_tokens - 1)
    prefill, decode = [], []
    for _, _, _, pre_s, dec_n, dec_s in batches[1:]:
        if int(dec_n) != want_decode:
            raise cp.BenchError(f"a batch stopped early ({dec_n} of {want_decode} decode "
                                "positions): an end-of-document was generated; change --seed")
        prefill.append(float(pre_s))
        decode.append(float(dec_s))
    results = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return {
        "prefill_tokens_per_s": batch * args.prompt_len / statistics.median(prefill),
        "decode_tokens_per_s": want_decode / statistics.median(decode),
        "prefill_s": prefill, "decode_s": decode,
        "first_batch_tokens": [r["tokens"] for r in results[:batch]],
    }


def agreement(ours, theirs, prompt_len):
    same = total = 0
    for a, b in zip(ours, theirs):
        for x, y in zip(a[prompt_len:], b[prompt_len:]):
            same += x == y
            total += 1
    return same, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", required=True)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1 or args.new_tokens < 2 or args.prompt_len < 2:
        ap.error("--repeats must be >= 1, --new-tokens and --prompt-len >= 2")
    if args.threads > cp.available_cpus():
        log(f"warning: {args.threads} threads on {cp.available_cpus()} CPUs")
    env, removed = cp.pytorch_env(args.threads)
    cfg = CONFIGS[args.config]
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    rows, notes = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for dtype in dtypes:
                for batch in args.batches:
                    out = os.path.join(tmp, f"{dtype}-b{batch}")
                    log(f"{dtype} batch {batch}: PyTorch")
                    theirs = run_pytorch(args, cfg, batch, dtype == "bf16", out, env)
                    log(f"{dtype} batch {batch}: megatron")
                    ours = run_megatron(args, batch, dtype == "bf16", out)
                    for phase in ("prefill", "decode"):
                        a = ours[f"{phase}_tokens_per_s"]
                        b = theirs[f"{phase}_tokens_per_s"]
                        rows.append([dtype, str(batch), phase, f"{a:.1f}", f"{b:.1f}",
                                     f"{a / b:.2f}x"])
                    if dtype == "fp32":
                        same, total = agreement(ours["first_batch_tokens"],
                                                theirs["first_batch_tokens"], args.prompt_len)
                        notes.append(f"fp32 batch {batch}: {same} of {total} greedy tokens of "
                                     "the warm-up batch equal PyTorch's")
                    notes.append(f"{dtype} batch {batch} seconds (prefill, decode) per batch: "
                                 f"ours {ours['prefill_s']}, {ours['decode_s']}; "
                                 f"PyTorch {theirs['prefill_s']}, {theirs['decode_s']}")
                    torch_version = theirs["torch"]
    except cp.BenchError as e:
        print(f"generate_speed: {e}", file=sys.stderr)
        return 1
    layers, hidden, heads, vocab, _ = cfg
    header = ["dtype", "batch", "phase", "ours tok/s", "PyTorch tok/s", "ours / PyTorch"]
    if args.markdown:
        print(f"- date: {datetime.date.today().isoformat()}")
        print(f"- command: `{cp.command_line()}`")
        print(f"- CPU: {cp.cpu_model()}, {args.threads} threads; PyTorch {torch_version} eager")
        if removed:
            print(f"- removed from PyTorch's environment: {', '.join(sorted(removed))}")
    print(f"model: config {args.config} ({layers} layers, hidden {hidden}, {heads} heads, "
          f"vocabulary {vocab}); prompt {args.prompt_len} tokens, {args.new_tokens} new, greedy, "
          f"log-probs on; median of {args.repeats} batches after a warm-up")
    print()
    print(cp.render_table(header, rows, args.markdown))
    print()
    for n in notes:
        print(f"- {n}" if args.markdown else n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
