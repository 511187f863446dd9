#!/usr/bin/env python3
"""FP8 training end to end: the delayed-scaling recipe against NumPy, layouts, resume, bad flags.

What it is: `megatron train --fp8-format ...` alone and under mpiexec, on an indexed dataset the
test writes (`megatron preprocess` of NullTokenizer documents that count up in steps of 3, a rule
a tiny GPT learns within a few hundred steps; the Brown corpus needs scripts/fetch_data.sh, which
CI does not run).
  - Delayed scaling per step against a NumPy restatement of Transformer Engine's recipe
    (amax_and_scale_update: roll, amax by most_recent or max, scale = 448 or 57344 x 2^-margin /
    amax, kept on a zero or non-finite amax): a run checkpoints after every iteration with an
    amax history longer than the run's updates, so the last checkpoint holds every amax the run
    recorded (the recorded sequence); NumPy replays the recipe over it from the initial state
    (scale 1, zero history) and every checkpoint's scales, for every GEMM and operand, must be
    the replay's at that step, exactly (float32 arithmetic on both sides).
  - 200 iterations in FP8 hybrid (delayed, tensorwise, mxfp8 and blockwise) against bf16: the
    loss curves stay within a stated distance (FP8 rounds GEMM inputs to 3 or 2 mantissa bits
    instead of bf16's 7; a missing scale or a wrong format moves the curve by far more, or to
    NaN), and the block-scaled recipes differ from the per-tensor ones.
  - Layouts: tp2 with sequence parallelism, dp2 and dp2 with the distributed optimizer against
    one process (delayed scaling reduces amaxes over TP x DP x CP, so every layout quantises with
    the same scales; tp2's recorded weight amaxes equal one process's exactly); mxfp8 at tp2 +
    SP and blockwise at dp2 against one process (their blocks fall alike in both layouts);
    full recomputation against none (recomputation reuses the forward's scales), identical
    lines, for every recipe.
  - Exact resume with the scaling state (single process and tp2), the state read back by the
    independent checkpoint reader.
  - An FP8 checkpoint loads into a run without FP8 (its scaling state left unread).
  - --first-last-layers-bf16 (tensorwise): all layers kept out is the bf16 run bit for bit.
  - --fp8-param-gather (the FP8 weights kept and all-gathered as codes): the losses of the run
    without it, digit for digit, under the distributed optimizer (also overlapped), tp2 + SP +
    pp2, Megatron-FSDP ZeRO-2 and ZeRO-3 (also with MoE experts); the compute copy's bytes
    falling to one per FP8 weight element; exact resume, also across the flag.
  - Bad flags: exit 2 naming the flag on every rank, no crash.
What it is not: the codec against the OCP spec (tests/core), the FP8 Linear against fp64
(tests/parallel), or speed (FP8 on the CPU is emulated through its bf16 GEMM).

Usage: test_fp8.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import os
import re
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import checkpoint_reader  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 300
VOCAB = 128
TMP = None
DATA = None

TINY = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB), "--num-layers", "4",
        "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "20",
        "--log-interval", "1", "--lr", "2e-3", "--lr-warmup-iters", "3", "--eval-iters", "0",
        "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--bf16", "--num-threads", "1"]
HYBRID = ["--fp8-format", "hybrid"]
FIELDS = ("consumed samples", "learning rate", "lm loss", "loss scale", "grad norm",
          "number of skipped iterations", "number of nan iterations")
FP8_MAX = {"input": 448.0, "weight": 448.0, "grad": 57344.0}  # hybrid: E4M3, E4M3, E5M2


def setUpModule():
    global TMP, DATA
    TMP = tempfile.TemporaryDirectory(prefix="fp8_")
    DATA = megatron_job.counting_dataset(MEGATRON, TMP.name, VOCAB, seed=11)


def tearDownModule():
    TMP.cleanup()


def run(ranks, *args, expect_rc=0):
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                  [*DATA, *megatron_job.with_flags(TINY, args)], TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def iterations(proc):
    return {it: {k: v for k, v in f.items() if k in FIELDS}
            for it, f in megatron_log.iteration_lines(proc.stdout).items()}


def losses(proc):
    return {it: float(f["lm loss"]) for it, f in iterations(proc).items()}


def fp8_state(ckpt):
    """{linear name: (scale [3], amax history [len, 3])} of a checkpoint, as float32 arrays."""
    _, tensors = checkpoint_reader.read_checkpoint(ckpt)
    out = {}
    for name, value in tensors.items():
        if name.startswith("model.") and name.endswith(".fp8_scale"):
            linear = name[len("model."):-len(".fp8_scale")]
            out[linear] = (value, tensors[f"model.{linear}.fp8_amax_history"])
    return out


def te_replay(recorded, fp8_max, margin, algo, length):
    """Transformer Engine's delayed scaling over one operand's recorded amaxes (one per update),
    from the initial state; the scale after each update. float32 throughout, as TE's kernel."""
    history = np.zeros(length, dtype=np.float32)
    scale = np.float32(1.0)
    scaled_max = np.float32(fp8_max) * np.float32(2.0 ** -margin)
    out = []
    for amax_now in recorded:
        history[0] = np.float32(amax_now)
        last = history[0]
        window = np.max(np.concatenate([history[1:], [last]]))
        history = np.concatenate([history[1:], [last]])
        history[0] = 0
        amax = last if algo == "most_recent" else window
        if np.isfinite(amax) and amax > 0:
            s = scaled_max / amax
            scale = np.float32(np.finfo(np.float32).max) if np.isinf(s) else np.float32(s)
        out.append(scale)
    return out


