#!/usr/bin/env python3
"""Megatron's --optimizer sgd end to end: momentum SGD in every optimizer layout, and its checkpoints.

What it is: `megatron train --optimizer sgd [--sgd-momentum M]` on a tiny GPT over a counting
dataset the test writes (megatron_job.counting_dataset), --bf16.
  - It learns, and the momentum is in effect: with the default momentum 0.9 the loss falls far
    below the momentum-0 run's over 60 iterations, and both differ from Adam's curve. The start-up
    line names the rule; the distributed optimizer's state is half of Adam's fp32 moments with a
    buffer and nothing without one, and the start-up memory estimate counts the same bytes.
  - Layouts: the distributed optimizer (dp2) and Megatron-FSDP (optim_grads_params, dp2) give the
    plain optimizer's curve at dp2 bit for bit (each element's update is the same arithmetic on
    the same reduced gradient).
  - Checkpoints: the buffers are saved as optimizer.momentum_buffer.<param> (no Adam moments), and
    a dp2 run stopped at iteration 10 and resumed prints the straight run's iterations 11..20
    character for character; the same checkpoint loads at dp1 with the plain optimizer, its next
    step within the bound stated there. As Megatron restores the optimizer's parameter groups, a
    resumed run keeps the checkpoint's momentum (a momentum-0 checkpoint, which holds no buffers,
    resumed under momentum 0.9, and the other way round) or Adam's betas and eps, saying so, and
    its iterations 11..20 equal the uninterrupted run's; --no-load-optim keeps the flag.
  - Refused, exit 2 naming the flag on every rank: an Adam checkpoint under --optimizer sgd and an
    SGD one under adam (with --no-load-optim they load), --optimizer with an unknown value, a
    negative --sgd-momentum, --use-precision-aware-optimizer with sgd.
What it is not: the update rule's arithmetic (tests/tensor/test_ops.cpp against hand-worked
numbers and the f64 device; tests/models/test_gpt_hf_oracle.cpp against torch.optim.SGD).

Usage: test_sgd.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import checkpoint_reader  # noqa: E402
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 180
VOCAB = 128
TMP = None
DATA = None

TINY = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB), "--num-layers", "2",
        "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", "20",
        "--log-interval", "1", "--lr", "0.3", "--lr-warmup-iters", "5",
        "--lr-decay-style", "cosine", "--eval-iters", "0", "--num-threads", "1", "--bf16",
        "--optimizer", "sgd"]
FIELDS = ("consumed samples", "learning rate", "lm loss", "loss scale", "grad norm",
          "number of skipped iterations", "number of nan iterations")
DIST = ["--use-distributed-optimizer"]


def setUpModule():
    global TMP, DATA
    TMP = tempfile.TemporaryDirectory(prefix="sgd_")
    DATA = megatron_job.counting_dataset(MEGATRON, TMP.name, VOCAB, seed=3)


def tearDownModule():
    TMP.cleanup()


def run(ranks, *args, expect_rc=0, base=TINY):
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                  [*DATA, *megatron_job.with_flags(base, args)], TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def iterations(proc):
    return {it: {k: v for k, v in f.items() if k in FIELDS}
            for it, f in megatron_log.iteration_lines(proc.stdout).items()}


def loss(proc, iteration):
    return float(iterations(proc)[iteration]["lm loss"])


def line_value(proc, marker, after, before):
    for line in proc.stdout.splitlines():
        if marker in line:
            return float(line.split(after)[1].split(before)[0])
    raise AssertionError(f"no '{marker}' line:\n" + proc.stdout[-2000:])


def state_mb(proc):
    """The distributed optimizer's reported state on rank 0 (MB)."""
    return line_value(proc, "> distributed optimizer:", "(", " MB")


def weight_and_optimizer_mb(proc):
    return line_value(proc, "Theoretical memory footprints: weight and optimizer=",
                      "weight and optimizer=", " MB")


