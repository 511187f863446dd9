#!/usr/bin/env python3
"""Megatron's --optimizer muon end to end: Muon in every parallel layout, and its checkpoints.

What it is: `megatron train --optimizer muon` on mock data with a tiny Llama-shaped GPT (GQA, so
the fused QKV splits into queries, keys and values of unequal sizes; SwiGLU, whose fc1 shards are
stride blocks; RMSNorm; untied output layer), and an MoE variant (4 experts, top-2).
  - It learns and is not Adam: the start-up line names the matrices it takes, the loss falls, and
    the curve differs from Adam's; --bf16 with the default bf16 Newton-Schulz learns too. The
    start-up memory estimate prices a matrix's state at 4 bytes per element (Adam's 8 for the
    rest), and the layer-wise distributed optimizer's at half of it per replica at dp2.
  - Layouts with the whole-matrix TP modes (--muon-tp-mode duplicated or distributed) and f32
    iterations (--muon-fp32-matmul-prec high): tp2 + sequence parallelism, tp2 distributed, pp2,
    dp2, cp2, and for the MoE model ep2 and expert TP 2 (with TP 2, and alone: the experts split
    over a group that is not the dense weights'): loss and grad-norm curves as the single
    process within 1e-5 relative (every layout sums the same f32 terms in another order). The
    default blockwise mode orthogonalises each TP shard alone, so its tp2 curve is not the one
    process's (Megatron's semantics).
  - Checkpoints: the momentum of each matrix is saved as optimizer.momentum_buffer.<param> and
    Adam's moments for the rest; a tp2 run stopped at iteration 6 and resumed prints the straight
    run's iterations 7..12 character for character, the same checkpoint resumes in one process
    within 1e-5, and --muon-momentum comes back from the checkpoint (Megatron restores the
    optimizer's parameter groups). An Adam checkpoint is refused under muon and the other way
    round.
  - Megatron's layer-wise distributed optimizer (--use-distributed-optimizer with Muon, and the
    deprecated --optimizer dist_muon, which warns): the plain optimizer's iterations bit for bit
    at dp2, at tp2 x dp2 (duplicated mode) and at ep2 x dp2 with experts, rank 0 holding about
    half of the state; its checkpoint resumes exactly under itself and under the plain optimizer.
  - Lion (--optimizer lion, as Megatron builds it: Lion with Adam's betas for the matrices, AdamW
    for the rest): learns and is not Adam; its layer-wise distributed optimizer gives the plain
    optimizer's iterations bit for bit; its checkpoint holds one moment per matrix and two for
    the rest, resumes exactly in the other optimizer layout with --adam-beta2 restored, and is
    refused by Adam. Muon with --muon-scalar-optimizer lion learns, is layer-wise distributable bit for bit,
    and its checkpoint is refused under Muon with Adam for the rest.
  - Refused, exit 2 naming the flag on every rank: --fp16 (Muon and Lion), an unknown coefficient
    type, TP mode, scale mode or scalar optimizer, a beta a Lion takes outside [0, 1),
    --muon-num-ns-steps 0, --muon-fp32-matmul-prec low, and with the layer-wise distributed
    optimizer --overlap-param-gather and --num-distributed-optimizer-instances.
What it is not: the update's arithmetic against PyTorch and the TP modes' algebra
(tests/optim/test_muon.cpp with tests/reference/muon_oracle.py).

Usage: test_muon.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
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
ITERS = 12
TMP = None

TINY = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "2",
        "--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope",
        "--untie-embeddings-and-output-weights", "--seq-length", "32",
        "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", str(ITERS),
        "--log-interval", "1", "--lr", "1e-2", "--lr-warmup-iters", "3", "--eval-iters", "0",
        "--num-threads", "1", "--optimizer", "muon"]
EXACT = ["--muon-fp32-matmul-prec", "high", "--muon-tp-mode", "duplicated"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
       "--moe-aux-loss-coeff", "1e-2", "--moe-token-dispatcher-type", "alltoall"]
TP, PP, CP, EP, ETP = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                       "--context-parallel-size", "--expert-model-parallel-size",
                       "--expert-tensor-parallel-size")
KEYS = ("lm loss", "grad norm")
DIST = "--use-distributed-optimizer"
RTOL = 1e-5


def setUpModule():
    global TMP
    TMP = tempfile.TemporaryDirectory(prefix="muon_")


def tearDownModule():
    TMP.cleanup()


def run(ranks, *args, expect_rc=0, base=TINY):
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, megatron_job.with_flags(base, args),
                                  TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def curve(proc, first=1, last=ITERS):
    return megatron_log.curves(proc.stdout, KEYS, first, last)


def raw_iterations(proc):
    fields = ("consumed samples", "learning rate", "lm loss", "grad norm")
    return {it: {k: v for k, v in f.items() if k in fields}
            for it, f in megatron_log.iteration_lines(proc.stdout).items()}


class TestCurves(unittest.TestCase):
    def test_learns_and_is_not_adam(self):
        proc = run(1)
        self.assertIn(" > Muon (Megatron's --optimizer muon): 16 matrices", proc.stdout)
        self.assertIn("5 quintic Newton-Schulz steps in bf16, scale spectral, tensor-parallel "
                      "mode blockwise, QKV split", proc.stdout)
        muon = curve(proc)
        self.assertLess(muon[ITERS]["lm loss"], muon[1]["lm loss"] - 0.5)
        adam_proc = run(1, "--optimizer", "adam")
        adam = curve(adam_proc)
        self.assertGreater(abs(adam[ITERS]["lm loss"] - muon[ITERS]["lm loss"]), 0.05)
        # The start-up estimate prices a matrix's state at its one fp32 buffer (Adam's 8 bytes
        # for the rest): 4 bytes fewer per matrix element than Adam's (two %.2f roundings).
        elements = int(proc.stdout.split(" matrices (")[1].split(" elements")[0])
        self.assertAlmostEqual(weight_and_optimizer_mb(adam_proc) - weight_and_optimizer_mb(proc),
                               4 * elements / 1048576, delta=0.011)
        bf16 = curve(run(1, "--bf16"))
        self.assertLess(bf16[ITERS]["lm loss"], bf16[1]["lm loss"] - 0.5)

    def test_layouts_equal_one_process(self):
        want = curve(run(1, *EXACT))
        for ranks, args in [(2, [TP, "2", "--sequence-parallel"]),
                            (2, [TP, "2", "--muon-tp-mode", "distributed"]),
                            (2, [PP, "2"]), (2, []), (2, [CP, "2"])]:
            got = curve(run(ranks, *EXACT, *args))
            megatron_log.assert_same_curves(self, got, want, " ".join(args) or "dp2", RTOL)
        want = curve(run(1, *EXACT, *MOE))
        for ranks, args in [(2, [EP, "2"]), (2, [TP, "2", "--sequence-parallel", ETP, "2"]),
                            (2, [TP, "2", "--sequence-parallel", ETP, "2", "--muon-tp-mode",
                                 "distributed"]),
                            # Experts split over their own group, the dense weights whole.
                            (2, [ETP, "2"])]:
            got = curve(run(ranks, *EXACT, *MOE, *args))
            megatron_log.assert_same_curves(self, got, want, "MoE " + " ".join(args), RTOL)

    def test_blockwise_is_each_shard_alone(self):
        one = curve(run(1, "--muon-fp32-matmul-prec", "high"))
        tp2 = curve(run(2, "--muon-fp32-matmul-prec", "high", TP, "2"))
        # Iteration 1 has seen no update; after it each shard's own orthogonalisation shows.
        self.assertAlmostEqual(tp2[1]["lm loss"], one[1]["lm loss"], delta=1e-5 * one[1]["lm loss"])
        self.assertGreater(abs(tp2[ITERS]["lm loss"] - one[ITERS]["lm loss"]), 1e-3)


def line_value(proc, marker, after, before):
    for line in proc.stdout.splitlines():
        if marker in line:
            return float(line.split(after)[1].split(before)[0])
    raise AssertionError(f"no '{marker}' line:\n" + proc.stdout[-2000:])


def weight_and_optimizer_mb(proc):
    return line_value(proc, "Theoretical memory footprints: weight and optimizer=",
                      "weight and optimizer=", " MB")


def state_mb(proc):
    marker = " > Muon's layer-wise distributed optimizer"
    for line in proc.stdout.splitlines():
        if line.startswith(marker):
            return float(line.split("(")[-1].split(" MB")[0])
    raise AssertionError("no layer-wise line:\n" + proc.stdout[-2000:])


class TestLayerWise(unittest.TestCase):
    """--use-distributed-optimizer with Muon: Megatron's layer-wise distributed optimizer."""

    def test_same_bits_as_the_plain_optimizer_state_divided(self):
        plain_proc = run(2)
        plain = raw_iterations(plain_proc)
        lw = run(2, DIST)
        self.assertEqual(raw_iterations(lw), plain)
        # The start-up estimate spreads the state over the two replicas: half of its 4 bytes per
        # matrix element and 8 per other parameter off the plain optimizer's figure.
        params = int(lw.stdout.split("model parallel rank (0, 0): ")[1].split()[0])
        elements = int(lw.stdout.split(" matrices (")[1].split(" elements")[0])
        state = 4 * elements + 8 * (params - elements)
        self.assertAlmostEqual(weight_and_optimizer_mb(plain_proc) - weight_and_optimizer_mb(lw),
                               state / 2 / 1048576, delta=0.011)
        dist_muon = run(2, "--optimizer", "dist_muon")
        self.assertIn("WARNING: optimizer='dist_muon' is deprecated. Use --optimizer muon "
                      "--use-distributed-optimizer instead.", dist_muon.stdout)
        self.assertEqual(raw_iterations(dist_muon), plain)
        # Rank 0's state: about half of one process's (whole parameters per owner, balanced by
        # their elements: the 8192-element embeddings and output layer make it uneven).
        whole = state_mb(run(1, DIST))
        self.assertLess(state_mb(lw), 0.75 * whole)
        self.assertGreater(state_mb(lw), 0.25 * whole)
        # With TP (the owners of a matrix's shards form its TP group, duplicated mode's gathers
        # among them) and with experts over their own data-parallel group.
        for args in [[TP, "2", "--muon-tp-mode", "duplicated"],
                     [*MOE, EP, "2"]]:
            self.assertEqual(raw_iterations(run(4, *args, DIST)), raw_iterations(run(4, *args)),
                             " ".join(args))

    def test_checkpoints_continue_across_the_two(self):
        ck = tempfile.mkdtemp(prefix="lw_", dir=TMP.name)
        straight = raw_iterations(run(2, DIST))
        run(2, DIST, "--save", ck, "--exit-interval", "6")
        _, saved = checkpoint_reader.read_checkpoint(ck)
        # Each owner wrote its parameters' state: all of it is there, once.
        buffers = [k for k in saved if k.startswith("optimizer.momentum_buffer.")]
        moments = [k for k in saved if k.startswith("optimizer.exp_avg.")]
        self.assertEqual(len(buffers), 16)
        self.assertEqual(len(buffers) + len(moments),
                         len([k for k in saved if k.startswith("model.")]))
        resumed = raw_iterations(run(2, DIST, "--load", ck))
        self.assertEqual([resumed[i] for i in range(7, ITERS + 1)],
                         [straight[i] for i in range(7, ITERS + 1)])
        # The plain optimizer continues it bit for bit at dp2.
        resumed = raw_iterations(run(2, "--load", ck))
        self.assertEqual([resumed[i] for i in range(7, ITERS + 1)],
                         [straight[i] for i in range(7, ITERS + 1)])


