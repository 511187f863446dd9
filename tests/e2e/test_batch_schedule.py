#!/usr/bin/env python3
"""Sample-based training and the batch-size ramp-up against independent restatements.

What it is: `megatron pretrain_gpt` on mock data, 2 ranks (data parallel 2):
- --rampup-batch-size: the global batch size and consumed samples of every iteration line, the
  iteration count --train-samples makes, and the learning rate after each step equal a
  restatement here of Megatron's RampupBatchsizeNumMicroBatchesCalculator, update_train_iters
  and OptimizerParamScheduler (written from their formulas, not from our code). The lr is
  printed to 7 digits and compared within 1e-6 relative for that reason.
- resume in the middle of the ramp-up: the checkpoint Megatron saves before the first
  iteration of each larger batch, loaded by a second run, gives the uninterrupted run's losses
  and grad norms digit for digit (the batch is a function of the consumed samples; data and
  dropout follow the sample order).
- a sample-based run (--train-samples, --lr-warmup-samples, --lr-decay-samples) equals the
  iteration-based run with the same schedule digit for digit.
- --decrease-batch-size-if-needed: a ramp-up step that does not split over micro-batch x data
  parallel is refused without it and rounded down with it.
- a ramp-up with --train-iters (which Megatron's GPT-3 example passes, though Megatron asserts
  against it) runs --train-iters iterations with the calculator's batches.
- refusals (exit 2, the flag named): both --train-iters and --train-samples, iteration-based LR
  lengths with sample-based training and the reverse, a ramp-up that does not reach the global
  batch in whole increments.

Usage: test_batch_schedule.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 180
BASE = {"--mock-data": None, "--vocab-size": "128", "--num-layers": "2", "--hidden-size": "64",
        "--num-attention-heads": "4", "--seq-length": "32", "--micro-batch-size": "1",
        "--log-interval": "1", "--lr": "2e-3", "--min-lr": "1e-4", "--lr-decay-style": "cosine",
        "--eval-iters": "1", "--eval-interval": "100", "--num-threads": "1"}


def rampup_batches(start, incr, rampup_samples, global_batch, train_samples):
    """Megatron's ramp-up calculator and update_train_iters: the global batch of every iteration
    of a --train-samples run."""
    per_increment = rampup_samples / ((global_batch - start) // incr)
    def batch_at(consumed):
        if consumed > rampup_samples:
            return global_batch
        return start + int(consumed / per_increment) * incr
    iterations, consumed = 0, 0
    while consumed <= rampup_samples and consumed <= train_samples:
        consumed += batch_at(consumed)
        iterations += 1
    if train_samples > consumed:
        iterations += (train_samples - consumed) // global_batch
    out, consumed = [], 0
    for _ in range(iterations):
        out.append(batch_at(consumed))
        consumed += out[-1]
    return out


def scheduled_lr(steps, max_lr, min_lr, warmup, decay):
    """Megatron's OptimizerParamScheduler.get_lr, cosine style, at `steps` samples."""
    if warmup > 0 and steps <= warmup:
        return max_lr * steps / warmup
    if steps > decay:
        return min_lr
    ratio = (steps - warmup) / (decay - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)


