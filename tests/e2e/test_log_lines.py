#!/usr/bin/env python3
"""Whole log lines under mpiexec: the log a user reads, and a tool parses, is never cut.

What it is: `megatron train` on 4 ranks (tp2 pp2) and 8 ranks (tp2 pp2 dp2), bf16, 200
iterations, every iteration logged with --timing-log-level 2, evaluation every 50, run several
times with stdout read through a pipe, as a test harness (read to the end at once) and as a log
collector (line by line while the job runs) read it. mpirun forwards each rank's stream in chunks
of what it could read, so two ranks writing at the same moment interleave mid-line; every line of
the run therefore comes from rank 0, and what every rank has to say (parameter counts, the memory
report, refusals) is gathered and printed there as one block. Checked in every run: all 200
iteration lines whole, once each, in order, each followed by its whole timing report; the
validation lines whole; the memory report once, after the first interval, one line per
data-parallel rank 0 in rank order; one line per model-parallel rank of parameter counts; and
bad arguments refused on every rank in one block on stderr.
What it is not: a check of the numbers (tests/parallel, tests/train/test_mixed_precision.py).

Usage: test_log_lines.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import os
import re
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 300
ITERS = 200
# Runs per layout and reader: a cut showed in 6 of 16 runs of the 4-rank job before the fix.
RUNS = int(os.environ.get("MEGATRON_LOG_RUNS", "3"))
TINY = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
        "--global-batch-size", "4", "--train-iters", str(ITERS), "--log-interval", "1",
        "--lr", "2e-3", "--lr-warmup-iters", "3", "--eval-interval", "50", "--eval-iters", "1",
        "--bf16", "--timing-log-level", "2", "--num-threads", "1"]
TP2PP2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
TIMER_LINE_RE = re.compile(r"^    \S.*? \.+: \([0-9.]+, [0-9.]+\)$")
MEMORY_RE = re.compile(r"^\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| resident: "
                       r"[0-9.]+ \| max resident: [0-9.]+$")


def command(ranks, args):
    return [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", MEGATRON,
            "train", *megatron_job.with_given_peak("train", args)]


def run_harness(ranks, args):
    """stdout and stderr read to the end through pipes (subprocess.run)."""
    proc = subprocess.run(command(ranks, args), capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=dict(os.environ, **megatron_job.MPI_ENV),
                          check=False)
    return proc.returncode, proc.stdout, proc.stderr


def run_collector(ranks, args):
    """stdout read line by line while the job runs, as a log collector reads it."""
    proc = subprocess.Popen(command(ranks, args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **megatron_job.MPI_ENV))
    out, err = [], []
    readers = [threading.Thread(target=lambda s, buf: buf.extend(iter(s.readline, "")),
                                args=(stream, buf)) for stream, buf in ((proc.stdout, out),
                                                                         (proc.stderr, err))]
    for t in readers:
        t.start()
    try:
        proc.wait(TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        for t in readers:
            t.join(30)
        proc.stdout.close()
        proc.stderr.close()
    return proc.returncode, "".join(out), "".join(err)


class TestWholeLines(unittest.TestCase):
    def check_log(self, stdout, ranks, dp):
        lines = stdout.splitlines()
        # Every iteration line whole, once, 1..200 (the shared parser fails on a cut line).
        got = megatron_log.iteration_lines(stdout, range(1, ITERS + 1))
        self.assertTrue(all(f["lm loss"] and f["grad norm"] for f in got.values()))
        # In order, and each followed by its whole timing report (a header and 10 timers).
        at = [i for i, ln in enumerate(lines) if ln.startswith(" [") and "] iteration " in ln]
        self.assertEqual([int(re.search(r"iteration +(\d+)/", lines[i])[1]) for i in at],
                         list(range(1, ITERS + 1)))
        for i in at:
            self.assertEqual(lines[i + 1], "(min, max) time across ranks (ms):", lines[i + 1])
            for ln in lines[i + 2:i + 12]:
                self.assertRegex(ln, TIMER_LINE_RE)
        # Validation lines whole: at 50, 100, 150, 200, then the validation and test sets.
        places = [w for w, _ in megatron_log.validation_lines(stdout)]
        self.assertEqual(places, [f"iteration {i}" for i in (50, 100, 150, 200)] +
                         [f"iteration {ITERS} on validation set", f"iteration {ITERS} on test set"])
        # Megatron's memory report: once, after the first interval, from each data-parallel
        # rank 0 (tp fastest, then dp: world ranks with (r // 2) % dp == 0), in rank order.
        memory = [MEMORY_RE.match(ln) for ln in lines if "memory (MB)" in ln]
        self.assertTrue(all(memory), [ln for ln in lines if "memory (MB)" in ln])
        want_ranks = [r for r in range(ranks) if (r // 2) % dp == 0]
        self.assertEqual([int(m[1]) for m in memory], want_ranks)
        self.assertEqual({m[2] for m in memory}, {"1"})
        # One parameter-count line per model-parallel rank, together.
        counts = [ln for ln in lines if "number of parameters on (tensor, pipeline)" in ln]
        self.assertEqual(len(counts), 4, counts)
        first = lines.index(counts[0])
        self.assertEqual(lines[first:first + 4], counts)

    def check_layout(self, ranks, layout, dp):
        for reader in (run_harness, run_collector):
            for k in range(RUNS):
                with self.subTest(ranks=ranks, reader=reader.__name__, run=k):
                    rc, out, err = reader(ranks, [*TINY, *layout])
                    self.assertEqual(rc, 0, err[-3000:])
                    self.check_log(out, ranks, dp)
                    self.assertEqual(err.strip(), "", "nothing on stderr")

    def test_tp2pp2_four_ranks(self):
        self.check_layout(4, TP2PP2, 1)

    def test_tp2pp2dp2_eight_ranks(self):
        self.check_layout(8, TP2PP2, 2)

    def test_refusals_are_one_block_with_a_line_per_rank(self):
        # tp 3 does not divide 4 ranks: every rank refuses; rank 0 prints all four lines at once.
        rc, out, err = run_harness(4, [*TINY, "--tensor-model-parallel-size", "3"])
        self.assertEqual(rc, 2, err[-3000:])
        lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
        self.assertEqual([re.match(r"error: \[rank (\d+)\] ", ln)[1] for ln in lines],
                         ["0", "1", "2", "3"], err)
        self.assertEqual(len({ln.split("] ", 1)[1] for ln in lines}), 1, err)
        self.assertIn("--tensor-model-parallel-size (3)", lines[0])
        self.assertNotIn("] iteration ", out)

    def test_help_is_printed_once(self):
        rc, out, err = run_harness(2, ["--help"])
        self.assertEqual(rc, 0, err[-3000:])
        self.assertEqual(out.count("Usage: train [OPTIONS]"), 1, out[-3000:])


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