class TestCurves(unittest.TestCase):
    def test_learns_and_the_momentum_is_in_effect(self):
        def tail(proc):  # mean loss of iterations 51..60
            return sum(loss(proc, i) for i in range(51, 61)) / 10

        sgd = run(1, "--train-iters", "60", *DIST)
        plain = run(1, "--train-iters", "60", "--sgd-momentum", "0", *DIST)
        adam = run(1, "--train-iters", "60", "--optimizer", "adam", "--lr", "3e-3", *DIST)
        self.assertIn("SGD (Megatron's --optimizer sgd", sgd.stdout)
        self.assertIn("momentum 0.9 (one buffer per weight)", sgd.stdout)
        self.assertIn("momentum 0, no buffer", plain.stdout)
        # Measured on this dataset: 0.3-0.5 with momentum, 3.6-3.8 without, from 4.86 at
        # iteration 1; the halving bound is far from both.
        first = loss(sgd, 1)
        print(f"SGD last-10 mean loss: momentum 0.9 {tail(sgd):.4f}, momentum 0 "
              f"{tail(plain):.4f}, Adam {tail(adam):.4f} (iteration 1: {first:.4f})",
              file=sys.stderr)
        self.assertLess(tail(sgd), 0.5 * tail(plain))
        self.assertLess(tail(plain), first - 0.5)  # SGD without momentum learns too
        self.assertNotEqual(iterations(sgd)[2], iterations(adam)[2])
        # State: one fp32 buffer per owned element, half of Adam's two; none without momentum
        # (to the log's two decimals).
        self.assertAlmostEqual(state_mb(sgd), state_mb(adam) / 2, delta=0.011)
        self.assertEqual(state_mb(plain), 0.0)
        # The estimate: a bf16 run's 4 + 2 + 4 bytes of main weights, compute copy and gradients
        # per parameter plus the state's 8 (Adam), 4 or 0.
        adam_mb = weight_and_optimizer_mb(adam)
        self.assertAlmostEqual(weight_and_optimizer_mb(sgd), adam_mb * 14 / 18, delta=0.011)
        self.assertAlmostEqual(weight_and_optimizer_mb(plain), adam_mb * 10 / 18, delta=0.011)

    def test_every_optimizer_layout_gives_the_same_bits(self):
        plain = iterations(run(2))
        self.assertEqual(sorted(plain), list(range(1, 21)))
        for name, flags in (("distributed optimizer", DIST),
                            ("Megatron-FSDP", ["--use-megatron-fsdp",
                                               "--data-parallel-sharding-strategy",
                                               "optim_grads_params"])):
            with self.subTest(layout=name):
                self.assertEqual(iterations(run(2, *flags)), plain)


