#!/usr/bin/env python3
"""Checkpoint save and load throughput of `megatron train`, against this disk's raw write speed.

What it is: one model trained for one iteration and saved (weights, fp32 main weights and both
Adam moments: 16 bytes per parameter), blocking and with --async-save, on one process and as a
tp2 job, then loaded back into another layout; reports the MB/s the trainer prints
(` > checkpoint of iteration ...` and ` > read ... MB of tensors`) next to a plain
write + fsync of the same number of bytes from Python (the disk's ceiling for one writer). Each
load runs three times: with the per-tensor XXH3-64 checksums (the default), with
--no-verify-integrity (no checks beyond sizes) and with --verify-integrity (whole-file SHA-256 too).
What it is not: a correctness test (tests/checkpoint), or a shared-filesystem measurement.

Usage: bench/checkpoint.py --megatron build/megatron [--mpiexec mpiexec] [--markdown]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# About 29M parameters (8 layers x 12 h^2 + 8192 x 512 embeddings): 470 MB per checkpoint.
MODEL = ["--mock-data", "--vocab-size", "8192", "--num-layers", "8", "--hidden-size", "512",
         "--num-attention-heads", "8", "--seq-length", "128", "--max-position-embeddings", "128",
         "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-4",
         "--log-interval", "1", "--eval-iters", "0", "--gemm-peak-gflops", "100"]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
SAVE_RE = re.compile(r"> checkpoint of iteration \d+: ([0-9.]+) MB in \d+ files, ([0-9.]+) s "
                     r"\(([0-9.]+) MB/s\)(?:; training waited ([0-9.]+) s)?")
LOAD_RE = re.compile(r"> read ([0-9.]+) MB of tensors on \d+ ranks in ([0-9.]+) s "
                     r"\(([0-9.]+) MB/s\)")


def run(args, ranks, flags):
    cmd = [args.megatron, "train", *MODEL, *flags]
    if ranks > 1:
        cmd = [args.mpiexec, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                          timeout=1800, check=False)
    if proc.returncode != 0:
        sys.exit(f"checkpoint bench: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def raw_write(path, nbytes):
    """MB/s of writing nbytes in 8 MB blocks and fsyncing: the disk's speed for one writer."""
    block = os.urandom(8 << 20)
    start = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    os.remove(path)
    return nbytes / 1e6 / seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        for name, ranks, layout, extra in [
                ("1 process, blocking", 1, [], []),
                ("1 process, --async-save", 1, [], ["--async-save"]),
                ("tp2 (2 ranks), blocking", 2, ["--tensor-model-parallel-size", "2"], []),
                ("tp2 (2 ranks), --async-save", 2, ["--tensor-model-parallel-size", "2"],
                 ["--async-save"])]:
            ck = os.path.join(tmp, "ck")
            shutil.rmtree(ck, ignore_errors=True)
            threads = ["--num-threads", str(2 // ranks)]
            out = run(args, ranks, [*layout, *threads, "--train-iters", "1", "--save", ck, *extra])
            m = SAVE_RE.search(out)
            if not m:
                sys.exit(f"checkpoint bench: no save line in the output of {name}")
            rows.append((f"save, {name}", float(m.group(1)), float(m.group(2)), float(m.group(3)),
                         float(m.group(4)) if m.group(4) else None))
            # Load into the other layout: a 1-process checkpoint into tp2 and back; with the
            # per-tensor checksums (the default), without them, and with whole-file SHA-256 too.
            other = 2 if ranks == 1 else 1
            other_layout = ["--tensor-model-parallel-size", "2"] if other == 2 else []
            for check, flags in [("checksums", []), ("--no-verify-integrity",
                                                     ["--no-verify-integrity"]),
                                 ("--verify-integrity", ["--verify-integrity"])]:
                out = run(args, other, [*other_layout, "--num-threads", str(2 // other),
                                        "--train-iters", "1", "--load", ck, *flags])
                m = LOAD_RE.search(out)
                if not m:
                    sys.exit(f"checkpoint bench: no load line in the output of {name}")
                into = "tp2" if other == 2 else "1 process"
                rows.append((f"load into {into} (saved by {name}), {check}",
                             float(m.group(1)), float(m.group(2)), float(m.group(3)), None))
        disk = raw_write(os.path.join(tmp, "raw"), int(rows[0][1] * 1e6))
    if args.markdown:
        print("| operation | MB | seconds | MB/s | training blocked (s) |")
        print("|---|---|---|---|---|")
        for name, mb, s, rate, blocked in rows:
            b = f"{blocked:.3f}" if blocked is not None else "-"
            print(f"| {name} | {mb:.1f} | {s:.3f} | {rate:.0f} | {b} |")
        print(f"| raw write + fsync from Python (same bytes, one writer) | {rows[0][1]:.1f} | - | "
              f"{disk:.0f} | - |")
    else:
        for name, mb, s, rate, blocked in rows:
            extra = f", training blocked {blocked:.3f} s" if blocked is not None else ""
            print(f"{name}: {mb:.1f} MB in {s:.3f} s = {rate:.0f} MB/s{extra}")
        print(f"raw write + fsync: {disk:.0f} MB/s")


if __name__ == "__main__":
    main()
