#!/usr/bin/env python3
"""Side-by-side CPU training throughput: megatron-cpp's trainer vs the PyTorch eager baseline.

What this is: one invocation that trains the same GPT-2-style model (same
layers, hidden size, heads, vocabulary, sequence length, micro-batch and
thread count) first with `megatron train --mock-data` and then with
bench/pytorch_gpt.py, once per requested dtype (fp32, and bf16 = our --bf16
vs torch.autocast bfloat16), and prints a table per dtype: time per
iteration, tokens/s, the ratio ours/PyTorch, and model-FLOPs utilisation of
both against the GEMM peak our trainer measured at start-up. Our time is the
median of the per-iteration `elapsed time per iteration (ms)` lines after
warm-up; PyTorch's is the mean the baseline script reports (it prints only
that). Before the runs it measures, in a PyTorch subprocess with the same
environment as the baseline, a 1024x1024 f32 and bf16 matmul, and reports
which BLAS library torch loaded, so a reader sees whether PyTorch's fp32 path
had an optimised BLAS.

Model FLOPs per iteration use Megatron-LM's formula for multi-head attention
and a 4h MLP:
    12 * B * s * L * h^2 * ((1 + 1 + s/h) + 4 + V / (2 * L * h))
with V the padded vocabulary (50304).

The PyTorch subprocesses run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
removed from their environment (Debian's OpenBLAS then picks its AVX-512
kernels on CPUs that have them) and with OPENBLAS_NUM_THREADS and
OMP_NUM_THREADS set to --threads, so that the BLAS pool matches the thread
count; our trainer's environment is left untouched (it gets --num-threads).

What this is not: not a convergence or accuracy comparison, not a tuned
PyTorch (no torch.compile, no IPEX), not a multi-process or multi-node
benchmark, and not a statistically careful one: a few iterations on a shared
machine are noisy, so read ratios, not the third digit.

Usage:
    python3 bench/compare_pytorch.py --megatron build/megatron \
        [--config a|b] [--dtype fp32|bf16|both] [--threads 2] \
        [--iters N] [--warmup W] [--baseline OLD_BUILD/megatron] [--markdown]
Exit status: 0 on success, 1 if either side fails or its output cannot be
parsed, 2 on bad arguments.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

CONFIGS = {
    # name: layers, hidden, heads, micro-batch, default iters, default warm-up
    "a": dict(layers=4, hidden=256, heads=4, batch=8, iters=5, warmup=2,
              desc="4 layers, hidden 256, 4 heads"),
    "b": dict(layers=12, hidden=768, heads=12, batch=4, iters=3, warmup=1,
              desc="GPT-2 124M: 12 layers, hidden 768, 12 heads"),
}
VOCAB = 50304
VOCAB_DIVISIBLE_BY = 128
SEQ = 256
REMOVED_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

HERE = os.path.dirname(os.path.abspath(__file__))
PYTORCH_SCRIPT = os.path.join(HERE, "pytorch_gpt.py")

PROBE = r"""
import json, re, sys, time, torch
threads = int(sys.argv[1])
torch.set_num_threads(threads)

def gflops(dtype, n=1024, min_s=1.0):
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    for _ in range(3):
        a @ b
    reps, t0 = 0, time.perf_counter()
    while True:
        a @ b
        reps += 1
        el = time.perf_counter() - t0
        if el >= min_s and reps >= 3:
            return 2.0 * n ** 3 * reps / el / 1e9

f32 = gflops(torch.float32)
bf16 = gflops(torch.bfloat16)
libs = set()
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split()
        if len(parts) >= 6 and "blas" in parts[-1].rsplit("/", 1)[-1].lower():
            libs.add("/".join(parts[-1].split("/")[-2:]))
m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
print(json.dumps({"torch": torch.__version__, "blas_info": m.group(1) if m else "?",
                  "blas_libs": sorted(libs), "f32_gflops": f32, "bf16_gflops": bf16,
                  "threads": torch.get_num_threads()}))
"""


class BenchError(Exception):
    pass


def log(msg):
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def model_flops(batch, seq, layers, hidden, vocab):
    """Megatron-LM's model FLOPs per iteration (MHA, 4h MLP, no recompute)."""
    return 12.0 * batch * seq * layers * hidden ** 2 * (
        (1 + 1 + seq / hidden) + 4 + vocab / (2.0 * layers * hidden))


