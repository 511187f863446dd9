#!/usr/bin/env python3
"""PyTorch eager baseline: GPT-2-style training throughput on the CPU.

A plain eager training loop (learned absolute positions, pre-LN LayerNorm,
exact GELU, biases, tied embeddings, 4h MLP, causal attention, dropout 0,
AdamW lr 1e-4, grad clip 1.0) on random tokens, timed per iteration
including forward, loss, backward, clipping, optimizer step and zero_grad.
Prints exactly one line of JSON at the end.

Attention is baddbmm (scale and additive causal mask fused into one batched
matmul) followed by softmax and bmm: torch 1.13 has no
scaled_dot_product_attention, and this is the cheapest eager formulation
available there. With --device cuda (a GPU build of a recent torch) the model
runs on the GPU under torch.autocast('cuda', bfloat16) for --bf16, attention
through F.scaled_dot_product_attention (its flash kernel), and each timed
iteration ends with the loss read back (a synchronisation).

What this is not: not Megatron-LM, not a convergence test, not tuned
(no torch.compile, no fused optimizers, no channels-last or IPEX tricks);
it is a reference point for the C++ trainer's tokens/s on the same config.
Caveat: fp32 matmuls go through whatever BLAS the system's libblas points to
(Debian's torch is built with BLAS_INFO=generic); with the reference (netlib)
BLAS they run at a few GFLOP/s, so the setup script installs OpenBLAS, and
bench/compare_pytorch.py reports which library was loaded. bf16 goes through
oneDNN.

Usage: python3 bench/pytorch_gpt.py --num-layers 4 --hidden-size 256
    --num-attention-heads 4 --vocab-size 50304 --seq-length 256
    --micro-batch-size 8 --iters 10 --warmup 2 --threads 2 [--bf16] [--device cuda]
"""

import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden, heads, seq, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.fc_out = nn.Linear(4 * hidden, hidden)
        mask = torch.full((seq, seq), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def attn(self, x):
        B, S, H = x.shape
        nh = self.heads
        hd = H // nh
        qkv = self.qkv(x).view(B, S, 3, nh, hd).permute(2, 0, 3, 1, 4)  # [3,B,nh,S,hd]
        if self.sdpa:
            o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            return self.proj(o.transpose(1, 2).reshape(B, S, H))
        q = qkv[0].reshape(B * nh, S, hd)
        k = qkv[1].reshape(B * nh, S, hd)
        v = qkv[2].reshape(B * nh, S, hd)
        mask = self.mask[:S, :S].to(q.dtype).expand(B * nh, S, S)
        scores = torch.baddbmm(mask, q, k.transpose(1, 2), beta=1.0, alpha=hd ** -0.5)
        probs = torch.softmax(scores, dim=-1)
        o = torch.bmm(probs.to(v.dtype), v).view(B, nh, S, hd).transpose(1, 2).reshape(B, S, H)
        return self.proj(o)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))
        return x


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, vocab, seq, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList([Block(hidden, heads, seq, sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        self.register_buffer("pos", torch.arange(seq), persistent=False)
        for name, p in self.named_parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=0.02)
            elif "ln" in name:
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, ids):
        S = ids.shape[1]
        x = self.wte(ids) + self.wpe(self.pos[:S])[None]
        for blk in self.blocks:
            x = blk(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight)  # tied output layer


def main():
    ap = argparse.ArgumentParser(description="PyTorch eager GPT training baseline")
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--num-attention-heads", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=50304)
    ap.add_argument("--seq-length", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bf16", action="store_true",
                    help="run forward+loss under torch.autocast(device, bfloat16)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: on the GPU, attention through scaled_dot_product_attention")
    args = ap.parse_args()
    if args.hidden_size % args.num_attention_heads:
        print("pytorch_gpt: hidden size must be divisible by heads", file=sys.stderr)
        return 1
    if args.iters < 1 or args.warmup < 0:
        print("pytorch_gpt: need --iters >= 1 and --warmup >= 0", file=sys.stderr)
        return 1

    if args.device == "cuda" and not torch.cuda.is_available():
        print("pytorch_gpt: --device cuda: this torch sees no GPU", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = GPT(args.num_layers, args.hidden_size, args.num_attention_heads,
                args.vocab_size, args.seq_length, sdpa=args.device == "cuda").to(args.device)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)

    B, S, V = args.micro_batch_size, args.seq_length, args.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, V, (B, S + 1), generator=gen)
    tokens = tokens.to(args.device)
    inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(inputs)
            loss = F.cross_entropy(logits.float().view(-1, V), labels.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    loss = float("nan")
    for _ in range(args.iters):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    if loss != loss:
        print("pytorch_gpt: loss is NaN", file=sys.stderr)
        return 1

    ms = 1000.0 * sum(times) / len(times)
    result = {
        "framework": "pytorch",
        "tokens_per_s": round(B * S / (ms / 1000.0), 1),
        "ms_per_iter": round(ms, 2),
        "dtype": "bf16" if args.bf16 else "fp32",
        "threads": args.threads,
        "device": args.device,
        "params": n_params,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
