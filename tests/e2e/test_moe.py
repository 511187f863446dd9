#!/usr/bin/env python3
"""Mixture of Experts end to end: parallel layouts, capacity, resharding, Mixtral import, refusals,
upcycling a dense checkpoint.

What it is: `megatron train` on mock data with a tiny Llama-style MoE model (4 experts, top-2,
aux loss 1e-2, z-loss 1e-3, dropout on), as one process and under mpiexec:
  - Layouts: expert parallelism ep2, ep4; ep2 with tp2 + sequence parallelism at expert TP 2 and
    1; expert TP 2 alone; ep2 with pp2; ep2 with the distributed optimizer; the alltoall
    dispatcher at ep2 and ep2 + tp2 (etp 1); ep2 with context parallelism 2, also with
    --calculate-per-token-loss; every second layer MoE on interleaved pp2 x ep2 stages with
    overlapped bucket reductions and the distributed optimizer: the same global batch, so the lm loss, the logged
    load_balancing_loss and z_loss and the grad norm must follow the single-process curve over 12
    iterations within 1e-5 relative (cross-rank sums add the same f32 partial sums in another
    order; a wrong expert shard, reduction group or scale moves the 3rd digit).
  - bf16: the curve follows f32's, and ep2's (both dispatchers) the single bf16 run's, within
    bf16's rounding (TestBf16 states the tolerances).
  - Capacity (--moe-expert-capacity-factor 0.5, tokens dropped): Megatron drops per rank from
    the rank's own tokens before any exchange, so the layouts whose ranks hold the single run's
    micro-batch (dp2, ep2, which carves EP out of DP) drop the same tokens and follow its curve,
    while tp2 + sequence parallelism (each rank routes half the sequence, with half the capacity)
    drops others and does not; and the capacity run differs from the dropless one (tokens were
    dropped at all).
  - Resharding: a checkpoint saved at ep2 x tp2 (4 ranks) loads at ep1 (one process) and at ep4
    (4 ranks, tp1), with the plain and the distributed optimizer, and the next iteration's loss
    equals the uninterrupted ep2 x tp2 run's within 1e-5 relative (expert weights are saved under
    their global index, so every layout finds them).
  - Hugging Face Mixtral (the PyTorch oracle's tiny model): --pretrained-checkpoint trains from it
    at ep2, and `megatron convert` of the trained checkpoint writes a Mixtral directory holding
    exactly the trained router and experts, which trains again as a pretrained checkpoint.
  - Bad input: Megatron's validate_args checks for MoE, each an exit 2 on every rank with a
    message naming the flag.
  - Hybrid Mamba models with MoE layers (E in --hybrid-override-pattern): the layouts above
    against one process, an ep2 x tp2 checkpoint resumed at ep1, the pattern's refusals.
What it is not: the router math (tests/transformer/test_moe_routing.cpp), the per-layer gradients
(test_layers.cpp), or the PyTorch comparison (tests/models/test_gpt_hf_oracle.cpp).

Usage: test_moe.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import json
import os
import re
import subprocess
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
TIMEOUT_S = 240
ITERS = 12
TMP = None

MOE = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
       "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
       "--global-batch-size", "4", "--train-iters", str(ITERS), "--log-interval", "1",
       "--lr", "2e-3", "--lr-warmup-iters", "3", "--eval-iters", "2", "--eval-interval", "100",
       "--num-threads", "1", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
       "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
       "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
       "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3"]
TP, PP, EP, ETP = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                   "--expert-model-parallel-size", "--expert-tensor-parallel-size")
SP, DISTOPT, A2A = ("--sequence-parallel", "--use-distributed-optimizer",
                    ["--moe-token-dispatcher-type", "alltoall"])
FIELDS = ("lm loss", "load_balancing_loss", "z_loss", "grad norm")
# 1e-5 relative: see the module comment.
RTOL = 1e-5


with_flags = megatron_job.with_flags


def run(ranks, *args, expect_rc=0):
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, with_flags(MOE, args), TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def training_flags():
    """MOE without its model flags: what a run resuming with --use-checkpoint-args passes."""
    valued = {"--num-layers", "--hidden-size", "--num-attention-heads",
              "--position-embedding-type", "--normalization", "--num-experts",
              "--moe-router-topk", "--moe-ffn-hidden-size"}
    switches = {"--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"}
    out, i = [], 0
    while i < len(MOE):
        if MOE[i] in valued:
            i += 2
            continue
        if MOE[i] not in switches:
            out.append(MOE[i])
        i += 1
    return out


def oracle_model(arch):
    """A Hugging Face directory of the PyTorch oracle's tiny `arch` (tests/reference)."""
    oracle = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference",
                          "hf_oracle.py")
    out = tempfile.mkdtemp(prefix=arch + "_", dir=TMP.name)
    subprocess.run(["/usr/bin/python3", oracle, "--arch", arch, "--out", out],
                   check=True, capture_output=True, timeout=TIMEOUT_S)
    return os.path.join(out, "model")


def train_nemotron_h_and_convert_back(test, arch, *extra):
    """The oracle's `arch` NemotronH trained 2 iterations at ep2 from --pretrained-checkpoint,
    then `megatron convert` back to Hugging Face: (the oracle's directory, the training run, the
    checkpoint, the converted directory, its config.json)."""
    hf = oracle_model(arch)
    ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
    args = ["--model", "mamba", "--mock-data", "--pretrained-checkpoint", hf,
            "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "2",
            "--train-iters", "2", "--eval-iters", "0", "--num-threads", "1",
            "--save", ck, "--log-interval", "1", EP, "2", "--tokenizer-type", "NullTokenizer",
            *extra]
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, 2, args, TIMEOUT_S)
    test.assertEqual(proc.returncode, 0, proc.stdout[-2000:] + proc.stderr[-2000:])
    back = tempfile.mkdtemp(prefix=arch + "_back_", dir=TMP.name)
    conv = subprocess.run([MEGATRON, "convert", "--model", "mamba", "--load", ck,
                           "--save-hf", back], capture_output=True, text=True, timeout=TIMEOUT_S)
    test.assertEqual(conv.returncode, 0, conv.stdout[-2000:] + conv.stderr[-2000:])
    with open(os.path.join(back, "config.json")) as f:
        cfg = json.load(f)
    return hf, proc, ck, back, cfg


def curve(proc):
    """{iteration: {field: float}} of the fields that must follow the single-process run."""
    return {it: {k: float(v) for k, v in f.items() if k in FIELDS}
            for it, f in megatron_log.iteration_lines(proc.stdout).items()}


def worst(got, want):
    """The largest relative difference of any field of any iteration."""
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    return max(abs(got[it][k] / want[it][k] - 1) for it in want for k in want[it])


_single = {}


def single(*flags):
    key = tuple(flags)
    if key not in _single:
        _single[key] = curve(run(1, *flags))
    return _single[key]