class TestDelayedScalingRecipe(unittest.TestCase):
    def check(self, margin, algo):
        iters, micro, length = 5, 4, 64  # 20 forward and 20 backward updates < 64
        ck = os.path.join(TMP.name, f"recipe_{margin}_{algo}")
        run(1, *HYBRID, "--train-iters", str(iters), "--save", ck, "--save-interval", "1",
            "--fp8-amax-history-len", str(length), "--fp8-margin", str(margin),
            "--fp8-amax-compute-algo", algo)
        states = {it: fp8_state(os.path.join(ck, f"iter_{it:07d}")) for it in range(1, iters + 1)}
        final = states[iters]
        self.assertEqual(len(final), 4 * 4)  # qkv, proj, fc1, fc2 of 4 layers
        updates = iters * micro
        nonzero = 0
        for linear, (scale, history) in final.items():
            self.assertEqual(history.shape, (length, 3))
            for col, operand in enumerate(("input", "weight", "grad")):
                # The recorded sequence: the last `updates` rows, oldest first (row 0 is cleared
                # by every update; nothing has rolled out of a 64-long history yet).
                recorded = history[length - updates:, col]
                self.assertTrue(np.all(history[:length - updates, col] == 0), (linear, operand))
                if operand == "weight":
                    # The weight is quantised on each step's first micro-batch only.
                    self.assertTrue(np.all(recorded.reshape(iters, micro)[:, 1:] == 0),
                                    (linear, recorded))
                nonzero += int(np.count_nonzero(recorded))
                replay = te_replay(recorded, FP8_MAX[operand], margin, algo, length)
                for it in range(1, iters + 1):
                    got = states[it][linear][0][col]
                    want = replay[it * micro - 1]
                    self.assertEqual(got, want, f"{linear} {operand} after iteration {it}: "
                                                f"{got!r} vs TE's {want!r}")
        self.assertGreater(nonzero, 16 * (20 + 5 + 20) - 5)  # real amaxes were recorded

    def test_most_recent(self):
        self.check(0, "most_recent")

    def test_max_with_margin(self):
        self.check(1, "max")


