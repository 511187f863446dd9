#!/usr/bin/env python3
"""1-bit Adam end to end: the loss curve against Adam, the traffic, layouts, resume, bad flags.

What it is: `megatron train --optimizer onebit_adam` under mpiexec on a dataset the test writes
(NullTokenizer documents counting up in steps of 3; the Brown corpus needs scripts/fetch_data.sh,
which CI does not run: its curves are in docs/PERFORMANCE.md).
  - dp2, 150 iterations, --onebit-freeze-step 30 (20%, DeepSpeed's guidance is 15-25%) against
    Adam over the same steps: 1-bit Adam is a different optimizer (no bias correction, a dropped
    first step, a frozen variance and 1-bit momenta), so the curves are not expected to agree
    step for step; its final loss must not be worse than Adam's by more than 10% (measured: it is
    better here) and it must learn.
  - The trainer's traffic line: the data-parallel bytes of the first compressed step against the
    last full one, counted by the process group, below 1/20 (1 bit for 32 per element, plus each
    tensor's scales and padding; measured 26720 against 841232 bytes, 0.0318).
  - tp2 x dp2: the compression runs over the data-parallel group of each tensor-parallel shard;
    trains and learns.
  - Resume in the compressed stage: the run continues (DeepSpeed resets the compression errors
    on load, so not bit for bit: the losses after the load within 5% of the straight run's,
    measured 2.0%).
  - Bad flags: exit 2 naming the flag on every rank.
What it is not: the compressed all-reduce against NumPy (tests/comm) or the optimizer's
arithmetic (tests/optim, under MPI).

Usage: test_onebit_adam.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 300
VOCAB = 128
TMP = None
DATA = None

TINY = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB), "--num-layers", "4",
        "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "150",
        "--log-interval", "1", "--lr", "2e-3", "--lr-warmup-iters", "10", "--eval-iters", "0",
        "--num-threads", "1"]
ONEBIT = ["--optimizer", "onebit_adam", "--onebit-freeze-step", "30"]
TRAFFIC_RE = re.compile(r"1-bit Adam: data-parallel bytes sent by rank 0 per step: (\d+) with "
                        r"the gradient all-reduce, (\d+) compressed")


def setUpModule():
    global TMP, DATA
    TMP = tempfile.TemporaryDirectory(prefix="onebit_")
    DATA = megatron_job.counting_dataset(MEGATRON, TMP.name, VOCAB, seed=13)


def tearDownModule():
    TMP.cleanup()


def run(ranks, *args, expect_rc=0):
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                  [*DATA, *megatron_job.with_flags(TINY, args)], TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def losses(proc):
    return {it: float(f["lm loss"]) for it, f in megatron_log.iteration_lines(proc.stdout).items()}


def tail_mean(curve, last=10):
    its = sorted(curve)[-last:]
    return sum(curve[i] for i in its) / len(its)


class TestOneBitAdam(unittest.TestCase):
    def test_dp2_curve_against_adam_and_the_traffic(self):
        adam = losses(run(2))
        proc = run(2, *ONEBIT)
        onebit = losses(proc)
        self.assertEqual(sorted(onebit), list(range(1, 151)))
        gap = (tail_mean(onebit) - tail_mean(adam)) / tail_mean(adam)
        print(f"dp2 150 iterations, freeze 30: mean of the last 10 losses Adam "
              f"{tail_mean(adam):.4f}, 1-bit Adam {tail_mean(onebit):.4f} (gap {gap:.3f})",
              file=sys.stderr)
        # Not worse than Adam by more than 10% (measured: better, 0.228 against 0.643: without
        # bias correction its first steps are larger, which this short schedule rewards).
        self.assertLess(tail_mean(onebit), 1.10 * tail_mean(adam))
        self.assertLess(tail_mean(onebit), 0.6 * onebit[1])  # it learns
        self.assertIn("the variance froze at iteration 30", proc.stdout)
        m = TRAFFIC_RE.search(proc.stdout)
        self.assertIsNotNone(m, proc.stdout[-3000:])
        full, compressed = int(m[1]), int(m[2])
        print(f"data-parallel bytes per step: {full} full, {compressed} compressed "
              f"({compressed / full:.4f})", file=sys.stderr)
        self.assertLess(compressed, full / 20)
        self.assertGreater(compressed, full / 64)

    def test_tensor_and_data_parallel(self):
        curve = losses(run(4, *ONEBIT, "--tensor-model-parallel-size", "2", "--train-iters",
                           "60"))
        self.assertEqual(sorted(curve), list(range(1, 61)))
        self.assertLess(tail_mean(curve), 0.8 * curve[1])

    def test_resume_in_the_compressed_stage(self):
        straight = losses(run(2, *ONEBIT, "--train-iters", "60"))
        ck = os.path.join(TMP.name, "resume")
        run(2, *ONEBIT, "--train-iters", "60", "--save", ck, "--save-interval", "45",
            "--exit-interval", "45")
        proc = run(2, *ONEBIT, "--train-iters", "60", "--load", ck)
        resumed = losses(proc)
        self.assertEqual(sorted(resumed), list(range(46, 61)))
        self.assertIn("resumed in the compressed stage", proc.stdout)
        # The first step after the load is the straight run's but for the errors (zero at the
        # load): the same loss (computed before that step) at 46, then close.
        self.assertEqual(resumed[46], straight[46])
        worst = max(abs(resumed[i] - straight[i]) / straight[i] for i in resumed)
        print(f"resume at 45: worst relative loss difference {worst:.2e}", file=sys.stderr)
        self.assertLess(worst, 0.05)

    def test_bad_flags(self):
        cases = [
            ([*ONEBIT, "--use-distributed-optimizer"], "--use-distributed-optimizer"),
            ([*ONEBIT, "--num-experts", "4", "--disable-bias-linear"], "--num-experts"),
            (["--optimizer", "onebit_adam", "--onebit-freeze-step", "0"], "--onebit-freeze-step"),
            (["--optimizer", "lamb"], "--optimizer lamb is not supported"),
        ]
        for args, needle in cases:
            proc = run(2, *args, expect_rc=2)
            text = proc.stdout + proc.stderr
            self.assertIn(needle, text, args)
            for marker in megatron_job.CRASH_MARKERS:
                self.assertNotIn(marker, text, args)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
