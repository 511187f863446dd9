#!/usr/bin/env python3
"""Activation recomputation end to end: `megatron train` with and without recomputation agrees.

What it is: black-box runs of the binary on a tiny model (4 layers, h 64, 4 heads, s 32, micro
batch 2, global batch 4, 10 iterations, dropout on by default) under every recompute setting
(Megatron's --recompute-granularity full|selective, --recompute-method uniform|block,
--recompute-num-layers, --recompute-activations, --recompute-modules on a DeepSeek-V3-style
model with multi-latent attention and MoE, --moe-layer-recompute), each compared with the same
layout without recomputation: every `lm loss` and `grad norm` printed must be identical, and in
one process the trained weights written by --save-hf must be identical byte for byte
(recomputation re-runs the same kernels on the same inputs, so nothing may change). Layouts: one process; `mpiexec -n 2`
with --tensor-model-parallel-size 2 --sequence-parallel (the recomputed forward re-issues its
all-gathers and reduce-scatters, which must still pair up across the TP ranks); `mpiexec -n 2`
with --pipeline-model-parallel-size 2 (recomputation per stage). Also: the flag combinations
Megatron refuses exit 2 with a message naming the flags, and the flags are in --help and in the
argument dump.

What it is not: the memory saved (tests/transformer/test_recompute.cpp counts it exactly) or the
numerics of training itself.

Usage: test_recompute_cli.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest options]
"""
import filecmp
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

MEGATRON = None  # set from --megatron
MPIEXEC = None  # set from --mpiexec
# A run takes a few seconds; the limit only guards against a hang (TP ranks whose recomputed
# collectives do not pair up would wait for each other forever), which is itself the failure.
TIMEOUT_S = 180
TINY = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "2",
        "--global-batch-size", "4", "--train-iters", "10", "--log-interval", "1",
        "--num-threads", "1", "--lr", "1e-3"]
FULL_UNIFORM_1 = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"]
FULL_UNIFORM_2 = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "2"]
FULL_BLOCK_1 = ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", "1"]
FULL_BLOCK_2 = ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", "2"]
SELECTIVE = ["--recompute-granularity", "selective"]
DUMP_BANNER = "------------------------ arguments"
CRASH_MARKERS = megatron_job.CRASH_MARKERS
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
PP2 = ["--pipeline-model-parallel-size", "2"]


def run(ranks, args):
    return megatron_job.run_train(MEGATRON, MPIEXEC, ranks, args, TIMEOUT_S)


def curve(stdout, iters=10):
    """The (lm loss, grad norm) pair of iterations 1..iters, as printed (every one of them, whole
    lines, once each)."""
    lines = megatron_log.iteration_lines(stdout, range(1, iters + 1))
    return [(lines[it]["lm loss"], lines[it]["grad norm"]) for it in sorted(lines)]


class CurveCase(unittest.TestCase):
    def train(self, ranks, args):
        proc = run(ranks, TINY + args)
        self.assertEqual(proc.returncode, 0, f"{args}:\n{proc.stderr[-3000:]}")
        return curve(proc.stdout)

    def assertSameCurve(self, ranks, layout, settings):
        want = self.train(ranks, layout)
        for setting in settings:
            with self.subTest(setting=" ".join(setting)):
                self.assertEqual(self.train(ranks, layout + setting), want)