class TestCurves(unittest.TestCase):
    def test_200_iterations_of_fp8_hybrid_track_bf16(self):
        # Measured on this data (Zen 5, AVX-512): delayed scaling's worst iteration 1.8% from
        # bf16 (at 179), the mean over the last 50 iterations 0.79%; tensorwise 0.77% and 0.33%
        # (final losses 0.388 bf16, 0.393 delayed, 0.390 tensorwise). Bounds: 4% at any
        # iteration, 1.5% on the last 50's mean (twice the measured), and FP8 must differ from
        # bf16 at all (quantisation happening: a mean gap above 1e-4).
        # mxfp8 and blockwise are held to the same bounds (measured, Zen 5: worst 1.05% and
        # 0.82%, last-50 means 0.42% and 0.40%), and each must differ from tensorwise (per-block
        # scales are not one per tensor).
        args = ["--train-iters", "200"]
        bf16 = losses(run(1, *args))
        curves = {}
        for recipe in ("delayed", "tensorwise", "mxfp8", "blockwise"):
            fp8 = curves[recipe] = losses(run(1, *args, *HYBRID, "--fp8-recipe", recipe))
            self.assertEqual(sorted(fp8), list(range(1, 201)))
            rel = [abs(fp8[i] - bf16[i]) / bf16[i] for i in range(1, 201)]
            tail = sum(rel[150:]) / 50
            print(f"{recipe}: worst {max(rel):.4f} at iteration {1 + rel.index(max(rel))}, last "
                  f"50 mean {tail:.5f}; final loss bf16 {bf16[200]:.4f}, fp8 {fp8[200]:.4f}",
                  file=sys.stderr)
            self.assertLess(max(rel), 0.04, recipe)
            self.assertLess(tail, 0.015, recipe)
            self.assertGreater(sum(rel) / len(rel), 1e-4, recipe)
            self.assertLess(fp8[200], 0.5 * fp8[1], recipe)  # it learns
        for recipe in ("mxfp8", "blockwise"):
            self.assertNotEqual(curves[recipe], curves["tensorwise"], recipe)