class BatchScheduleTest(unittest.TestCase):
    def train(self, ranks=2, expect_rc=0, **overrides):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                      ["--model", "gpt", *megatron_job.flags_with(BASE, **overrides)],
                                      TIMEOUT_S)
        self.assertEqual(proc.returncode, expect_rc, proc.stdout[-3000:] + proc.stderr[-3000:])
        return proc

    def test_rampup_matches_megatron_calculator_and_resumes_exactly(self):
        start, incr, ramp, gbs, samples, warmup = 2, 2, 20, 8, 80, 10
        want = rampup_batches(start, incr, ramp, gbs, samples)
        with tempfile.TemporaryDirectory() as tmp:
            save = os.path.join(tmp, "ckpt")
            flags = dict(global_batch_size=gbs, train_samples=samples,
                         rampup_batch_size=(start, incr, ramp), lr_warmup_samples=warmup)
            full = self.train(**flags, save=save, save_interval=1000)
            lines = megatron_log.iteration_lines(full.stdout, range(1, len(want) + 1))
            self.assertIn(f"setting training iterations to {len(want)}", full.stdout)
            consumed = 0
            for it, batch in enumerate(want, 1):
                consumed += batch
                f = lines[it]
                self.assertEqual(int(f["global batch size"]), batch, f"iteration {it}")
                self.assertEqual(int(f["consumed samples"]), consumed, f"iteration {it}")
                self.assertEqual(int(f["train iters"]), len(want))
                lr = scheduled_lr(consumed, 2e-3, 1e-4, warmup, samples)
                self.assertLess(abs(float(f["learning rate"]) - lr), 1e-6 * lr, f"iteration {it}")
            # Megatron saves before the first iteration of each larger batch: after the
            # iterations that end at a change.
            changes = [it for it in range(1, len(want)) if want[it] != want[it - 1]]
            self.assertGreaterEqual(len(changes), 2, want)
            for it in changes:
                self.assertTrue(os.path.isdir(os.path.join(save, f"iter_{it:07d}")), it)
            resume_at = changes[0]  # the first checkpoint, with ramp-up steps still ahead
            resumed = self.train(**flags, load=save, ckpt_step=resume_at,
                                 save=os.path.join(tmp, "again"), save_interval=1000)
            after = megatron_log.iteration_lines(resumed.stdout, range(resume_at + 1, len(want) + 1))
            for it in after:
                for field in ("lm loss", "grad norm", "global batch size", "consumed samples",
                              "learning rate"):
                    self.assertEqual(after[it][field], lines[it][field], f"iteration {it} {field}")

    def test_sample_based_equals_iteration_based(self):
        gbs, iters = 4, 12
        by_iters = self.train(global_batch_size=gbs, train_iters=iters, lr_warmup_iters=3,
                              lr_decay_iters=10)
        by_samples = self.train(global_batch_size=gbs, train_samples=iters * gbs,
                                lr_warmup_samples=3 * gbs, lr_decay_samples=10 * gbs)
        a = megatron_log.iteration_lines(by_iters.stdout, range(1, iters + 1))
        b = megatron_log.iteration_lines(by_samples.stdout, range(1, iters + 1))
        for it in a:
            for field in ("lm loss", "grad norm", "learning rate", "consumed samples"):
                self.assertEqual(a[it][field], b[it][field], f"iteration {it} {field}")
        self.assertEqual(megatron_log.validation_losses(by_iters.stdout),
                         megatron_log.validation_losses(by_samples.stdout))

    def test_rampup_with_train_iters(self):
        # Megatron's GPT-3 example passes --rampup-batch-size with --train-iters: the iterations
        # are --train-iters, each with the ramp-up's batch.
        proc = self.train(global_batch_size=8, train_iters=10, rampup_batch_size=(2, 2, 20))
        lines = megatron_log.iteration_lines(proc.stdout, range(1, 11))
        want = rampup_batches(2, 2, 20, 8, 10**9)[:10]
        self.assertEqual([int(lines[it]["global batch size"]) for it in range(1, 11)], want)
        self.assertIn("--rampup-batch-size with --train-iters", proc.stdout)

    def test_iterations_to_skip(self):
        # Megatron's counts before the step: 2 and 3 skip the iterations logged as 3 and 4. Their
        # batches are read and dropped (consumed and skipped samples grow, the data moves on), the
        # LR schedule does not advance, nothing is logged for them.
        flags = dict(global_batch_size=4, train_iters=6, lr_warmup_iters=2, lr_decay_iters=6)
        plain = megatron_log.iteration_lines(self.train(**flags).stdout, range(1, 7))
        skip = megatron_log.iteration_lines(
            self.train(**flags, iterations_to_skip=(2, 3)).stdout, [1, 2, 5, 6])
        for it in (1, 2):
            self.assertEqual(skip[it]["lm loss"], plain[it]["lm loss"])
        self.assertEqual(int(skip[5]["consumed samples"]), 20)
        self.assertEqual(int(skip[5]["skipped samples"]), 8)
        self.assertNotIn("skipped samples", plain[5])
        # Two steps fewer: the LR after step 5 is the plain run's after step 3.
        self.assertEqual(skip[5]["learning rate"], plain[3]["learning rate"])
        self.assertEqual(skip[6]["learning rate"], plain[4]["learning rate"])
        refused = self.train(ranks=1, expect_rc=2, **flags, iterations_to_skip=("x",))
        self.assertIn("--iterations-to-skip takes iteration numbers", refused.stderr)

    def test_rampup_over_zero_samples(self):
        # Megatron's calculator divides 0 by 0 here; the limit, used here: the start batch for
        # the first iteration (consumed 0 <= 0 ramp-up samples), the global batch after it.
        proc = self.train(global_batch_size=8, train_samples=26, rampup_batch_size=(2, 2, 0))
        lines = megatron_log.iteration_lines(proc.stdout, range(1, 5))
        self.assertEqual([int(lines[it]["global batch size"]) for it in range(1, 5)], [2, 8, 8, 8])

    def test_decrease_batch_size_if_needed(self):
        # Steps 2, 5, 8: 5 does not split over 2 data-parallel ranks of micro-batch 1.
        flags = dict(global_batch_size=8, train_samples=40, rampup_batch_size=(2, 3, 8))
        refused = self.train(expect_rc=2, **flags)
        self.assertIn("--decrease-batch-size-if-needed", refused.stderr)
        ran = self.train(**flags, decrease_batch_size_if_needed=True)
        lines = megatron_log.iteration_lines(ran.stdout)
        sizes = [int(lines[it]["global batch size"]) for it in sorted(lines)]
        self.assertIn(4, sizes)  # the step of 5 ran as 4
        self.assertNotIn(5, sizes)
        self.assertEqual(sizes[0], 2)
        self.assertEqual(sizes[-1], 8)

    def test_refusals(self):
        cases = [
            (dict(global_batch_size=8, train_iters=5, train_samples=40), "not both"),
            (dict(global_batch_size=8, train_samples=40, lr_warmup_iters=2),
             "--lr-warmup-samples instead of --lr-warmup-iters"),
            (dict(global_batch_size=8, train_iters=5, lr_decay_samples=40),
             "--lr-decay-samples needs --train-samples"),
            (dict(global_batch_size=8, train_samples=40, rampup_batch_size=(2, 4, 20)),
             "must be divisible by the batch size increment"),
            (dict(global_batch_size=8, train_samples=40, rampup_batch_size=(2, 2)),
             "--rampup-batch-size takes three values"),
        ]
        for flags, message in cases:
            with self.subTest(flags=flags):
                proc = self.train(ranks=1, expect_rc=2, **flags)
                self.assertIn(message, proc.stderr)
                for marker in megatron_job.CRASH_MARKERS:
                    self.assertNotIn(marker, proc.stderr)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