class TestRecomputeTraining(CurveCase):
    def test_one_process_curves_and_weights_identical(self):
        with tempfile.TemporaryDirectory() as tmp:
            want_dir = os.path.join(tmp, "none")
            want = self.train(1, ["--save-hf", want_dir])
            settings = [SELECTIVE, ["--recompute-activations"], FULL_UNIFORM_1, FULL_UNIFORM_2,
                        FULL_BLOCK_1, FULL_BLOCK_2]
            for i, setting in enumerate(settings):
                with self.subTest(setting=" ".join(setting)):
                    got_dir = os.path.join(tmp, str(i))
                    self.assertEqual(self.train(1, setting + ["--save-hf", got_dir]), want)
                    self.assertTrue(filecmp.cmp(os.path.join(want_dir, "model.safetensors"),
                                                os.path.join(got_dir, "model.safetensors"),
                                                shallow=False), "trained weights differ")

    def test_tensor_and_sequence_parallel_curves_identical(self):
        self.assertSameCurve(2, TP2_SP, [FULL_UNIFORM_1, FULL_BLOCK_1, SELECTIVE])

    def test_distributed_saved_activations_curves_identical(self):
        # --distribute-saved-activations (TP without SP): each kept chunk input is split over the
        # TP ranks and all-gathered before its recomputation; the numbers cannot change.
        tp2 = ["--tensor-model-parallel-size", "2"]
        dist = ["--distribute-saved-activations"]
        self.assertSameCurve(2, tp2, [FULL_UNIFORM_1 + dist, FULL_BLOCK_2 + dist])

    def test_distributed_saved_activations_halve_the_kept_inputs(self):
        # The activation estimate printed at start-up (Theoretical memory footprints): 4 kept
        # layer inputs of s x b x h f32 = 256 x 2 x 256 x 4 bytes = 0.5 MB each, half of each
        # on a TP rank of 2 with the flag: 1 MB less (printed to 0.01 MB).
        big = ["--seq-length", "256", "--hidden-size", "256", "--max-position-embeddings", "256",
               "--train-iters", "1", "--tensor-model-parallel-size", "2"]
        figures = []
        for extra in ([], ["--distribute-saved-activations"]):
            proc = run(2, TINY + big + FULL_UNIFORM_1 + extra)
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            line = next(l for l in proc.stdout.splitlines() if "Theoretical memory" in l)
            figures.append(float(line.split("activation=")[1].split(" MB")[0]))
        self.assertAlmostEqual(figures[0] - figures[1], 1.0, delta=0.011)

    def test_pipeline_parallel_curves_identical(self):
        # 2 layers per stage: uniform 1 recomputes each layer, uniform 2 the whole stage.
        self.assertSameCurve(2, PP2, [FULL_UNIFORM_1, FULL_UNIFORM_2])


# A DeepSeek-V3-style model for the module recomputation: multi-latent attention, a dense layer
# then MoE layers (alltoall) with a shared expert and sigmoid routing with an aux loss.
DEEPSEEK = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
            "--disable-bias-linear", "--multi-latent-attention", "--q-lora-rank", "24",
            "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8",
            "--v-head-dim", "12", "--qk-layernorm", "--num-experts", "4", "--moe-router-topk", "2",
            "--moe-layer-freq", "([0]+[1]*3)", "--moe-ffn-hidden-size", "32",
            "--moe-shared-expert-intermediate-size", "32", "--moe-router-score-function",
            "sigmoid", "--moe-aux-loss-coeff", "0.01", "--moe-token-dispatcher-type", "alltoall",
            "--moe-grouped-gemm"]
MODULES = ["--recompute-granularity", "selective", "--recompute-modules"]


class TestRecomputeModules(CurveCase):
    # --recompute-modules: each module's recomputation re-runs the same kernels on the same
    # inputs (MLP, MoE with its routing and token exchange, shared experts, the experts'
    # activation, MLA's up projections and RoPE), so every printed loss and norm is identical to
    # the run without recomputation, in one process, under TP + SP (the recomputed forwards
    # re-issue their all-gathers) and under expert parallelism (the recomputed MoE layer
    # exchanges its tokens again).
    SETTINGS = [MODULES + ["mlp", "moe"],
                MODULES + ["core_attn", "mla_up_proj", "moe_act", "shared_experts", "layernorm"],
                # Megatron's DeepSeek recipes' set.
                MODULES + ["layernorm", "mla_up_proj", "mlp", "moe_act"],
                MODULES + ["mla_up_proj", "moe", "mlp", "layernorm"],
                ["--moe-layer-recompute"]]

    def test_one_process(self):
        self.assertSameCurve(1, DEEPSEEK, self.SETTINGS)

    def test_tensor_sequence_and_expert_parallel(self):
        self.assertSameCurve(2, DEEPSEEK + TP2_SP, self.SETTINGS[:2])
        self.assertSameCurve(2, DEEPSEEK + ["--expert-model-parallel-size", "2"],
                             self.SETTINGS[:1])

    def test_multi_token_prediction_full_uniform(self):
        # Megatron recomputes each MTP depth (norms, eh_proj, layer, final norm) under full
        # uniform recomputation: the same curves (the depth's gradients enter the norm); and it
        # requires one layer per recomputed chunk with MTP.
        mtp = DEEPSEEK + ["--mtp-num-layers", "1"]
        self.assertSameCurve(1, mtp, [FULL_UNIFORM_1])
        proc = run(1, TINY + mtp + FULL_UNIFORM_2)
        self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
        self.assertIn("recompute_num_layers must be 1 for MTP recompute", proc.stderr)

    def test_gpt_mlp_and_layernorm(self):
        self.assertSameCurve(1, [], [MODULES + ["mlp"], MODULES + ["core_attn", "mlp"],
                                     MODULES + ["layernorm"]])
        self.assertSameCurve(2, TP2_SP, [MODULES + ["layernorm", "mlp"]])


