"""gpt-oss end to end (Megatron core 0.19's flags): sliding windows, attention sinks, quick GeGLU
with its offset and clamp, YaRN on ordinary attention, biased routers and experts.

What it is: `megatron train` on mock data with a tiny gpt-oss-shaped model (the flags of
Megatron's examples/gptoss at small sizes: --window-size 5,0 on every second layer, learnable
sinks, --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 0.1 (active at the
initial weights' scale), YaRN factor 4 with an unrounded correction range (partial over the pairs), GQA, head dim 12 != hidden / heads, q/k/v/o biases), as one process
and under mpiexec:
  - Layouts, dense: tp2 + sequence parallelism (sinks split with the heads), tp2, pp2 (the window
    pattern global: each stage its own layers'), cp2 with the ring and with all-to-all (the
    window skips whole key chunks), dp2 with the distributed optimizer, selective and full
    recomputation: loss, grad-norm and validation curves as the single process within 1e-5
    relative (every layout sums the same f32 terms in another order).
  - Layouts, MoE (4 biased experts, top-2, biased router, aux and z losses): ep2, tp2 + sequence
    parallelism at expert TP 1, pp2, cp2, dp2 distributed optimizer with ep2: the same curves.
  - Checkpoints: a run saved at tp2 resumes in one process with --use-checkpoint-args and no model
    flags, the next iterations equal to the uninterrupted run's (the gpt-oss flags come back from
    the checkpoint); a model without sinks refuses the checkpoint naming softmax_learnable.
  - Hugging Face gpt-oss (the PyTorch oracle's tiny model, tests/reference/hf_oracle.py): trains
    from --pretrained-checkpoint at ep2, both the unquantized directory and OpenAI's MXFP4 form of
    the same weights (equal losses), and `megatron convert` writes a gpt_oss directory whose
    config.json says what the original's does.
  - Bad input: each an exit 2 on every rank with a message naming the flag.
What it is not: the kernels (tests/tensor/test_attention.cpp, test_op_harness.cpp) or the
comparison with PyTorch (tests/models/test_gpt_hf_oracle.cpp).

Usage: test_gpt_oss.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 240
ITERS = 12
TMP = tempfile.TemporaryDirectory(prefix="gpt_oss_")

TINY = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
        "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
        "--train-iters", str(ITERS), "--log-interval", "1", "--lr", "2e-3",
        "--lr-warmup-iters", "3", "--eval-iters", "2", "--eval-interval", "6",
        "--num-threads", "1"]
OSS = ["--normalization", "RMSNorm", "--untie-embeddings-and-output-weights",
       "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4",
       "--kv-channels", "12", "--position-embedding-type", "yarn", "--rotary-scaling-factor", "4",
       "--yarn-original-max-position-embeddings", "64", "--no-yarn-correction-range-round-to-int",
       "--window-size", "5,0", "--window-attn-skip-freq", "2", "--softmax-type", "learnable",
       "--quick-geglu", "--glu-linear-offset", "1", "--activation-func-clamp-value", "0.1"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
       "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3",
       "--moe-token-dispatcher-type", "alltoall"]
TP, PP, CP, EP, ETP = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                       "--context-parallel-size", "--expert-model-parallel-size",
                       "--expert-tensor-parallel-size")
SP, DISTOPT = "--sequence-parallel", "--use-distributed-optimizer"
RTOL = 1e-5

with_flags = megatron_job.with_flags


def run(ranks, *args, expect_rc=0, base=TINY):
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, with_flags(base, list(args)),
                                  TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"exit {proc.returncode}, expected {expect_rc}:\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def curves(proc):
    """(iteration -> (lm loss, grad norm), validation losses)."""
    return (megatron_log.loss_curve(proc.stdout, ITERS),
            [v for _, v in megatron_log.validation_losses(proc.stdout)])


class TestLayouts(unittest.TestCase):
    def check(self, model, layouts):
        want, want_valid = curves(run(1, *model))
        self.assertEqual(len(want_valid), 4)  # iterations 6 and 12, then validation and test
        for name, ranks, flags in layouts:
            with self.subTest(layout=name):
                got, got_valid = curves(run(ranks, *model, *flags))
                for it, (wl, wn) in want.items():
                    gl, gn = got[it]
                    self.assertAlmostEqual(gl, wl, delta=RTOL * wl, msg=f"{name} loss, iter {it}")
                    # The norm is printed with 3 decimals: one unit of the last digit.
                    self.assertAlmostEqual(gn, wn, delta=RTOL * wn + 2e-3,
                                           msg=f"{name} grad norm, iter {it}")
                for g, w in zip(got_valid, want_valid):
                    self.assertAlmostEqual(g, w, delta=RTOL * w, msg=f"{name} validation")

    def test_dense_layouts_match_single_process(self):
        self.check(OSS, [
            ("tp2+sp", 2, [TP, "2", SP]),
            ("tp2", 2, [TP, "2"]),
            ("pp2", 2, [PP, "2"]),
            ("cp2 p2p", 2, [CP, "2"]),
            ("cp2 a2a", 2, [CP, "2", "--cp-comm-type", "a2a"]),
            ("dp2 distributed optimizer", 2, [DISTOPT]),
            ("selective recompute", 1, ["--recompute-granularity", "selective"]),
            ("tp2+sp full recompute", 2, [TP, "2", SP, "--recompute-granularity", "full",
                                          "--recompute-method", "uniform",
                                          "--recompute-num-layers", "1"]),
        ])

    def test_moe_layouts_match_single_process(self):
        self.check(OSS + MOE, [
            ("ep2", 2, [EP, "2"]),
            ("tp2+sp etp1", 2, [TP, "2", SP, ETP, "1"]),
            ("pp2", 2, [PP, "2"]),
            ("cp2", 2, [CP, "2"]),
            ("ep2 distributed optimizer", 2, [EP, "2", DISTOPT]),
        ])

    def test_window_and_sinks_change_the_curve(self):
        # Each piece is in the run: without it the curve is another one. Runs are deterministic
        # (the same bits every time), so a difference beyond the printed loss's resolution (7
        # digits: 2e-6 relative is two units of the last) is the piece's (the rounded YaRN range
        # moves one rotary pair of twelve: 1.9e-5).
        base = curves(run(1, *OSS))[0]
        rounded = [f for f in OSS if f != "--no-yarn-correction-range-round-to-int"]
        for name, model in (("no window", [*OSS, "--window-size", "-1,0"]),
                            ("no sinks", [*OSS, "--softmax-type", "vanilla"]),
                            ("no clamp", [*OSS, "--activation-func-clamp-value", "100"]),
                            ("no offset", [*OSS, "--glu-linear-offset", "0"]),
                            ("rounded YaRN range", rounded)):
            with self.subTest(drop=name):
                other = curves(run(1, *model))[0]
                self.assertGreater(abs(other[ITERS][0] / base[ITERS][0] - 1), 2e-6)


class TestCheckpoints(unittest.TestCase):
    def test_resume_takes_the_model_from_the_checkpoint(self):
        whole = curves(run(2, *OSS, *MOE, TP, "2", SP, ETP, "1"))[0]
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        run(2, *OSS, *MOE, TP, "2", SP, ETP, "1", "--save", ck, "--save-interval", "6",
            "--exit-interval", "6")
        # One process, no model flags: the window, sinks, GeGLU, YaRN and MoE come back.
        resumed = megatron_log.loss_curve(
            run(1, "--load", ck, "--use-checkpoint-args", *MOE[-2:]).stdout, None)
        self.assertEqual(sorted(resumed), list(range(7, ITERS + 1)))
        for it in range(7, ITERS + 1):
            self.assertAlmostEqual(resumed[it][0], whole[it][0], delta=RTOL * whole[it][0],
                                   msg=f"iteration {it}")
        refused = run(1, *OSS, *MOE, "--softmax-type", "vanilla", "--load", ck, expect_rc=2)
        self.assertIn("softmax_learnable", refused.stderr)
        # The flags' model as a Hugging Face gpt_oss directory: transformers reads YaRN's factor
        # as max_position_embeddings / original_max_position_embeddings, so the file's context
        # is 4 x 64; it trains again as a pretrained checkpoint, YaRN's factor 4 read back.
        hf = tempfile.mkdtemp(prefix="hf_", dir=TMP.name)
        conv = subprocess.run([MEGATRON, "convert", "--load", ck, "--save-hf", hf],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertEqual(conv.returncode, 0, conv.stdout[-2000:] + conv.stderr[-2000:])
        with open(os.path.join(hf, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["model_type"], "gpt_oss")
        self.assertEqual(cfg["max_position_embeddings"], 256)
        self.assertEqual(cfg["rope_scaling"]["factor"], 4)
        self.assertEqual(cfg["rope_scaling"]["original_max_position_embeddings"], 64)
        self.assertFalse(cfg["rope_scaling"]["truncate"])
        self.assertEqual(cfg["sliding_window"], 6)
        self.assertEqual(cfg["layer_types"], ["sliding_attention", "full_attention"] * 2)
        again = run(1, "--mock-data", "--pretrained-checkpoint", hf, "--seq-length", "32",
                    "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1",
                    "--eval-iters", "0", "--num-threads", "1", "--tokenizer-type",
                    "NullTokenizer", "--lr", "1e-4", base=[])
        self.assertIn("iteration        1/", again.stdout)
        self.assertNotIn("differs from max_position_embeddings", again.stderr)


def oracle_dir():
    """The PyTorch oracle's gpt-oss directories (model/ and model_mxfp4/)."""
    oracle = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference",
                          "hf_oracle.py")
    out = tempfile.mkdtemp(prefix="oracle_", dir=TMP.name)
    subprocess.run(["/usr/bin/python3", oracle, "--arch", "gpt-oss", "--out", out],
                   check=True, capture_output=True, timeout=TIMEOUT_S)
    return out