class TestLayouts(unittest.TestCase):
    LAYOUTS = [  # (name, ranks, flags, single-process flags)
        ("ep2", 2, [EP, "2"], []),
        ("ep4", 4, [EP, "4"], []),
        ("ep2 tp2+sp etp2", 4, [EP, "2", TP, "2", SP], []),
        ("ep2 tp2+sp etp1", 4, [EP, "2", TP, "2", SP, ETP, "1"], []),
        ("etp2", 2, [ETP, "2"], []),
        ("ep2 pp2", 4, [EP, "2", PP, "2"], []),
        ("ep2 dp4 distributed optimizer", 4, [EP, "2", DISTOPT], []),
        # Two distributed-optimizer instances: dense buckets over halves of the 4 data-parallel
        # ranks, expert buckets over halves of the 2 expert-data-parallel ranks, each shard then
        # summed across the instances.
        ("ep2 dp4 distributed optimizer, 2 instances", 4,
         [EP, "2", DISTOPT, "--num-distributed-optimizer-instances", "2"], []),
        # ... and at dp8, where each instance's 2 expert-data-parallel ranks reduce-scatter too.
        ("ep2 dp8 distributed optimizer, 2 instances", 8,
         [EP, "2", DISTOPT, "--num-distributed-optimizer-instances", "2", "--global-batch-size",
          "8"], ["--global-batch-size", "8"]),
        ("alltoall ep2", 2, [EP, "2", *A2A], A2A),
        ("alltoall ep2 tp2+sp etp1", 4, [EP, "2", TP, "2", SP, ETP, "1", *A2A], A2A),
        # Context parallelism: the losses' counts sum over TP x CP and each CP rank's share of
        # their gradient is weighted by CP (the data-parallel average divides by it).
        ("cp2 ep2", 4, ["--context-parallel-size", "2", EP, "2"], []),
        ("cp2 ep2 per-token loss", 4, ["--context-parallel-size", "2", EP, "2",
                                       "--calculate-per-token-loss"],
         ["--calculate-per-token-loss"]),
        # Benchmark routing on random logits, drawn per token of the micro-batch (the same in
        # every layout), and Llama 4's top-1 sigmoid routing with the probabilities on the
        # experts' input.
        ("forced load balancing, ep2 tp2+sp etp1", 4,
         [EP, "2", TP, "2", SP, ETP, "1", "--moe-router-force-load-balancing"],
         ["--moe-router-force-load-balancing"]),
        ("probabilities on the input, top-1 sigmoid, ep2 tp2+sp", 4,
         [EP, "2", TP, "2", SP, "--moe-apply-probs-on-input", "--moe-router-topk", "1",
          "--moe-router-score-function", "sigmoid"],
         ["--moe-apply-probs-on-input", "--moe-router-topk", "1", "--moe-router-score-function",
          "sigmoid"]),
        # Dense and MoE layers alternating, on interleaved pipeline stages, with overlapped
        # reductions of small (dense and expert) buckets and the distributed optimizer.
        ("moe every 2nd layer, pp2 interleaved ep2 overlapped distributed", 4,
         ["--moe-layer-freq", "([1,0]*2)", PP, "2", "--num-layers-per-virtual-pipeline-stage",
          "1", EP, "2", "--overlap-grad-reduce", "--ddp-bucket-size", "2000", DISTOPT],
         ["--moe-layer-freq", "([1,0]*2)"]),
    ]

    def test_every_layout_follows_the_single_process_curve(self):
        for name, ranks, flags, base in self.LAYOUTS:
            with self.subTest(layout=name):
                want = single(*base)
                self.assertEqual(sorted(want), list(range(1, ITERS + 1)))
                self.assertTrue(all(want[it]["load_balancing_loss"] > 0.5 for it in want))
                got = curve(run(ranks, *flags))
                rel = worst(got, want)
                print(f"{name}: worst relative difference {rel:.1e}", file=sys.stderr)
                self.assertLess(rel, RTOL)

    def test_alltoall_equals_allgather(self):
        # Only the routed rows move instead of every token: the same numbers.
        self.assertLess(worst(single(*A2A), single()), RTOL)


class TestLatentMoe(unittest.TestCase):
    """Megatron core 0.19's LatentMoE (--moe-latent-size, Nemotron 3): the routed experts at width
    16 between fc1_latent_proj and fc2_latent_proj (replicated over TP, their gradients summed
    over it under sequence parallelism), the router and the shared experts at the hidden size.
    A different model from the plain MoE one; every layout follows one process; an ep2 tp2+sp
    checkpoint resumes at ep1 on the straight run's iteration 7, and loading it with another width
    exits 2 naming moe_latent_size."""
    LATENT = ["--moe-latent-size", "16", "--moe-shared-expert-intermediate-size", "32"]
    LAYOUTS = [("ep2", 2, [EP, "2"]),
               ("ep2 tp2+sp etp1", 4, [EP, "2", TP, "2", SP, ETP, "1"]),
               ("tp2+sp etp2", 2, [TP, "2", SP]),
               ("alltoall ep2 tp2+sp", 4, [EP, "2", TP, "2", SP, *A2A]),
               ("ep2 pp2 distributed optimizer", 4, [EP, "2", PP, "2", DISTOPT])]

    def test_layouts_follow_the_single_process_curve(self):
        want = single(*self.LATENT)
        self.assertEqual(sorted(want), list(range(1, ITERS + 1)))
        shared_only = ["--moe-shared-expert-intermediate-size", "32"]
        self.assertGreater(worst(want, single(*shared_only)), 1e-3)
        for name, ranks, flags in self.LAYOUTS:
            with self.subTest(layout=name):
                rel = worst(curve(run(ranks, *self.LATENT, *flags)), want)
                print(f"latent {name}: worst relative difference {rel:.1e}", file=sys.stderr)
                self.assertLess(rel, RTOL)
        proc = run(1, "--moe-latent-size", "-1", *shared_only, expect_rc=2)
        self.assertIn("--moe-latent-size", proc.stderr)

    def test_fp8_projections_follow_bf16(self):
        # Under --fp8-format the projections run in FP8 beside the experts (Megatron's
        # TELinears in the layer's autocast): within the 5% of bf16 of TestFp8, in one process
        # and at ep2, and not bf16's curve.
        bf16 = curve(run(1, *self.LATENT, "--bf16"))
        fp8 = [*self.LATENT, "--bf16", "--fp8-format", "hybrid"]
        one = curve(run(1, *fp8))
        rel = max(abs(one[it]["lm loss"] / bf16[it]["lm loss"] - 1) for it in bf16)
        self.assertLess(rel, 0.05)
        self.assertGreater(worst(one, bf16), 0)
        # At ep2 the amaxes pair other experts (see TestFp8): the same 5% of bf16.
        ep2 = curve(run(2, *fp8, EP, "2"))
        self.assertLess(max(abs(ep2[it]["lm loss"] / bf16[it]["lm loss"] - 1) for it in bf16),
                        0.05)

    def test_checkpoint_reshards_and_keeps_the_width(self):
        saved = [*self.LATENT, EP, "2", TP, "2", SP, ETP, "1"]
        want = curve(run(4, *saved))[7]
        ck = tempfile.mkdtemp(prefix="ck_latent_", dir=TMP.name)
        run(4, *saved, "--save", ck, "--exit-interval", "6")
        got = curve(run(1, *self.LATENT, "--load", ck, "--exit-interval", "7"))
        self.assertEqual(sorted(got), [7])
        self.assertLess(max(abs(got[7][k] / want[k] - 1) for k in want), RTOL)
        proc = run(1, "--moe-latent-size", "8", "--moe-shared-expert-intermediate-size", "32",
                   "--load", ck, "--exit-interval", "7", expect_rc=2)
        self.assertIn("moe_latent_size", proc.stderr)