class TestRecomputeArgs(unittest.TestCase):
    def assertRefused(self, ranks, args, *needles):
        proc = run(ranks, TINY + args)
        self.assertEqual(proc.returncode, 2, f"{args}: expected exit 2, got {proc.returncode}\n"
                                             f"stderr:\n{proc.stderr[-3000:]}")
        for n in needles:
            self.assertIn(n, proc.stderr, f"stderr does not name {n!r}:\n{proc.stderr}")
        for marker in CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr, f"crash marker {marker!r} in stderr")
        self.assertNotIn(DUMP_BANNER, proc.stdout, "refused after start-up, not in validation")

    def test_method_without_full(self):
        self.assertRefused(1, ["--recompute-method", "uniform"],
                           "--recompute-method requires --recompute-granularity full")
        self.assertRefused(1, SELECTIVE + ["--recompute-method", "block"],
                           "--recompute-method requires --recompute-granularity full",
                           "selective")

    def test_full_without_method(self):
        self.assertRefused(1, ["--recompute-granularity", "full", "--recompute-num-layers", "1"],
                           "recompute_method must be \"block\" or \"uniform\"",
                           "--recompute-method")

    def test_full_num_layers_out_of_range(self):
        self.assertRefused(1, ["--recompute-granularity", "full", "--recompute-method", "uniform"],
                           "recompute_num_layers must be between 1 and "
                           "num_layers_per_pipeline_rank: 4", "got --recompute-num-layers 0")
        self.assertRefused(1, FULL_BLOCK_1[:-1] + ["5"],
                           "num_layers_per_pipeline_rank: 4", "got --recompute-num-layers 5")
        # Per pipeline stage: 4 layers over 2 stages leave 2 for block recomputation.
        self.assertRefused(2, PP2 + FULL_BLOCK_1[:-1] + ["3"],
                           "num_layers_per_pipeline_rank: 2", "got --recompute-num-layers 3")

    def test_selective_with_num_layers(self):
        self.assertRefused(1, SELECTIVE + ["--recompute-num-layers", "2"],
                           "When using recompute_granularity: selective recompute_num_layers "
                           "must be None", "--recompute-num-layers")

    def test_num_layers_without_granularity(self):
        self.assertRefused(1, ["--recompute-num-layers", "2"],
                           "--recompute-num-layers (2) requires --recompute-granularity full")

    def test_unknown_values(self):
        self.assertRefused(1, ["--recompute-granularity", "partial"],
                           "--recompute-granularity must be full or selective, got 'partial'")
        self.assertRefused(1, ["--recompute-granularity", "full", "--recompute-method", "every",
                               "--recompute-num-layers", "1"],
                           "--recompute-method must be uniform or block, got 'every'")

    def test_module_refusals(self):
        self.assertRefused(1, MODULES + ["attention"], "--recompute-modules: invalid choice "
                                                       "'attention'")
        self.assertRefused(1, MODULES + ["mla_up_proj"], "mla_up_proj",
                           "--multi-latent-attention")
        self.assertRefused(1, DEEPSEEK[:-1] + MODULES + ["moe_act"], "moe_act",
                           "--moe-grouped-gemm")
        self.assertRefused(1, ["--moe-layer-recompute"] + FULL_UNIFORM_1,
                           "--moe-layer-recompute", "full")

    def test_distribute_saved_activations_refusals(self):
        # Megatron's assertions: TP > 1, full granularity with a method, no sequence parallelism.
        dist = ["--distribute-saved-activations"]
        for ranks, args, needle in (
                (1, FULL_UNIFORM_1 + dist, "across tensor model parallel groups"),
                (2, ["--tensor-model-parallel-size", "2"] + SELECTIVE + dist,
                 "only applicable to --recompute-granularity full"),
                (2, TP2_SP + FULL_UNIFORM_1 + dist, "sequence parallel")):
            proc = run(ranks, TINY + args)
            self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
            self.assertIn(needle, proc.stderr)

    def test_deprecated_alias_against_full(self):
        self.assertRefused(1, ["--recompute-activations"] + FULL_UNIFORM_1,
                           "--recompute-activations", "contradicts --recompute-granularity full")

    def test_flags_in_help_and_dump(self):
        proc = subprocess.run([MEGATRON, "train", "--help"], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for flag in ("--recompute-granularity", "--recompute-method", "--recompute-num-layers",
                     "--recompute-activations"):
            self.assertIn(flag, proc.stdout)
        # The deprecated alias shows as what it means.
        proc = run(1, TINY + ["--recompute-activations"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertRegex(proc.stdout, r"recompute_granularity \.+ selective")
        self.assertRegex(proc.stdout, r"recompute_method \.+ None")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
