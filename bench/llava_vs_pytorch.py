#!/usr/bin/env python3
"""LLaVA training step time, side by side: `megatron pretrain_vlm` against PyTorch eager.

What this is: one invocation that trains the same LLaVA (a CLIP ViT of --vit-layers layers and
hidden --hidden on --img x --img images in --patch patches, the mlp projector, a Llama-style
decoder of --layers layers and hidden --hidden; text --text tokens, micro-batch --batch, fp32)
twice on the same machine with the same thread count: our trainer on `megatron scenes` images
(timing: the median `elapsed time per iteration (ms)` after --warmup iterations), and PyTorch
eager running tests/reference/llava_oracle.py's forward (the oracle's restatement of
CLIPVisionModel, the projector and LlamaForCausalLM, every weight a parameter) with backward and
torch.optim.AdamW on random images and tokens (timing: the median step after the same warm-up),
in a process of its own with OpenBLAS free to pick this CPU's kernels (OPENBLAS_CORETYPE removed)
and its threads set to --threads, as bench/compare_pytorch.py runs PyTorch.
It prints both, the ratio, and the model FLOPs per step by our trainer's formula (the language
model over its combined sequence, the ViT, patch GEMM and projector) as TFLOP/s.

What this is not: a convergence comparison (the data differ), a tuned PyTorch (no
torch.compile), or statistically careful: a few steps on a shared machine; read ratios.

Usage: python3 bench/llava_vs_pytorch.py --megatron build/megatron [--threads 2] [--steps 8]
       [--warmup 3] [--markdown]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))


def ours(args, work):
    data = os.path.join(work, "scenes")
    subprocess.run([args.megatron, "scenes", "--output-dir", data, "--num-samples", "256",
                    "--img-size", str(args.img)], check=True, capture_output=True)
    cmd = [args.megatron, "pretrain_vlm", "--num-layers", str(args.layers), "--encoder-num-layers",
           str(args.vit_layers), "--hidden-size", str(args.hidden), "--num-attention-heads",
           str(args.heads), "--ffn-hidden-size", str(args.ffn), "--vision-ffn-hidden-size",
           str(4 * args.hidden), "--img-h", str(args.img), "--img-w", str(args.img),
           "--patch-dim", str(args.patch), "--disable-vision-class-token",
           "--seq-length", str(args.text - 1),
           "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
           "--disable-bias-linear", "--untie-embeddings-and-output-weights",
           "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file",
           os.path.join(data, "vocab.txt"), "--train-data-path",
           os.path.join(data, "scenes.jsonl"), "--micro-batch-size", str(args.batch),
           "--global-batch-size", str(args.batch), "--train-iters",
           str(args.steps + args.warmup), "--lr", "1e-4", "--log-interval", "1",
           "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0",
           "--num-threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    times = [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)",
                                          proc.stdout)]
    vocab = int(re.search(r"new size: (\d+)", proc.stdout).group(1))
    return statistics.median(times[args.warmup:]) / 1000.0, vocab


def pytorch(args, vocab):
    import torch
    import torch.nn.functional as F
    import llava_oracle as lo
    from hf_oracle import Init
    torch.set_num_threads(args.threads)
    lo.IMG, lo.PATCH, lo.TEXT, lo.BATCH = args.img, args.patch, args.text, args.batch
    lo.CONFIG["vision_feature_layer"] = -1
    lo.CONFIG["text_config"].update(vocab_size=vocab, hidden_size=args.hidden,
                                    intermediate_size=args.ffn, num_hidden_layers=args.layers,
                                    num_attention_heads=args.heads,
                                    num_key_value_heads=args.heads)
    lo.CONFIG["vision_config"].update(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                      num_hidden_layers=args.vit_layers,
                                      num_attention_heads=args.heads, image_size=args.img,
                                      patch_size=args.patch)
    gen = torch.Generator().manual_seed(1)
    params = {n: torch.nn.Parameter(t) for n, t in lo.weights(Init(gen)).items()
              if "post_layernorm" not in n}
    opt = torch.optim.AdamW(params.values(), lr=1e-4)
    images = torch.randn(args.batch, 3, args.img, args.img, generator=gen)
    tokens = torch.randint(0, vocab - 1, (args.batch, args.text), generator=gen)
    tokens[:, 0] = lo.IMAGE_TOKEN
    times = []
    for _ in range(args.steps + args.warmup):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        feats = lo.clip_features(params, images)
        p = "multi_modal_projector."
        img = F.linear(F.gelu(F.linear(feats, params[p + "linear_1.weight"],
                                       params[p + "linear_1.bias"])),
                       params[p + "linear_2.weight"], params[p + "linear_2.bias"])
        text = F.embedding(tokens.clamp(min=0), params["language_model.model.embed_tokens.weight"])
        embeds = torch.cat([img, text[:, 1:]], dim=1)  # the image first, as the scenes samples
        logits = lo.llama_embeds_forward(params, embeds)
        labels = torch.randint(0, vocab, logits.shape[:2], generator=gen)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[args.warmup:])


def flops(args):
    """Our trainer's formula: 6 x tokens x (matrix parameters) + attention, LM and ViT."""
    b, h, f = args.batch, args.hidden, args.ffn
    patches = (args.img // args.patch) ** 2
    s_lm = args.text - 1 + patches
    lm = 12 * b * s_lm * args.layers * h * h * ((1 + 1 + s_lm / h) + 1.5 * f / h)
    vit = 12 * b * patches * args.vit_layers * h * h * ((1 + 1 + patches / h) + 4)
    stem = 6 * b * patches * 3 * args.patch ** 2 * h
    proj = 6 * b * patches * 2 * h * h
    return lm + vit + stem + proj  # (the output layer's small vocabulary left out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vit-layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--img", type=int, default=64)
    ap.add_argument("--patch", type=int, default=8)
    ap.add_argument("--text", type=int, default=33)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--torch-only", type=int, default=0, help=argparse.SUPPRESS)  # the vocabulary
    args = ap.parse_args()
    if args.torch_only:
        print(pytorch(args, args.torch_only))
        return
    with tempfile.TemporaryDirectory() as work:
        t_ours, vocab = ours(args, work)
    # PyTorch in its own process, as bench/compare_pytorch.py runs it: OpenBLAS left to pick its
    # kernels for this CPU, its pool and OpenMP sized to --threads.
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:],
                           "--torch-only", str(vocab)], capture_output=True, text=True, env=env,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    t_torch = float(proc.stdout.split()[-1])
    f = flops(args)
    rows = [("megatron-cpp", t_ours), ("PyTorch eager", t_torch)]
    if args.markdown:
        print("| | step (ms) | TFLOP/s | ratio |\n|---|---:|---:|---:|")
        for name, t in rows:
            print(f"| {name} | {t * 1e3:.1f} | {f / t / 1e12:.3f} | {t_torch / t:.2f}x |")
    else:
        for name, t in rows:
            print(f"{name:14s} step {t * 1e3:8.1f} ms  {f / t / 1e12:6.3f} TFLOP/s  "
                  f"{t_torch / t:5.2f}x")


if __name__ == "__main__":
    main()
