#!/usr/bin/env python3
"""Megatron's optimizer, logging and checkpoint-retention flags, end to end.

What it is: `megatron pretrain_gpt` on mock data, alone and under mpiexec, checked against the
independent checkpoint reader (tests/testing/checkpoint_reader.py), the independent TensorBoard
decoder (tests/train/decode_tfevents.py) and restatements of Megatron's rules:
- --load-main-params-from-ckpt (with --no-load-optim): a bf16 checkpoint's fp32 main weights
  load as they are (saved again at once: the same bits); without --no-load-optim it exits 2;
- --no-rope-freq 1 trains as --position-embedding-type none bit for bit, and --qk-l2-norm as
  --qk-layernorm (RMSNorm) with --lr 0 (its weights stay the ones the L2 norm fixes);
- --padded-vocab-size sets the embedding and output rows (one process and tp2); below the
  vocabulary, or not divisible by TP, it exits 2;
- --lr 0 leaves every weight bit for bit as initialised (a 1- and a 3-iteration run save the
  same tensors); --lr 0 --decoupled-lr X moves exactly the word embeddings and the output layer
  (Megatron's is_embedding_or_output_parameter group) and prints "decoupled learning rate";
- --weight-decay-incr-style linear with start == end equals the constant style digit for digit,
  and start 0 / end 0.5 differs from both constant 0 and constant 0.5 (the decay really
  follows the schedule);
- --apply-wd-to-qk-layernorm (and its deprecated --no-weight-decay-cond-type spelling) decays
  the query and key norms' weights and nothing else (one step, against the run without it);
- --log-params-norm equals the L2 norm of the saved fp32 weights (each element once, so the
  same for one process and tp2 x pp2), to the 3 printed decimals;
- --log-num-zeros-in-grad is the same count in every layout (tp2, pp2, dp2 with the
  distributed optimizer) and at least the never-looked-up padded embedding rows;
- --skip-train on a checkpoint prints the validation and test losses the training run printed
  at its end, and trains nothing;
- --check-weight-hash-across-dp-replicas-interval: the replicas' weights match before training
  and at every interval (dp2, tp2 x dp2 with the distributed optimizer); a bit flipped on one
  replica stops the run at the next check on every rank, naming the parameter and the replica;
- --save-retain-interval keeps the multiples and the latest checkpoint; --log-progress writes
  Megatron's progress.txt lines;
- the TensorBoard flags add (and --no-log-loss-scale-to-tensorboard removes) their tags;
- --overlap-param-gather (the distributed optimizer's all-gather of the updated weights waited
  for layer by layer in the next forward) changes nothing but timing: fp32 and bf16 at dp2, and
  pp2 x dp2, print the curves and validation losses of the same runs without it digit for digit,
  also across a checkpoint saved mid-run and the evaluations; the timing report shows the
  exposed gather time;
- --calculate-per-token-loss on documents of 3 to 40 tokens with --eod-mask-loss (so that
  micro-batches hold different numbers of loss tokens): the objective is the mean over the global
  batch's tokens whatever the micro-batching and layout: micro-batches of 1 (4 per step), of 4
  (one per step), dp2 and tp2 x pp2 runs give one curve (within 1e-5 relative, the float-sum-order
  tolerance of tests/e2e/test_parallel_equivalence.py), which the default objective (the mean of
  the micro-batches' means) leaves at the first step already.

Usage: test_training_flags.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import json
import math
import random
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
import checkpoint_reader  # noqa: E402
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

import numpy as np  # noqa: E402

DECODE_TFEVENTS = os.path.join(HERE, "..", "train", "decode_tfevents.py")
MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 180
# Vocabulary 100 padded to 128 (a multiple of 64 x tp for tp 1 and 2, so every layout pads the
# same): with untied embeddings rows 100..127 of the word embeddings are never looked up, so their
# gradient is exactly zero.
BASE = {"--mock-data": None, "--vocab-size": "100", "--num-layers": "2", "--hidden-size": "64",
        "--num-attention-heads": "4", "--seq-length": "32", "--micro-batch-size": "1",
        "--global-batch-size": "4", "--train-iters": "3", "--log-interval": "1", "--lr": "1e-2",
        "--eval-iters": "1", "--eval-interval": "100", "--num-threads": "1",
        "--untie-embeddings-and-output-weights": None, "--make-vocab-size-divisible-by": "64"}


def weights(path):
    """{name: array} of the model's tensors of a checkpoint (optimizer state left out)."""
    _, tensors = checkpoint_reader.read_checkpoint(path)
    return {k: v for k, v in tensors.items() if k.startswith("model.")}


