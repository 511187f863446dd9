#!/usr/bin/env python3
"""MuonClip's qk-clip (--qk-clip) and --log-max-attention-logit end to end.

What it is: `megatron train` on mock data with a tiny Llama-shaped GPT (GQA: 8 query heads in 2
groups, RoPE, SwiGLU, RMSNorm) whose weights start large enough (--init-method-std 0.2) that its
attention scores (12 to 17) exceed a threshold of 3, and a multi-latent-attention variant.
  - The statistic: every iteration line carries "max attention logit" with either flag; without
    --qk-clip it is only logged (the curve is Adam's without it, bit for bit).
  - The clip: with --qk-clip the curve differs from the unclipped one and the largest score of
    every later iteration stays near the threshold while the unclipped run's stays above 3x it.
  - Layouts (f32): tp2 + sequence parallelism, pp2, dp2, cp2 (ring and all-to-all: each rank the
    whole sequence of half the heads), dp2 with the distributed optimizer,
    and for MLA tp2: loss, grad norm and max attention logit within 1e-5 of one process (every
    layout computes the same f32 scores and sums in another order; the statistic is reduced over
    data- and context-parallel replicas and the model-parallel ranks).
  - bf16 with the distributed optimizer (which scales its own shards of the main weights before
    rounding and gathering them) against the plain optimizer at dp2, and Muon's layer-wise
    distributed optimizer against plain Muon: the same iterations bit for bit.
  - fp16 with a loss scale that overflows first: the skipped iterations still clip (as Megatron's
    clip_qk runs after a skipped step), the same with and without the distributed optimizer, also
    for an MoE model whose expert buckets are gathered across the TP ranks.
  - Checkpoints: a bf16 distributed-optimizer run stopped at iteration 6 and resumed prints the
    straight run's iterations 7..12 character for character.
  - Refused, exit 2 on every rank: --qk-clip-alpha outside (0, 1), --qk-clip-threshold <= 0, and
    either flag with BERT (no decoder: Megatron's clip_qk walks decoder layers).
What it is not: the scores, the factors and the steps against PyTorch (tests/models/
test_gpt_hf_oracle.cpp's qk-clip runs with tests/reference/hf_oracle.py), the attention kernels'
statistic (tests/tensor/test_attention.cpp), the rows and torch's arithmetic
(tests/transformer/test_qk_clip.cpp).

Usage: test_qk_clip.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
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
TIMEOUT_S = 180
ITERS = 12
TMP = None
THRESHOLD = 3.0

TINY = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "2",
        "--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--init-method-std", "0.2",
        "--untie-embeddings-and-output-weights", "--seq-length", "32",
        "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", str(ITERS),
        "--log-interval", "1", "--lr", "1e-2", "--lr-warmup-iters", "3", "--eval-iters", "0",
        "--num-threads", "1"]
# MLA: every head its own key (no query groups).
MLA_BASE = [a for a in TINY if a not in ("--group-query-attention", "--num-query-groups", "2")]
MLA = ["--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "16",
       "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8",
       "--kv-channels", "16"]
CLIP = ["--qk-clip", "--qk-clip-threshold", str(THRESHOLD)]
LOG = "--log-max-attention-logit"
TP, PP, CP = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
              "--context-parallel-size")
DIST = "--use-distributed-optimizer"
KEYS = ("lm loss", "grad norm", "max attention logit")
RTOL = 1e-5


def setUpModule():
    global TMP
    TMP = tempfile.TemporaryDirectory(prefix="qk_clip_")


def tearDownModule():
    TMP.cleanup()


def run(ranks, *args, expect_rc=0, base=TINY):
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, megatron_job.with_flags(base, args),
                                  TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def curve(proc, keys=KEYS, first=1, last=ITERS):
    return megatron_log.curves(proc.stdout, keys, first, last)


def raw_iterations(proc):
    fields = ("consumed samples", "learning rate", "lm loss", "grad norm", "max attention logit")
    return {it: {k: v for k, v in f.items() if k in fields}
            for it, f in megatron_log.iteration_lines(proc.stdout).items()}


class TestClip(unittest.TestCase):
    def test_logged_clipped_and_not_without_the_flag(self):
        plain = run(1)
        logged = run(1, LOG)
        self.assertNotIn("max attention logit", plain.stdout)
        base = curve(plain, ("lm loss", "grad norm"))
        stat = curve(logged)
        # Logging alone changes nothing.
        for it in base:
            self.assertEqual(stat[it]["lm loss"], base[it]["lm loss"])
        # Unclipped, the scores stay far above the threshold.
        for it in stat:
            self.assertGreater(stat[it]["max attention logit"], 3 * THRESHOLD, it)
        clipped = curve(run(1, *CLIP))
        # Iteration 1 ran before any clip; later ones on clipped weights, whose largest score is
        # the threshold again after each step's update moves it a little.
        self.assertEqual(clipped[1]["lm loss"], stat[1]["lm loss"])
        self.assertEqual(clipped[1]["max attention logit"], stat[1]["max attention logit"])
        for it in range(2, ITERS + 1):
            self.assertLess(clipped[it]["max attention logit"], 1.5 * THRESHOLD, it)
        self.assertGreater(abs(clipped[ITERS]["lm loss"] - stat[ITERS]["lm loss"]), 1e-3)
        self.assertLess(clipped[ITERS]["lm loss"], clipped[1]["lm loss"] - 0.3)  # still learns

    def test_layouts_equal_one_process(self):
        want = curve(run(1, *CLIP))
        for ranks, args in [(2, [TP, "2", "--sequence-parallel"]), (2, [PP, "2"]), (2, []),
                            (2, [CP, "2"]), (2, [CP, "2", "--cp-comm-type", "a2a"]),
                            (2, [DIST])]:
            got = curve(run(ranks, *CLIP, *args))
            megatron_log.assert_same_curves(self, got, want, " ".join(args) or "dp2", RTOL)
        want = curve(run(1, *CLIP, *MLA, base=MLA_BASE))
        got = curve(run(2, *CLIP, *MLA, TP, "2", base=MLA_BASE))
        megatron_log.assert_same_curves(self, got, want, "MLA tp2", RTOL)
        self.assertLess(want[ITERS]["max attention logit"], 1.5 * THRESHOLD)

    def test_optimizer_layouts_bit_for_bit(self):
        # The distributed optimizer scales its shards of the main weights, then rounds and
        # gathers them: the plain optimizer's bf16 weights.
        self.assertEqual(raw_iterations(run(2, *CLIP, "--bf16", DIST)),
                         raw_iterations(run(2, *CLIP, "--bf16")))
        # MuonClip: Muon's layer-wise distributed optimizer, the clip after the owners' updates
        # are broadcast.
        muon = ["--optimizer", "muon", "--bf16"]
        self.assertEqual(raw_iterations(run(2, *CLIP, *muon, DIST)),
                         raw_iterations(run(2, *CLIP, *muon)))

    def test_skipped_fp16_iterations_still_clip(self):
        fp16 = ["--fp16", "--initial-loss-scale", str(2.0 ** 40), "--lr", "5e-3"]
        plain = run(2, *CLIP, *fp16)
        self.assertIn("number of skipped iterations:   1", plain.stdout)
        # (A skipped iteration's line has no loss.)
        got = curve(run(2, *CLIP, *fp16, DIST), ("max attention logit",))
        want = curve(plain, ("max attention logit",))
        megatron_log.assert_same_curves(self, got, want, "fp16 distributed", RTOL)
        # The first iteration overflowed (no update) yet its clip ran: the second sees clipped
        # weights, their largest score below the first's.
        self.assertLess(want[2]["max attention logit"], 0.8 * want[1]["max attention logit"])
        # Experts whose data-parallel group spans the TP ranks (expert TP 1 under TP 2): the
        # TP ranks clip different heads, and the skipped step's gathers of the expert buckets
        # still run on every rank.
        # (Expert parallelism refuses fp16: the experts are whole on each rank, their
        # data-parallel group is the two TP ranks.)
        moe = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
               "--moe-token-dispatcher-type", "alltoall", TP, "2", "--sequence-parallel",
               "--expert-tensor-parallel-size", "1"]
        want = curve(run(2, *CLIP, *fp16, *moe), ("max attention logit",))
        got = curve(run(2, *CLIP, *fp16, *moe, DIST), ("max attention logit",))
        megatron_log.assert_same_curves(self, got, want, "fp16 MoE distributed", RTOL)

    def test_resume_is_exact(self):
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        args = [*CLIP, "--bf16", DIST]
        straight = raw_iterations(run(2, *args))
        run(2, *args, "--save", ck, "--exit-interval", "6")
        resumed = raw_iterations(run(2, *args, "--load", ck))
        self.assertEqual([resumed[i] for i in range(7, ITERS + 1)],
                         [straight[i] for i in range(7, ITERS + 1)])


class TestRefused(unittest.TestCase):
    def check(self, ranks, args, message, base=TINY):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                      megatron_job.with_flags(base, args), TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stdout[-1000:] + proc.stderr[-2000:])
        self.assertIn(message, proc.stderr)
        if ranks > 1:  # every rank refuses, none crashes
            self.assertGreaterEqual(proc.stderr.count(message), ranks, proc.stderr[-2000:])
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)

    def test_bad_values_exit_2(self):
        self.check(2, ["--qk-clip", "--qk-clip-alpha", "1"],
                   "--qk-clip-alpha must be between 0.0 and 1.0 when using --qk-clip (got 1)")
        self.check(1, ["--qk-clip", "--qk-clip-alpha", "0"],
                   "--qk-clip-alpha must be between 0.0 and 1.0")
        self.check(2, ["--qk-clip", "--qk-clip-threshold", "0"],
                   "--qk-clip-threshold must be greater than 0 when using --qk-clip (got 0)")
        bert = ["--model", "bert", "--mock-data", "--vocab-size", "128", "--num-layers", "2",
                "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
                "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2",
                "--lr", "1e-3", "--num-threads", "1"]
        self.check(1, [LOG], "--log-max-attention-logit reads the self-attention layers of a "
                   "decoder (Megatron's clip_qk); --model bert has none", base=bert)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