def padded_vocab(vocab, divisible_by):
    return -(-vocab // divisible_by) * divisible_by


def tail(text, n=25):
    lines = text.strip().splitlines()
    return "\n".join(lines[-n:])


def display_path(path):
    """A path as a reader should see it: relative to the working directory when inside it."""
    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else rel


def pytorch_env(threads):
    env = dict(os.environ)
    removed = {k: env.pop(k) for k in REMOVED_ENV if k in env}
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    return env, removed


def run(cmd, env=None):
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    except OSError as e:
        raise BenchError(f"cannot start {cmd[0]}: {e}")
    return p.returncode, p.stdout


ITER_RE = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
MS_RE = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)")
MFU_RE = re.compile(r"model FLOPs utilisation:\s*([0-9.eE+-]+)%")
LOSS_RE = re.compile(r"lm loss:\s*(\S+)")
PEAK_RE = re.compile(r"measured (\w+) GEMM peak with (\d+) threads:\s*([0-9.eE+-]+) GFLOP/s")


def finite(text):
    try:
        x = float(text)
    except ValueError:
        return False
    return x == x and abs(x) != float("inf")


def run_megatron(args, cfg, dtype, binary=None):
    b = cfg["batch"]
    cmd = [binary or args.megatron, "train", "--mock-data",
           "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", str(VOCAB_DIVISIBLE_BY),
           "--num-layers", str(cfg["layers"]), "--hidden-size", str(cfg["hidden"]),
           "--num-attention-heads", str(cfg["heads"]),
           "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
           "--micro-batch-size", str(b), "--global-batch-size", str(b),
           "--train-iters", str(args.warmup + args.iters), "--log-interval", "1",
           "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout", "0",
           # No evaluation: the final validation and test passes (100 iterations each by
           # default) would take longer than the timed training.
           "--eval-iters", "0", "--num-threads", str(args.threads)]
    if dtype == "bf16":
        cmd.append("--bf16")
    log(f"megatron-cpp {dtype}{' (baseline binary)' if binary else ''}: {args.warmup} warm-up + "
        f"{args.iters} timed iterations ...")
    rc, out = run(cmd)
    if rc != 0:
        raise BenchError(f"megatron-cpp {dtype} failed (exit {rc}); last output:\n{tail(out)}")
    peak = PEAK_RE.search(out)
    if not peak:
        raise BenchError(f"megatron-cpp {dtype}: no 'measured ... GEMM peak' line; last output:\n"
                         f"{tail(out)}")
    iters = []
    for line in out.splitlines():
        it, ms = ITER_RE.search(line), MS_RE.search(line)
        if not (it and ms):
            continue
        loss = LOSS_RE.search(line)
        if loss and not finite(loss.group(1)):
            raise BenchError(f"megatron-cpp {dtype}: loss {loss.group(1)} at iteration "
                             f"{it.group(1)}")
        mfu = MFU_RE.search(line)
        iters.append(dict(it=int(it.group(1)), ms=float(ms.group(1)),
                          mfu=float(mfu.group(1)) if mfu else None))
    timed = [r for r in iters if r["it"] > args.warmup]
    if len(timed) != args.iters:
        raise BenchError(f"megatron-cpp {dtype}: expected {args.iters} iteration lines after "
                         f"warm-up, parsed {len(timed)}; last output:\n{tail(out)}")
    ms = [r["ms"] for r in timed]
    printed_mfu = [r["mfu"] for r in timed if r["mfu"] is not None]
    return dict(ms_median=statistics.median(ms), ms_mean=statistics.fmean(ms), ms_all=ms,
                peak_dtype=peak.group(1), peak_threads=int(peak.group(2)),
                peak_gflops=float(peak.group(3)),
                printed_mfu_median=statistics.median(printed_mfu) if printed_mfu else None)


