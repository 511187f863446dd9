#!/usr/bin/env python3
"""PyTorch eager baseline for text generation: a GPT-2 KV-cache loop on the CPU.

Writes a GPT-2-style model with seeded random weights (std 0.02) as a Hugging Face directory
(OUT/model: config.json and model.safetensors, the tests' restatement of the HF layout) and the
prompts (OUT/prompts.txt: (repeats + 1) x batch lines of token ids, all of one length), then
generates from the same weights in plain eager PyTorch, the way a KV-cache loop is written by hand:

  - prefill: one forward over the whole prompt that fills a preallocated per-layer K/V cache
    [b, heads, positions, head dim] and returns the logits of every prompt position;
  - decode: one position per step through the cache (attention over the cached keys), greedy
    (argmax over the vocabulary), to a fixed number of new tokens (no stop at end-of-document);
  - the log-probabilities of every token after the first, as `megatron generate` returns them
    (Megatron's default): the prefill's log-softmax over every prompt position, then one row per
    step.

Timing matches `megatron generate`'s per-batch line: prefill is the first forward through the
first new token (its sampling and log-probabilities), decode every later step; positions are
b x positions run. The first batch is a warm-up; the report is the median of the others.
fp32 runs in f32; bf16 converts the weights to bf16 and runs the model in bf16 (logits to f32
for the log-softmax), the cheapest eager bf16 inference.

Prints one line of JSON. Usage: python3 bench/pytorch_generate.py --out DIR --layers 12
    --hidden 768 --heads 12 --vocab 50257 --prompt-len 128 --new-tokens 64 --batch 8
    --repeats 3 --threads 2 [--bf16]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import hf_oracle  # noqa: E402


def write_model(args):
    cfg = dict(hf_oracle.GPT2_CONFIG, vocab_size=args.vocab, n_positions=args.positions,
               n_embd=args.hidden, n_layer=args.layers, n_head=args.heads)
    gen = torch.Generator().manual_seed(args.seed)
    weights = hf_oracle.gpt2_weights(cfg, hf_oracle.Init(gen, std=0.02))
    os.makedirs(os.path.join(args.out, "model"), exist_ok=True)
    with open(os.path.join(args.out, "model", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    hf_oracle.write_safetensors(os.path.join(args.out, "model", "model.safetensors"), weights)
    # Ids below vocab - 1: the NullTokenizer's end-of-document id never appears in a prompt.
    prompts = torch.randint(0, args.vocab - 1, ((args.repeats + 1) * args.batch, args.prompt_len),
                            generator=gen)
    with open(os.path.join(args.out, "prompts.txt"), "w") as f:
        for row in prompts.tolist():
            f.write(" ".join(map(str, row)) + "\n")
    return cfg, weights, prompts


class Gpt2:
    """GPT-2 (pre-LN, learned positions, tanh GELU, tied output) with a K/V cache."""

    def __init__(self, cfg, weights, dtype):
        self.w = {k: v.to(dtype).contiguous() for k, v in weights.items()}
        self.H, self.nh, self.L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
        self.eps = cfg["layer_norm_epsilon"]
        self.dtype = dtype

    def new_cache(self, b, positions):
        hd = self.H // self.nh
        return [(torch.empty(b, self.nh, positions, hd, dtype=self.dtype),
                 torch.empty(b, self.nh, positions, hd, dtype=self.dtype)) for _ in range(self.L)]

    def linear(self, x, name):
        shape = x.shape
        y = torch.addmm(self.w[name + ".bias"], x.reshape(-1, shape[-1]), self.w[name + ".weight"])
        return y.view(*shape[:-1], -1)

    def norm(self, x, name):
        return F.layer_norm(x, (self.H,), self.w[name + ".weight"], self.w[name + ".bias"], self.eps)

    def forward(self, ids, cache, start):
        """Logits [b, n, V] (f32) of positions start .. start + n - 1; writes their K/V."""
        b, n = ids.shape
        hd = self.H // self.nh
        end = start + n
        x = self.w["wte.weight"][ids] + self.w["wpe.weight"][start:end]
        mask = None
        if n > 1:  # causal over the new positions; every cached one is visible
            mask = torch.full((n, end), float("-inf"), dtype=self.dtype).triu(start + 1)
        for i in range(self.L):
            p = f"h.{i}."
            qkv = self.linear(self.norm(x, p + "ln_1"), p + "attn.c_attn")
            q, k, v = qkv.view(b, n, 3, self.nh, hd).permute(2, 0, 3, 1, 4)
            kc, vc = cache[i]
            kc[:, :, start:end] = k
            vc[:, :, start:end] = v
            scores = torch.matmul(q, kc[:, :, :end].transpose(-1, -2)) * hd ** -0.5
            if mask is not None:
                scores = scores + mask
            o = torch.matmul(torch.softmax(scores, dim=-1), vc[:, :, :end])
            x = x + self.linear(o.transpose(1, 2).reshape(b, n, self.H), p + "attn.c_proj")
            h = F.gelu(self.linear(self.norm(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
            x = x + self.linear(h, p + "mlp.c_proj")
        x = self.norm(x, "ln_f")
        return torch.matmul(x, self.w["wte.weight"].t()).float()


def generate(model, prompts, new_tokens):
    """Greedy tokens [b, prompt + new], log-probs [b, prompt + new - 1], prefill and decode s."""
    b, n = prompts.shape
    cache = model.new_cache(b, n + new_tokens)
    tokens = torch.empty(b, n + new_tokens, dtype=torch.long)
    tokens[:, :n] = prompts
    logprobs = torch.empty(b, n + new_tokens - 1)
    t0 = time.perf_counter()
    logits = model.forward(prompts, cache, 0)
    lsm = F.log_softmax(logits, dim=-1)
    logprobs[:, :n - 1] = lsm[:, :-1].gather(2, prompts[:, 1:, None])[..., 0]
    nxt = torch.argmax(logits[:, -1], dim=-1)
    tokens[:, n] = nxt
    logprobs[:, n - 1] = lsm[:, -1].gather(1, nxt[:, None])[:, 0]
    t1 = time.perf_counter()
    for pos in range(n, n + new_tokens - 1):
        logits = model.forward(tokens[:, pos:pos + 1], cache, pos)[:, 0]
        nxt = torch.argmax(logits, dim=-1)
        tokens[:, pos + 1] = nxt
        logprobs[:, pos] = F.log_softmax(logits, dim=-1).gather(1, nxt[:, None])[:, 0]
    t2 = time.perf_counter()
    return tokens, logprobs, t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    if args.new_tokens < 2 or args.prompt_len < 2:
        ap.error("--new-tokens and --prompt-len must be >= 2 (decode and prefill both timed)")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1 (the first batch is a warm-up, then the timed ones)")
    torch.set_num_threads(args.threads)
    cfg, weights, prompts = write_model(args)
    model = Gpt2(cfg, weights, torch.bfloat16 if args.bf16 else torch.float32)
    prefill, decode, first_tokens = [], [], None
    with torch.no_grad():
        for r in range(args.repeats + 1):
            batch = prompts[r * args.batch:(r + 1) * args.batch]
            tokens, _, tp, td = generate(model, batch, args.new_tokens)
            if r == 0:
                first_tokens = tokens.tolist()
                continue
            prefill.append(tp)
            decode.append(td)
    b, n, g = args.batch, args.prompt_len, args.new_tokens
    print(json.dumps({
        "prefill_tokens_per_s": b * n / statistics.median(prefill),
        "decode_tokens_per_s": b * (g - 1) / statistics.median(decode),
        "prefill_s": prefill, "decode_s": decode,
        "torch": torch.__version__, "first_batch_tokens": first_tokens,
    }))


if __name__ == "__main__":
    main()