class TestLion(unittest.TestCase):
    """--optimizer lion and Muon's --muon-scalar-optimizer lion."""

    def test_lion_learns_shards_and_resumes(self):
        lion = ["--optimizer", "lion", "--lr", "1e-3"]
        proc = run(1, *lion)
        self.assertIn(" > Lion (Megatron's --optimizer lion, emerging_optimizers' rule as Megatron "
                      "builds it): 16 matrices", proc.stdout)
        got = curve(proc)
        self.assertLess(got[ITERS]["lm loss"], got[1]["lm loss"] - 0.5)
        adam = curve(run(1, "--optimizer", "adam", "--lr", "1e-3"))
        # Lion's sign steps and Adam's normalised ones part by 0.046 at iteration 12 (measured);
        # the same rule would agree to f32 noise (1e-6).
        self.assertGreater(abs(adam[ITERS]["lm loss"] - got[ITERS]["lm loss"]), 0.01)
        # Megatron's layer-wise distributed optimizer for it: the plain optimizer's bits.
        plain = raw_iterations(run(2, *lion))
        lw = run(2, *lion, DIST)
        self.assertIn(" > Lion's layer-wise distributed optimizer", lw.stdout)
        self.assertEqual(raw_iterations(lw), plain)
        ck = tempfile.mkdtemp(prefix="lion_", dir=TMP.name)
        run(2, *lion, DIST, "--adam-beta2", "0.99", "--save", ck, "--exit-interval", "6")
        _, saved = checkpoint_reader.read_checkpoint(ck)
        # One moment for each of the 16 matrices, Adam's two for the rest.
        self.assertEqual(len([k for k in saved if k.startswith("optimizer.exp_avg.")]),
                         len([k for k in saved if k.startswith("model.")]))
        self.assertEqual(len([k for k in saved if k.startswith("optimizer.exp_avg_sq.")]),
                         len([k for k in saved if k.startswith("model.")]) - 16)
        want = raw_iterations(run(2, *lion, DIST, "--adam-beta2", "0.99"))
        proc = run(2, *lion, "--load", ck)  # the plain optimizer, the checkpoint's beta
        self.assertIn(" > --adam-beta2 0.99 from checkpoint", proc.stdout)
        got = raw_iterations(proc)
        self.assertEqual([got[i] for i in range(7, ITERS + 1)],
                         [want[i] for i in range(7, ITERS + 1)])
        refused = run(1, "--optimizer", "adam", "--load", ck, expect_rc=2)
        self.assertIn("holds the optimizer state of --optimizer lion, which --optimizer adam "
                      "cannot continue", refused.stderr)

    def test_muon_with_lion_for_the_rest(self):
        proc = run(1, "--muon-scalar-optimizer", "lion")
        self.assertIn("embeddings, output layer and the other parameters take Lion", proc.stdout)
        got = curve(proc)
        self.assertLess(got[ITERS]["lm loss"], got[1]["lm loss"] - 0.5)
        self.assertNotEqual(got[ITERS]["lm loss"], curve(run(1))[ITERS]["lm loss"])
        self.assertEqual(raw_iterations(run(2, "--muon-scalar-optimizer", "lion", DIST)),
                         raw_iterations(run(2, "--muon-scalar-optimizer", "lion")))
        ck = tempfile.mkdtemp(prefix="muon_lion_", dir=TMP.name)
        run(1, "--muon-scalar-optimizer", "lion", "--save", ck, "--exit-interval", "4")
        _, saved = checkpoint_reader.read_checkpoint(ck)
        self.assertEqual(len([k for k in saved if k.startswith("optimizer.momentum_buffer.")]), 16)
        self.assertFalse([k for k in saved if k.startswith("optimizer.exp_avg_sq.")])
        refused = run(1, "--load", ck, expect_rc=2)
        self.assertIn("holds the optimizer state of --optimizer muon --muon-scalar-optimizer "
                      "lion, which --optimizer muon --muon-scalar-optimizer adam cannot continue",
                      refused.stderr)