def short_documents(tmp):
    """--data-path flags of a NullTokenizer dataset of 400 documents of 3 to 40 tokens."""
    rng = random.Random(11)
    jsonl = os.path.join(tmp, "docs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for _ in range(400):
            start, n = rng.randrange(1, 90), rng.randrange(3, 41)
            f.write(json.dumps({"text": " ".join(str(1 + (start + 3 * i) % 97)
                                                 for i in range(n))}) + "\n")
    prefix = os.path.join(tmp, "docs")
    proc = subprocess.run([MEGATRON, "preprocess", "--input", jsonl, "--output-prefix", prefix,
                           "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
                           "--append-eod", "--workers", "1"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"megatron preprocess failed:\n{proc.stderr[-3000:]}")
    return prefix + "_text_document"


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * max(abs(a), abs(b))


class TrainingFlagsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="megatron_flags_")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def train(self, ranks=1, extra=(), **overrides):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                      [*megatron_job.flags_with(BASE, **overrides), *extra],
                                      TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        return proc

    def test_llama4_attention_variants(self):
        # --no-rope-freq 1 (every layer without RoPE) is a model without positions, bit for bit;
        # --qk-l2-norm is --qk-layernorm (RMSNorm) with its weights at their initial ones: the
        # same losses while --lr 0 keeps them there. Every value as printed.
        rms = {"normalization": "RMSNorm"}
        nope = self.train(position_embedding_type="rope", no_rope_freq=1, **rms)
        none = self.train(position_embedding_type="none", **rms)
        self.assertEqual(megatron_log.curves(nope.stdout, ["lm loss", "grad norm"], 1, 3),
                         megatron_log.curves(none.stdout, ["lm loss", "grad norm"], 1, 3))
        with_rope = self.train(position_embedding_type="rope", **rms)
        self.assertNotEqual(megatron_log.curves(with_rope.stdout, ["lm loss"], 1, 1),
                            megatron_log.curves(none.stdout, ["lm loss"], 1, 1))
        l2 = self.train(position_embedding_type="rope", qk_l2_norm=True, lr=0, **rms)
        qk = self.train(position_embedding_type="rope", qk_layernorm=True, lr=0, **rms)
        self.assertEqual(megatron_log.curves(l2.stdout, ["lm loss"], 1, 3),
                         megatron_log.curves(qk.stdout, ["lm loss"], 1, 3))
        for flags, named in (({"no_rope_freq": 3}, "--no-rope-freq"),
                             ({"qk_l2_norm": True, "multi_latent_attention": True}, "MLA")):
            proc = megatron_job.run_train(MEGATRON, MPIEXEC, 1,
                                          megatron_job.flags_with(BASE, **flags), TIMEOUT_S)
            self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
            self.assertIn(named, proc.stderr)

    def test_load_main_params_from_ckpt(self):
        # A bf16 run's fp32 main weights come back from the checkpoint under --no-load-optim
        # (not rounded from the bf16 compute copies): saved again at once, they are the same bits.
        a, b = os.path.join(self.tmp, "main_a"), os.path.join(self.tmp, "main_b")
        self.train(bf16=True, save=a)
        self.train(bf16=True, load=a, save=b, no_load_optim=True,
                   load_main_params_from_ckpt=True)
        wa, wb = weights(a + "/iter_0000003"), weights(b + "/iter_0000003")
        self.assertEqual(sorted(wa), sorted(wb))
        for name in wa:
            self.assertTrue(np.array_equal(wa[name], wb[name]), name)
        proc = megatron_job.run_train(
            MEGATRON, MPIEXEC, 1,
            megatron_job.flags_with(BASE, load=a, load_main_params_from_ckpt=True), TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
        self.assertIn("--no-load-optim", proc.stderr)

    def test_padded_vocab_size(self):
        # The embedding and output layer take the given number of rows (200, not 100 rounded up
        # to 128), split over TP; a size below the vocabulary or not divisible by TP exits 2.
        for ranks, extra in ((1, ()), (2, ("--tensor-model-parallel-size", "2"))):
            ck = os.path.join(self.tmp, f"padded{ranks}")
            proc = self.train(ranks, extra, padded_vocab_size=200, train_iters=1, save=ck)
            self.assertIn("(new size: 200)", proc.stdout)
            w = weights(ck + "/iter_0000001")
            self.assertEqual(w["model.embedding.word_embeddings.weight"].shape, (200, 64))
            self.assertEqual(w["model.output_layer.weight"].shape, (200, 64))
        for ranks, extra, size in ((1, (), 50), (2, ("--tensor-model-parallel-size", "2"), 201)):
            proc = megatron_job.run_train(
                MEGATRON, MPIEXEC, ranks,
                [*megatron_job.flags_with(BASE, padded_vocab_size=size), *extra], TIMEOUT_S)
            self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
            self.assertIn("--padded-vocab-size", proc.stderr)

    def test_lr_zero_and_decoupled_lr(self):
        one, three, dec = (os.path.join(self.tmp, n) for n in ("one", "three", "dec"))
        self.train(lr=0, train_iters=1, save=one)
        self.train(lr=0, save=three)
        proc = self.train(lr=0, decoupled_lr="1e-2", save=dec)
        a, b, c = weights(one), weights(three), weights(dec)
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertTrue(np.array_equal(a[name], b[name]), f"--lr 0 moved {name}")
        moved = sorted(n for n in a if not np.array_equal(a[n], c[n]))
        self.assertEqual(moved, ["model.embedding.word_embeddings.weight",
                                 "model.output_layer.weight"])
        lines = megatron_log.iteration_lines(proc.stdout, range(1, 4))
        for it, f in lines.items():
            self.assertEqual(float(f["learning rate"]), 0.0)
            # The decoupled rate follows the same (linear, to 0) schedule from 1e-2.
            self.assertAlmostEqual(float(f["decoupled learning rate"]), 1e-2 * (3 - it) / 3,
                                   delta=1e-8)

    def test_weight_decay_increment(self):
        common = dict(train_iters=4, weight_decay="0.5")
        const = megatron_log.loss_curve(self.train(**common).stdout, 4)
        same = megatron_log.loss_curve(self.train(
            **common, weight_decay_incr_style="linear", start_weight_decay="0.5",
            end_weight_decay="0.5").stdout, 4)
        self.assertEqual(const, same)
        zero = megatron_log.loss_curve(self.train(train_iters=4, weight_decay="0").stdout, 4)
        ramp = megatron_log.loss_curve(self.train(
            train_iters=4, weight_decay_incr_style="cosine", start_weight_decay="0",
            end_weight_decay="0.5").stdout, 4)
        # Iteration 1 has decay 0 in both zero and ramp; later steps apply the ramp's decay.
        self.assertEqual(ramp[1], zero[1])
        self.assertNotEqual(ramp[4], zero[4])
        self.assertNotEqual(ramp[4], const[4])

    def test_apply_wd_to_qk_layernorm(self):
        # One step with --weight-decay 0.5 and the query/key norms (weights 1 at start): the
        # flag decays exactly those (by the same lr x wd on every element) and nothing else;
        # its deprecated spelling is the same run bit for bit, with Megatron's warning.
        common = dict(train_iters=1, weight_decay="0.5", qk_layernorm=True)
        paths = {n: os.path.join(self.tmp, n) for n in ("plain", "wd", "alias")}
        self.train(**common, save=paths["plain"])
        self.train(**common, save=paths["wd"], apply_wd_to_qk_layernorm=True)
        alias = self.train(**common, save=paths["alias"],
                           no_weight_decay_cond_type="apply_wd_to_qk_layernorm")
        self.assertIn("WARNING: --no-weight-decay-cond-type is deprecated. Please use "
                      "--apply-wd-to-qk-layernorm instead.", alias.stdout)
        plain, wd, again = (weights(paths[n]) for n in ("plain", "wd", "alias"))
        for name in wd:
            self.assertTrue(np.array_equal(wd[name], again[name]), name)
        moved = sorted(n for n in wd if not np.array_equal(wd[n], plain[n]))
        self.assertEqual(moved, [f"model.decoder.layers.{i}.self_attention.{k}_layernorm.weight"
                                 for i in range(2) for k in ("k", "q")])
        for name in moved:
            gap = plain[name].astype(np.float64) - wd[name].astype(np.float64)
            self.assertGreater(gap.min(), 0, name)
            self.assertLess(gap.max() - gap.min(), 1e-6, name)  # one lr x wd x 1 everywhere
        proc = megatron_job.run_train(
            MEGATRON, MPIEXEC, 1, [*megatron_job.flags_with(BASE, no_weight_decay_cond_type="x")],
            TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
        self.assertIn("--no-weight-decay-cond-type must be apply_wd_to_qk_layernorm, got 'x'",
                      proc.stderr)

    def test_params_norm_matches_the_saved_weights_in_every_layout(self):
        for name, ranks, layout in (("single", 1, {}),
                                    ("tp2pp2", 4, dict(tensor_model_parallel_size=2,
                                                       pipeline_model_parallel_size=2))):
            with self.subTest(layout=name):
                save = os.path.join(self.tmp, name)
                proc = self.train(ranks=ranks, log_params_norm=True, save=save, **layout)
                printed = float(megatron_log.iteration_lines(proc.stdout, range(1, 4))[3]
                                ["params norm"])
                w = weights(save)
                norm = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in w.values()))
                self.assertLess(abs(printed - norm), 1e-3, f"{name}: printed {printed}, saved {norm}")

    def test_num_zeros_is_layout_invariant(self):
        counts = {}
        for name, ranks, layout in (("single", 1, {}),
                                    ("tp2", 2, dict(tensor_model_parallel_size=2)),
                                    ("pp2", 2, dict(pipeline_model_parallel_size=2)),
                                    ("dp2 distributed optimizer", 2,
                                     dict(use_distributed_optimizer=True))):
            proc = self.train(ranks=ranks, log_num_zeros_in_grad=True, **layout)
            lines = megatron_log.iteration_lines(proc.stdout, range(1, 4))
            counts[name] = [int(lines[it]["num zeros"]) for it in sorted(lines)]
        self.assertEqual(len(set(map(tuple, counts.values()))), 1, counts)
        self.assertGreaterEqual(min(counts["single"]), 28 * 64)  # the padded embedding rows

    def test_skip_train_evaluates_the_checkpoint(self):
        save = os.path.join(self.tmp, "ckpt")
        trained = self.train(save=save, eval_iters=2)
        skipped = self.train(load=save, skip_train=True, eval_iters=2)
        self.assertIn("skipping training (--skip-train is on) ...", skipped.stdout)
        self.assertEqual(megatron_log.iteration_lines(skipped.stdout), {})
        self.assertEqual(megatron_log.validation_losses(skipped.stdout),
                         megatron_log.validation_losses(trained.stdout)[-2:])
        self.assertEqual(megatron_log.validation_losses(skipped.stdout)[0][0],
                         "iteration 3 on validation set")

    def test_weight_hashes_across_data_parallel_replicas(self):
        # dp2 (and tp2 x dp2 with the distributed optimizer): the replicas' weights are compared
        # before training and every 2 iterations and match; one flipped bit on one replica (the
        # testing hook, after iteration 3's step) stops the run at the next check, on every rank,
        # naming the parameter and the replica (exit 1: a runtime failure, not bad input).
        flag = "check_weight_hash_across_dp_replicas_interval"
        for ranks, layout in ((2, {}), (4, {"tensor_model_parallel_size": 2,
                                            "use_distributed_optimizer": True})):
            with self.subTest(ranks=ranks):
                proc = self.train(ranks, train_iters=4, **layout, **{flag: 2})
                for it in (0, 2, 4):
                    self.assertIn(f">>> Weight hashes match after {it} iterations...",
                                  proc.stdout)
        # One bit flipped on world rank 1 after iteration 3's step, at tp2 x dp2: its replica
        # (rank 3) and itself name the weight at iteration 4's check; ranks 0 and 2, whose
        # replicas match, stop with them (one clean exit 1, every rank's line, no abort).
        proc = megatron_job.run_train(
            MEGATRON, MPIEXEC, 4,
            megatron_job.flags_with(BASE, train_iters=6, inject_fault="flip-weight:1:3",
                                    tensor_model_parallel_size=2, **{flag: 2}), TIMEOUT_S)
        self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
        self.assertIn(">>> Weight hashes match after 2 iterations...", proc.stdout)
        self.assertNotIn("match after 4 iterations", proc.stdout)
        head = "Parameter hashes not matching across DP replicas after 4 iterations: "
        for rank in (1, 3):
            self.assertIn(f"[rank {rank}] {head}embedding.word_embeddings.weight: rank 1 of its "
                          "data-parallel group differs from rank 0", proc.stderr)
        for rank in (0, 2):
            self.assertIn(f"[rank {rank}] {head}on other ranks", proc.stderr)
        self.assertNotIn("MPI_ABORT", proc.stderr)
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)
        # Megatron-FSDP's ZeRO-3 shards the weights: no replicas to compare (refused, as there).
        proc = megatron_job.run_train(
            MEGATRON, MPIEXEC, 2,
            megatron_job.flags_with(BASE, use_megatron_fsdp=True,
                                    data_parallel_sharding_strategy="optim_grads_params",
                                    **{flag: 2}), TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
        self.assertIn("not supported with optim_grads_params", proc.stderr)

    def test_test_mode_compares_the_query_key_norms(self):
        # --test-mode (Megatron's run_realtime_tests): with --qk-layernorm at tp2 x dp2 the query
        # and key norms' weights are compared over DP and TP every iteration and match; one bit
        # flipped in the first of them on world rank 1 (its TP peer of rank 0, after iteration 3's
        # step) ends the run at that iteration's check, on every rank, naming the weight (exit 1).
        qk = dict(qk_layernorm=True, tensor_model_parallel_size=2, train_iters=5, test_mode=True)
        proc = self.train(4, **qk)
        self.assertEqual(sorted(megatron_log.loss_curve(proc.stdout, None)), [1, 2, 3, 4, 5])
        proc = megatron_job.run_train(
            MEGATRON, MPIEXEC, 4,
            megatron_job.flags_with(BASE, inject_fault="flip-weight:1:3", **qk), TIMEOUT_S)
        self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
        # World rank 1's replicas: rank 3 (data parallel) and rank 0 (tensor parallel) name the
        # weight; rank 2, whose groups match, stops too.
        head = "--test-mode: discrepancy between the query/key norm weights at iteration 3: "
        name = "decoder.layers.0.self_attention.q_layernorm.weight"
        self.assertIn(f"[rank 1] {head}{name} differs across data-parallel replicas and "
                      "tensor-parallel ranks", proc.stderr)
        self.assertIn(f"[rank 3] {head}{name} differs across data-parallel replicas (",
                      proc.stderr)
        self.assertIn(f"[rank 0] {head}{name} differs across tensor-parallel ranks (", proc.stderr)
        self.assertIn(f"[rank 2] {head}on other ranks", proc.stderr)
        self.assertNotIn("MPI_ABORT", proc.stderr)  # a clean exit: every line is out
        self.assertNotIn("iteration        4/", proc.stdout)
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)

    def test_retention_and_progress_log(self):
        save = os.path.join(self.tmp, "ckpt")
        proc = self.train(train_iters=7, save=save, save_interval=1, save_retain_interval=3,
                          log_progress=True)
        kept = sorted(d for d in os.listdir(save) if d.startswith("iter_"))
        self.assertEqual(kept, ["iter_0000003", "iter_0000006", "iter_0000007"])
        for it in (1, 2, 4, 5):
            self.assertIn(f"successfully deleted checkpoint from iteration {it:7d}", proc.stdout)
        with open(os.path.join(save, "progress.txt"), encoding="utf-8") as f:
            rows = [line.rstrip("\n").split("\t") for line in f]
        for r in rows:
            self.assertRegex(r[0], r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
            self.assertRegex(r[1], r"^Job ID: ")
            self.assertEqual(r[2], "# GPUs: 1")
        events = [(r[3], r[4] if len(r) > 4 else "") for r in rows]
        self.assertEqual(events[0], ("Starting job", ""))
        saved = [int(e[1].split(": ")[1]) for e in events if e[0] == "Saved checkpoint"]
        deleted = [int(e[1].split(": ")[1]) for e in events if e[0] == "Deleted checkpoint"]
        self.assertEqual(saved, list(range(1, 8)))
        self.assertEqual(deleted, [1, 2, 4, 5])
        last = rows[-1]
        self.assertRegex(last[5], r"^Job throughput: \d+\.\d TFLOP/s/GPU$")
        self.assertRegex(last[6], r"^Cumulative throughput: \d+\.\d TFLOP/s/GPU$")
        self.assertRegex(last[7], r"^Floating-point operations: \d\.\d\de[+-]\d\d$")
        self.assertEqual(last[8], f"Tokens (in billions): {7 * 4 * 32 / 1e9:.2f}")
        # A second job appends its start and continues the FLOP count from the checkpoint.
        # (One iteration longer than the saved run: its schedule overridden, as Megatron asks.)
        self.train(train_iters=8, load=save, save=save, save_interval=1, log_progress=True,
                   extra=["--override-opt_param-scheduler"])
        with open(os.path.join(save, "progress.txt"), encoding="utf-8") as f:
            rows2 = [line.rstrip("\n").split("\t") for line in f]
        self.assertEqual(rows2[len(rows)][3], "Starting job")
        flops = [float(r[7].split(": ")[1]) for r in rows2 if r[3] == "Saved checkpoint"]
        self.assertAlmostEqual(flops[-1] / flops[-2], 8 / 7, places=2)

    def test_overlap_param_gather_changes_nothing_but_timing(self):
        common = dict(use_distributed_optimizer=True, overlap_grad_reduce=True,
                      ddp_bucket_size=4000, train_iters=6, eval_interval=3, eval_iters=1)
        for name, ranks, layout in (("dp2", 2, {}), ("dp2 bf16", 2, {"bf16": True}),
                                    ("pp2 x dp2", 4, {"pipeline_model_parallel_size": 2})):
            with self.subTest(layout=name):
                save = os.path.join(self.tmp, name.replace(" ", "_"))
                plain = self.train(ranks=ranks, **common, **layout)
                overlap = self.train(ranks=ranks, **common, **layout, overlap_param_gather=True,
                                     save=save, save_interval=3, timing_log_level=1)
                self.assertEqual(megatron_log.loss_curve(plain.stdout, 6),
                                 megatron_log.loss_curve(overlap.stdout, 6))
                self.assertEqual(megatron_log.validation_losses(plain.stdout),
                                 megatron_log.validation_losses(overlap.stdout))
                self.assertIn("params-all-gather (exposed)", overlap.stdout)
        refused = megatron_job.run_train(MEGATRON, MPIEXEC, 1, megatron_job.flags_with(
            BASE, overlap_param_gather=True), TIMEOUT_S)
        self.assertEqual(refused.returncode, 2)
        self.assertIn("--overlap-param-gather only supported with distributed optimizer",
                      refused.stderr)

    def test_ddp_num_buckets_and_persistent_save_interval(self):
        # --ddp-num-buckets N: bucket size = this rank's parameters / N (Megatron's rule), about N
        # buckets, the same numbers as one bucket (each element is reduced and stepped alike).
        common = dict(use_distributed_optimizer=True, overlap_grad_reduce=True, train_iters=4)
        one = self.train(ranks=2, **common)
        four = self.train(ranks=2, **common, ddp_num_buckets=4)
        def buckets(proc):
            return int(re.search(r"Number of buckets for gradient all-reduce / reduce-scatter: "
                                 r"(\d+)", proc.stdout).group(1))
        # The default size holds the whole model (its buckets are only the parameter groups the
        # layout keeps apart); a quarter of it cuts those groups further, into 4 or more.
        self.assertGreaterEqual(buckets(four), 4)
        self.assertGreater(buckets(four), buckets(one))
        self.assertEqual(megatron_log.loss_curve(one.stdout, 4),
                         megatron_log.loss_curve(four.stdout, 4))
        # --persistent-save-interval is Megatron's other name of --save-interval.
        save = os.path.join(self.tmp, "persistent")
        self.train(train_iters=4, save=save, persistent_save_interval=2)
        self.assertEqual(sorted(d for d in os.listdir(save) if d.startswith("iter_")),
                         ["iter_0000002", "iter_0000004"])
        for extra, message in (
                (dict(ddp_num_buckets=4, ddp_bucket_size=100),
                 "Cannot specify both --ddp-num-buckets and --ddp-bucket-size"),
                (dict(ddp_num_buckets=0), "--ddp-num-buckets must be greater than 0"),
                (dict(save_interval=2, persistent_save_interval=3),
                 "--persistent-save-interval is Megatron's other name of --save-interval")):
            proc = megatron_job.run_train(MEGATRON, MPIEXEC, 1, megatron_job.flags_with(
                BASE, **extra), TIMEOUT_S)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn(message, proc.stderr)

    def test_calculate_per_token_loss(self):
        data = {"data_path": short_documents(self.tmp), "split": "90,5,5",
                "tokenizer_type": "NullTokenizer", "eod_mask_loss": True, "train_iters": 6,
                "data_cache_path": os.path.join(self.tmp, "cache"),
                # Dropout masks follow the micro-batch index: off, so that micro-batches of 1
                # and of 4 compute the same function.
                "hidden_dropout": "0", "attention_dropout": "0"}
        base = {k: v for k, v in BASE.items() if k != "--mock-data"}

        def curve(ranks=1, **overrides):
            proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, megatron_job.flags_with(
                base, **data, **overrides), TIMEOUT_S)
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            return megatron_log.loss_curve(proc.stdout, 6)

        per_token = curve(calculate_per_token_loss=True)
        runs = {"one micro-batch of 4": curve(calculate_per_token_loss=True, micro_batch_size=4),
                "dp2": curve(2, calculate_per_token_loss=True),
                "tp2 pp2": curve(4, calculate_per_token_loss=True, tensor_model_parallel_size=2,
                                 pipeline_model_parallel_size=2)}
        for name, other in runs.items():
            for it in per_token:
                for a, b in zip(per_token[it], other[it]):
                    self.assertTrue(close(a, b), f"{name}, iteration {it}: {per_token[it]} vs "
                                                 f"{other[it]}")
        default = curve()
        one_mb_default = curve(micro_batch_size=4)
        # One micro-batch per step: the mean of means is the token mean, so both objectives agree;
        # four micro-batches of unequal token counts: they do not (grad norm of step 1).
        self.assertTrue(close(one_mb_default[1][1], per_token[1][1]))
        self.assertFalse(close(default[1][1], per_token[1][1], 1e-4), (default[1], per_token[1]))

    def tags(self, tb):
        dec = subprocess.run([sys.executable, DECODE_TFEVENTS, tb], capture_output=True,
                             text=True, timeout=TIMEOUT_S, check=False)
        self.assertEqual(dec.returncode, 0, dec.stderr)
        return {json.loads(line)["tag"] for line in dec.stdout.splitlines() if line.strip()}

    def test_tensorboard_flags(self):
        plain = os.path.join(self.tmp, "plain")
        self.train(tensorboard_dir=plain, eval_interval=2)
        flagged = os.path.join(self.tmp, "flagged")
        self.train(tensorboard_dir=flagged, eval_interval=2, log_params_norm=True,
                   log_num_zeros_in_grad=True, log_timers_to_tensorboard=True,
                   log_memory_to_tensorboard=True, log_validation_ppl_to_tensorboard=True,
                   log_world_size_to_tensorboard=True, no_log_loss_scale_to_tensorboard=True,
                   decoupled_lr="1e-3", timing_log_level=1)
        a, b = self.tags(plain), self.tags(flagged)
        self.assertIn("loss-scale", a)
        self.assertIn("lm loss validation", a)
        added = {"params-norm", "num-zeros", "iteration-time", "throughput", "world-size",
                 "mem-reserved-bytes", "mem-max-allocated-bytes", "lm loss validation ppl",
                 "decoupled-learning-rate", "forward-backward-time"}
        self.assertEqual(added & a, set())
        self.assertEqual(added - b, set())
        self.assertNotIn("loss-scale", b)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
