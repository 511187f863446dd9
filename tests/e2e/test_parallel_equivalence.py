#!/usr/bin/env python3
"""Hybrid-parallel training under MPI against the single-process run.

What it is: `megatron train` on mock data as one process and under `mpiexec` in every layout of
the parallelism matrix (tp2, tp4, tp2 + sequence parallel, pp2, pp4, pp2 interleaved (also with
--microbatch-group-size-per-virtual-pipeline-stage), dp2, dp4,
tp2pp2, tp2pp2dp2 on 8 ranks, and overlapped gradient buckets; uneven pipeline splits), with the
same global batch, for a GPT-2-style and a Llama-style tiny model (and multi-latent attention,
multi-token prediction, also under context parallelism, and a hybrid Mamba model), dropout on. The layouts differ only in
where the arithmetic happens: initialisation is TP-invariant (each shard is the slice of the full init), dropout masks are
keyed by global element and head indices and by the micro-batch's index in the global batch, each
rank reads Megatron's sampler share. So the loss, gradient-norm and validation curves must equal the
single-process ones up to the order of floating-point sums: we require 20 iterations within 1e-5
relative (cross-rank reductions add f32 partial sums in another order than one process does; over
20 Adam steps that moves the 7th significant digit at most here; a wrong shard, mask or
reduction moves the 2nd or 3rd).

What it is not: a speed test (bench/), or the bad-layout messages (tests/cli/test_parallel_args.py).

Usage: test_parallel_equivalence.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import json
import os
import re
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 180
TINY = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
        "--global-batch-size", "4", "--train-iters", "20", "--log-interval", "1", "--lr", "2e-3",
        "--lr-warmup-iters", "3", "--eval-iters", "2", "--eval-interval", "10",
        "--num-threads", "1"]
# 8 heads in 4 query groups, so that tp4 still holds one group per rank.
LLAMA = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
         "--disable-bias-linear", "--num-attention-heads", "8", "--group-query-attention",
         "--num-query-groups", "4", "--untie-embeddings-and-output-weights"]
TP, PP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size"
# (name, ranks, flags): the data-parallel size is what the ranks leave over.
LAYOUTS = [
    ("tp2", 2, [TP, "2"]),
    ("tp4", 4, [TP, "4"]),
    ("tp2+sp", 2, [TP, "2", "--sequence-parallel"]),
    ("pp2", 2, [PP, "2"]),
    ("pp4", 4, [PP, "4"]),
    ("pp2 interleaved", 2, [PP, "2", "--num-layers-per-virtual-pipeline-stage", "1"]),
    ("dp2", 2, []),
    ("dp4", 4, []),
    ("tp2pp2", 4, [TP, "2", PP, "2"]),
    ("tp2pp2dp2", 8, [TP, "2", PP, "2"]),
    # Megatron's other rank order (tp-cp-ep-pp-dp): the same groups' arithmetic on other ranks.
    ("tp2pp2dp2 --use-tp-pp-dp-mapping", 8, [TP, "2", PP, "2", "--use-tp-pp-dp-mapping"]),
    # Bucketed data-parallel reduction overlapped with backward (small buckets: many of them).
    ("dp2 overlapped buckets", 2, ["--overlap-grad-reduce", "--ddp-bucket-size", "5000"]),
    ("tp2+sp pp2-interleaved dp2 overlapped", 8,
     [TP, "2", "--sequence-parallel", PP, "2", "--num-layers-per-virtual-pipeline-stage", "1",
      "--overlap-grad-reduce", "--ddp-bucket-size", "2000"]),
    # The distributed optimizer (ZeRO-1): reduce-scattered gradients, sharded Adam moments,
    # all-gathered weights.
    ("dp2 distributed optimizer", 2, ["--use-distributed-optimizer"]),
    ("dp4 distributed optimizer, overlapped buckets", 4,
     ["--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "3000"]),
    ("tp2dp2 distributed optimizer", 4, [TP, "2", "--use-distributed-optimizer"]),
    # Two distributed-optimizer instances (Megatron's partial distributed optimizer): gradients
    # reduce-scattered within each half of the data-parallel ranks, then summed across the
    # halves; at tp2dp2 each instance is one rank (nothing to scatter, only the sum).
    ("dp4 distributed optimizer, 2 instances", 4,
     ["--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"]),
    ("tp2dp2 distributed optimizer, 2 instances, overlapped", 4,
     [TP, "2", "--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2",
      "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "3000"]),
]


with_flags = megatron_job.with_flags


def run(ranks, *args):
    return megatron_job.run_train(MEGATRON, MPIEXEC, ranks, args, TIMEOUT_S)


class TestParallelEquivalence(unittest.TestCase):
    def check_equivalent(self, extra, layouts=LAYOUTS, mtp_depths=0):
        model = with_flags(TINY, extra)
        single = run(1, *model)
        self.assertEqual(single.returncode, 0, single.stderr[-2000:])
        want = megatron_log.loss_curve(single.stdout, 20)
        mtp_keys = [f"mtp_{k} loss" for k in range(1, mtp_depths + 1)]
        want_mtp = megatron_log.curves(single.stdout, mtp_keys, 1, 20) if mtp_keys else {}
        want_valid = megatron_log.validation_losses(single.stdout)
        self.assertEqual(len(want_valid), 4)  # iterations 10 and 20, then validation and test
        for name, ranks, flags in layouts:
            with self.subTest(layout=name):
                proc = run(ranks, *model, *flags)
                self.assertEqual(proc.returncode, 0, f"{name}: {proc.stderr[-2000:]}")
                # Every iteration, whole lines, printed once.
                got = megatron_log.loss_curve(proc.stdout, 20)
                for it, (wl, wn) in want.items():
                    gl, gn = got[it]
                    self.assertAlmostEqual(gl, wl, delta=1e-5 * wl, msg=f"{name} loss, iter {it}")
                    # The norm is printed with 3 decimals: allow one unit of the last digit.
                    self.assertAlmostEqual(gn, wn, delta=1e-5 * wn + 2e-3,
                                           msg=f"{name} grad norm, iter {it}")
                if mtp_keys:
                    got_mtp = megatron_log.curves(proc.stdout, mtp_keys, 1, 20)
                    for it, values in want_mtp.items():
                        for key, w in values.items():
                            self.assertAlmostEqual(got_mtp[it][key], w, delta=1e-5 * w,
                                                   msg=f"{name} {key}, iter {it}")
                got_valid = megatron_log.validation_losses(proc.stdout)
                self.assertEqual([w for w, _ in got_valid], [w for w, _ in want_valid], name)
                for (where, g), (_, w) in zip(got_valid, want_valid):
                    self.assertAlmostEqual(g, w, delta=1e-5 * w, msg=f"{name} validation {where}")
                self.assertEqual(proc.stdout.count("------------------------ arguments"), 1)

    def test_interleaved_microbatch_groups(self):
        # --microbatch-group-size-per-virtual-pipeline-stage: 5 micro-batches in groups of 3 (the
        # last of 2), and breadth-first (one group of all 5), which the default groups of pp 2
        # cannot schedule.
        vpp = [PP, "2", "--num-layers-per-virtual-pipeline-stage", "1",
               "--microbatch-group-size-per-virtual-pipeline-stage"]
        self.check_equivalent(["--global-batch-size", "5"],
                              layouts=[("pp2 interleaved, groups of 3", 2, [*vpp, "3"]),
                                       ("pp2 interleaved, breadth-first", 2, [*vpp, "5"])])

    def test_gpt2_style_every_layout_matches_single_process(self):
        self.check_equivalent([])

    def test_llama_style_every_layout_matches_single_process(self):
        self.check_equivalent(LLAMA)

    def test_model_variants_in_parallel_layouts(self):
        # The variant flags in the layouts that split what they touch: --qk-layernorm's weights
        # see only their TP rank's heads (summed over TP after backward), the RoPE variants and
        # --kv-channels run per head on every rank, squared ReLU and the zero-centred norms
        # everywhere.
        layouts = [l for l in LAYOUTS if l[0] in ("tp2+sp", "tp4", "pp2", "tp2pp2dp2")]
        self.check_equivalent([*LLAMA, "--qk-layernorm", "--rotary-interleaved",
                               "--use-rope-scaling", "--rotary-base", "500000",
                               "--kv-channels", "32", "--apply-layernorm-1p"], layouts)
        self.check_equivalent(["--squared-relu", "--qk-layernorm", "--apply-layernorm-1p",
                               "--init-method-xavier-uniform", "--embedding-init-method-std",
                               "0.05"], layouts)
        # Llama 4's attention variants: weightless L2 norms of the heads, and layers 2 and 4
        # without RoPE (a global layer index: pp2 puts one of each on each stage).
        self.check_equivalent([*LLAMA, "--qk-l2-norm", "--no-rope-freq", "2"], layouts)

    def test_hybrid_mamba_in_parallel_layouts(self):
        # A hybrid Mamba model (pretrain_mamba): Mamba-2, attention-only and MLP-only layers. Its
        # mixers split whole heads and groups over TP and CP (the in-projection's z, x, B, C and dt
        # blocks each sharded), their norms and dropout see SP's positions, and the pattern is
        # global: pp2 puts M* on one stage and M- on the other, the interleaved split one layer
        # per chunk.
        layouts = [l for l in LAYOUTS if l[0] in ("tp2+sp", "tp4", "pp2", "pp2 interleaved",
                                                   "tp2pp2dp2", "dp2 distributed optimizer")]
        mamba = ["--model", "mamba", "--hybrid-override-pattern", "M*M-",
                 "--mamba-state-dim", "8", "--mamba-head-dim", "16", "--mamba-num-groups", "4",
                 "--normalization", "RMSNorm", "--position-embedding-type", "none",
                 "--disable-bias-linear"]
        # Context parallelism: the mixers' all-to-all from rows to heads and back (4 groups over
        # cp2; over tp2 x cp4 one group per TP rank serves two CP ranks, Megatron's repeat),
        # beside the attention layer's own CP.
        cp = "--context-parallel-size"
        layouts += [("cp2", 2, [cp, "2"]), ("cp4", 4, [cp, "4"]),
                    ("tp2+sp cp2", 4, [TP, "2", "--sequence-parallel", cp, "2"]),
                    ("tp2 cp4", 8, [TP, "2", cp, "4"]),
                    ("cp2 pp2", 4, [cp, "2", PP, "2"])]
        self.check_equivalent(mamba, layouts)

    def test_heterogeneous_layers_in_parallel_layouts(self):
        # Llama-Nemotron's heterogeneous layers (--heterogeneous-layers-config-path): a whole
        # layer (4 query groups, MLP 256 wide), a linear attention without MLP, no attention with
        # a 512-wide MLP, and a whole attention of 2 query groups with a linear MLP. Each splits
        # its own groups and width over TP; the linear replacements gather their column-parallel
        # output (and keep SP's positions); pp2 puts two different layers on each stage.
        blocks = [
            ({"n_heads_in_group": 2}, {"ffn_mult": 2.0}),
            ({"n_heads_in_group": None, "replace_with_linear": True}, {"no_op": True}),
            ({"n_heads_in_group": None, "no_op": True}, {"ffn_mult": 7.0}),
            ({"n_heads_in_group": 4}, {"ffn_mult": None, "replace_with_linear": True}),
        ]
        config = {"model_type": "nemotron-nas", "hidden_act": "silu", "num_hidden_layers": 4,
                  "hidden_size": 64, "num_attention_heads": 8, "tie_word_embeddings": False,
                  "rope_theta": 500000.0,
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
                  "block_configs": [{"attention": a, "ffn": f} for a, f in blocks]}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(config, f)
            layouts = [l for l in LAYOUTS if l[0] in ("tp2+sp", "pp2", "pp2 interleaved",
                                                       "tp2pp2dp2", "dp2 distributed optimizer")]
            layouts.append(("cp2", 2, ["--context-parallel-size", "2"]))
            model = [*LLAMA, "--use-rope-scaling", "--use-rotary-position-embeddings",
                     "--rotary-base", "500000", "--heterogeneous-layers-config-path", path]
            self.check_equivalent(model, layouts)
            # Layer 3's 2 query groups do not split over 4 TP ranks: exit 2 naming the layer on
            # every rank.
            refused = run(4, *with_flags(TINY, model), TP, "4")
            self.assertEqual(refused.returncode, 2, refused.stderr[-2000:])
            for rank in range(4):
                self.assertIn(f"[rank {rank}] the heterogeneous block list "
                              "(--heterogeneous-layers-config-path): layer 3's 2 query groups must "
                              "be divisible by --tensor-model-parallel-size 4", refused.stderr)

    def test_multi_latent_attention_in_parallel_layouts(self):
        # MLA (DeepSeek-V3's attention) with YaRN: the replicated down projections and latent
        # norms (summed over TP under sequence parallelism), the rotary key shared by the heads
        # (its gradient summed over TP without sequence parallelism, reduce-scattered with it),
        # the zero-padded value heads, selective recomputation of the core attention. Then
        # without the query bottleneck, with plain RoPE and value heads wider than the queries'.
        mla = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
               "--disable-bias-linear", "--untie-embeddings-and-output-weights",
               "--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "16",
               "--qk-pos-emb-head-dim", "8", "--qk-layernorm"]
        layouts = [l for l in LAYOUTS if l[0] in ("tp2", "tp2+sp", "tp4", "pp2", "tp2pp2dp2",
                                                  "tp2dp2 distributed optimizer")]
        self.check_equivalent([*mla, "--q-lora-rank", "24", "--v-head-dim", "12",
                               "--rotary-scaling-factor", "40", "--mscale-all-dim", "0.8"],
                              layouts + [("tp2+sp selective recompute", 2,
                                          [TP, "2", "--sequence-parallel",
                                           "--recompute-granularity", "selective"])])
        self.check_equivalent([*mla, "--rope-type", "rope", "--v-head-dim", "32"],
                              [l for l in layouts if l[0] in ("tp2", "tp2+sp", "pp2")])

    def test_multi_token_prediction_with_context_parallelism(self):
        # The rolled tokens, labels and loss mask cross the context-parallel chunks (each chunk's
        # last position takes the next global chunk's first, gathered over CP), and the
        # prediction layers' attention runs context-parallel like the decoder's.
        mtp = [*LLAMA, "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3"]
        cp = "--context-parallel-size"
        self.check_equivalent(mtp, [("cp2", 2, [cp, "2"]),
                                    ("cp4 allgather", 4, [cp, "4", "--cp-comm-type", "allgather"]),
                                    ("tp2+sp cp2", 4, [TP, "2", "--sequence-parallel", cp, "2"]),
                                    ("cp2 pp2", 4, [cp, "2", PP, "2"])],
                              mtp_depths=2)

    def test_multi_token_prediction_in_parallel_layouts(self):
        # Megatron's MTP after the decoder on the last stage: the rolled tokens through the shared
        # embedding (a copy on the last stage under pipelining, summed with the first stage's, for
        # tied and untied output layers alike), eh_proj gathered over TP, the depths' losses in
        # the objective. Then a DeepSeek-V3-style model: MLA, dense then MoE layers with sigmoid
        # routing, expert bias and a shared expert, an MoE prediction layer (its router in the
        # load-balancing loss and the bias update), under expert parallelism too. The mtp_k
        # losses are compared as the lm loss is.
        mtp = [*LLAMA, "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3"]
        layouts = [l for l in LAYOUTS if l[0] in ("tp2+sp", "pp2", "pp2 interleaved",
                                                  "dp2 distributed optimizer",
                                                  "tp2+sp pp2-interleaved dp2 overlapped")]
        # Megatron-FSDP ZeRO-3: the word embeddings' gradient buffer must be attached before the
        # prediction depths add the rolled tokens' gradients to it.
        fsdp = ("fsdp optim_grads_params", 2, ["--use-megatron-fsdp",
                                                "--data-parallel-sharding-strategy",
                                                "optim_grads_params"])
        self.check_equivalent(mtp, layouts + [fsdp], mtp_depths=2)
        self.check_equivalent([m for m in mtp if m != "--untie-embeddings-and-output-weights"],
                              [l for l in layouts if l[0] in ("pp2", "tp2+sp")], mtp_depths=2)
        # Megatron core 0.19's repeated block (one block at both depths, each application with
        # its depth's dropout streams) with detached heads (the MTP parameters clipped by their
        # own norm: on the distributed optimizer's shards too).
        self.check_equivalent([*mtp, "--mtp-use-repeated-layer", "--mtp-detach-heads"],
                              [l for l in layouts if l[0] in ("pp2", "tp2+sp",
                                                              "dp2 distributed optimizer")],
                              mtp_depths=2)
        deepseek = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                    "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                    "--multi-latent-attention", "--q-lora-rank", "24", "--kv-lora-rank", "16",
                    "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "12",
                    "--qk-layernorm", "--rotary-scaling-factor", "40", "--mscale-all-dim", "1.0",
                    "--num-experts", "4", "--moe-router-topk", "2", "--moe-layer-freq",
                    "([0]+[1]*3)", "--moe-router-score-function", "sigmoid",
                    "--moe-router-enable-expert-bias", "--moe-aux-loss-coeff", "0.01",
                    "--moe-shared-expert-intermediate-size", "32", "--moe-ffn-hidden-size", "32",
                    "--moe-token-dispatcher-type", "alltoall", "--mtp-num-layers", "1"]
        self.check_equivalent(deepseek, [
            ("tp2+sp", 2, [TP, "2", "--sequence-parallel"]),
            ("ep2", 2, ["--expert-model-parallel-size", "2"]),
            ("pp2", 2, [PP, "2"]),
            ("tp2+sp ep2 pp2", 8, [TP, "2", "--sequence-parallel", "--expert-model-parallel-size",
                                    "2", PP, "2"]),
        ], mtp_depths=1)

    def test_uneven_pipeline_splits_match_single_process(self):
        # Megatron's uneven stages: a first (last) stage of its own size, the middle sharing the
        # rest; the embedding and the loss counted as layers, down to chunks holding no
        # transformer layer at all (pp2x3 with both: rank 0's first chunk only embeds, rank 1's
        # last only computes the loss); a layout string. The 4 layers go 1+3, 1+2+1,
        # 0+1|1+1|1+0, 1+3, 0+2|1+1.
        emb, loss = "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"
        self.check_equivalent([*LLAMA], [
            ("pp2 first 1", 2, [PP, "2", "--decoder-first-pipeline-num-layers", "1"]),
            ("pp3 embedding and loss counted", 3, [PP, "3", emb, loss]),
            ("pp2x3 embedding and loss counted", 2,
             [PP, "2", "--num-layers-per-virtual-pipeline-stage", "1", emb, loss]),
            ("tp2pp2 last 3, distributed optimizer", 4,
             [TP, "2", PP, "2", "--decoder-last-pipeline-num-layers", "3",
              "--use-distributed-optimizer"]),
            # Megatron's layout string: 2 ranks x 2 chunks holding 0 (the embedding alone),
            # 2, 1 and 1 layers.
            ("pp2x2 layout E|tt|t|tL", 2, [PP, "2", "--pipeline-model-parallel-layout",
                                            "E|tt|t|tL"]),
        ])

    def test_document_masks_reach_every_stage(self):
        # With --reset-attention-mask every pipeline stage needs the document starts (middle
        # stages read the batch too), and positions restart after each end of document.
        docs = ["--reset-attention-mask", "--reset-position-ids", "--eod-mask-loss"]
        layouts = [l for l in LAYOUTS if l[0] in ("tp2+sp", "pp4", "tp2pp2dp2")]
        self.check_equivalent(docs, layouts)
        self.check_equivalent([*LLAMA, *docs], layouts)

    def test_distributed_optimizer_state_falls_as_one_over_dp(self):
        # The start-up line states this rank's Adam-moment bytes; ZeRO-1 splits them over dp
        # (up to the bucket padding to a multiple of lcm(16 dp, 128) elements).
        state = {}
        for ranks in (1, 2, 4):
            proc = run(ranks, *with_flags(TINY, ["--train-iters", "4", "--use-distributed-optimizer"]))
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
            m = re.search(r"distributed optimizer: .*?\(([0-9.]+) MB on this rank\)", proc.stdout)
            self.assertIsNotNone(m, proc.stdout[-2000:])
            state[ranks] = float(m[1])
            if ranks == 1:
                self.assertIn("nothing to shard", proc.stdout)
        print(f"Adam state per rank (MB) at dp 1, 2, 4: {state}", file=sys.stderr)
        for ranks in (2, 4):
            self.assertAlmostEqual(state[ranks], state[1] / ranks, delta=0.01 * state[1])
        # Two instances at dp4: each shards over its 2 ranks, so the state is dp2's.
        proc = run(4, *with_flags(TINY, ["--train-iters", "4", "--use-distributed-optimizer",
                                         "--num-distributed-optimizer-instances", "2"]))
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        m = re.search(r"distributed optimizer: .*?\(([0-9.]+) MB on this rank\) in each of 2 "
                      r"instances", proc.stdout)
        self.assertIsNotNone(m, proc.stdout[-2000:])
        self.assertAlmostEqual(float(m[1]), state[2], delta=0.01 * state[1])
        # Refusals, on every rank: without the distributed optimizer, and 3 instances of dp4.
        for flags, needle in ((["--num-distributed-optimizer-instances", "2"],
                               "needs --use-distributed-optimizer"),
                              (["--use-distributed-optimizer",
                                "--num-distributed-optimizer-instances", "3"],
                               "must be divisible by --num-distributed-optimizer-instances (3)")):
            bad = run(4, *with_flags(TINY, ["--train-iters", "1", *flags]))
            self.assertEqual(bad.returncode, 2, bad.stderr[-2000:])
            for rank in range(4):
                self.assertIn(f"[rank {rank}]", bad.stderr)
            self.assertIn(needle, bad.stderr)

    def test_a_failing_rank_takes_the_whole_job_down_with_its_message(self):
        # World rank 2 (tp 0 of the second pipeline stage) throws at iteration 3, while its peers
        # wait for it in point-to-point and TP collectives: the job must end quickly, with that
        # rank's message and exit code 1, never hang.
        start = time.monotonic()
        proc = run(4, *TINY, TP, "2", PP, "2", "--inject-fault", "exception:2:3")
        elapsed = time.monotonic() - start
        self.assertEqual(proc.returncode, 1, proc.stderr[-2000:])
        self.assertIn("[rank 2] injected fault (--inject-fault): rank 2 fails at the start of "
                      "iteration 3", proc.stderr)
        self.assertLessEqual(max(megatron_log.loss_curve(proc.stdout, None), default=0), 2,
                             "no iteration after the failure")
        # Start-up of 4 oversubscribed ranks takes a few seconds; a hang would hit TIMEOUT_S.
        self.assertLess(elapsed, 60, f"the job took {elapsed:.0f} s to go down")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
