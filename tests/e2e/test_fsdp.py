#!/usr/bin/env python3
"""Megatron-FSDP end to end: each sharding strategy against plain data parallelism, in the
layouts that combine with it, checkpoints across strategies, the memory each rank keeps, bad
flags.

What it is: `megatron train --use-megatron-fsdp --data-parallel-sharding-strategy S` under
mpiexec on mock data (a tiny GPT), against the same run without FSDP.
  - Equivalence: the loss and grad norm of every iteration within a stated tolerance of plain
    data parallelism. The sharded strategies reduce each micro-batch's gradients as it finishes
    (Megatron-FSDP's order) where plain DP sums the micro-batches first, so the sums round in
    another order: fp32 runs agree to 2e-6 relative (a few fp32 ulps per step, 8 steps; measured:
    every printed digit equal), bf16 runs to 2e-4 (the reordered fp32 sums change the bf16
    compute copies by one bf16 ulp now and then; measured 2.0e-5).
    dp2 and dp4 (every strategy), tp2 x dp2 with sequence parallelism, pp2 x dp2 (tied
    embeddings summed on shards), MoE with ep2, bf16 with full recomputation, bf16 MoE with the
    routers' expert bias under pp2 (1e-3: top-k routing flips on near ties), context parallelism,
    fp16 with loss scaling, FP8 hybrid (the loss within 1e-3: neighbouring FP8 codes).
  - Checkpoints: a ZeRO-3 checkpoint (each rank wrote its shards) resumes bit for bit in its own
    layout, and loads into plain DP on one process, ZeRO-1 at dp4 and ZeRO-2 at tp2 x dp2, whose
    losses then follow the straight runs of those layouts (within the fp32 tolerance); a plain
    distributed-optimizer checkpoint loads into ZeRO-3 at dp4.
  - Memory (bf16): the start-up line's per-rank buffers (measured from the tensors): the fp32
    main weights and the optimizer state of every sharded strategy are 1/dp of no_shard's, the
    gradients of optim_grads too, and the compute copy of optim_grads_params (up to each unit's
    padding to lcm(16 dp, 128) elements).
  - --save-hf from ZeRO-3 (every rank gathers the whole weights) equals plain DP's export (fp32,
    within 1e-5; measured 5e-7), and ZeRO-3 started from that Hugging Face directory follows plain
    DP started from it.
  - Bad flags: exit 2 naming the flag, on every rank.
What it is not: the lending and reductions in isolation (tests/parallel/test_fsdp.cpp, under
MPI), the memory table of docs/PERFORMANCE.md (bench/fsdp_memory.py).

Usage: test_fsdp.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import json
import os
import re
import struct
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 300
ITERS = 8
TMP = None

TINY = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
        "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "8",
        "--train-iters", str(ITERS), "--log-interval", "1", "--lr", "2e-3", "--min-lr", "1e-4",
        "--lr-warmup-iters", "2", "--eval-iters", "1", "--eval-interval", "4",
        "--num-threads", "1"]
FP32_REL = 2e-6
BF16_REL = 2e-4
BUFFERS_RE = re.compile(r"\[Rank (\d+)\] FSDP buffers \(MB\): main weights ([\d.]+) \| compute "
                        r"weights ([\d.]+) \| gradients ([\d.]+) \| optimizer state ([\d.]+)")


def setUpModule():
    global TMP
    TMP = tempfile.TemporaryDirectory(prefix="fsdp_")


def tearDownModule():
    TMP.cleanup()


def fsdp(strategy):
    return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]


def run(ranks, *args, expect_rc=0):
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, megatron_job.with_flags(TINY, args),
                                  TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def curves(proc, first=1, last=ITERS):
    return megatron_log.curves(proc.stdout, ["lm loss", "grad norm"], first, last)


def worst(got, want):
    return max(abs(got[i]["lm loss"] - want[i]["lm loss"]) / want[i]["lm loss"] for i in want)


class TestStrategies(unittest.TestCase):
    def check_layout(self, ranks, strategies, *layout, rel=FP32_REL, loss_only=False):
        def pick(c):
            return {it: {"lm loss": v["lm loss"]} for it, v in c.items()} if loss_only else c
        plain = pick(curves(run(ranks, *layout)))
        for s in strategies:
            got = pick(curves(run(ranks, *layout, *fsdp(s))))
            print(f"{ranks} ranks {' '.join(layout)} {s}: worst relative loss difference "
                  f"{worst(got, plain):.1e}", file=sys.stderr)
            megatron_log.assert_same_curves(self, got, plain, f"{s} {' '.join(layout)}", rel)

    def test_dp2_every_strategy(self):
        self.check_layout(2, ["no_shard", "optim", "optim_grads", "optim_grads_params"])

    def test_dp4(self):
        self.check_layout(4, ["optim", "optim_grads", "optim_grads_params"])

    def test_torch_fsdp2_runs_as_zero3(self):
        # --use-torch-fsdp2 (PyTorch's FSDP2, ZeRO-3) runs as optim_grads_params, and with
        # --torch-fsdp2-no-reshard-after-forward as optim_grads: plain data parallelism's curve.
        # Megatron refuses it with pipeline parallelism (exit 2 naming it).
        plain = curves(run(2))
        for extra in ([], ["--torch-fsdp2-no-reshard-after-forward"]):
            got = curves(run(2, "--use-torch-fsdp2", *extra))
            megatron_log.assert_same_curves(self, got, plain, f"torch fsdp2 {extra}", FP32_REL)
        proc = run(2, "--use-torch-fsdp2", "--pipeline-model-parallel-size", "2", expect_rc=2)
        self.assertIn("--use-torch-fsdp2 is not supported with pipeline parallelism", proc.stderr)

    def test_hybrid_sharding_over_two_instances(self):
        # HSDP (--num-distributed-optimizer-instances 2): each strategy shards within halves of
        # the 4 data-parallel ranks and the gradient shards are summed across the halves, so
        # the curve is plain data parallelism's; also with experts split over EP 2.
        instances = ["--num-distributed-optimizer-instances", "2"]
        plain = curves(run(4))
        for s in ["optim", "optim_grads", "optim_grads_params"]:
            got = curves(run(4, *fsdp(s), *instances))
            megatron_log.assert_same_curves(self, got, plain, f"{s} 2 instances", FP32_REL)
        moe = ["--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-router-topk",
               "2", "--disable-bias-linear"]
        plain = curves(run(4, *moe))
        got = curves(run(4, *moe, *fsdp("optim_grads_params"), *instances))
        megatron_log.assert_same_curves(self, got, plain, "experts, 2 instances", FP32_REL)

    def test_tensor_and_sequence_parallel(self):
        self.check_layout(4, ["optim_grads", "optim_grads_params"],
                          "--tensor-model-parallel-size", "2", "--sequence-parallel")

    def test_pipeline_parallel_with_tied_embeddings(self):
        self.check_layout(4, ["optim_grads", "optim_grads_params"],
                          "--pipeline-model-parallel-size", "2")

    def test_experts(self):
        self.check_layout(4, ["optim_grads", "optim_grads_params"], "--num-experts", "4",
                          "--expert-model-parallel-size", "2", "--moe-router-topk", "2",
                          "--disable-bias-linear")

    def test_bf16_with_recomputation(self):
        self.check_layout(2, ["optim", "optim_grads", "optim_grads_params"], "--bf16",
                          "--recompute-granularity", "full", "--recompute-method", "uniform",
                          "--recompute-num-layers", "2", rel=BF16_REL)

    def test_overlapped_reductions_and_gathers(self):
        # --overlap-grad-reduce --overlap-param-gather (Megatron r0.14 accepts the latter with
        # Megatron-FSDP alone): the same sums, so the same curve as plain DP without them.
        plain = curves(run(2))
        for s in ["no_shard", "optim_grads", "optim_grads_params"]:
            got = curves(run(2, *fsdp(s), "--overlap-grad-reduce", "--overlap-param-gather"))
            megatron_log.assert_same_curves(self, got, plain, f"{s} overlapped", FP32_REL)

    def test_timing_report_shows_the_gather_waits(self):
        # --timing-log-level 1: ZeRO-3's per-unit gathers waited for in forward and backward
        # appear as the distributed optimizer's do (exposed all-gather time; some is always
        # exposed: the first unit of each pass has nothing to overlap with).
        proc = run(2, *fsdp("optim_grads_params"), "--timing-log-level", "1")
        waits = [float(m[2]) for m in re.finditer(
            r"params-all-gather \(exposed\) \.+: \(([\d.]+), ([\d.]+)\)", proc.stdout)]
        self.assertEqual(len(waits), ITERS, proc.stdout[-2000:])
        self.assertGreater(max(waits), 0.0)

    def test_context_parallel(self):
        # The shards span data x context parallelism, as the gradients reduce.
        self.check_layout(4, ["optim_grads_params"], "--context-parallel-size", "2")

    def test_fp16_and_fp8(self):
        # fp16 with loss scaling: the overflow check and unscaling on the shards (measured
        # 2.7e-6). FP8 hybrid: values that differ in their last bits can round to neighbouring
        # FP8 codes, a 6% step with E4M3's 3-bit mantissa (25% with E5M2's 2 bits for the
        # gradients): the loss within 1e-3 (measured 1.4e-4); the grad norm, whose E5M2 output
        # gradients such flips move by 0.8%, is left out.
        self.check_layout(2, ["optim_grads_params"], "--fp16", "--initial-loss-scale", "4096",
                          rel=BF16_REL)
        self.check_layout(2, ["optim_grads_params"], "--bf16", "--fp8-format", "hybrid",
                          rel=1e-3, loss_only=True)

    def test_bf16_experts_with_expert_bias_and_pipeline(self):
        # The routers' expert bias (a frozen buffer, updated after each step outside the
        # optimizer) keeps a whole private copy when the main weights are sharded. Top-k routing
        # turns the bf16 rounding differences into an occasional different expert choice: the
        # loss within 1e-3 (measured 3.0e-4); the grad norm, which such a flip moves by 0.5%,
        # is left out.
        self.check_layout(4, ["optim", "optim_grads", "optim_grads_params"], "--bf16",
                          "--num-experts", "4", "--expert-model-parallel-size", "2",
                          "--moe-router-topk", "2", "--disable-bias-linear",
                          "--moe-router-enable-expert-bias", "--moe-router-score-function",
                          "sigmoid", "--pipeline-model-parallel-size", "2", rel=1e-3,
                          loss_only=True)


class TestCheckpoints(unittest.TestCase):
    def test_zero3_checkpoint_resumes_and_loads_into_other_strategies(self):
        ck = os.path.join(TMP.name, "zero3")
        zero3 = [*fsdp("optim_grads_params")]
        straight = curves(run(2, *zero3))
        run(2, *zero3, "--save", ck, "--save-interval", "4", "--exit-interval", "4")
        resumed = curves(run(2, *zero3, "--load", ck), 5, ITERS)
        # Same layout and strategy: bit for bit.
        for it in resumed:
            self.assertEqual(resumed[it], straight[it], f"resume at iteration {it}")
        # Other layouts: each follows its own straight run, which plain DP equals (see above).
        for ranks, layout in [(1, []), (4, fsdp("optim")),
                              (4, [*fsdp("optim_grads"), "--tensor-model-parallel-size", "2"])]:
            there = curves(run(ranks, *layout), 5, ITERS)
            loaded = curves(run(ranks, *layout, "--load", ck), 5, ITERS)
            print(f"zero3 dp2 checkpoint into {ranks} ranks {' '.join(layout)}: worst "
                  f"{worst(loaded, there):.1e}", file=sys.stderr)
            megatron_log.assert_same_curves(self, loaded, there, f"into {layout}", FP32_REL)

    def test_distributed_optimizer_checkpoint_loads_into_zero3(self):
        ck = os.path.join(TMP.name, "zero1")
        run(2, "--use-distributed-optimizer", "--save", ck, "--save-interval", "4",
            "--exit-interval", "4")
        straight = curves(run(4, *fsdp("optim_grads_params")), 5, ITERS)
        loaded = curves(run(4, *fsdp("optim_grads_params"), "--load", ck), 5, ITERS)
        megatron_log.assert_same_curves(self, loaded, straight, "zero1 -> zero3", FP32_REL)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        assert meta["dtype"] == "F32", meta
        out[name] = np.frombuffer(data[b:e], dtype=np.float32)
    return out


class TestMemoryAndExport(unittest.TestCase):
    def buffers(self, proc):
        rows = {int(m[1]): [float(x) for x in m.groups()[1:]]
                for m in BUFFERS_RE.finditer(proc.stdout)}
        self.assertTrue(rows, proc.stdout[-2000:])
        return rows

    def test_each_rank_keeps_its_share(self):
        dp = 4
        # Per-rank (fp32 main, bf16 compute, gradients, optimizer state) MB; a bigger model so
        # that the padding (at most lcm(16 dp, 128) = 128 elements per unit) is small against the
        # shares. bf16: the fp32 main weights shard with the optimizer state in every strategy
        # but no_shard, the compute copy only in optim_grads_params.
        model = ["--hidden-size", "128", "--train-iters", "2", "--lr-warmup-iters", "1",
                 "--eval-iters", "0", "--bf16"]
        base = self.buffers(run(dp, *model, *fsdp("no_shard")))[0]
        for s, sharded in [("optim", {0, 3}), ("optim_grads", {0, 2, 3}),
                           ("optim_grads_params", {0, 1, 2, 3})]:
            rows = self.buffers(run(dp, *model, *fsdp(s)))
            self.assertEqual(sorted(rows), list(range(dp)))
            for rank, got in rows.items():
                for k in range(4):
                    want = base[k] / dp if k in sharded else base[k]
                    # 6 units x 128 padding elements x 4 bytes (twice for the two moments),
                    # plus the printed rounding.
                    slack = 6 * 128 * 4 / 1048576 * (2 if k == 3 else 1) + 2e-3
                    self.assertAlmostEqual(got[k], want, delta=slack,
                                           msg=f"{s} rank {rank} column {k}: {got} vs {base}")

    def test_save_hf_from_sharded_weights(self):
        plain_dir = os.path.join(TMP.name, "hf_plain")
        zero3_dir = os.path.join(TMP.name, "hf_zero3")
        few = ["--train-iters", "3", "--eval-iters", "0"]
        run(2, *few, "--save-hf", plain_dir)
        run(2, *few, *fsdp("optim_grads_params"), "--save-hf", zero3_dir)
        files = sorted(f for f in os.listdir(plain_dir) if f.endswith(".safetensors"))
        self.assertTrue(files)
        self.assertEqual(files, sorted(f for f in os.listdir(zero3_dir)
                                       if f.endswith(".safetensors")))
        for f in files:
            a = read_safetensors(os.path.join(plain_dir, f))
            b = read_safetensors(os.path.join(zero3_dir, f))
            self.assertEqual(sorted(a), sorted(b))
            for name in a:
                # fp32: the same weights but for the reordered sums' last bits, which Adam's
                # normalised step carries to elements whose gradient is near zero (measured
                # 5e-7 at most); a misplaced or missing shard would be off by the weights' own
                # size (init std 0.02), far above 1e-5.
                np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-5, err_msg=name)
        # And back: ZeRO-3 started from that directory (written straight into each rank's
        # shards) follows plain DP started from it.
        start = ["--pretrained-checkpoint", plain_dir, "--train-iters", "4", "--eval-iters", "0"]
        want = curves(run(2, *start), 1, 4)
        got = curves(run(2, *start, *fsdp("optim_grads_params")), 1, 4)
        megatron_log.assert_same_curves(self, got, want, "zero3 from HF", FP32_REL)


class TestBadFlags(unittest.TestCase):
    def test_refused_combinations(self):
        cases = [
            (["--data-parallel-sharding-strategy", "optim_grads"], "--use-megatron-fsdp"),
            ([*fsdp("zero3")], "--data-parallel-sharding-strategy"),
            ([*fsdp("optim"), "--optimizer", "onebit_adam"], "--optimizer"),
            (["--use-torch-fsdp2", *fsdp("optim")], "--use-torch-fsdp2"),
            ([*fsdp("no_shard"), "--num-distributed-optimizer-instances", "2"],
             "hybrid sharding"),
            (["--ckpt-format", "fsdp_dtensor"], "--ckpt-format"),
        ]
        for args, needle in cases:
            proc = run(2, *args, expect_rc=2)
            text = proc.stdout + proc.stderr
            self.assertIn(needle, text, args)
            for marker in megatron_job.CRASH_MARKERS:
                self.assertNotIn(marker, text, args)
        # Megatron's checkpoint format name for FSDP is accepted with it.
        run(2, *fsdp("optim_grads_params"), "--ckpt-format", "fsdp_dtensor", "--train-iters", "2",
            "--lr-warmup-iters", "1", "--eval-iters", "0")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