class TestSharedExpertGate(unittest.TestCase):
    """Megatron core 0.19's --moe-shared-expert-gate (Qwen2-MoE's shared_expert_gate): the shared
    experts' output scaled per token by sigmoid(x gate_weight), gate_weight [1, h] replicated over
    TP (its gradient summed over TP under sequence parallelism). A different curve from the
    ungated model; every layout follows one process. The oracle's Qwen2-MoE (q/k/v biases, a
    dense first layer, pre-softmax top-2, the gated shared expert) trains from Hugging Face at
    ep2 and converts back with the trained gate under Qwen2-MoE's names."""
    GATED = ["--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate"]
    LAYOUTS = [("ep2", 2, [EP, "2"]),
               ("tp2+sp etp2", 2, [TP, "2", SP]),
               ("ep2 tp2+sp etp1", 4, [EP, "2", TP, "2", SP, ETP, "1"]),
               ("alltoall ep2 tp2+sp", 4, [EP, "2", TP, "2", SP, *A2A]),
               ("ep2 pp2 distributed optimizer", 4, [EP, "2", PP, "2", DISTOPT])]

    def test_layouts_follow_the_single_process_curve(self):
        want = single(*self.GATED)
        self.assertEqual(sorted(want), list(range(1, ITERS + 1)))
        self.assertGreater(worst(want, single(*self.GATED[:2])), 1e-3)
        for name, ranks, flags in self.LAYOUTS:
            with self.subTest(layout=name):
                rel = worst(curve(run(ranks, *self.GATED, *flags)), want)
                print(f"gated shared experts {name}: worst relative difference {rel:.1e}",
                      file=sys.stderr)
                self.assertLess(rel, RTOL)

    def test_qwen2_moe_trains_at_ep2_and_converts_back(self):
        hf = oracle_model("qwen2-moe")
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        args = ["--mock-data", "--pretrained-checkpoint", hf, "--seq-length", "16",
                "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2",
                "--lr", "1e-3", "--eval-iters", "0", "--num-threads", "1", "--save", ck,
                "--log-interval", "1", "--disable-bias-linear", EP, "2",
                "--tokenizer-type", "NullTokenizer"]
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, 2, args, TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stdout[-2000:] + proc.stderr[-2000:])
        self.assertIn("loaded pretrained weights", proc.stdout)
        back = os.path.join(TMP.name, "qwen2_moe_back")
        conv = subprocess.run([MEGATRON, "convert", "--load", ck, "--save-hf", back],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertEqual(conv.returncode, 0, conv.stdout[-2000:] + conv.stderr[-2000:])
        with open(os.path.join(back, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["model_type"], "qwen2_moe")
        self.assertEqual(cfg["shared_expert_intermediate_size"], 40)
        self.assertEqual(cfg["mlp_only_layers"], [0])
        self.assertTrue(cfg["qkv_bias"])
        self.assertFalse(cfg["norm_topk_prob"])
        _, trained = checkpoint_reader.read_checkpoint(ck)
        hf_in, _ = checkpoint_reader.read_safetensors(os.path.join(hf, "model.safetensors"))
        hf_out, _ = checkpoint_reader.read_safetensors(os.path.join(back, "model.safetensors"))
        self.assertEqual(sorted(hf_in), sorted(hf_out))
        gate = "model.layers.1.mlp.shared_expert_gate.weight"
        ours = trained["model.decoder.layers.1.mlp.shared_experts.gate_weight"]
        self.assertTrue(np.array_equal(hf_out[gate], ours))
        self.assertFalse(np.array_equal(hf_out[gate], hf_in[gate]))  # it was trained
        fc1 = trained["model.decoder.layers.1.mlp.shared_experts.linear_fc1.weight"]
        self.assertTrue(np.array_equal(hf_out["model.layers.1.mlp.shared_expert.gate_proj.weight"],
                                       fc1[:40]))
        self.assertTrue(np.array_equal(hf_out["model.layers.1.mlp.shared_expert.up_proj.weight"],
                                       fc1[40:]))


class TestBf16(unittest.TestCase):
    """bf16 training (the experts' grouped GEMMs in bf16, tokens moved in bf16): against f32 and
    across expert parallelism. bf16 rounds weights and GEMM inputs to 8 bits (2^-9 relative);
    averaged over a loss's thousands of terms that moves the losses by about 2e-4 relative over 12
    iterations (measured: bf16 vs f32 2.4e-4, ep2 vs one process in bf16 1.8e-4), so 1e-3. The
    grad norm, a sum of squares dominated by a few large entries, moves more (measured 1e-2 and
    2e-3): 3e-2 and 1e-2. A wrong expert, shard or dtype conversion moves the losses by 1e-2 and
    more."""
    LOSSES = ("lm loss", "load_balancing_loss", "z_loss")

    def check(self, got, want, tol_loss, tol_norm):
        self.assertEqual(sorted(got), sorted(want))
        for k in FIELDS:
            rel = max(abs(got[it][k] / want[it][k] - 1) for it in want)
            print(f"  {k}: worst relative difference {rel:.1e}", file=sys.stderr)
            self.assertLess(rel, tol_loss if k in self.LOSSES else tol_norm, k)

    def test_bf16_follows_f32(self):
        self.check(single("--bf16"), single(), 1e-3, 3e-2)

    def test_ep2_bf16_follows_one_process(self):
        self.check(curve(run(2, "--bf16", EP, "2")), single("--bf16"), 1e-3, 1e-2)
        self.check(curve(run(2, "--bf16", EP, "2", *A2A)), single("--bf16"), 1e-3, 1e-2)


class TestFp8(unittest.TestCase):
    """--fp8-format hybrid on the experts' grouped GEMMs (a scaling state per expert GEMM, each
    expert's rows quantised with its own scale), the shared experts and attention. Against bf16:
    within 5% over the 12 iterations (FP8 rounds GEMM inputs to 3 or 2 mantissa bits; measured
    7.9e-4 in one process, 6.7e-4 at ep2), and not equal to it. At ep2 the amaxes are reduced over TP x DP x CP
    position by position, as Transformer Engine's reduction does, which pairs local expert i of
    one EP rank with local expert i of the other: the scales differ from one process's, so the
    curve is compared with the same 5%. The ep2 checkpoint holds every expert's state, each
    written once, and resumes exactly. --moe-router-padding-for-fp8 moves the FP8 curve (the
    padded rows enter the amaxes) within the same 5%."""

    def test_fp8_experts_train_and_resume(self):
        fp8 = ["--bf16", "--fp8-format", "hybrid", "--moe-shared-expert-intermediate-size", "64"]
        bf16 = single("--bf16", "--moe-shared-expert-intermediate-size", "64")
        one = single(*fp8)
        ep2 = curve(run(2, *fp8, EP, "2"))
        for name, got in (("one process", one), ("ep2", ep2)):
            rel = max(abs(got[it]["lm loss"] / bf16[it]["lm loss"] - 1) for it in bf16)
            print(f"fp8 {name} vs bf16: worst lm loss difference {rel:.1e}", file=sys.stderr)
            self.assertLess(rel, 0.05, name)
            self.assertGreater(rel, 0, name)
        ck = tempfile.mkdtemp(prefix="fp8_", dir=TMP.name)
        run(2, *fp8, EP, "2", "--save", ck, "--save-interval", "6", "--exit-interval", "6")
        _, tensors = checkpoint_reader.read_checkpoint(ck)
        experts = sorted(k for k in tensors if ".local_experts." in k and k.endswith("fp8_scale"))
        # 4 layers x 4 experts x (fc1, fc2), across both EP ranks.
        self.assertEqual(len(experts), 32, experts)
        shared = [k for k in tensors if "shared_experts" in k and k.endswith("fp8_scale")]
        self.assertEqual(len(shared), 8, shared)
        resumed = curve(run(2, *fp8, EP, "2", "--load", ck))
        self.assertEqual({it: resumed[it] for it in range(7, ITERS + 1)},
                         {it: ep2[it] for it in range(7, ITERS + 1)})


    def test_router_padding_for_fp8(self):
        # At ep2 with the alltoall dispatcher each expert's rows from a rank are padded to a
        # multiple of 16 with probability-0 tokens: they add nothing to the output (exactly so
        # without FP8: test_layers.cpp) but enter the expert GEMMs' amaxes, so the curve leaves
        # the unpadded FP8 run's while staying within the 5% of bf16 stated above.
        fp8 = ["--bf16", "--fp8-format", "hybrid", *A2A, EP, "2"]
        bf16 = single("--bf16")
        plain = curve(run(2, *fp8))
        ck = tempfile.mkdtemp(prefix="pad_", dir=TMP.name)
        padded = curve(run(2, *fp8, "--moe-router-padding-for-fp8", "--save", ck,
                           "--save-interval", str(ITERS)))
        self.assertGreater(worst(padded, plain), 0, "the padded rows changed no amax")
        rel = max(abs(padded[it]["lm loss"] / bf16[it]["lm loss"] - 1) for it in bf16)
        self.assertLess(rel, 0.05)
        # An FP8 setting, not the model's: the checkpoint generates in bf16 without it, and in
        # FP8 with it (Megatron's dispatcher pads in inference too).
        for extra in ([], ["--fp8-format", "hybrid", *A2A, "--moe-router-padding-for-fp8"]):
            proc = megatron_job.run_train(
                MEGATRON, MPIEXEC, 1, ["--load", ck, "--tokenizer-type", "NullTokenizer",
                                       "--vocab-size", "128", "--prompts", "1 4 7",
                                       "--num-tokens-to-generate", "4", "--bf16", *extra],
                TIMEOUT_S, "generate")
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
            self.assertIn('"tokens"', proc.stdout.strip().splitlines()[-1])


    def test_block_scaled_recipes_on_the_experts(self):
        # mxfp8 and blockwise quantise each expert's rows in blocks (MXFP8's 32-row column blocks
        # stop at each expert's last row, as TE's zero padding of the rows leaves them), at ep2
        # with the alltoall dispatcher and --moe-router-padding-for-fp8 (which pads to 32 for
        # mxfp8, Megatron's get_fp8_align_size): within the 5% of bf16 stated above, and not the
        # per-tensor curve.
        base = ["--bf16", "--fp8-format", "hybrid", *A2A, EP, "2", "--moe-router-padding-for-fp8"]
        bf16 = single("--bf16")
        tensorwise = curve(run(2, *base, "--fp8-recipe", "tensorwise"))
        for recipe in ("mxfp8", "blockwise"):
            got = curve(run(2, *base, "--fp8-recipe", recipe))
            rel = max(abs(got[it]["lm loss"] / bf16[it]["lm loss"] - 1) for it in bf16)
            print(f"{recipe} experts vs bf16: worst lm loss difference {rel:.1e}", file=sys.stderr)
            self.assertLess(rel, 0.05, recipe)
            self.assertGreater(worst(got, tensorwise), 0, recipe)


class TestCapacity(unittest.TestCase):
    def test_layouts_with_the_same_local_tokens_drop_the_same(self):
        cap = ["--moe-expert-capacity-factor", "0.5"]
        want = single(*cap)
        self.assertGreater(worst(want, single()), 1e-3, "capacity 0.5 dropped nothing")
        for name, ranks, flags in [("dp2", 2, []), ("ep2", 2, [EP, "2"])]:
            with self.subTest(layout=name):
                self.assertLess(worst(curve(run(ranks, *cap, *flags)), want), RTOL)
        # Each TP rank routes s / 2 tokens with half the capacity: other tokens are dropped.
        other = curve(run(2, *cap, TP, "2", SP))
        self.assertGreater(worst(other, want), 1e-4)


class TestResharding(unittest.TestCase):
    def test_ep2_tp2_checkpoint_loads_at_ep1_and_ep4(self):
        saved = [EP, "2", TP, "2", SP]
        for opt in ([], [DISTOPT]):
            with self.subTest(optimizer="distributed" if opt else "plain"):
                want = curve(run(4, *saved, *opt))[7]
                ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
                run(4, *saved, *opt, "--save", ck, "--exit-interval", "6")
                for name, ranks, flags in [("ep1", 1, []), ("ep4", 4, [EP, "4"]),
                                           ("ep2 tp2 (saved)", 4, saved)]:
                    got = curve(run(ranks, *flags, *opt, "--load", ck, "--exit-interval", "7"))
                    self.assertEqual(sorted(got), [7], name)
                    rel = max(abs(got[7][k] / want[k] - 1) for k in want)
                    print(f"reshard to {name}{' distributed' if opt else ''}: iteration 7 "
                          f"relative {rel:.1e}", file=sys.stderr)
                    self.assertLess(rel, RTOL, name)


    def test_checkpoint_of_two_optimizer_instances_loads_at_one(self):
        # ep2 dp4 with two distributed-optimizer instances: instance 0 writes the dense and the
        # expert shards (each instance holds them all); ep1 on one rank, ep4 and the saved layout
        # take the next step to the straight run's iteration 7.
        saved = [EP, "2", DISTOPT, "--num-distributed-optimizer-instances", "2"]
        want = curve(run(4, *saved))[7]
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        run(4, *saved, "--save", ck, "--exit-interval", "6")
        for name, ranks, flags in [("ep1", 1, []), ("ep4", 4, [EP, "4", DISTOPT]),
                                   ("ep2 two instances (saved)", 4, saved)]:
            got = curve(run(ranks, *flags, "--load", ck, "--exit-interval", "7"))
            self.assertEqual(sorted(got), [7], name)
            rel = max(abs(got[7][k] / want[k] - 1) for k in want)
            print(f"reshard to {name}: iteration 7 relative {rel:.1e}", file=sys.stderr)
            self.assertLess(rel, RTOL, name)


class TestHybridMamba(unittest.TestCase):
    """MoE layers in a hybrid Mamba model (pretrain_mamba, Megatron core 0.16's E symbol): the
    same experts, router and losses as GPT's MoE layers, one per E of the pattern, between Mamba
    and attention layers."""
    HYBRID = ["--model", "mamba", "--hybrid-override-pattern", "ME*E", "--mamba-state-dim", "8",
              "--mamba-head-dim", "16", "--mamba-num-groups", "4"]
    # The pattern puts an E layer on each stage of pp2; cp2 runs the mixers' all-to-all beside
    # the experts' exchange.
    LAYOUTS = [("ep2", 2, [EP, "2"]),
               ("ep2 tp2+sp etp1", 4, [EP, "2", TP, "2", SP, ETP, "1"]),
               ("ep2 pp2", 4, [EP, "2", PP, "2"]),
               ("ep2 dp4 distributed optimizer", 4, [EP, "2", DISTOPT]),
               ("ep2 alltoall", 2, [EP, "2", *A2A]),
               ("ep2 cp2", 4, [EP, "2", "--context-parallel-size", "2"])]

    def test_layouts_follow_the_single_process_curve(self):
        want = single(*self.HYBRID)
        self.assertEqual(sorted(want), list(range(1, ITERS + 1)))
        # Two MoE layers' losses logged (averaged over them, as GPT's), and a different model
        # from the GPT one of the same flags.
        self.assertTrue(all(want[it]["load_balancing_loss"] > 0.5 for it in want))
        self.assertGreater(worst(want, single()), 1e-3)
        for name, ranks, flags in self.LAYOUTS:
            with self.subTest(layout=name):
                rel = worst(curve(run(ranks, *self.HYBRID, *flags)), want)
                print(f"hybrid {name}: worst relative difference {rel:.1e}", file=sys.stderr)
                self.assertLess(rel, RTOL)

    def test_checkpoint_reshards_and_refusals(self):
        # Saved at ep2 x tp2, the next iteration at ep1 in one process equals the uninterrupted
        # run's (the E layers' experts under their global index, the mixers' blocks resharded);
        # that run gives no model flag: --use-checkpoint-args restores the pattern, the Mamba
        # sizes and the experts' flags (not a --moe-layer-freq, which would be refused).
        saved = [*self.HYBRID, EP, "2", TP, "2", SP]
        want = curve(run(4, *saved))[7]
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        run(4, *saved, "--save", ck, "--exit-interval", "6")
        training = training_flags()
        resumed = megatron_job.run_train(
            MEGATRON, MPIEXEC, 1,
            [*training, "--load", ck, "--exit-interval", "7", "--use-checkpoint-args"],
            TIMEOUT_S)
        self.assertEqual(resumed.returncode, 0, resumed.stderr[-2000:])
        self.assertIn("ME*E", resumed.stdout)  # the restored pattern, as allocated
        got = curve(resumed)
        self.assertEqual(sorted(got), [7])
        self.assertLess(max(abs(got[7][k] / want[k] - 1) for k in want), RTOL)
        # The MoE layers are exactly the E layers: each mismatch exits 2 naming the flag.
        for flags, text in (
                (["--num-experts", "0", "--moe-ffn-hidden-size", "0"],
                 "has E (Mixture of Experts) layers: set --num-experts"),
                (["--hybrid-override-pattern", "M*M-"], "has no E (Mixture of Experts) layer"),
                (["--moe-layer-freq", "2"], "--moe-layer-freq 2 does not apply"),
                (["--hybrid-attention-ratio", "0.25"], "must hold as many of each layer type")):
            with self.subTest(flags=" ".join(flags)):
                proc = run(2, *self.HYBRID, *flags, expect_rc=2)
                self.assertIn(text, proc.stderr)
                for r in range(2):
                    self.assertIn(f"[rank {r}]", proc.stderr)


    def test_dense_hybrid_upcycles_into_e_layers(self):
        # --moe-use-upcycling from a dense hybrid checkpoint ("ME*-" with an MLP layer where the
        # MoE run has E, an extension of Megatron's upcycling): top-2 of 4 copies of the MLP
        # with probabilities summing to 1 is the dense model, so the validation losses agree
        # (1e-5 relative, the f32 sums as the layouts' tolerance); the pattern must otherwise be
        # the checkpoint's.
        dense = [a for a in with_flags(MOE, [*self.HYBRID, "--hybrid-override-pattern", "M-*-",
                                             "--ffn-hidden-size", "64", "--eval-iters", "2"])]
        for flag in ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                     "--moe-aux-loss-coeff", "--moe-z-loss-coeff"):
            i = dense.index(flag)
            del dense[i:i + 2]
        ck = tempfile.mkdtemp(prefix="dense_hybrid_", dir=TMP.name)
        for args in ([*dense, "--save", ck], [*dense, "--load", ck, "--skip-train"]):
            proc = megatron_job.run_train(MEGATRON, MPIEXEC, 1, args, TIMEOUT_S)
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        want = [float(f["lm loss value"]) for _, f in megatron_log.validation_lines(proc.stdout)]
        self.assertEqual(len(want), 2)
        up = run(1, *self.HYBRID, "--hybrid-override-pattern", "ME*E", "--load", ck, "--save",
                 os.path.join(TMP.name, "upcycled_hybrid"), "--moe-use-upcycling",
                 "--skip-train", "--eval-iters", "2")
        got = [float(f["lm loss value"]) for _, f in megatron_log.validation_lines(up.stdout)]
        self.assertEqual(len(got), 2)
        print(f"upcycled hybrid: validation {got} against dense {want}", file=sys.stderr)
        for g, w in zip(got, want):
            self.assertAlmostEqual(g, w, delta=1e-5 * w)
        bad = run(1, *self.HYBRID, "--hybrid-override-pattern", "MEME", "--load", ck, "--save",
                  os.path.join(TMP.name, "upcycled_bad"), "--moe-use-upcycling", expect_rc=2)
        self.assertIn("the hybrid pattern 'MEME' must be the dense checkpoint's 'M-*-'",
                      bad.stderr)

    def test_nemotron_h_moe_trains_at_ep2_and_converts_back(self):
        # The PyTorch oracle's NemotronH with MoE layers ("ME*-E", tests/reference/hf_oracle.py):
        # --pretrained-checkpoint takes the model (its layers_block_type), its experts and router
        # flags from config.json (no --moe-layer-freq: the E layers), trains at ep2 with the expert bias updated
        # (aux-loss-free balancing), and `megatron convert` writes the trained router, bias and
        # experts back under NemotronH's names, exactly.
        hf, proc, ck, back, cfg = train_nemotron_h_and_convert_back(self, "nemotron-h-moe",
                                                                     "--lr", "1e-4")
        self.assertIn("loaded pretrained weights", proc.stdout)
        self.assertIn("ME*-E", proc.stdout)
        self.assertEqual((cfg["hybrid_override_pattern"], cfg["n_routed_experts"],
                          cfg["routed_scaling_factor"], cfg["norm_topk_prob"]),
                         ("ME*-E", 4, 2.5, True))
        _, trained = checkpoint_reader.read_checkpoint(ck)
        hf_in, _ = checkpoint_reader.read_safetensors(os.path.join(hf, "model.safetensors"))
        hf_out, _ = checkpoint_reader.read_safetensors(os.path.join(back, "model.safetensors"))
        # Every tensor but the prediction layer's (mtp.*, skipped on import as Hugging Face's model
        # does; a checkpoint's export has none).
        self.assertEqual(sorted(hf_out), sorted(n for n in hf_in if not n.startswith("mtp.")))
        for layer in (1, 4):
            ours = f"model.decoder.layers.{layer}.mlp."
            theirs = f"backbone.layers.{layer}.mixer."
            for e in range(4):
                self.assertTrue(np.array_equal(
                    hf_out[theirs + f"experts.{e}.up_proj.weight"],
                    trained[ours + f"experts.local_experts.{e}.linear_fc1.weight"]), e)
                self.assertTrue(np.array_equal(
                    hf_out[theirs + f"experts.{e}.down_proj.weight"],
                    trained[ours + f"experts.local_experts.{e}.linear_fc2.weight"]), e)
            self.assertTrue(np.array_equal(hf_out[theirs + "gate.weight"],
                                           trained[ours + "router.weight"]))
            bias = hf_out[theirs + "gate.e_score_correction_bias"]
            self.assertTrue(np.array_equal(bias, trained[ours + "router.expert_bias"]))
            self.assertFalse(np.array_equal(bias, hf_in[theirs + "gate.e_score_correction_bias"]))


class TestMixtral(unittest.TestCase):
    def test_pretrained_mixtral_trains_at_ep2_and_converts_back(self):
        hf = oracle_model("mixtral")
        ck = tempfile.mkdtemp(prefix="ck_", dir=TMP.name)
        args = ["--mock-data", "--pretrained-checkpoint", hf, "--seq-length", "16",
                "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2",
                "--lr", "1e-4", "--eval-iters", "0", "--num-threads", "1", "--save", ck,
                "--log-interval", "1",
                "--disable-bias-linear", EP, "2", "--tokenizer-type", "NullTokenizer"]
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, 2, args, TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stdout[-2000:] + proc.stderr[-2000:])
        self.assertIn("loaded pretrained weights", proc.stdout)
        lines = megatron_log.iteration_lines(proc.stdout, range(1, 3))
        self.assertIn("lm loss", lines[1])
        back = os.path.join(TMP.name, "mixtral_back")
        conv = subprocess.run([MEGATRON, "convert", "--load", ck, "--save-hf", back],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertEqual(conv.returncode, 0, conv.stdout[-2000:] + conv.stderr[-2000:])
        with open(os.path.join(back, "config.json")) as f:
            cfg = f.read()
        self.assertIn('"mixtral"', cfg)
        self.assertIn('"num_local_experts": 4', cfg)
        # The trained experts and router (saved by two EP ranks) under Mixtral's names and
        # layouts: fc1 = [w1; w3], fc2 = w2, the router = gate, exactly.
        _, trained = checkpoint_reader.read_checkpoint(ck)
        hf_out, _ = checkpoint_reader.read_safetensors(os.path.join(back, "model.safetensors"))
        for e in range(4):
            ours = f"model.decoder.layers.1.mlp.experts.local_experts.{e}."
            theirs = f"model.layers.1.block_sparse_moe.experts.{e}."
            fc1 = trained[ours + "linear_fc1.weight"]
            self.assertTrue(np.array_equal(hf_out[theirs + "w1.weight"], fc1[:48]), e)
            self.assertTrue(np.array_equal(hf_out[theirs + "w3.weight"], fc1[48:]), e)
            self.assertTrue(np.array_equal(hf_out[theirs + "w2.weight"],
                                           trained[ours + "linear_fc2.weight"]), e)
        self.assertTrue(np.array_equal(hf_out["model.layers.1.block_sparse_moe.gate.weight"],
                                       trained["model.decoder.layers.1.mlp.router.weight"]))
        # The exported directory is a pretrained checkpoint again.
        again = megatron_job.run_train(
            MEGATRON, MPIEXEC, 1,
            ["--mock-data", "--pretrained-checkpoint", back, "--seq-length", "16",
             "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1",
             "--lr", "1e-4", "--eval-iters", "0", "--num-threads", "1",
             "--tokenizer-type", "NullTokenizer"], TIMEOUT_S)
        self.assertEqual(again.returncode, 0, again.stdout[-2000:] + again.stderr[-2000:])
        # `megatron score` reads the MoE model too: one JSON line per sequence.
        tokens = os.path.join(TMP.name, "tokens.txt")
        with open(tokens, "w") as f:
            f.write("1 2 3 4 5 6\n7 8 9 10\n")
        score = subprocess.run([MEGATRON, "score", "--pretrained-checkpoint", back, "--input",
                                tokens, "--num-threads", "1"], capture_output=True, text=True,
                               timeout=TIMEOUT_S)
        self.assertEqual(score.returncode, 0, score.stderr[-2000:])
        lines = [json.loads(l) for l in score.stdout.splitlines() if l.startswith("{")]
        self.assertEqual([len(l["logprobs"]) for l in lines], [5, 3])


class TestBadInput(unittest.TestCase):
    CASES = [  # (ranks, flags, text the message must contain)
        (1, ["--moe-router-topk", "5"], "--moe-router-topk"),
        (2, [EP, "3"], "--expert-model-parallel-size"),
        (2, ["--num-experts", "3", EP, "2"], "--expert-model-parallel-size"),
        (2, [EP, "4"], "--expert-model-parallel-size"),  # EP x ETP must divide the stage's ranks
        (1, ["--moe-router-load-balancing-type", "sinkhorn"], "--moe-aux-loss-coeff"),
        (1, ["--moe-router-enable-expert-bias"], "--moe-router-score-function sigmoid"),
        (1, ["--moe-router-topk", "1"], "--moe-router-pre-softmax"),
        (1, ["--moe-router-num-groups", "3", "--moe-router-group-topk", "1"],
         "--moe-router-num-groups"),
        (2, [TP, "2"], "--sequence-parallel"),
        (1, ["--moe-layer-freq", "[1,0]"], "--moe-layer-freq"),
        (1, ["--moe-token-dispatcher-type", "flex"], "--moe-token-dispatcher-type"),
        # MXFP8 wants the experts' GEMM dimensions divisible by 32 (TE's MXFP8Quantizer).
        (1, ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8",
             "--moe-ffn-hidden-size", "48"], "--moe-ffn-hidden-size"),
        (1, ["--moe-pad-expert-input-to-capacity"], "--moe-expert-capacity-factor"),
        (2, [EP, "2", "--fp16"], "fp16"),
        (1, ["--moe-shared-expert-overlap", "--moe-shared-expert-intermediate-size", "32"],
         "alltoall"),
        (1, ["--moe-router-padding-for-fp8", *A2A], "fp8 must be specified"),
        (1, ["--moe-router-padding-for-fp8", "--bf16", "--fp8-format", "hybrid"],
         "allgather and alltoall_seq dispatcher does not support"),
        # LatentMoE: with --moe-shared-expert-overlap (Megatron's training assertion) and a
        # width MXFP8 cannot take (the experts' GEMMs run at it).
        (1, ["--moe-latent-size", "16", "--moe-shared-expert-overlap", *A2A,
             "--moe-shared-expert-intermediate-size", "32"], "--moe-shared-expert-overlap"),
        (1, ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8",
             "--moe-latent-size", "48"], "--moe-latent-size"),
    ]

    def test_each_refusal_names_the_flag_on_every_rank(self):
        for ranks, flags, text in self.CASES:
            with self.subTest(flags=" ".join(flags)):
                proc = run(ranks, *flags, expect_rc=2)
                err = proc.stderr
                self.assertIn(text, err)
                for r in range(ranks if ranks > 1 else 0):
                    self.assertIn(f"[rank {r}]", err)
                for marker in megatron_job.CRASH_MARKERS:
                    self.assertNotIn(marker, err + proc.stdout)

    def test_latent_size_needs_experts(self):
        moe_flags = ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                     "--moe-aux-loss-coeff", "--moe-z-loss-coeff")
        dense = []
        for i, a in enumerate(MOE):  # MOE without the MoE flags and their values
            if a not in moe_flags and (i == 0 or MOE[i - 1] not in moe_flags):
                dense.append(a)
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, 1, [*dense, "--moe-latent-size", "16"],
                                      TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
        self.assertIn("--moe-latent-size needs --num-experts", proc.stderr)

    def test_shared_experts_need_no_bias(self):
        # Routers and experts take biases since Megatron core 0.19 (gpt-oss, tests/e2e/
        # test_gpt_oss.py); its SharedExpertMLP still asserts that there are none.
        args = [a for a in MOE if a != "--disable-bias-linear"]
        proc = megatron_job.run_train(
            MEGATRON, MPIEXEC, 1, args + ["--moe-shared-expert-intermediate-size", "32"],
            TIMEOUT_S)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("bias is not supported in the shared experts", proc.stderr)
        self.assertIn("--disable-bias-linear", proc.stderr)


