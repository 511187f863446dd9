#!/usr/bin/env python3
"""GPT's numbers across a refactor: per-iteration lm loss and grad norm, as printed, against
values recorded before the change.

What it is: 20 iterations (dropout on, evaluation every 10) of each configuration below, every
iteration's `lm loss` and `grad norm` and every validation line's loss compared with the recorded
text: identical to every printed digit. A refactor of the trainer, the pipeline or the layers
that changes no arithmetic passes; one that reorders a sum, drops a dropout mask or misroutes a
tensor does not.

The recorded values hold for one kind of build only: `megatron --version` prints what decides the
arithmetic (the vector extensions compiled for, the compiler, oneDNN and the kernels it picks on
this CPU); the last bits of a sum differ with another vector width or GEMM blocking. The file
keeps one record per such fingerprint. On a build with no record the test says so and is skipped
(CTest: not run): record one with `--record` from a binary built before the change to check.

What it is not: a check that the numbers are right (tests/parallel, tests/reference): only that
they did not move.

Usage: test_reference_curves.py --megatron BUILD/megatron --mpiexec MPIEXEC [--record]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_curves.json")
SKIPPED = 77  # CTest's SKIP_RETURN_CODE for this test
TIMEOUT_S = 300
ITERS = 20
TINY = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
        "--global-batch-size", "4", "--train-iters", str(ITERS), "--log-interval", "1",
        "--lr", "2e-3", "--lr-warmup-iters", "3", "--eval-interval", "10", "--eval-iters", "2",
        "--num-threads", "1"]
LLAMA = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
         "--disable-bias-linear", "--num-attention-heads", "8", "--group-query-attention",
         "--num-query-groups", "4", "--untie-embeddings-and-output-weights"]
TP, PP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size"
DOCS = ["--reset-attention-mask", "--reset-position-ids", "--eod-mask-loss"]
# (name, ranks, flags)
CONFIGS = [
    ("gpt2 fp32", 1, []),
    ("llama fp32", 1, LLAMA),
    ("gpt2 bf16", 1, ["--bf16"]),
    ("gpt2 fp16 dp2", 2, ["--fp16", "--initial-loss-scale", "4096"]),
    ("gpt2 tp2+sp", 2, [TP, "2", "--sequence-parallel"]),
    ("gpt2 pp2 interleaved, document masks", 2,
     [PP, "2", "--num-layers-per-virtual-pipeline-stage", "1", *DOCS]),
    ("gpt2 tp2pp2dp2 distributed optimizer", 8, [TP, "2", PP, "2", "--use-distributed-optimizer"]),
    ("llama tp2+sp pp2 bf16", 4, [*LLAMA, TP, "2", "--sequence-parallel", PP, "2", "--bf16"]),
    ("gpt2 full recomputation", 1, ["--recompute-granularity", "full", "--recompute-method",
                                    "uniform", "--recompute-num-layers", "1"]),
    ("gpt2 selective recomputation tp2", 2, [TP, "2", "--recompute-granularity", "selective"]),
]


def fingerprint(megatron):
    out = subprocess.run([megatron, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def merged(base, extra):
    """base's flags with extra's added, a flag given in both taking extra's value."""
    def pairs(flags):
        out, i = {}, 0
        while i < len(flags):
            has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
            out[flags[i]] = flags[i + 1] if has_value else None
            i += 1 + has_value
        return out
    return megatron_job.flags_with(dict(pairs(base), **pairs(extra)))


def curves(megatron, mpiexec, ranks, flags):
    """{"lm loss": [...], "grad norm": [...], "validation": [...]}, as printed."""
    proc = megatron_job.run_train(megatron, mpiexec, ranks, merged(TINY, flags), TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"{ranks} rank(s) {' '.join(flags)} failed:\n{proc.stderr[-3000:]}")
    lines = megatron_log.iteration_lines(proc.stdout, range(1, ITERS + 1))
    return {"lm loss": [lines[i]["lm loss"] for i in sorted(lines)],
            "grad norm": [lines[i]["grad norm"] for i in sorted(lines)],
            "validation": [[where, f["lm loss value"]]
                           for where, f in megatron_log.validation_lines(proc.stdout)]}


def format_records(records):
    """JSON with one line per recorded series, so that a diff shows which one moved."""
    out = []
    for key in sorted(records):
        configs = []
        for name in sorted(records[key]):
            fields = ",\n".join(f"   {json.dumps(field)}: {json.dumps(values)}"
                                for field, values in sorted(records[key][name].items()))
            configs.append(f"  {json.dumps(name)}: {{\n{fields}\n  }}")
        out.append(f" {json.dumps(key)}: {{\n" + ",\n".join(configs) + "\n }")
    return "{\n" + ",\n".join(out) + "\n}\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megatron", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--record", action="store_true",
                        help="write this build's curves as the record of its fingerprint")
    args = parser.parse_args()
    megatron = os.path.abspath(args.megatron)
    key = fingerprint(megatron)
    records = {}
    if os.path.exists(RECORDS):
        with open(RECORDS, encoding="utf-8") as f:
            records = json.load(f)
    if args.record:
        records[key] = {name: curves(megatron, args.mpiexec, ranks, flags)
                        for name, ranks, flags in CONFIGS}
        with open(RECORDS, "w", encoding="utf-8") as f:
            f.write(format_records(records))
        print(f"recorded {len(CONFIGS)} configurations for {key!r} in {RECORDS}")
        return 0
    if key not in records:
        print(f"no recorded curves for this build ({key!r}; recorded: {sorted(records)}): "
              "nothing to compare, skipped. Record them with --record from a build before "
              "the change to check.")
        return SKIPPED
    want = records[key]
    failures = []
    for name, ranks, flags in CONFIGS:
        if name not in want:
            failures.append(f"{name}: not recorded for this build")
            continue
        got = curves(megatron, args.mpiexec, ranks, flags)
        for field in ("lm loss", "grad norm", "validation"):
            if got[field] != want[name][field]:
                diff = [(i + 1, g, w) for i, (g, w) in enumerate(zip(got[field], want[name][field]))
                        if g != w]
                failures.append(f"{name}: {field} differs (iteration or line, got, recorded): "
                                f"{diff[:5]} (lengths {len(got[field])}, "
                                f"{len(want[name][field])})")
        print(f"{name}: {'ok' if not failures or not failures[-1].startswith(name) else 'DIFFERS'}")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    print(f"{len(CONFIGS)} configurations identical to the record of {key!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
