#!/usr/bin/env python3
"""Gated attention (--attention-output-gate, Megatron core 0.19) end to end.

What it is: `megatron train` on mock data with a tiny Llama-style GQA model whose attention
output is multiplied by sigmoid of linear_qkv's gate rows:
- a different curve from the plain model's; tp2 with sequence parallelism (each rank's whole
  query groups with their gates), cp2, pp2 and dp2 follow one process within 1e-5 (float sums in
  another order);
- a tp2 checkpoint resumes at tp1 on the straight run's curve (the gate rows reshard with their
  groups), and loading it without the flag exits 2 naming attention_output_gate;
- --qk-clip with it exits 2 naming the flag on every rank.
The layer's gradients, its row layout and cached generation: tests/transformer/test_layers.cpp.

Usage: test_attention_output_gate.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 240
ITERS = 6
MODEL = ["--mock-data", "--vocab-size", "128", "--num-layers", "2", "--hidden-size", "64",
         "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
         "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
         "--train-iters", str(ITERS), "--log-interval", "1", "--lr", "2e-3", "--eval-iters", "0",
         "--num-threads", "1", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
         "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
         "--hidden-dropout", "0", "--attention-dropout", "0"]
GATE = ["--attention-output-gate"]
KEYS = ["lm loss", "grad norm"]
RTOL = 1e-5  # float sums in another order (tests/e2e/test_parallel_equivalence.py)


def run(ranks, *args, expect_rc=0):
    return megatron_job.run_expecting(MEGATRON, MPIEXEC, ranks, [*MODEL, *args], TIMEOUT_S,
                                      expect_rc)


def curve(proc, first=1, last=ITERS):
    return megatron_log.curves(proc.stdout, KEYS, first, last)


class TestAttentionOutputGate(unittest.TestCase):
    def test_layouts_follow_the_single_process_curve(self):
        want = curve(run(1, *GATE))
        self.assertNotEqual(want[ITERS]["lm loss"], curve(run(1))[ITERS]["lm loss"])
        for name, ranks, flags in (
                ("tp2+sp", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
                ("cp2", 2, ["--context-parallel-size", "2"]),
                ("pp2", 2, ["--pipeline-model-parallel-size", "2"]),
                ("dp2", 2, [])):
            with self.subTest(layout=name):
                megatron_log.assert_same_curves(self, curve(run(ranks, *GATE, *flags)), want,
                                                name, RTOL)

    def test_checkpoint_reshards_and_keeps_the_gate(self):
        with tempfile.TemporaryDirectory(prefix="megatron_gate_") as tmp:
            ck = os.path.join(tmp, "ck")
            straight = curve(run(1, *GATE))
            run(2, *GATE, "--tensor-model-parallel-size", "2", "--sequence-parallel",
                "--save", ck, "--save-interval", "3", "--exit-interval", "3")
            resumed = curve(run(1, *GATE, "--load", ck), 4, ITERS)
            megatron_log.assert_same_curves(self, resumed,
                                            {it: straight[it] for it in resumed}, "resume", RTOL)
            proc = run(1, "--load", ck, expect_rc=2)
            self.assertIn("attention_output_gate", proc.stderr)

    def test_refusals_name_the_flag(self):
        # (With --multi-latent-attention: TransformerConfig's check, tests/transformer.)
        for flags, text in ((["--qk-clip"], "--qk-clip"),):
            with self.subTest(flags=flags):
                proc = run(2, *GATE, *flags, expect_rc=2)
                self.assertIn(text, proc.stderr)
                for r in range(2):
                    self.assertIn(f"[rank {r}]", proc.stderr)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