class TestCheckpoints(unittest.TestCase):
    def test_resume_exactly_and_in_another_layout(self):
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        straight = run(2, *DIST)
        first = run(2, *DIST, "--save", ck, "--exit-interval", "10")
        want = iterations(straight)
        self.assertEqual(sorted(want), list(range(1, 21)))
        self.assertEqual(iterations(first), {i: want[i] for i in range(1, 11)})
        _, saved = checkpoint_reader.read_checkpoint(ck)
        buffers = [k for k in saved if k.startswith("optimizer.momentum_buffer.")]
        self.assertTrue(buffers)
        self.assertEqual(len(buffers), len([k for k in saved if k.startswith("model.")]))
        self.assertFalse([k for k in saved if k.startswith("optimizer.exp_avg")])
        self.assertTrue(any(abs(saved[k]).max() > 0 for k in buffers), "all buffers zero")
        resumed = iterations(run(2, *DIST, "--load", ck))
        self.assertEqual(sorted(resumed), list(range(11, 21)))
        for i in resumed:
            self.assertEqual(resumed[i], want[i], f"iteration {i} after resuming")
        # The distributed optimizer's buffers into the plain optimizer of one rank.
        got = iterations(run(1, "--load", ck, "--exit-interval", "12"))
        self.assertEqual(sorted(got), [11, 12])
        # 1e-4 relative at iteration 12: dp1 adds the gradients in another order than dp2 (a
        # change in the 7th digit); a lost buffer moves the 2nd digit (the buffer carries ~10x
        # one step's gradient at momentum 0.9).
        self.assertAlmostEqual(float(got[12]["lm loss"]), float(want[12]["lm loss"]),
                               delta=1e-4 * float(want[12]["lm loss"]))
        self.assertEqual(got[11]["lm loss"], want[11]["lm loss"])

    def test_the_checkpoints_momentum_and_betas_continue(self):
        # Megatron's load_state_dict restores the optimizer's parameter groups: a resumed run
        # keeps the checkpoint's momentum (or betas and eps) whatever its flags say, and continues
        # the uninterrupted run's curve exactly; --no-load-optim keeps the flags.
        def resumed(saved_flags, resume_flags, note):
            ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
            want = iterations(run(1, *saved_flags))
            run(1, *saved_flags, "--save", ck, "--exit-interval", "10")
            proc = run(1, *resume_flags, "--load", ck)
            self.assertIn(note, proc.stdout)
            got = iterations(proc)
            self.assertEqual([got[i] for i in range(11, 21)], [want[i] for i in range(11, 21)])
            return ck, want

        # Momentum 0 saved (no buffers), 0.9 asked: it continues without momentum.
        ck, want = resumed(["--sgd-momentum", "0"], [], " > --sgd-momentum 0 from checkpoint")
        _, saved = checkpoint_reader.read_checkpoint(ck)
        self.assertFalse([k for k in saved if k.startswith("optimizer.")])
        # --no-load-optim: the flag's momentum, nothing restored (nor the scheduler: Megatron's).
        proc = run(1, "--load", ck, "--no-load-optim")
        self.assertNotIn("from checkpoint", proc.stdout)
        self.assertIn("momentum 0.9 (one buffer per weight)", proc.stdout)
        # Momentum 0.9 saved, 0 asked: the buffers are loaded and keep their momentum.
        resumed([], ["--sgd-momentum", "0"], " > --sgd-momentum 0.9 from checkpoint")
        # Adam: betas and eps.
        adam = ["--optimizer", "adam", "--lr", "3e-3", "--adam-beta2", "0.95", "--adam-eps",
                "1e-6"]
        resumed(adam, ["--optimizer", "adam", "--lr", "3e-3"],
                " > --adam-beta2 0.95 from checkpoint")


class TestRefused(unittest.TestCase):
    def check(self, ranks, args, message, base=TINY, load=False):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                      [*DATA, *megatron_job.with_flags(base, args)], TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stdout[-1000:] + proc.stderr[-2000:])
        self.assertIn(message, proc.stderr)
        if load:  # a load stops every rank together, rank 0 saying so
            self.assertIn(f"all {ranks} ranks stopped: ", proc.stderr)
        elif ranks > 1:  # every rank refuses, none crashes
            self.assertGreaterEqual(proc.stderr.count(message), ranks, proc.stderr[-2000:])
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)

    def test_other_optimizers_state_is_refused(self):
        adam_ck = tempfile.mkdtemp(prefix="adam_", dir=TMP.name)
        sgd_ck = tempfile.mkdtemp(prefix="sgd_", dir=TMP.name)
        run(2, "--optimizer", "adam", "--lr", "3e-3", *DIST, "--save", adam_ck, "--exit-interval",
            "4")
        run(2, *DIST, "--save", sgd_ck, "--exit-interval", "4")
        self.check(2, [*DIST, "--load", adam_ck],
                   "holds the optimizer state of --optimizer adam, which --optimizer sgd cannot "
                   "continue: pass --no-load-optim", load=True)
        self.check(2, ["--optimizer", "adam", "--lr", "3e-3", "--load", sgd_ck],
                   "holds the optimizer state of --optimizer sgd, which --optimizer adam cannot "
                   "continue", load=True)
        # Without the optimizer state the weights load and training goes on from iteration 5.
        got = iterations(run(2, *DIST, "--load", adam_ck, "--no-load-optim", "--exit-interval",
                             "6"))
        self.assertEqual(sorted(got), [5, 6])

    def test_bad_values_exit_2(self):
        self.check(2, ["--optimizer", "lamb"], "--optimizer lamb is not supported (adam, sgd, "
                   "muon, lion, onebit_adam)")
        self.check(2, ["--sgd-momentum", "-0.5"], "--sgd-momentum must be >= 0, got -0.5")
        self.check(1, [*DIST, "--use-precision-aware-optimizer"],
                   "--use-precision-aware-optimizer only supported with adam")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