class TestHuggingFace(unittest.TestCase):
    def test_trains_from_both_forms_and_converts_back(self):
        out = oracle_dir()
        runs = {}
        for form in ("model", "model_mxfp4"):
            ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
            args = ["--mock-data", "--pretrained-checkpoint", os.path.join(out, form),
                    "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "2",
                    "--train-iters", "2", "--eval-iters", "0", "--num-threads", "1",
                    "--save", ck, "--log-interval", "1", EP, "2",
                    "--tokenizer-type", "NullTokenizer", "--lr", "1e-4"]
            proc = run(2, *args, base=[])
            runs[form] = (megatron_log.loss_curve(proc.stdout, 2), ck)
        # The MXFP4 experts dequantize to the unquantized weights: the same run.
        self.assertEqual(runs["model"][0], runs["model_mxfp4"][0])
        back = tempfile.mkdtemp(prefix="back_", dir=TMP.name)
        conv = subprocess.run([MEGATRON, "convert", "--load", runs["model"][1], "--save-hf", back],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertEqual(conv.returncode, 0, conv.stdout[-2000:] + conv.stderr[-2000:])
        with open(os.path.join(back, "config.json")) as f:
            got = json.load(f)
        with open(os.path.join(out, "model", "config.json")) as f:
            want = json.load(f)
        self.assertEqual(got["model_type"], "gpt_oss")
        for key in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts",
                    "num_experts_per_tok", "sliding_window", "layer_types", "swiglu_limit",
                    "rope_theta", "vocab_size", "tie_word_embeddings"):
            self.assertEqual(got[key], want[key], key)
        for key, value in want["rope_scaling"].items():
            self.assertEqual(got["rope_scaling"][key], value, key)
        # A flag that contradicts the file is refused, the --no- form of a flag pair too (a
        # copy of the oracle's directory whose rope_scaling rounds the correction range).
        rounding = tempfile.mkdtemp(prefix="truncate_", dir=TMP.name)
        for name in os.listdir(os.path.join(out, "model")):
            shutil.copy(os.path.join(out, "model", name), rounding)
        with open(os.path.join(rounding, "config.json"), "w") as f:
            json.dump(dict(want, rope_scaling=dict(want["rope_scaling"], truncate=True)), f)
        bad = run(1, "--mock-data", "--pretrained-checkpoint", rounding, "--seq-length", "16",
                  "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1",
                  "--lr", "1e-4", "--no-yarn-correction-range-round-to-int", base=[],
                  expect_rc=2)
        self.assertIn("--yarn-correction-range-round-to-int false contradicts", bad.stderr)
        # The converted directory trains again as a pretrained checkpoint.
        again = run(1, "--mock-data", "--pretrained-checkpoint", back, "--seq-length", "16",
                    "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1",
                    "--eval-iters", "0", "--num-threads", "1", "--tokenizer-type",
                    "NullTokenizer", "--lr", "1e-4", base=[])
        self.assertIn("iteration        1/", again.stdout)