class TestCheckpoints(unittest.TestCase):
    def test_resume_exactly_and_in_another_layout(self):
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        straight = run(2, *EXACT, TP, "2")
        run(2, *EXACT, TP, "2", "--save", ck, "--exit-interval", "6")
        _, saved = checkpoint_reader.read_checkpoint(ck)
        buffers = {k[len("optimizer.momentum_buffer."):] for k in saved
                   if k.startswith("optimizer.momentum_buffer.")}
        adam = {k[len("optimizer.exp_avg."):] for k in saved if k.startswith("optimizer.exp_avg.")}
        self.assertIn("decoder.layers.0.self_attention.linear_qkv.weight", buffers)
        self.assertIn("decoder.layers.3.mlp.linear_fc2.weight", buffers)
        self.assertEqual(len(buffers), 16)
        self.assertIn("embedding.word_embeddings.weight", adam)
        self.assertIn("output_layer.weight", adam)
        self.assertIn("decoder.final_layernorm.weight", adam)
        self.assertFalse(buffers & adam)
        self.assertEqual(len(buffers) + len(adam),
                         len([k for k in saved if k.startswith("model.")]))
        self.assertTrue(all(abs(saved["optimizer.momentum_buffer." + k]).max() > 0
                            for k in buffers))
        want = raw_iterations(straight)
        resumed = raw_iterations(run(2, *EXACT, TP, "2", "--load", ck))
        self.assertEqual(sorted(resumed), list(range(7, ITERS + 1)))
        for i in resumed:
            self.assertEqual(resumed[i], want[i], f"iteration {i} after resuming")
        # The tp2 momentum resharded into one process: the one-process curve (duplicated tp2 is).
        got = curve(run(1, *EXACT, "--load", ck), 7, ITERS)
        megatron_log.assert_same_curves(self, got, curve(straight, 7, ITERS), "tp2 -> 1", RTOL)

    def test_momentum_comes_back_and_other_state_is_refused(self):
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        want = raw_iterations(run(1, "--muon-momentum", "0.8"))
        run(1, "--muon-momentum", "0.8", "--save", ck, "--exit-interval", "6")
        proc = run(1, "--load", ck)
        self.assertIn(" > --muon-momentum 0.8 from checkpoint", proc.stdout)
        got = raw_iterations(proc)
        self.assertEqual([got[i] for i in range(7, ITERS + 1)],
                         [want[i] for i in range(7, ITERS + 1)])
        refused = run(1, "--optimizer", "adam", "--load", ck, expect_rc=2)
        self.assertIn("holds the optimizer state of --optimizer muon --muon-scalar-optimizer adam, "
                      "which --optimizer adam cannot continue", refused.stderr)
        adam_ck = tempfile.mkdtemp(prefix="adam_", dir=TMP.name)
        run(1, "--optimizer", "adam", "--save", adam_ck, "--exit-interval", "4")
        refused = run(2, "--load", adam_ck, expect_rc=2)
        self.assertIn("holds the optimizer state of --optimizer adam, which --optimizer muon "
                      "--muon-scalar-optimizer adam cannot continue: pass --no-load-optim",
                      refused.stderr)
        got = raw_iterations(run(1, "--load", adam_ck, "--no-load-optim", "--exit-interval", "6"))
        self.assertEqual(sorted(got), [5, 6])