def run_pytorch(args, cfg, dtype, env):
    cmd = [args.python, PYTORCH_SCRIPT,
           "--num-layers", str(cfg["layers"]), "--hidden-size", str(cfg["hidden"]),
           "--num-attention-heads", str(cfg["heads"]), "--vocab-size", str(VOCAB),
           "--seq-length", str(SEQ), "--micro-batch-size", str(cfg["batch"]),
           "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--threads", str(args.threads)]
    if dtype == "bf16":
        cmd.append("--bf16")
    log(f"PyTorch {dtype}: {args.warmup} warm-up + {args.iters} timed iterations ...")
    rc, out = run(cmd, env=env)
    if rc != 0:
        raise BenchError(f"PyTorch {dtype} failed (exit {rc}); last output:\n{tail(out)}")
    result = None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{") and '"framework"' in line:
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                pass
    if not result or "ms_per_iter" not in result:
        raise BenchError(f"PyTorch {dtype}: no JSON result line; last output:\n{tail(out)}")
    if result.get("dtype") != dtype or result.get("threads") != args.threads:
        raise BenchError(f"PyTorch {dtype}: result is for dtype {result.get('dtype')}, "
                         f"threads {result.get('threads')}")
    notes = [l.strip() for l in out.splitlines() if l.startswith("pytorch_gpt:")]
    return dict(ms_mean=float(result["ms_per_iter"]), params=result.get("params"), notes=notes)


def probe_pytorch(args, env):
    log("PyTorch: timing 1024x1024 f32 and bf16 matmul ...")
    rc, out = run([args.python, "-c", PROBE, str(args.threads)], env=env)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if rc != 0 or not lines:
        raise BenchError(f"PyTorch probe failed (exit {rc}); last output:\n{tail(out)}")
    return json.loads(lines[-1])


def blas_label(probe):
    libs = probe["blas_libs"]
    if any("openblas" in l.lower() for l in libs):
        kind = "OpenBLAS"
    elif any(l == "blas/libblas.so.3" for l in libs):
        kind = "reference BLAS (netlib)"
    elif libs:
        kind = "unknown BLAS"
    else:
        kind = "no shared BLAS library loaded"
    shown = ", ".join(libs) if libs else "-"
    return f"{kind} ({shown}; torch BLAS_INFO={probe['blas_info']})"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def available_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def command_line():
    interp = sys.executable if sys.executable.startswith("/usr/bin/") else \
        os.path.basename(sys.executable or "python3")
    argv = list(sys.argv)
    argv[0] = display_path(argv[0])
    for i, a in enumerate(argv):
        if a in ("--megatron", "--baseline") and i + 1 < len(argv):
            argv[i + 1] = display_path(argv[i + 1])
        elif a.startswith("--megatron="):
            argv[i] = "--megatron=" + display_path(a.split("=", 1)[1])
    return shlex.join([interp] + argv)


def render_table(header, rows, markdown):
    if markdown:
        out = ["| " + " | ".join(header) + " |",
               "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def report(args, cfg, probe, removed, results, markdown):
    b, L, h = cfg["batch"], cfg["layers"], cfg["hidden"]
    v = padded_vocab(VOCAB, VOCAB_DIVISIBLE_BY)
    flops = model_flops(b, SEQ, L, h, v)
    tokens = b * SEQ
    removed_txt = ("were set and removed: " + ", ".join(f"{k}={v}" for k, v in removed.items())
                   if removed else "not set in the caller's environment either")
    meta = [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("command", f"`{command_line()}`" if markdown else command_line()),
        ("CPU", f"{cpu_model()} ({available_cpus()} CPUs available to the process)"),
        ("threads", f"{args.threads} (ours: --num-threads; PyTorch: torch.set_num_threads, "
                    f"OMP_NUM_THREADS and OPENBLAS_NUM_THREADS)"),
        ("model", f"config {args.config}: {cfg['desc']}, vocab {v}, seq {SEQ}, micro-batch = "
                  f"global batch {b}, tied embeddings, exact GELU, dropout 0, AdamW, clip 1.0"),
        ("iterations", f"{args.warmup} warm-up + {args.iters} timed; ours: median of the "
                       f"trainer's per-iteration times; PyTorch: mean (all the baseline reports)"),
        ("model FLOPs / iteration", f"{flops / 1e9:.1f} GFLOP (Megatron's formula), "
                                    f"{tokens} tokens / iteration"),
        ("PyTorch", f"torch {probe['torch']}, {blas_label(probe)}; 1024 matmul in this run: "
                    f"f32 {probe['f32_gflops']:.1f} GFLOP/s, bf16 {probe['bf16_gflops']:.1f} "
                    f"GFLOP/s with {probe['threads']} threads"),
        ("PyTorch environment", f"{', '.join(REMOVED_ENV)} removed from the PyTorch "
                                f"subprocesses only ({removed_txt})"),
    ]
    out = []
    if markdown:
        out.append(f"### megatron-cpp vs PyTorch eager, config {args.config}, "
                   f"{args.threads} threads")
        out.append("")
        out += [f"- {k}: {val}" for k, val in meta]
    else:
        w = max(len(k) for k, _ in meta)
        out += [f"{k.ljust(w)} : {val}" for k, val in meta]
    for dtype, ours, pt, base in results:
        peak = ours["peak_gflops"]
        ours_tps = tokens / (ours["ms_median"] / 1e3)
        pt_tps = tokens / (pt["ms_mean"] / 1e3)
        ours_mfu = flops / (ours["ms_median"] / 1e3) / (peak * 1e9) * 100
        pt_mfu = flops / (pt["ms_mean"] / 1e3) / (peak * 1e9) * 100
        header = [f"{dtype}", "ms / iteration", "tokens/s", "ours / PyTorch",
                  f"MFU vs {ours['peak_dtype']} peak {peak:.1f} GFLOP/s"]
        rows = [
            ["megatron-cpp", f"{ours['ms_median']:.1f} (median)", f"{ours_tps:.1f}",
             f"{ours_tps / pt_tps:.2f}x", f"{ours_mfu:.1f}%"],
            ["PyTorch eager", f"{pt['ms_mean']:.1f} (mean)", f"{pt_tps:.1f}", "1.00x",
             f"{pt_mfu:.1f}%"],
        ]
        if base:
            base_tps = tokens / (base["ms_median"] / 1e3)
            base_mfu = flops / (base["ms_median"] / 1e3) / (peak * 1e9) * 100
            rows.append([f"baseline {display_path(args.baseline)}",
                         f"{base['ms_median']:.1f} (median)", f"{base_tps:.1f}",
                         f"{base_tps / pt_tps:.2f}x", f"{base_mfu:.1f}%"])
            rows[0][0] += f" (ours / baseline {ours_tps / base_tps:.3f}x)"
        out.append("")
        if markdown:
            out.append(f"#### {dtype}" + (" (ours --bf16; PyTorch autocast bfloat16)"
                                          if dtype == "bf16" else ""))
            out.append("")
        out.append(render_table(header, rows, markdown))
        ours_mean_tps = tokens / (ours["ms_mean"] / 1e3)
        notes = [
            f"our per-iteration times (ms): {', '.join(f'{x:.1f}' for x in ours['ms_all'])}; "
            f"on means ours is {ours_mean_tps:.1f} tokens/s, "
            f"{ours_mean_tps / pt_tps:.2f}x PyTorch",
            f"GEMM peak measured by the trainer at start-up ({ours['peak_dtype']}, "
            f"{ours['peak_threads']} threads)",
        ]
        if ours["printed_mfu_median"] is not None:
            notes[-1] += f"; trainer-printed MFU, median: {ours['printed_mfu_median']:.1f}%"
        notes += [f"PyTorch said: {n}" for n in pt["notes"]]
        out.append("")
        out += [("- " if markdown else "  ") + n for n in notes]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(
        description="CPU training throughput of megatron-cpp vs PyTorch eager, side by side")
    ap.add_argument("--megatron", required=True, help="the megatron trainer binary")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="a",
                    help="a: 4x256 (default); b: GPT-2 124M")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=None,
                    help="timed iterations (default: 5 for config a, 3 for b)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up iterations, not timed (default: 2 for a, 1 for b)")
    ap.add_argument("--baseline", default=None,
                    help="another megatron binary (an older build) run the same way right after "
                         "ours, for a before/after ratio in the same run")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for the PyTorch side (default: this one)")
    ap.add_argument("--markdown", action="store_true", help="print markdown instead of text")
    args = ap.parse_args()

    cfg = CONFIGS[args.config]
    if args.iters is None:
        args.iters = cfg["iters"]
    if args.warmup is None:
        args.warmup = cfg["warmup"]
    if args.iters < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("need --iters >= 1, --warmup >= 0, --threads >= 1")
    if not (os.path.isfile(args.megatron) and os.access(args.megatron, os.X_OK)):
        ap.error(f"--megatron {args.megatron}: not an executable file")
    if args.threads > available_cpus():
        log(f"warning: --threads {args.threads} exceeds the {available_cpus()} CPUs available")

    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    env, removed = pytorch_env(args.threads)
    try:
        probe = probe_pytorch(args, env)
        results = []
        for dtype in dtypes:
            ours = run_megatron(args, cfg, dtype)
            base = run_megatron(args, cfg, dtype, args.baseline) if args.baseline else None
            pt = run_pytorch(args, cfg, dtype, env)
            results.append((dtype, ours, pt, base))
    except BenchError as e:
        print(f"compare_pytorch: error: {e}", file=sys.stderr)
        return 1
    print(report(args, cfg, probe, removed, results, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