class TestRefusals(unittest.TestCase):
    def test_bad_flags_exit_2_on_every_rank(self):
        for flags, text in (
                (["--window-size", "5,3"], "causal attention sees no key after the query"),
                (["--window-size", "five"], "--window-size 'five': give two integers"),
                (["--window-attn-skip-freq", "[1,0]"], "--window-attn-skip-freq"),
                (["--softmax-type", "sparse"], "--softmax-type: unknown 'sparse'"),
                (["--quick-geglu", "--swiglu"], "--quick-geglu is an activation of its own"),
                (["--quick-geglu", "--activation-func-clamp-value", "-1"],
                 "--activation-func-clamp-value must be positive"),
                (["--glu-linear-offset", "1"], "act on --quick-geglu"),
                (["--yarn-beta-fast", "16"], "--yarn-beta-fast applies to "
                                             "--position-embedding-type yarn"),
                (["--window-size", "5,0", "--model", "bert"], "--window-size: sliding-window"),
                (["--num-experts", "4", TP, "2", SP], "--expert-tensor-parallel-size 1"),
                (["--num-experts", "4", "--moe-shared-expert-intermediate-size", "32"],
                 "bias is not supported in the shared experts"),
                (["--position-embedding-type", "yarn", "--rotary-interleaved"],
                 "--rotary-interleaved does not work with --position-embedding-type yarn")):
            with self.subTest(flags=" ".join(flags)):
                proc = run(2, "--num-attention-heads", "4", *flags, expect_rc=2)
                self.assertIn(text, proc.stderr)
                for r in range(2):
                    self.assertIn(f"[rank {r}]", proc.stderr)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
