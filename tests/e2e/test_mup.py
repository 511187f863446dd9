#!/usr/bin/env python3
"""Maximal Update Parameterization (--use-mup, Megatron core 0.19) end to end.

What it is: `megatron train` on mock data with a tiny Llama-style model:
- at width multiplier 1, with an attention scale of 1/sqrt(head dim) (the base head dim at power
  1, or power 0.5), μP changes nothing: the curve equals the plain run's digit for digit;
- at m = 2 (--mup-base-hidden-size half the width), Adam's first step moves the hidden matrices
  by lr / m and the norms and embeddings by lr (its first update is lr g / (|g| + eps), about lr
  for every element whose gradient is well above eps: the median over a tensor, within 5%), read
  back from the checkpoints of a run at lr 0 (the initial weights) and one at lr 1e-3;
- tp2 with sequence parallelism, pp2 and dp2 with the distributed optimizer follow one process
  within 1e-5 (float sums in another order), with the multipliers and the scaled rates;
- refusals (1-bit Adam; a model other than GPT and hybrid) exit 2 naming the flag.
The model-level checks (init stds, multipliers, finite differences) are in
tests/models/test_gpt_model.cpp, the optimizer's classes in tests/optim/test_mup.cpp.

Usage: test_mup.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import checkpoint_reader  # noqa: E402
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 240
ITERS = 6
MODEL = ["--mock-data", "--vocab-size", "128", "--num-layers", "2", "--hidden-size", "64",
         "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
         "--global-batch-size", "4", "--train-iters", str(ITERS), "--log-interval", "1",
         "--lr", "2e-3", "--eval-iters", "0", "--num-threads", "1",
         "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
         "--disable-bias-linear", "--untie-embeddings-and-output-weights",
         "--hidden-dropout", "0", "--attention-dropout", "0"]
MUP = ["--use-mup", "--mup-base-hidden-size", "32", "--mup-embedding-mult", "1.5"]
KEYS = ["lm loss", "grad norm"]
RTOL = 1e-5  # float sums in another order (tests/e2e/test_parallel_equivalence.py)


def run(ranks, *args, expect_rc=0):
    return megatron_job.run_expecting(MEGATRON, MPIEXEC, ranks, [*MODEL, *args], TIMEOUT_S,
                                      expect_rc)


def curve(proc):
    return megatron_log.curves(proc.stdout, KEYS, 1, ITERS)


class TestMup(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="megatron_mup_")
        cls.tmp = cls._tmp.name

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_width_one_is_the_plain_model(self):
        plain = curve(run(1))
        # sqrt(16) / 16^1 and sqrt(1) / 16^0.5: both 1/4, the plain scale of 16-wide heads.
        for flags in (["--mup-base-head-dim", "16"], ["--mup-attn-scale-power", "0.5"]):
            with self.subTest(flags=flags):
                self.assertEqual(curve(run(1, "--use-mup", *flags)), plain)
        # The default (power 1, no base head dim): 1/16, another model.
        self.assertNotEqual(curve(run(1, "--use-mup"))[ITERS], plain[ITERS])
        wider = curve(run(1, *MUP))
        self.assertNotEqual(wider[ITERS]["lm loss"], plain[ITERS]["lm loss"])

    def test_adam_moves_the_hidden_matrices_by_lr_over_m(self):
        lr = 1e-3
        step = ["--train-iters", "1", "--lr-decay-style", "constant", "--weight-decay", "0",
                "--clip-grad", "0", *MUP]
        before = os.path.join(self.tmp, "before")
        after = os.path.join(self.tmp, "after")
        run(1, *step, "--lr", "0", "--save", before)
        run(1, *step, "--lr", str(lr), "--save", after)
        _, w0 = checkpoint_reader.read_checkpoint(before)
        _, w1 = checkpoint_reader.read_checkpoint(after)

        def moved(name):
            name = "model." + name
            return float(np.median(np.abs(w1[name].astype(np.float64) - w0[name])))
        m = 2.0  # hidden 64 over base 32
        for name, want in (("decoder.layers.0.mlp.linear_fc1.weight", lr / m),
                           ("decoder.layers.1.self_attention.linear_qkv.weight", lr / m),
                           ("decoder.layers.0.input_layernorm.weight", lr),
                           ("embedding.word_embeddings.weight", lr),
                           ("output_layer.weight", lr)):
            with self.subTest(tensor=name):
                self.assertAlmostEqual(moved(name), want, delta=0.05 * want)

    def test_layouts_follow_the_single_process_curve(self):
        want = curve(run(1, *MUP))
        for name, ranks, flags in (
                ("tp2+sp", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
                ("pp2", 2, ["--pipeline-model-parallel-size", "2"]),
                ("dp2 distributed optimizer", 2, ["--use-distributed-optimizer"])):
            with self.subTest(layout=name):
                megatron_log.assert_same_curves(self, curve(run(ranks, *MUP, *flags)), want,
                                                name, RTOL)

    def test_refusals_name_the_flag(self):
        proc = run(2, *MUP, "--optimizer", "onebit_adam", expect_rc=2)
        self.assertIn("--use-mup", proc.stderr)
        for r in range(2):
            self.assertIn(f"[rank {r}]", proc.stderr)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
