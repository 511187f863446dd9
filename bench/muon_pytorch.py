#!/usr/bin/env python3
"""PyTorch eager's Newton-Schulz (Muon's orthogonalisation) on the shape bench_ops' BM_NewtonSchulz
times: [768, 3072], five quintic steps, f32 and bf16 (emerging_optimizers' newton_schulz as
Megatron runs it: torch.addmm, bf16 inputs and outputs under "medium" precision).

Usage: OMP_NUM_THREADS=2 /usr/bin/python3 bench/muon_pytorch.py [--threads 2] [--iters 10]
Prints ms per call and GFLOP/s for each dtype; compare with
`OMP_NUM_THREADS=2 build/bench/bench_ops --benchmark_filter=NewtonSchulz`.
"""
import argparse
import time

import torch

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def newton_schulz(x, dtype):
    X = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=1e-7).to(dtype)
    for a, b, c in QUINTIC:
        A = X @ X.T
        B = torch.addmm(A, A, A, alpha=c, beta=b)
        X = torch.addmm(X, B, X, alpha=1.0, beta=a)
    return X.float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    m, n = 768, 3072
    x = torch.randn(m, n)
    flops = 5 * (4 * m * m * n + 2 * m ** 3)
    for dtype in (torch.float32, torch.bfloat16):
        newton_schulz(x, dtype)  # warm-up
        t = time.perf_counter()
        for _ in range(args.iters):
            newton_schulz(x, dtype)
        ms = (time.perf_counter() - t) / args.iters * 1e3
        print(f"{str(dtype):16s} {ms:9.1f} ms  {flops / ms / 1e6:8.1f} GFLOP/s")


if __name__ == "__main__":
    main()