class TestRefused(unittest.TestCase):
    def check(self, ranks, args, message):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                      megatron_job.with_flags(TINY, args), TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stdout[-1000:] + proc.stderr[-2000:])
        self.assertIn(message, proc.stderr)
        if ranks > 1:  # every rank refuses, none crashes
            self.assertGreaterEqual(proc.stderr.count(message), ranks, proc.stderr[-2000:])
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)

    def test_bad_combinations_and_values_exit_2(self):
        self.check(2, ["--fp16"], "--optimizer muon with --fp16: emerging optimizer with fp16 is "
                   "not supported")
        self.check(2, [DIST, "--overlap-grad-reduce", "--overlap-param-gather"],
                   "--overlap-param-gather with the layer-wise distributed optimizer (--optimizer "
                   "muon --use-distributed-optimizer) is not implemented")
        self.check(2, [DIST, "--num-distributed-optimizer-instances", "2"],
                   "--num-distributed-optimizer-instances with the layer-wise distributed "
                   "optimizer")
        self.check(1, ["--muon-coefficient-type", "custom"],
                   "Unsupported muon coefficient type 'custom'")
        self.check(2, ["--muon-tp-mode", "sharded"],
                   "--muon-tp-mode must be blockwise, duplicated or distributed, got 'sharded'")
        self.check(1, ["--muon-scale-mode", "rms"], "--muon-scale-mode must be spectral")
        self.check(1, ["--muon-scalar-optimizer", "rmsprop"],
                   "--muon-scalar-optimizer must be adam or lion, got 'rmsprop'")
        self.check(2, ["--optimizer", "lion", "--adam-beta1", "1.5"],
                   "Invalid beta: --adam-beta1 must be in [0, 1), got 1.5 (--optimizer lion "
                   "takes Adam's betas)")
        self.check(1, ["--muon-scalar-optimizer", "lion", "--lion-beta2", "1"],
                   "Invalid beta: --lion-beta2 must be in [0, 1), got 1")
        self.check(1, ["--optimizer", "lion", "--fp16"], "--optimizer lion with --fp16")
        self.check(1, ["--muon-num-ns-steps", "0"], "--muon-num-ns-steps must be at least 1")
        self.check(1, ["--muon-fp32-matmul-prec", "low"],
                   "--muon-fp32-matmul-prec low is not a matmul precision")
        self.check(1, ["--muon-fp32-matmul-prec", "highest"],
                   "--muon-fp32-matmul-prec must be low, medium or high, got 'highest'")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