class TestLayouts(unittest.TestCase):
    def test_parallel_layouts_match_one_process(self):
        # tp2 + SP: the amaxes are reduced over TP, so each GEMM quantises with the single
        # process's scales: losses up to 6e-4 apart by iteration 20 (the row-parallel partial
        # sums add in another order, and a last-bit change of an operand now and then crosses an
        # FP8 rounding boundary, a 2^-4 step, or, with bf16 attention tiles, a bf16 one: 1.9e-5
        # at iteration 1 on AVX-512 BF16, 0 with f32 tiles; training amplifies them).
        # dp2 (and the distributed optimizer): Transformer Engine reduces the amaxes over DP
        # too, so each update takes the max over both replicas' micro-batches instead of one
        # micro-batch at a time: a different (by design) scale sequence, measured 1.1e-4 apart
        # at iteration 1 and at most 5.7e-4 by 20. Bound for every layout: 2e-3.
        want = losses(run(1, *HYBRID))
        for ranks, layout in ((2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
                              (2, []), (2, ["--use-distributed-optimizer"])):
            got = losses(run(ranks, *HYBRID, *layout))
            self.assertEqual(sorted(got), sorted(want))
            rel = [abs(got[i] - want[i]) / want[i] for i in sorted(want)]
            print(f"{layout or 'dp2'}: " + " ".join(f"{r:.1e}" for r in rel), file=sys.stderr)
            self.assertLess(max(rel), 2e-3, layout)

    def test_block_scaled_layouts_match_one_process(self):
        # Per-block scales need no reduction: a layout computes one process's numbers when its
        # blocks fall where one process's do. mxfp8 at tp2 + SP: every split dimension (QKV's 96
        # output rows, the projection's 32 inputs, the MLP's 128) is a multiple of 32 and the
        # token-wise blocks see the gathered sequence, so the quantised values are the same and
        # only sums add in another order (the per-tensor layouts' 2e-3 bound). blockwise at dp2:
        # each micro-batch quantised as in one process; the gradients add in another order.
        # Measured: both identical to one process for 10 iterations, then within 1.9e-4.
        # Megatron-FSDP with sharded gradients (attached in the backward only) at dp2: the
        # same, for each recipe.
        fsdp = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy"]
        for recipe, ranks, layout in (
                ("mxfp8", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
                ("blockwise", 2, ["--use-distributed-optimizer"]),
                ("mxfp8", 2, [*fsdp, "optim_grads_params"]),
                ("blockwise", 2, [*fsdp, "optim_grads"])):
            want = losses(run(1, *HYBRID, "--fp8-recipe", recipe))
            got = losses(run(ranks, *HYBRID, "--fp8-recipe", recipe, *layout))
            self.assertEqual(sorted(got), sorted(want))
            rel = [abs(got[i] - want[i]) / want[i] for i in sorted(want)]
            print(f"{recipe} {layout}: " + " ".join(f"{r:.1e}" for r in rel), file=sys.stderr)
            self.assertLess(max(rel), 2e-3, (recipe, layout))

    def test_tensor_parallel_ranks_reduce_their_amaxes(self):
        # Exactly, where the losses cannot tell: before the first update the weights are the
        # single process's, so after one iteration every linear's recorded weight amaxes equal
        # the single process's when the TP ranks take the max over their shards; without the
        # reduction a rank's history holds its own shard's maximum (in half of the 16 linears on
        # average) and iteration 1's loss moves by 1.0e-4 (measured) instead of 1.9e-5.
        states = {}
        for ranks, layout in ((1, []),
                              (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"])):
            ck = os.path.join(TMP.name, f"amax_tp{ranks}")
            # A history long enough to keep every micro-batch's amaxes (4 updates).
            run(ranks, *HYBRID, *layout, "--train-iters", "1", "--lr-warmup-iters", "0",
                "--fp8-amax-history-len", "8", "--save", ck, "--save-interval", "1")
            states[ranks] = fp8_state(ck)
        self.assertEqual(sorted(states[2]), sorted(states[1]))
        self.assertEqual(len(states[1]), 16)
        for linear, (_, history) in states[1].items():
            self.assertGreater(np.max(history[:, 1]), 0, linear)  # a weight amax was recorded
            np.testing.assert_array_equal(states[2][linear][1][:, 1], history[:, 1], linear)

    def test_full_recomputation_changes_nothing(self):
        # The recomputed forward quantises with the forward's scales and records nothing, so
        # every printed digit agrees (for every recipe).
        for recipe in ("delayed", "tensorwise", "mxfp8", "blockwise"):
            plain = iterations(run(1, *HYBRID, "--fp8-recipe", recipe))
            recomputed = iterations(run(1, *HYBRID, "--fp8-recipe", recipe,
                                        "--recompute-granularity", "full", "--recompute-method",
                                        "uniform", "--recompute-num-layers", "2"))
            self.assertEqual(recomputed, plain, recipe)

    def test_no_fp8_wgrad_acts_on_delayed_scaling_only(self):
        # Megatron passes fp8_wgrad to DelayedScaling alone: delayed with --no-fp8-wgrad computes
        # the weight gradients in bf16 (another curve); the other recipes keep them in FP8, so
        # the flag changes no digit there and a start-up line says it is ignored.
        args = ["--train-iters", "6"]
        for recipe in ("delayed", "tensorwise", "mxfp8"):
            plain = iterations(run(1, *args, *HYBRID, "--fp8-recipe", recipe))
            proc = run(1, *args, *HYBRID, "--fp8-recipe", recipe, "--no-fp8-wgrad")
            ignored = "--no-fp8-wgrad applies to delayed scaling only" in proc.stdout
            self.assertEqual(ignored, recipe != "delayed", recipe)
            if recipe == "delayed":
                self.assertNotEqual(iterations(proc), plain, recipe)
            else:
                self.assertEqual(iterations(proc), plain, recipe)

    def test_first_last_layers_bf16(self):
        # Tensorwise with all 4 layers kept out of FP8 (2 at the start, 2 at the end) is the
        # bf16 run exactly; 1 and 1 keeps the middle two in FP8: neither bf16 nor all-FP8.
        args = ["--train-iters", "8"]
        bf16 = iterations(run(1, *args))
        tw = [*HYBRID, "--fp8-recipe", "tensorwise", "--first-last-layers-bf16"]
        none = iterations(run(1, *args, *tw, "--num-layers-at-start-in-bf16", "2",
                              "--num-layers-at-end-in-bf16", "2"))
        self.assertEqual(none, bf16)
        # Any recipe but delayed takes the flag (Megatron's rule): mxfp8 with every layer out.
        mx_none = iterations(run(1, *args, *HYBRID, "--fp8-recipe", "mxfp8",
                                 "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2",
                                 "--num-layers-at-end-in-bf16", "2"))
        self.assertEqual(mx_none, bf16)
        middle = losses(run(1, *args, *tw))
        every = losses(run(1, *args, *HYBRID, "--fp8-recipe", "tensorwise"))
        plain = {i: float(f["lm loss"]) for i, f in bf16.items()}
        self.assertNotEqual(middle, plain)
        self.assertNotEqual(middle, every)


class TestResume(unittest.TestCase):
    def test_resume_is_exact_with_the_scaling_state(self):
        # A run stopped at 10 and resumed prints the straight run's lines 11..20 digit for
        # digit: the scales and amax histories come back with the weights (history 4, max: the
        # window matters). Single process and tp2 (whose replicated state is written by TP rank
        # 0 and read by both).
        fp8 = [*HYBRID, "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max"]
        for ranks, layout in ((1, []), (2, ["--tensor-model-parallel-size", "2"])):
            straight = iterations(run(ranks, *fp8, *layout))
            ck = os.path.join(TMP.name, f"resume_{ranks}")
            run(ranks, *fp8, *layout, "--save", ck, "--save-interval", "10", "--exit-interval",
                "10")
            state = fp8_state(ck)
            self.assertEqual(len(state), 16)
            for linear, (scale, history) in state.items():
                self.assertEqual(history.shape, (4, 3), linear)
                self.assertTrue(np.all(scale > 1), (linear, scale))  # updated, not initial
            resumed = iterations(run(ranks, *fp8, *layout, "--load", ck))
            self.assertEqual({i: resumed[i] for i in range(11, 21)},
                             {i: straight[i] for i in range(11, 21)}, layout)

    def test_a_checkpoint_without_fp8_state_starts_fp8_from_scale_1(self):
        ck = os.path.join(TMP.name, "bf16_ck")
        run(1, "--save", ck, "--save-interval", "5", "--exit-interval", "5")
        proc = run(1, *HYBRID, "--load", ck, "--no-load-optim", "--no-load-rng", "--finetune",
                   "--train-iters", "8")
        self.assertIn("has no FP8 scaling state", proc.stdout)
        self.assertEqual(sorted(iterations(proc)), list(range(1, 9)))


    def test_an_fp8_checkpoint_loads_into_a_run_without_fp8(self):
        # The scaling state is extra state: a bf16 run resumes from an FP8 checkpoint, leaving it
        # unread, and trains on.
        ck = os.path.join(TMP.name, "fp8_to_bf16")
        run(1, *HYBRID, "--save", ck, "--save-interval", "5", "--exit-interval", "5")
        self.assertEqual(len(fp8_state(ck)), 16)
        # (A shorter run than the saved one's 20 iterations: its schedule is overridden, as
        # Megatron asks.)
        resumed = iterations(run(1, "--load", ck, "--train-iters", "8",
                                 "--override-opt_param-scheduler"))
        self.assertEqual(sorted(resumed), [6, 7, 8])


class TestMultiTokenPrediction(unittest.TestCase):
    # --mtp-num-layers under FP8, as Megatron's MultiTokenPredictionLayer: each depth's eh_proj
    # and transformer layer run in FP8 (two fp8_autocast regions per depth), the shared output
    # layer in bf16. Two depths on the 4-layer model: 16 + 2 x (1 + 4) FP8 linears.
    MTP = ["--position-embedding-type", "rope", "--mtp-num-layers", "2"]
    FIELDS = FIELDS + ("mtp_1 loss", "mtp_2 loss")

    def lines(self, proc):
        return {it: {k: v for k, v in f.items() if k in self.FIELDS}
                for it, f in megatron_log.iteration_lines(proc.stdout).items()}

    def test_prediction_depths_run_in_fp8_and_resume_exactly(self):
        # History 8 with max: a micro-batch has five regions here (the decoder, two per depth),
        # and each region's end rolls every GEMM's history (TE's global buffer), so a shorter
        # history would have rolled depth 0's eh_proj amax out again by the time the step ends;
        # with max the zeros those rolls bring in decide the scales, so an exact resume needs
        # the same GEMMs rolled at every region's end as in the uninterrupted run.
        fp8 = [*self.MTP, *HYBRID, "--fp8-amax-history-len", "8", "--fp8-amax-compute-algo",
               "max"]
        straight = self.lines(run(1, *fp8))
        self.assertIn("mtp_2 loss", straight[20])
        ck = os.path.join(TMP.name, "mtp_resume")
        run(1, *fp8, "--save", ck, "--save-interval", "10", "--exit-interval", "10")
        state = fp8_state(ck)
        self.assertEqual(len(state), 26)
        for k in (0, 1):
            for linear in ("eh_proj", "transformer_layer.self_attention.linear_qkv",
                           "transformer_layer.mlp.linear_fc2"):
                scale, history = state[f"mtp.layers.{k}.{linear}"]
                self.assertGreater(np.max(history[:, 0]), 0, linear)  # an input amax recorded
                self.assertTrue(np.all(scale > 1), (k, linear, scale))  # updated, not initial
        resumed = self.lines(run(1, *fp8, "--load", ck))
        self.assertEqual({i: resumed[i] for i in range(11, 21)},
                         {i: straight[i] for i in range(11, 21)})
        # Full recomputation (uniform: the prediction depths too) re-runs each region with the
        # scales its forward used, recording nothing: every printed digit agrees.
        recomputed = self.lines(run(1, *fp8, "--recompute-granularity", "full",
                                    "--recompute-method", "uniform", "--recompute-num-layers",
                                    "1"))
        self.assertEqual(recomputed, straight)
        # One block at both depths (--mtp-use-repeated-layer): its weights quantised by the
        # first application and reused by the second (TE's is_first_microbatch), so recomputing
        # depth 1 reads the copy its forward read.
        repeated = [*fp8, "--mtp-use-repeated-layer"]
        once = self.lines(run(1, *repeated))
        self.assertNotEqual(once, straight)
        self.assertEqual(self.lines(run(1, *repeated, "--recompute-granularity", "full",
                                        "--recompute-method", "uniform",
                                        "--recompute-num-layers", "1")), once)

    def test_layouts_and_recipes_track_bf16(self):
        # tp2 + SP against one process: the amaxes reduced over TP as the decoder's (the
        # TestLayouts bound, 2e-3, on the main and both prediction losses). Delayed and mxfp8
        # against bf16 over 20 iterations: TestCurves' per-iteration bound (4%), and FP8 must
        # differ from bf16 (measured, Zen 5: at most 0.5% apart over 30 iterations).
        keys = ("lm loss", "mtp_1 loss", "mtp_2 loss")

        def curves(proc):
            return {it: [float(f[k]) for k in keys]
                    for it, f in megatron_log.iteration_lines(proc.stdout).items()}

        def rel(a, b):
            return [abs(x - y) / y for i in sorted(b) for x, y in zip(a[i], b[i])]

        one = curves(run(1, *self.MTP, *HYBRID))
        tp2 = curves(run(2, *self.MTP, *HYBRID, "--tensor-model-parallel-size", "2",
                         "--sequence-parallel"))
        self.assertEqual(sorted(tp2), sorted(one))
        self.assertLess(max(rel(tp2, one)), 2e-3)
        bf16 = curves(run(1, *self.MTP))
        mx = curves(run(1, *self.MTP, *HYBRID, "--fp8-recipe", "mxfp8"))
        for name, got in (("delayed", one), ("mxfp8", mx)):
            r = rel(got, bf16)
            print(f"mtp {name} vs bf16: worst {max(r):.2e}", file=sys.stderr)
            self.assertLess(max(r), 0.04, name)
            self.assertGreater(sum(r) / len(r), 1e-4, name)


class TestFp8ParamGather(unittest.TestCase):
    """--fp8-param-gather: the FP8 GEMMs' weights kept and all-gathered as E4M3 codes."""

    def assert_same_curve(self, want, got, what):
        # Quantising the fp32 main shards after the step with the weight's scale (and recording
        # its amax) is what the first micro-batch of the next step does without the flag, so the
        # losses agree digit for digit. The gradient norm sums the same squares in another order
        # (the FP8 weights move to buckets of their own, so the shards hold other elements):
        # equal to its printed 3 decimals, 1e-3 allowed for a last-digit flip.
        self.assertEqual(sorted(got), sorted(want), what)
        for i in sorted(want):
            self.assertEqual(got[i]["lm loss"], want[i]["lm loss"], f"{what} iteration {i}")
            self.assertAlmostEqual(float(got[i]["grad norm"]), float(want[i]["grad norm"]),
                                   delta=1e-3, msg=f"{what} iteration {i}")

    def test_losses_equal_the_run_without_it(self):
        zero3 = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
        moe = ["--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-router-topk", "2",
               "--disable-bias-linear"]
        for ranks, layout in (
                (2, ["--use-distributed-optimizer"]),
                (2, ["--use-distributed-optimizer", "--fp8-recipe", "tensorwise",
                     "--overlap-param-gather", "--overlap-grad-reduce"]),
                (4, ["--use-distributed-optimizer", "--tensor-model-parallel-size", "2",
                     "--sequence-parallel", "--pipeline-model-parallel-size", "2"]),
                (4, [*zero3, "--fp8-recipe", "tensorwise"]),
                (2, ["--use-distributed-optimizer", "--fp8-recipe", "mxfp8"]),
                # blockwise: codes with a scale per 128 x 128 tile (the shards' tile amaxes
                # reduced over DP); ZeRO-3 decodes them around each use, experts included.
                (2, ["--use-distributed-optimizer", "--fp8-recipe", "blockwise"]),
                (4, [*zero3, *moe, "--fp8-recipe", "blockwise"]),
                (4, [*zero3, *moe]),
                (2, ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
                     "--recompute-granularity", "full", "--recompute-method", "uniform",
                     "--recompute-num-layers", "1"])):
            short = ["--train-iters", "10"]  # equality is judged per iteration; 10 suffice
            want = iterations(run(ranks, *HYBRID, *layout, *short))
            proc = run(ranks, *HYBRID, *layout, *short, "--fp8-param-gather")
            # mxfp8: a smoke test (the run takes the flag and its line; the weights are gathered
            # in bf16 and quantised on each rank, as Megatron does, so it changes nothing).
            if "mxfp8" in layout:
                self.assertIn("--fp8-param-gather with MXFP8: the weights are all-gathered in "
                              "bf16", proc.stdout)
                self.assertEqual(iterations(proc), want, layout)
                continue
            self.assertIn("--fp8-param-gather: those GEMMs' weights are kept as E4M3 codes",
                          proc.stdout)
            self.assertEqual(len(want), 10)
            self.assertTrue(all(float(f["lm loss"]) > 0 for f in want.values()))
            self.assert_same_curve(want, iterations(proc), f"{ranks} ranks {layout}")

    def test_compute_weights_shrink_to_one_byte_per_fp8_weight(self):
        # ZeRO-3 at dp2, from the start-up buffer line: the compute copy holds 2 bytes per
        # element of the other parameters and 1 per FP8 weight element, halved by the sharding.
        # This model: 196,608 FP8 weight elements (qkv 3 x 64 x 64, proj 64 x 64, fc1 and fc2
        # 64 x 256 per layer, 4 layers), 13,696 others; bucket padding (each unit's buckets to a
        # multiple of 128 elements) is within the 3% allowed.
        zero3 = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
                 "--train-iters", "4"]
        line = re.compile(r"\[Rank 0\] FSDP buffers \(MB\): main weights [\d.]+ \| compute "
                          r"weights ([\d.]+)")
        plain = float(line.search(run(2, *HYBRID, *zero3).stdout).group(1))
        codes = float(line.search(run(2, *HYBRID, *zero3, "--fp8-param-gather").stdout).group(1))
        fp8, other = 196608, 13696
        expected = (2 * other + fp8) / (2 * (other + fp8))
        print(f"compute weights per rank: {plain:.3f} MB, with FP8 codes {codes:.3f} MB "
              f"({codes / plain:.3f}, expected {expected:.3f})", file=sys.stderr)
        self.assertAlmostEqual(codes / plain, expected, delta=0.03)

    def test_resume_is_exact_and_checkpoints_cross_the_flag(self):
        # A checkpoint of a run with the flag resumes exactly with it, and without it (the codes
        # are not saved: they are quantised again from the main weights and the scaling state),
        # and one saved without the flag resumes exactly with it.
        dist = ["--use-distributed-optimizer", *HYBRID, "--fp8-amax-history-len", "4",
                "--fp8-amax-compute-algo", "max"]
        straight = iterations(run(2, *dist))
        for saved_with, loaded_with in ((True, True), (True, False), (False, True)):
            ck = os.path.join(TMP.name, f"param_gather_{saved_with}_{loaded_with}")
            flag = ["--fp8-param-gather"]
            run(2, *dist, *(flag if saved_with else []), "--save", ck, "--save-interval", "10",
                "--exit-interval", "10")
            resumed = iterations(run(2, *dist, *(flag if loaded_with else []), "--load", ck))
            self.assert_same_curve({i: straight[i] for i in range(11, 21)},
                                   {i: resumed[i] for i in range(11, 21)},
                                   f"saved with the flag: {saved_with}, loaded: {loaded_with}")

    def test_inference_accepts_the_flag(self):
        # Megatron accepts --fp8-param-gather in inference; `megatron generate` quantises the
        # bf16 weights with the same scales, so the flag changes nothing there.
        ck = os.path.join(TMP.name, "param_gather_generate")
        run(1, "--use-distributed-optimizer", *HYBRID, "--fp8-param-gather", "--train-iters", "4",
            "--save", ck, "--save-interval", "4")
        outputs = []
        for extra in ([], ["--fp8-param-gather"]):
            proc = megatron_job.run_train(
                MEGATRON, MPIEXEC, 1, ["--load", ck, "--tokenizer-type", "NullTokenizer",
                                       "--vocab-size", str(VOCAB), "--prompts", "1 4 7",
                                       "--num-tokens-to-generate", "4", "--bf16", *HYBRID,
                                       *extra], TIMEOUT_S, "generate")
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
            outputs.append(proc.stdout.strip().splitlines()[-1])
        self.assertIn('"tokens"', outputs[0])
        self.assertEqual(outputs[1], outputs[0])


class TestBadFlags(unittest.TestCase):
    def test_refusals_name_the_flag_on_every_rank(self):
        cases = [
            (["--fp8-format", "e5m2"], "--fp8-format"),
            (["--fp8-format", "hybrid", "--fp8-recipe", "nvfp4"], "--fp8-recipe nvfp4"),
            # MXFP8 wants every GEMM dimension divisible by 32: hidden 48 is not.
            (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8", "--hidden-size", "48",
              "--num-attention-heads", "4"], "by 32 (MXFP8)"),
            (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8", "--seq-length", "16"],
             "divisible by 32"),
            (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8",
              "--reuse-grad-buf-for-mxfp8-param-ag"], "Reuse grad buffer only when keeping params"),
            (["--fp8-format", "hybrid", "--hidden-size", "72", "--num-attention-heads", "4"],
             "--hidden-size"),
            (["--fp8-format", "hybrid", "--first-last-layers-bf16"], "--first-last-layers-bf16"),
            (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
              "--num-layers-at-start-in-bf16", "5"], "--num-layers-at-start-in-bf16"),
            (["--fp8-format", "hybrid", "--fp8-amax-history-len", "0"], "--fp8-amax-history-len"),
            (["--fp8-format", "hybrid", "--fp8-param-gather"], "--fp8-param-gather"),
            (["--use-distributed-optimizer", "--fp8-param-gather"], "--fp8-param-gather"),
            (["--fp8-format", "hybrid", "--use-megatron-fsdp", "--fp8-param-gather"],
             "--fp8-param-gather"),
            (["--first-last-layers-bf16"], "--first-last-layers-bf16"),
        ]
        # Two ranks: the checks are pure arithmetic on the flags, so every rank refuses alike
        # (a rank that went on would hang the job until the timeout).
        for args, needle in cases:
            proc = run(2, *args, expect_rc=2)
            text = proc.stdout + proc.stderr
            self.assertIn(needle, text, args)
            for marker in megatron_job.CRASH_MARKERS:
                self.assertNotIn(marker, text, args)
        # FP8 primary weights replace the bf16 compute copy: fp32 runs are refused.
        fp32 = [a for a in TINY if a != "--bf16"]
        proc = megatron_job.run_train(
            MEGATRON, MPIEXEC, 2, [*DATA, *fp32, *HYBRID, "--use-distributed-optimizer",
                                   "--fp8-param-gather"], TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
        self.assertIn("--fp8-param-gather needs --bf16", proc.stdout + proc.stderr)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