class TestUpcycling(unittest.TestCase):
    """--moe-use-upcycling: a dense checkpoint becomes the MoE model (Megatron's upcycling)."""

    # The dense model of MOE: the same layers with one MLP of the experts' width.
    DENSE = [a for a in with_flags(MOE, ["--ffn-hidden-size", "64"])]

    @classmethod
    def dense(cls):
        drop = {"--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                "--moe-aux-loss-coeff", "--moe-z-loss-coeff"}
        out, skip = [], False
        for a in cls.DENSE:
            if skip:
                skip = False
                continue
            if a in drop:
                skip = True
                continue
            out.append(a)
        return out

    def validation(self, proc):
        return [float(f["lm loss value"]) for _, f in megatron_log.validation_lines(proc.stdout)]

    def test_dense_checkpoint_upcycles_into_the_same_model(self):
        dense_dir = os.path.join(TMP.name, "dense")
        dense = self.dense()
        train = megatron_job.run_train(MEGATRON, MPIEXEC, 1, [*dense, "--save", dense_dir],
                                       TIMEOUT_S)
        self.assertEqual(train.returncode, 0, train.stderr[-2000:])
        ref = megatron_job.run_train(MEGATRON, MPIEXEC, 1,
                                     [*dense, "--load", dense_dir, "--skip-train"], TIMEOUT_S)
        want = self.validation(ref)
        self.assertEqual(len(want), 2, ref.stdout[-2000:])  # validation and test sets
        # Granularity 1, softmax after the top 2: both chosen experts are the dense MLP and their
        # probabilities sum to 1, so the MoE model is the dense one up to the rounding of that
        # sum (1e-5 relative: the f32 sums, as the layouts' tolerance).
        for name, ranks, flags in [("ep1", 1, []), ("ep2", 2, [EP, "2"])]:
            with self.subTest(layout=name):
                out = os.path.join(TMP.name, "moe_" + name)
                proc = run(ranks, "--load", dense_dir, "--save", out, "--moe-use-upcycling",
                           "--skip-train", *flags)
                self.assertIn("Upcycled checkpoint saved to", proc.stdout)
                self.assertIn("Warning: disabling --no-load-optim for upcycling.", proc.stdout)
                got = self.validation(proc)
                self.assertEqual(len(got), 2)
                for g, w in zip(got, want):
                    self.assertAlmostEqual(g, w, delta=1e-5 * w)
                self.assertIn("validation loss at iteration 1 ", proc.stdout)
        # The next run trains the upcycled model from iteration 1, without the flag, its data
        # continuing after the dense run's 12 x 4 samples (Megatron's loader carries the consumed
        # samples over): a longer run (24 iterations' data) stopped at 8. With the flag the
        # existing checkpoint is refused.
        out = os.path.join(TMP.name, "moe_ep1")
        proc = run(1, "--load", out, "--no-load-optim", "--no-load-rng", "--train-iters", "24",
                   "--exit-interval", "8")
        lines = megatron_log.iteration_lines(proc.stdout)
        self.assertEqual(sorted(lines), list(range(2, 9)))
        self.assertEqual(int(lines[2]["consumed samples"]), ITERS * 4 + 4)
        again = run(1, "--load", dense_dir, "--save", out, "--moe-use-upcycling", expect_rc=2)
        self.assertIn("already holds a checkpoint", again.stderr)
        # Granularity 2 with softmax before the top-k (8 experts of half the width, Megatron's
        # scaling of the weights): a different function, which trains from there.
        fine = run(1, "--load", dense_dir, "--save", os.path.join(TMP.name, "moe_g2"),
                   "--moe-use-upcycling", "--num-experts", "8", "--moe-ffn-hidden-size", "32",
                   "--moe-upcycling-granularity", "2", "--moe-router-pre-softmax",
                   "--train-iters", "24", "--exit-interval", "10")
        losses = [float(f["lm loss"]) for _, f in
                  sorted(megatron_log.iteration_lines(fine.stdout).items())]
        self.assertLess(losses[-1], losses[0])
        # Its iteration-1 tensors against Megatron's _convert_to_moe_state_dict restated here:
        # activation scale E g / topk = 8 (pre-softmax), weights scaled by 8^(1/3) (SwiGLU);
        # expert e = fc1 rows of piece e % 2 of the gate and of the up projection, fc2 columns
        # of that piece; router rows 2k and 2k + 1 equal. f32 values scaled in f64 and rounded
        # once: 1e-6 relative.
        _, dense_t = checkpoint_reader.read_checkpoint(dense_dir)
        meta, moe_t = checkpoint_reader.read_checkpoint(
            os.path.join(TMP.name, "moe_g2", "iter_0000001"))
        self.assertEqual(meta["iteration"], 1)
        scale = (8 * 2 / 2) ** (1 / 3)
        for layer in range(4):
            p = f"model.decoder.layers.{layer}.mlp."
            fc1 = dense_t[p + "linear_fc1.weight"].astype(np.float64)  # [gate 64; up 64]
            fc2 = dense_t[p + "linear_fc2.weight"].astype(np.float64)  # [h, 64]
            for e in range(8):
                piece = e % 2
                want1 = scale * np.concatenate([fc1[32 * piece:32 * piece + 32],
                                                fc1[64 + 32 * piece:64 + 32 * piece + 32]])
                got1 = moe_t[p + f"experts.local_experts.{e}.linear_fc1.weight"]
                np.testing.assert_allclose(got1, want1, rtol=1e-6, atol=1e-9)
                want2 = scale * fc2[:, 32 * piece:32 * piece + 32]
                got2 = moe_t[p + f"experts.local_experts.{e}.linear_fc2.weight"]
                np.testing.assert_allclose(got2, want2, rtol=1e-6, atol=1e-9)
            router = moe_t[p + "router.weight"]
            np.testing.assert_array_equal(router[0::2], router[1::2])
            for name in ("self_attention.linear_qkv.weight", "pre_mlp_layernorm.weight"):
                key = f"model.decoder.layers.{layer}." + name
                np.testing.assert_array_equal(moe_t[key], dense_t[key])
        bad = run(1, "--load", dense_dir, "--save", os.path.join(TMP.name, "moe_bad"),
                  "--moe-use-upcycling", "--moe-upcycling-granularity", "3", expect_rc=2)
        self.assertIn("--moe-upcycling-granularity", bad.stderr)
        # Any other model difference is listed and refused (here the q/k norms, which the dense
        # model does not have).
        bad = run(1, "--load", dense_dir, "--save", os.path.join(TMP.name, "moe_bad"),
                  "--moe-use-upcycling", "--qk-layernorm", expect_rc=2)
        self.assertIn("differs from the dense checkpoint", bad.stderr)
        self.assertIn("qk_layernorm", bad.stderr)


def setUpModule():
    global TMP
    TMP = tempfile.TemporaryDirectory(prefix="moe_")


def tearDownModule():
    TMP.cleanup()



class TestHybridMtp(unittest.TestCase):
    """Megatron core 0.17's --hybrid-layer-pattern with multi-token prediction (Nemotron 3
    Super's MTP: each depth an attention then an MoE layer after '/') and '|' pipeline segments
    as the stage layout: every layout trains as one process, a checkpoint resumes in another
    layout with no model flag, the legacy spelling is the same model, bad patterns exit 2."""
    HYBRID = ["--model", "mamba", "--mamba-state-dim", "8", "--mamba-head-dim", "16",
              "--mamba-num-groups", "4"]
    PATTERN = "ME*E/*E/*E"
    FIELDS = (*FIELDS, "mtp_1 loss", "mtp_2 loss")
    # (name, ranks, pattern, flags): '|' puts M E on stage 0 and * E (then the MTP depths) on
    # stage 1; four segments over pp2 interleave two chunks per rank.
    LAYOUTS = [("pp2 by '|'", 2, "ME|*E/*E/*E", [PP, "2"]),
               ("pp2 interleaved by '|'", 2, "M|E|*|E/*E/*E", [PP, "2"]),
               ("tp2+sp", 2, PATTERN, [TP, "2", SP]),
               ("ep2", 2, PATTERN, [EP, "2"]),
               ("cp2", 2, PATTERN, ["--context-parallel-size", "2"]),
               ("dp2 distributed optimizer", 2, PATTERN, [DISTOPT])]

    def curve(self, proc):
        return {it: {k: float(v) for k, v in f.items() if k in self.FIELDS}
                for it, f in megatron_log.iteration_lines(proc.stdout).items()}

    def test_layouts_follow_the_single_process_curve(self):
        one = run(1, *self.HYBRID, "--hybrid-layer-pattern", self.PATTERN)
        want = self.curve(one)
        self.assertEqual(sorted(want), list(range(1, ITERS + 1)))
        # Both depths' losses logged, and the MoE losses average over the three E layers of the
        # decoder and the two of the depths.
        self.assertTrue(all("mtp_2 loss" in want[it] for it in want))
        self.assertRegex(one.stdout, r"mtp_num_layers \.+ 2\n")
        # The legacy spelling (--hybrid-override-pattern, --mtp-hybrid-override-pattern with
        # --mtp-num-layers) is the same model.
        legacy = run(1, *self.HYBRID, "--hybrid-override-pattern", "ME*E",
                     "--mtp-hybrid-override-pattern", "*E", "--mtp-num-layers", "2")
        self.assertEqual(self.curve(legacy), want)
        for name, ranks, pattern, flags in self.LAYOUTS:
            with self.subTest(layout=name):
                proc = run(ranks, *self.HYBRID, "--hybrid-layer-pattern", pattern, *flags)
                rel = worst(self.curve(proc), want)
                print(f"hybrid MTP {name}: worst relative difference {rel:.1e}", file=sys.stderr)
                self.assertLess(rel, RTOL)
        # Nemotron 3 Super's training form: one MTP block applied at both depths, detached from
        # the main model; a different model from the above, the same in pp2 x ep2 and tp2 as in
        # one process.
        super_flags = ["--mtp-use-repeated-layer", "--mtp-detach-heads"]
        repeated = self.curve(run(1, *self.HYBRID, "--hybrid-layer-pattern", self.PATTERN,
                                  *super_flags))
        self.assertGreater(worst(repeated, want), 1e-4)
        for name, ranks, pattern, flags in (
                ("pp2 ep2", 4, "ME|*E/*E/*E", [PP, "2", EP, "2"]),
                ("tp2+sp", 2, self.PATTERN, [TP, "2", SP])):
            with self.subTest(layout="repeated, detached " + name):
                proc = run(ranks, *self.HYBRID, "--hybrid-layer-pattern", pattern, *flags,
                           *super_flags)
                self.assertLess(worst(self.curve(proc), repeated), RTOL)
        # The '|' split is the one asked for: stage 0 holds the embedding and M only, while
        # the default split of pp2 gives it M and E.
        params = r"number of parameters on \(tensor, pipeline\) model parallel rank \(0, 0\): (\d+)"
        by_pipe = run(2, *self.HYBRID, "--hybrid-layer-pattern", "M|E*E/*E/*E", PP, "2")
        even = run(2, *self.HYBRID, "--hybrid-layer-pattern", self.PATTERN, PP, "2")
        self.assertLess(int(re.search(params, by_pipe.stdout).group(1)),
                        int(re.search(params, even.stdout).group(1)))

    def test_nemotron_h_mtp_block_trains_repeated_and_converts_back(self):
        # The oracle's NemotronH with one MTP block marked mtp_use_repeated_layer (Nemotron 3
        # Super's files, tests/reference/hf_oracle.py nemotron-h-mtp-repeated): trained at ep2
        # with --mtp-num-layers 2 (the block at both depths), two depths' losses logged; the
        # export holds the one trained block (num_nextn_predict_layers 1, repeated) under the
        # files' names.
        hf, proc, ck, back, cfg = train_nemotron_h_and_convert_back(
            self, "nemotron-h-mtp-repeated", "--lr", "1e-3", "--mtp-num-layers", "2",
            "--mtp-detach-heads")
        lines = megatron_log.iteration_lines(proc.stdout)
        self.assertTrue(all("mtp_2 loss" in lines[it] for it in lines))
        self.assertEqual((cfg["num_nextn_predict_layers"], cfg["mtp_use_repeated_layer"],
                          cfg["mtp_hybrid_override_pattern"]), (1, True, "*E"))
        hf_in, _ = checkpoint_reader.read_safetensors(os.path.join(hf, "model.safetensors"))
        hf_out, _ = checkpoint_reader.read_safetensors(os.path.join(back, "model.safetensors"))
        self.assertEqual(sorted(hf_out), sorted(hf_in))
        _, trained = checkpoint_reader.read_checkpoint(ck)
        self.assertTrue(np.array_equal(hf_out["mtp.layers.0.eh_proj.weight"],
                                       trained["model.mtp.layers.0.eh_proj.weight"]))
        self.assertFalse(np.array_equal(hf_out["mtp.layers.0.eh_proj.weight"],
                                        hf_in["mtp.layers.0.eh_proj.weight"]))

    def test_checkpoint_resumes_elsewhere_and_bad_patterns(self):
        # Saved at pp2 (split by '|'), the next iteration in one process with only training
        # flags and --use-checkpoint-args equals the uninterrupted run's: the pattern with its
        # MTP part comes back from the checkpoint.
        saved = [*self.HYBRID, "--hybrid-layer-pattern", "ME|*E/*E/*E", PP, "2"]
        want = self.curve(run(2, *saved))[7]
        ck = tempfile.mkdtemp(prefix="ck_mtp_", dir=TMP.name)
        run(2, *saved, "--save", ck, "--exit-interval", "6")
        training = training_flags()
        resumed = megatron_job.run_train(
            MEGATRON, MPIEXEC, 1,
            [*training, "--load", ck, "--exit-interval", "7", "--use-checkpoint-args"],
            TIMEOUT_S)
        self.assertEqual(resumed.returncode, 0, resumed.stderr[-2000:])
        got = self.curve(resumed)
        self.assertEqual(sorted(got), [7])
        self.assertLess(max(abs(got[7][k] / want[k] - 1) for k in want), RTOL)
        # A given pattern with the same layers and other '|' segments is this run's layout; one
        # with other layers is refused by the load, naming the layer types that differ.
        resplit = megatron_job.run_train(
            MEGATRON, MPIEXEC, 2,
            [*training, "--load", ck, "--exit-interval", "7", "--use-checkpoint-args",
             "--hybrid-layer-pattern", "M|E*E/*E/*E", PP, "2"], TIMEOUT_S)
        self.assertEqual(resplit.returncode, 0, resplit.stderr[-2000:])
        got = self.curve(resplit)
        self.assertLess(max(abs(got[7][k] / want[k] - 1) for k in want), RTOL)
        other = megatron_job.run_train(
            MEGATRON, MPIEXEC, 1,
            [*training, "--load", ck, "--exit-interval", "7", "--use-checkpoint-args",
             "--hybrid-layer-pattern", "ME*E/-E/-E"], TIMEOUT_S)
        self.assertEqual(other.returncode, 2, other.stderr[-2000:])
        self.assertIn("hybrid_mtp_layers", other.stderr)
        # Two blocks saved, one repeated block asked (the model's flags given, not the
        # checkpoint's): refused by the load, naming the setting.
        repeated = run(1, *self.HYBRID, "--hybrid-layer-pattern", self.PATTERN,
                       "--mtp-use-repeated-layer", "--load", ck, "--exit-interval", "7",
                       expect_rc=2)
        self.assertIn("mtp_use_repeated_layer", repeated.stderr)
        # Bad patterns and layouts: exit 2 on every rank, the message naming the flag.
        for flags, text in (
                (["--hybrid-layer-pattern", "ME|*E", PP, "2",
                  "--decoder-first-pipeline-num-layers", "1"],
                 "--decoder-first-pipeline-num-layers should not be specified"),
                (["--hybrid-layer-pattern", "M|E|*E", PP, "2"],
                 "must be evenly divisible by --pipeline-model-parallel-size"),
                (["--hybrid-layer-pattern", "MG*E"], "'G' (gated DeltaNet) is not implemented"),
                (["--hybrid-layer-pattern", "ME*E/*E/E*"], "all MTP patterns must be identical"),
                (["--hybrid-layer-pattern", "ME*E", "--mtp-num-layers", "2"],
                 "needs the MTP layers' pattern"),
                (["--hybrid-layer-pattern", "ME*E", "--hybrid-override-pattern", "M*EE"],
                 "cannot both be specified")):
            with self.subTest(flags=" ".join(flags)):
                proc = run(2, *self.HYBRID, *flags, expect_rc=2)
                self.assertIn(text, proc.stderr)
                for r in range(2):
                    self.assertIn(f"[rank {r}]", proc.stderr)

if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
