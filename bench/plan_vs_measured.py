#!/usr/bin/env python3
"""`megatron plan`'s predictions against `megatron train` on this machine, layout by layout.

What it is: for each layout below (two dense model sizes and an MoE model; TP with and without
SP, PP with and without virtual stages, DP with each sharding, CP, EP, recomputation on and off,
up to 4 ranks on this machine's cores) it asks `megatron plan --gpu cpu --evaluate --json` for the
predicted step time and peak resident memory of the most loaded rank, then trains the same flags
for real (mock data) and reads the per-iteration time (median of the logged intervals after the
first, which warms up caches and oneDNN primitives) and the largest `max resident` any rank
reports. The planner measures this machine itself (GEMM shapes, attention, elementwise kernels,
memory bandwidth) in each call, launched by mpiexec like the run so that it also measures the
job's collectives.
What it is not: a measurement of another machine, or of the GPU presets (bench/plan_published.py
compares those with published runs).

Usage: bench/plan_vs_measured.py --megatron build/megatron [--mpiexec mpiexec] [--markdown]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

COMMON = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "8192",
          "--seq-length", "256", "--max-position-embeddings", "256", "--global-batch-size", "8"]
# Two dense sizes: a GPT-2 style model (LayerNorm, GELU, learned positions, dropout 0.1) and a
# Llama style one (RMSNorm, SwiGLU, RoPE, GQA, no biases, no dropout); an MoE variant of the first.
SMALL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8"]
LLAMA = ["--num-layers", "4", "--hidden-size", "384", "--num-attention-heads", "6",
         "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "1024",
         "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--disable-bias-linear", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--untie-embeddings-and-output-weights"]
MOE = SMALL + ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "512",
              "--disable-bias-linear"]

TP2, SP, PP2, CP2 = (["--tensor-model-parallel-size", "2"], ["--sequence-parallel"],
                     ["--pipeline-model-parallel-size", "2"], ["--context-parallel-size", "2"])
FULL = ["--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1"]
SEL = ["--recompute-granularity", "selective"]
DIST = ["--use-distributed-optimizer"]


def mbs(n):
    return ["--micro-batch-size", str(n)]


# (name, model, ranks, layout flags)
CASES = [
    ("gpt-s tp1 mbs8", SMALL, 1, mbs(8)),
    ("gpt-s tp1 mbs2 (4 micro-batches)", SMALL, 1, mbs(2)),
    ("gpt-s tp1 mbs8 full recompute", SMALL, 1, mbs(8) + FULL),
    ("gpt-s tp1 mbs8 selective recompute", SMALL, 1, mbs(8) + SEL),
    ("gpt-s dp2", SMALL, 2, mbs(4)),
    ("gpt-s dp2 overlap-grad-reduce", SMALL, 2, mbs(4) + ["--overlap-grad-reduce"]),
    ("gpt-s dp2 distributed optimizer", SMALL, 2, mbs(4) + DIST),
    ("gpt-s tp2", SMALL, 2, mbs(8) + TP2),
    ("gpt-s tp2 sp", SMALL, 2, mbs(8) + TP2 + SP),
    ("gpt-s tp2 sp full recompute", SMALL, 2, mbs(8) + TP2 + SP + FULL),
    ("gpt-s pp2 mbs2", SMALL, 2, mbs(2) + PP2),
    ("gpt-s pp2 vpp2 mbs2", SMALL, 2, mbs(2) + PP2 + ["--num-virtual-stages-per-pipeline-rank", "2"]),
    ("gpt-s cp2", SMALL, 2, mbs(8) + CP2),
    ("gpt-s tp2 dp2 (4 ranks)", SMALL, 4, mbs(4) + TP2 + SP),
    ("gpt-s pp2 dp2 (4 ranks)", SMALL, 4, mbs(2) + PP2),
    ("llama tp1 mbs8", LLAMA, 1, mbs(8)),
    ("llama tp1 mbs8 full recompute", LLAMA, 1, mbs(8) + FULL),
    ("llama tp2 sp", LLAMA, 2, mbs(8) + TP2 + SP),
    ("llama dp2 distributed optimizer", LLAMA, 2, mbs(4) + DIST),
    ("llama pp2 mbs2", LLAMA, 2, mbs(2) + PP2),
    ("llama cp2", LLAMA, 2, mbs(8) + CP2),
    ("llama dp2 fsdp", LLAMA, 2, mbs(4) + ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                           "optim_grads_params"]),
    ("moe ep1", MOE, 1, mbs(8)),
    ("moe dp2 ep2", MOE, 2, mbs(4) + ["--expert-model-parallel-size", "2"]),
]

# Open MPI's defaults (shared-memory transfers by cross-memory attach: with copy-in/copy-out a
# large pipeline send only advances inside MPI calls, see docs/PERFORMANCE.md); ranks bound to
# cores where there are enough, oversubscribed otherwise.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
ITER_RE = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
MEM_RE = re.compile(r"max resident: ([0-9.]+)")


def launcher(args, ranks):
    """mpiexec for `ranks`: bound to cores where there are enough; oversubscribed otherwise, with
    idle ranks yielding (a busy-polling rank would take a core from one that computes)."""
    if ranks <= (os.cpu_count() or 1):
        return [args.mpiexec, "-n", str(ranks), "--bind-to", "core"]
    return [args.mpiexec, "-n", str(ranks), "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def predict(args, model, ranks, flags):
    cmd = [args.megatron, "plan", "--gpu", "cpu", "--gpus-per-node", str(ranks), *COMMON, *model,
           *flags, "--evaluate", "--json"]
    # Launched as the run will be, so that the planner measures this job's collectives.
    if ranks > 1:
        cmd = launcher(args, ranks) + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                          timeout=600, check=False)
    if proc.returncode != 0:
        sys.exit(f"plan_vs_measured: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    layout = json.loads(proc.stdout)["layouts"][0]
    return layout["step_seconds"], layout["memory_bytes"]["total"] / 2**20, layout


def measure(args, model, ranks, flags):
    cmd = [args.megatron, "train", *COMMON, *model, *flags, "--lr", "1e-4", "--train-iters",
           str(args.iters), "--log-interval", str(args.interval), "--eval-iters", "0"]
    if ranks > 1:
        cmd = launcher(args, ranks) + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                          timeout=1800, check=False)
    if proc.returncode != 0:
        sys.exit(f"plan_vs_measured: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    steps = [float(ms) / 1e3 for ms in ITER_RE.findall(proc.stdout)]
    mem = max(float(mb) for mb in MEM_RE.findall(proc.stdout))
    return statistics.median(steps[1:]), mem


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", default="build/megatron")
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--interval", type=int, default=3)
    p.add_argument("--only", help="run the cases whose name contains this")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    rows = []
    for name, model, ranks, flags in CASES:
        if args.only and args.only not in name:
            continue
        t_pred, m_pred, layout = predict(args, model, ranks, flags)
        t_meas, m_meas = measure(args, model, ranks, flags)
        rows.append((name, ranks, t_pred, t_meas, m_pred, m_meas, layout["seconds"]))
        if not args.markdown:
            print(f"{name:40s} ranks {ranks} step {t_pred:.3f}/{t_meas:.3f} s "
                  f"({100 * (t_pred / t_meas - 1):+.1f}%) memory {m_pred:.0f}/{m_meas:.0f} MiB "
                  f"({100 * (m_pred / m_meas - 1):+.1f}%)", flush=True)
    t_err = [abs(r[2] / r[3] - 1) for r in rows]
    m_err = [abs(r[4] / r[5] - 1) for r in rows]
    if args.markdown:
        print("| layout | ranks | predicted s | measured s | time error | predicted MiB | "
              "measured MiB | memory error |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, ranks, tp, tm, mp, mm, _ in rows:
            print(f"| {name} | {ranks} | {tp:.3f} | {tm:.3f} | {100 * (tp / tm - 1):+.1f}% | "
                  f"{mp:.0f} | {mm:.0f} | {100 * (mp / mm - 1):+.1f}% |")
    print(f"\n{len(rows)} layouts: time |error| median {100 * statistics.median(t_err):.1f}%, "
          f"worst {100 * max(t_err):.1f}%; memory |error| median "
          f"{100 * statistics.median(m_err):.1f}%, worst {100 * max(m_err):.1f}%")


if __name__ == "__main__":
    main()
