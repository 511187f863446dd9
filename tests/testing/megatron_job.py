"""Running the `megatron` binary from Python tests: alone, or as an mpiexec job.

What it is: the pieces every end-to-end test under mpiexec shares: the Open MPI environment (root
may launch, plain shared-memory copies instead of cross-memory attach, which containers often
forbid, and idle ranks yield, since the tests oversubscribe the cores), the command line of a
`megatron train` run on N ranks, and a main() that takes the binaries' paths. What it is not: a
launcher (mpiexec is) or a parser of the log (each test reads what it checks).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time
import unittest

# ob1, Open MPI's own messaging layer over shared memory: UCX's transport probing costs each
# process 0.2 s of MPI_Init, and these jobs never leave the machine. odls_base_sigkill_timeout 0:
# once a rank exits non-zero (every refusal), mpirun 4.1 signals the other ranks and then sleeps
# this many seconds (default 1) before SIGKILL, even when every rank has already exited; our ranks
# leave together through MPI_Finalize's fence after printing, so the second is only idle time
# (tests that stop mpirun with SIGTERM rely on the grace and set their own:
# test_checkpoint_faults.py, test_serve_cli.py).
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_mpi_yield_when_idle": "1",
           "OMPI_MCA_pml": "ob1", "OMPI_MCA_odls_base_sigkill_timeout": "0"}


# Text that only a crash prints (an uncaught exception, a signal, a failed assertion): a refusal
# or an agreed failure must not contain any of it.
CRASH_MARKERS = ("terminate called", "core dumped", "Segmentation fault", "what():",
                 "internal error", "Assertion")


def flags_with(base, **overrides):
    """The flag dict `base` ({"--flag": "value" or None}) as an argv list, with flags replaced or
    added: --foo-bar VALUE as foo_bar="VALUE", a valueless flag as foo_bar=True, a flag of several
    values as foo_bar=(V1, V2, ...)."""
    flags = dict(base)
    for key, value in overrides.items():
        if value is True:
            value = None
        elif isinstance(value, (list, tuple)):
            value = [str(v) for v in value]
        else:
            value = str(value)
        flags["--" + key.replace("_", "-")] = value
    out = []
    for flag, value in flags.items():
        if value is None:
            out.append(flag)
        elif isinstance(value, list):
            out += [flag, *value]
        else:
            out += [flag, value]
    return out


def with_flags(base, extra):
    """base with extra's flags appended, a flag already in base taking extra's value."""
    out, extra = list(base), list(extra)
    i = 0
    while i < len(extra):
        flag = extra[i]
        has_value = i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if flag in out and has_value:
            out[out.index(flag) + 1] = extra[i + 1]
        else:
            out += extra[i:i + 1 + has_value]
        i += 1 + has_value
    return out


def counting_dataset(megatron, directory, vocab, seed, documents=400, timeout=180):
    """Writes and preprocesses (NullTokenizer, EOD appended) documents that count up in steps of 3
    from a random start, a rule a tiny GPT learns within a few hundred steps; returns the
    --data-path flags (with --split 98,1,1 and a cache under `directory`)."""
    rng = random.Random(seed)
    jsonl = os.path.join(directory, "docs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for _ in range(documents):
            start, n = rng.randrange(1, 100), rng.randrange(5, 90)
            ids = [1 + (start + 3 * i) % (vocab - 2) for i in range(n)]
            f.write(json.dumps({"text": " ".join(map(str, ids))}) + "\n")
    prefix = os.path.join(directory, "docs")
    proc = subprocess.run([megatron, "preprocess", "--input", jsonl, "--output-prefix", prefix,
                           "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab),
                           "--append-eod", "--workers", "1"],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"megatron preprocess failed:\n{proc.stderr[-3000:]}")
    return ["--data-path", prefix + "_text_document", "--split", "98,1,1",
            "--data-cache-path", os.path.join(directory, "cache")]


# The GEMM peak that model-FLOPs utilisation is reported against, given to the tests' training
# runs: measuring it takes every rank 0.4 s at start-up (two GEMM sizes, 0.2 s each), a third of a
# tiny test job's time, and no test reads a tiny model's utilisation.
GIVEN_PEAK = ["--gemm-peak-gflops", "100"]


def with_given_peak(command, args):
    """ARGS of `megatron COMMAND`, with GIVEN_PEAK when the command trains and ARGS name none."""
    args = [str(a) for a in args]
    trains = command in ("train", "finetune") or command.startswith("pretrain_")
    return args + GIVEN_PEAK if trains and "--gemm-peak-gflops" not in args else args


def run_train(megatron, mpiexec, ranks, args, timeout, command="train"):
    """`megatron COMMAND ARGS` (train by default; pretrain_bert, generate, ...) as one process
    (ranks 1) or under `mpiexec -n RANKS`; never raises on a non-zero exit (the caller checks
    returncode), raises TimeoutExpired on a hang. Training commands get GIVEN_PEAK unless ARGS
    name a peak."""
    cmd = [megatron, command, *with_given_peak(command, args)]
    if ranks > 1:
        cmd = [mpiexec, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **MPI_ENV), check=False)


def run_expecting(megatron, mpiexec, ranks, args, timeout, expect_rc=0):
    """run_train of `megatron train ARGS`, raising AssertionError (with the output's tails) unless
    it exits with expect_rc."""
    proc = run_train(megatron, mpiexec, ranks, args, timeout)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


class _TimedResult(unittest.TextTestResult):
    """A text result that also records each test case's wall time."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.case_seconds = []
        self._started = 0.0

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.case_seconds.append((time.monotonic() - self._started, test.id()))


class _TimedRunner(unittest.TextTestRunner):
    """Prints the slowest cases after the run: what to look at when the suite grows slow."""
    resultclass = _TimedResult

    def run(self, test):
        result = super().run(test)
        slowest = sorted(result.case_seconds, reverse=True)[:8]
        self.stream.writeln("slowest cases: " + "; ".join(f"{name.rsplit('.', 1)[-1]} {s:.1f} s"
                                                          for s, name in slowest))
        return result


def main(module):
    """Parses --megatron and --mpiexec into module.MEGATRON / module.MPIEXEC, runs the module's
    unittest cases with the remaining arguments; returns the exit code."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--megatron", required=True)
    parser.add_argument("--mpiexec", required=True)
    args, rest = parser.parse_known_args()
    module.MEGATRON, module.MPIEXEC = os.path.abspath(args.megatron), args.mpiexec
    prog = unittest.main(module=module, argv=[sys.argv[0], *rest], exit=False,
                         testRunner=_TimedRunner)
    return 0 if prog.result.wasSuccessful() else 1
