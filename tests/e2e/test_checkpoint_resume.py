#!/usr/bin/env python3
"""Sharded checkpoints end to end: exact resume, resharding loads, and a missing optimizer state.

What it is: `megatron train` under mpiexec on an indexed dataset that the test writes itself
(`megatron preprocess` of a few hundred NullTokenizer documents: the GPT-2 BPE files exist only
under data/, which scripts/fetch_data.sh downloads, so a fresh clone has no BPE to use), a tiny
GPT model with dropout on, 20 iterations, evaluation every 5.
  - Exact resume: a run stopped at iteration 10 (`--save CK --exit-interval 10`, the same
    --train-iters as the straight run, since the LR schedule decays over it) and resumed with
    `--load CK` must print the straight run's iteration lines 11..20 and validation lines after
    iteration 10 character for character: weights, fp32 main weights, Adam moments, step count,
    schedule, consumed samples (so the data order) and dropout stream all come back. For fp32
    and bf16 at tp2pp2 and dp2 with the distributed optimizer, and for --async-save, whose
    iteration-5 checkpoint is written while iterations 6..10 train and must still hold
    iteration 5's state (resumed with --ckpt-step 5).
  - Resharding: a tp2pp2 checkpoint loaded at tp1pp1, pp4, dp2 with the distributed optimizer,
    tp4, and two uneven pipeline splits (pp2 with a 1-layer first stage; tp2pp3 with the
    embedding and loss counted as layers) (and tp2pp2 as the control) must take its next step to
    the straight run's
    iteration-11 loss, and, saved again right after loading, must hold the same global tensors
    (weights and both Adam moments) bit for bit, as tests/testing/checkpoint_reader.py
    assembles them from the shards.
  - Non-persistent checkpoints (--non-persistent-ckpt-type global): a dp2 run that fails at
    iteration 14 leaves persistent checkpoint 10 and non-persistent 8 and 12 (4 deleted); the
    resume takes 12 and prints the straight run's iterations 13..20 and validations exactly;
    once the persistent one is newer it wins (with a warning); bad type/interval flags exit 2.
  - --use-mp-args-from-checkpoint-args takes the saving run's model-parallel sizes over the
    given ones (with --use-checkpoint-args; refused without).
  - The learning-rate schedule on load, as Megatron's OptimizerParamScheduler: its state dict
    saved; a resume with another --lr or --train-iters refused (exit 2), kept with
    --override-opt_param-scheduler, the checkpoint's taken with
    --use-checkpoint-opt_param-scheduler (the learning rate printed at the next iteration).
  - --override-ckpt-iteration: a checkpoint of iteration 10 resumed as iteration 6 reads
    iteration 7's samples at the schedule's iteration-11 learning rate; another global batch
    size and --finetune are refused (exit 2).
  - A checkpoint saved with --no-save-optim refuses a load that wants the optimizer (exit 2,
    naming --no-load-optim) and loads its weights, with zero moments, under --no-load-optim.
  - The reader the checks above trust: an intact tp2 checkpoint assembles its boxes, and a
    flipped byte, a truncated or unlisted file, and overlapping, missing, out-of-bounds or
    mis-sized boxes each raise CheckpointError.
What it is not: the format's unit tests (test_safetensors.cpp), the layouts' numerical
equivalence without checkpoints (tests/parallel), or fault injection during a save.

Usage: test_checkpoint_resume.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import json
import os
import random
import re
import shutil
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
TIMEOUT_S = 180
VOCAB = 128
TMP = None  # the module's tempfile.TemporaryDirectory
DATA = None  # [--data-path ... flags] of the dataset setUpModule writes

TINY = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB), "--num-layers", "4",
        "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "20",
        "--log-interval", "1", "--lr", "2e-3", "--lr-warmup-iters", "3", "--eval-iters", "2",
        "--eval-interval", "5", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
        "--num-threads", "1"]
TP, PP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size"
TP2PP2 = [TP, "2", PP, "2"]
DISTOPT = ["--use-distributed-optimizer"]

# The iteration line's fields that do not depend on timing, compared as printed.
FIELDS = ("consumed samples", "learning rate", "global batch size", "lm loss", "loss scale",
          "grad norm", "number of skipped iterations", "number of nan iterations")
VALID_AT_RE = re.compile(r"iteration\s+(\d+)( on \w+ set)?$")


def setUpModule():
    """Writes the dataset once: documents that count up in steps of 3 from a random start (a
    rule the model starts to learn within 20 iterations), preprocessed with EOD appended."""
    global TMP, DATA
    TMP = tempfile.TemporaryDirectory(prefix="checkpoint_resume_")
    rng = random.Random(7)
    jsonl = os.path.join(TMP.name, "docs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for _ in range(300):
            start, n = rng.randrange(1, 100), rng.randrange(5, 90)
            ids = [1 + (start + 3 * i) % (VOCAB - 2) for i in range(n)]
            f.write(json.dumps({"text": " ".join(map(str, ids))}) + "\n")
    prefix = os.path.join(TMP.name, "docs")
    proc = subprocess.run([MEGATRON, "preprocess", "--input", jsonl, "--output-prefix", prefix,
                           "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
                           "--append-eod", "--workers", "1"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"megatron preprocess failed:\n{proc.stderr[-3000:]}")
    DATA = ["--data-path", prefix + "_text_document", "--split", "90,5,5",
            "--data-cache-path", os.path.join(TMP.name, "cache")]


def tearDownModule():
    TMP.cleanup()


with_flags = megatron_job.with_flags


def run(ranks, *args, expect_rc=0):
    """megatron train on the module's dataset with TINY and args (args' value of a flag wins)."""
    proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, [*DATA, *with_flags(TINY, args)],
                                  TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"{ranks} rank(s), train {' '.join(args)}: exit {proc.returncode}, "
                             f"expected {expect_rc}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def iterations(proc):
    """{iteration: {field: printed value}} of the iteration lines (every line whole and printed
    once: megatron_log), the fields that do not depend on timing."""
    return {it: {k: v for k, v in f.items() if k in FIELDS}
            for it, f in megatron_log.iteration_lines(proc.stdout).items()}


def validations(proc):
    """[(iteration, set label, loss, PPL)] of the validation lines, in order, as printed."""
    out = []
    for where, f in megatron_log.validation_lines(proc.stdout):
        m = VALID_AT_RE.match(where)
        assert m, f"validation line at {where!r}"
        out.append((int(m[1]), m[2] or "", f["lm loss value"], f["lm loss PPL"]))
    return out


def tmpdir(name):
    return tempfile.mkdtemp(prefix=name + "_", dir=TMP.name)


class TestExactResume(unittest.TestCase):
    def check_resume(self, ranks, flags, save_flags=(), resume_from=(10,)):
        """Straight 20 iterations vs. 10 + save, then a resume from each of resume_from."""
        ck = tmpdir("ck")
        straight = run(ranks, *flags)
        first = run(ranks, *flags, "--save", ck, "--exit-interval", "10", *save_flags)
        want, want_valid = iterations(straight), validations(straight)
        self.assertEqual(sorted(want), list(range(1, 21)), straight.stdout[-2000:])
        self.assertIn("lm loss", want[11])
        self.assertEqual(iterations(first), {i: want[i] for i in range(1, 11)},
                         "the first half is the straight run up to iteration 10")
        self.assertEqual(validations(first), [v for v in want_valid if v[0] <= 10])
        for step in resume_from:
            with self.subTest(resume_from=step):
                meta, _ = checkpoint_reader.read_checkpoint(
                    os.path.join(ck, f"iter_{step:07d}"))
                self.assertEqual(meta["iteration"], step)
                self.assertEqual(meta["run_state"]["consumed_train_samples"], 4 * step)
                pick = [] if step == 10 else ["--ckpt-step", str(step)]
                second = run(ranks, *flags, "--load", ck, *pick)
                got = iterations(second)
                self.assertEqual(sorted(got), list(range(step + 1, 21)), second.stdout[-2000:])
                for i in got:  # string-equal: bit-identical losses print identically
                    self.assertEqual(got[i], want[i], f"iteration {i} after resuming at {step}")
                self.assertEqual(validations(second), [v for v in want_valid if v[0] > step])
        with open(os.path.join(ck, "latest_checkpointed_iteration.txt"), encoding="utf-8") as f:
            self.assertEqual(f.read().strip(), "10")

    def test_fp32_tp2pp2(self):
        self.check_resume(4, TP2PP2)

    def test_bf16_tp2pp2(self):
        self.check_resume(4, [*TP2PP2, "--bf16"])

    def test_fp32_dp2_distributed_optimizer(self):
        self.check_resume(2, DISTOPT)

    def test_bf16_dp2_distributed_optimizer(self):
        self.check_resume(2, [*DISTOPT, "--bf16"])

    def test_async_save_tp2pp2(self):
        # Iteration 5's checkpoint is written on a background thread while 6..10 update the
        # weights: resuming from it proves the host copy was taken at iteration 5.
        self.check_resume(4, TP2PP2, ["--async-save", "--save-interval", "5"], (5, 10))


class TestNonPersistent(unittest.TestCase):
    """--non-persistent-ckpt-type global: checkpoints every --non-persistent-save-interval
    iterations that are not --save-interval multiples, under <save>/non_persistent, only the
    newest kept (the older ones deleted before each save, so at most two exist); a load takes the
    non-persistent checkpoint when it is at least as new as the persistent one."""

    NP = ["--non-persistent-ckpt-type", "global"]

    def test_a_crash_resumes_from_the_newer_non_persistent_checkpoint(self):
        ck = tmpdir("np")
        straight = run(2, *DISTOPT)
        want, want_valid = iterations(straight), validations(straight)
        # Rank 0 fails at the start of iteration 14: persistent checkpoint 10, non-persistent 12.
        crashed = megatron_job.run_train(
            MEGATRON, MPIEXEC, 2,
            [*DATA, *with_flags(TINY, [*DISTOPT, *self.NP, "--save", ck, "--save-interval", "10",
                                       "--non-persistent-save-interval", "4",
                                       "--inject-fault", "exception:0:14"])], TIMEOUT_S)
        self.assertNotEqual(crashed.returncode, 0)
        self.assertIn("saving non-persistent checkpoint at iteration      12", crashed.stdout)
        np_dir = os.path.join(ck, "non_persistent")
        self.assertEqual(sorted(os.listdir(np_dir)),
                         ["iter_0000008", "iter_0000012", "latest_checkpointed_iteration.txt"])
        self.assertEqual(sorted(d for d in os.listdir(ck) if d.startswith("iter_")),
                         ["iter_0000010"])
        resumed = run(2, *DISTOPT, *self.NP, "--load", ck, "--save", ck)
        self.assertIn(f"loading non-persistent checkpoint from {np_dir} at iteration 12",
                      resumed.stdout)
        got = iterations(resumed)
        self.assertEqual(sorted(got), list(range(13, 21)), resumed.stdout[-2000:])
        for i in got:
            self.assertEqual(got[i], want[i], f"iteration {i} after the non-persistent resume")
        self.assertEqual(validations(resumed), [v for v in want_valid if v[0] > 12])
        # Without the type the persistent checkpoint (iteration 20 now) is the only one looked at;
        # with it the older non-persistent one (12) is passed over with a warning.
        for flags in ([], self.NP):
            again = run(2, *DISTOPT, *flags, "--load", ck)
            self.assertIn(f"loading checkpoint from {ck} at iteration 20", again.stdout)
            self.assertEqual(bool(flags), "is older than the persistent one" in again.stdout)

    def test_refusals(self):
        for flags, named in ((["--non-persistent-save-interval", "4"], "--non-persistent-ckpt-type"),
                             (["--non-persistent-ckpt-type", "local"], "local"),
                             (["--non-persistent-ckpt-type", "in_memory"], "in_memory")):
            proc = run(1, *flags, expect_rc=2)
            self.assertIn(named, proc.stderr)


def same_tensor(name, a, b, vocab_rows):
    """a == b exactly; for the vocabulary tensors (padded differently per TP size) on the first
    vocab_rows rows, and b's rows beyond a's padding must be zero (never saved, never trained)."""
    if a.shape == b.shape:
        return np.array_equal(a, b)
    assert "word_embeddings" in name or "output_layer" in name, f"{name}: {a.shape} vs {b.shape}"
    assert a.shape[1:] == b.shape[1:], f"{name}: {a.shape} vs {b.shape}"
    extra_zero = b.shape[0] <= a.shape[0] or not b[a.shape[0]:].any()
    return np.array_equal(a[:vocab_rows], b[:vocab_rows]) and extra_zero


class TestResharding(unittest.TestCase):
    LAYOUTS = [  # (name, ranks, flags)
        ("tp2pp2 (the saved layout)", 4, TP2PP2),
        ("tp1pp1", 1, []),
        ("tp1pp4", 4, [PP, "4"]),
        ("dp2 distributed optimizer", 2, DISTOPT),
        ("tp4", 4, [TP, "4"]),
        # Uneven pipeline stages (layers 1 + 3; 1 + 2 + 1 with the embedding and loss counted).
        ("pp2 first stage 1 layer", 2, [PP, "2", "--decoder-first-pipeline-num-layers", "1"]),
        ("tp2pp3 embedding and loss counted", 6,
         [TP, "2", PP, "3", "--account-for-embedding-in-pipeline-split",
          "--account-for-loss-in-pipeline-split"]),
    ]

    def test_tp2pp2_checkpoint_loads_in_every_layout(self):
        self.check_reshard([], 4, TP2PP2, self.LAYOUTS)

    def test_hybrid_mamba_checkpoint_reshards(self):
        # A hybrid Mamba model's in-projection holds five blocks (z, x, B, C, dt) and its
        # convolution three, each split over TP: saved at tp2 with the distributed optimizer,
        # loaded at tp1, tp4 and pp2, and saved again unchanged.
        mamba = ["--model", "mamba", "--hybrid-override-pattern", "M*M-", "--mamba-state-dim", "8",
                 "--mamba-head-dim", "16", "--mamba-num-groups", "4", "--normalization",
                 "RMSNorm", "--position-embedding-type", "none"]
        saved = [TP, "2", *DISTOPT]
        self.check_reshard(mamba, 4, saved, [("tp2dp2 (the saved layout)", 4, saved),
                                             ("tp1pp1", 1, []), ("tp4", 4, [TP, "4"]),
                                             ("pp2 dp2 distributed optimizer", 4,
                                              [PP, "2", *DISTOPT])])

    def test_distributed_optimizer_instances_reshard(self):
        # Two distributed-optimizer instances hold the same sharded state (moments, and the main
        # weights in bf16): instance 0 writes it, and the checkpoint loads into one instance at
        # dp4, into tp1pp1 and back into two instances, and saves back unchanged, in fp32 and
        # bf16.
        saved = [*DISTOPT, "--num-distributed-optimizer-instances", "2"]
        layouts = [("dp4 two instances (the saved layout)", 4, saved),
                   ("dp4 one instance", 4, DISTOPT), ("tp1pp1", 1, []),
                   ("tp2dp2 two instances", 4, [TP, "2", *saved])]
        for precision in ([], ["--bf16"]):
            with self.subTest(precision=precision or "fp32"):
                self.check_reshard(precision, 4, saved, layouts, saved_tp=1)

    def test_heterogeneous_checkpoint_reshards_and_keeps_its_blocks(self):
        # Llama-Nemotron's heterogeneous layers: per-layer query groups (4 and 2 of 8 heads) and
        # MLP widths (256, 512), and two linear replacements, each split over TP on its own:
        # saved at tp2 with the distributed optimizer, loaded at tp1 and pp2, saved again
        # unchanged. Then the block list is the checkpoint's: another list is refused naming
        # it, and --use-checkpoint-args brings the saved one back without the flag.
        blocks = [({"n_heads_in_group": 2}, {"ffn_mult": 2.0}),
                  ({"replace_with_linear": True}, {"no_op": True}),
                  ({"no_op": True}, {"ffn_mult": 7.0}),
                  ({"n_heads_in_group": 4}, {"replace_with_linear": True})]
        config = {"hidden_act": "silu", "num_hidden_layers": 4, "hidden_size": 64,
                  "num_attention_heads": 8, "tie_word_embeddings": False, "rope_theta": 10000.0,
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
                  "block_configs": [{"attention": a, "ffn": f} for a, f in blocks]}
        path = os.path.join(tmpdir("het"), "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        llama = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                 "--disable-bias-linear", "--num-attention-heads", "8", "--group-query-attention",
                 "--num-query-groups", "4", "--untie-embeddings-and-output-weights",
                 "--use-rope-scaling",
                 "--use-rotary-position-embeddings"]
        model = [*llama, "--heterogeneous-layers-config-path", path]
        saved = [TP, "2", *DISTOPT]
        self.check_reshard(model, 4, saved, [("tp2dp2 (the saved layout)", 4, saved),
                                             ("tp1pp1", 1, []),
                                             ("pp2 dp2 distributed optimizer", 4,
                                              [PP, "2", *DISTOPT])])
        ck = tmpdir("het_ck")
        run(1, *model, "--save", ck, "--exit-interval", "5")
        config["block_configs"][2]["ffn"]["ffn_mult"] = 2.0
        other = os.path.join(tmpdir("het_other"), "config.json")
        with open(other, "w", encoding="utf-8") as f:
            json.dump(config, f)
        refused = run(1, *llama, "--heterogeneous-layers-config-path", other, "--load", ck,
                      expect_rc=2)
        self.assertIn("heterogeneous_blocks", refused.stderr)
        resumed = run(1, *llama, "--load", ck, "--use-checkpoint-args", "--exit-interval", "6")
        self.assertEqual(sorted(iterations(resumed)), [6], resumed.stdout[-2000:])
        straight = iterations(run(1, *model, "--exit-interval", "6"))
        self.assertEqual(iterations(resumed)[6], straight[6])

    def check_reshard(self, model, saved_ranks, saved_flags, layouts, saved_tp=2):
        ck = tmpdir("ck")
        want = iterations(run(saved_ranks, *model, *saved_flags))[11]
        run(saved_ranks, *model, *saved_flags, "--save", ck, "--exit-interval", "10")
        saved_meta, saved = checkpoint_reader.read_checkpoint(ck)
        self.assertEqual(saved_meta["layout"]["tensor_model_parallel_size"], saved_tp)
        self.assertTrue(any(k.startswith("optimizer.exp_avg_sq.") for k in saved))
        for name, ranks, flags in layouts:
            with self.subTest(layout=name):
                # (i) One step after loading, saved in this layout.
                step_dir = tmpdir("step")
                step = run(ranks, *model, *flags, "--load", ck, "--exit-interval", "11",
                           "--save", step_dir)
                got = iterations(step)
                self.assertEqual(sorted(got), [11], step.stdout[-2000:])
                self.assertEqual(checkpoint_reader.read_checkpoint(step_dir)[0]["iteration"], 11)
                for field in ("consumed samples", "learning rate"):
                    self.assertEqual(got[11][field], want[field], field)
                if flags is saved_flags:  # the same layout: the same sums, so the same bits
                    self.assertEqual(got[11], want)
                rel = abs(float(got[11]["lm loss"]) / float(want["lm loss"]) - 1)
                print(f"{name}: iteration-11 loss {got[11]['lm loss']} vs {want['lm loss']} "
                      f"(relative {rel:.1e})", file=sys.stderr)
                # 1e-5 relative: the layouts add the same f32 partial sums in another order (TP
                # all-reduces, pipeline stages, data-parallel reduce-scatter), which moves the
                # 7th significant digit at most in one step; a wrongly placed shard or a lost
                # moment moves the 3rd.
                self.assertAlmostEqual(float(got[11]["lm loss"]), float(want["lm loss"]),
                                       delta=1e-5 * float(want["lm loss"]))
                # (ii) Saved again right after loading (--train-iters 10: nothing to train, the
                # end-of-run save writes the loaded state in this layout; the schedule's
                # parameters taken from the checkpoint, whose run was 20 iterations long).
                out = tmpdir("out")
                run(ranks, *model, *flags, "--load", ck, "--save", out, "--train-iters", "10",
                    "--use-checkpoint-opt_param-scheduler")
                meta, tensors = checkpoint_reader.read_checkpoint(out)
                self.assertEqual(meta["iteration"], 10)
                self.assertEqual(meta["run_state"], saved_meta["run_state"])
                self.assertEqual(meta["layout"]["world_size"], ranks)
                self.assertEqual(sorted(tensors), sorted(saved))
                differ = [k for k in saved if not same_tensor(k, saved[k], tensors[k], VOCAB)]
                self.assertEqual(differ, [], "tensors that did not survive the reshard")


class TestScheduleOnLoad(unittest.TestCase):
    """Megatron's OptimizerParamScheduler on load: the checkpoint holds the schedule's parameters
    (its state_dict, in samples); a resume must give the same ones unless
    --override-opt_param-scheduler keeps the run's or --use-checkpoint-opt_param-scheduler takes
    the checkpoint's."""

    def test_schedule_parameters_checked_overridden_or_taken(self):
        ck = tmpdir("sched")
        run(1, "--save", ck, "--exit-interval", "10", "--eval-iters", "0")
        meta, _ = checkpoint_reader.read_checkpoint(os.path.join(ck, "iter_0000010"))
        # TINY: --lr 2e-3, warm-up 3 iterations, decay over --train-iters 20, global batch 4.
        self.assertEqual(meta["run_state"]["opt_param_scheduler"],
                         {"max_lr": 2e-3, "min_lr": 0.0, "lr_warmup_steps": 12.0,
                          "lr_decay_steps": 80, "lr_decay_style": "linear", "num_steps": 40,
                          "start_wd": 0.01, "end_wd": 0.01, "wd_incr_steps": 80,
                          "wd_incr_style": "constant"})
        same = run(1, "--load", ck, "--eval-iters", "0")
        self.assertIn(" > using checkpoint value 0.002 for learning rate", same.stdout)
        self.assertIn(" > using checkpoint value 80 for total number of iterations", same.stdout)
        # Another --lr, or another --train-iters (the decay length follows it): refused.
        for flags, name in ((["--lr", "1e-3"], "0.001 and checkpoint value 0.002 for learning "
                                               "rate do not match"),
                            (["--train-iters", "30"], "for total number of iterations do not "
                                                      "match")):
            with self.subTest(flags=flags):
                proc = run(1, "--load", ck, "--eval-iters", "0", *flags, expect_rc=2)
                self.assertIn(name, proc.stderr)
                self.assertIn("--override-opt_param-scheduler", proc.stderr)
        # Kept or taken: iteration 11's learning rate is the straight run's with those values.
        lr_at_11 = {lr: iterations(run(1, "--lr", lr, "--eval-iters", "0", "--exit-interval",
                                       "11"))[11]["learning rate"] for lr in ("1e-3", "2e-3")}
        self.assertNotEqual(lr_at_11["1e-3"], lr_at_11["2e-3"])
        kept = run(1, "--load", ck, "--eval-iters", "0", "--lr", "1e-3",
                   "--override-opt_param-scheduler")
        self.assertIn(" > overriding learning rate value to 0.001", kept.stdout)
        self.assertEqual(iterations(kept)[11]["learning rate"], lr_at_11["1e-3"])
        taken = run(1, "--load", ck, "--eval-iters", "0", "--lr", "1e-3",
                    "--use-checkpoint-opt_param-scheduler")
        self.assertEqual(iterations(taken)[11]["learning rate"], lr_at_11["2e-3"])
        proc = run(1, "--load", ck, "--override-opt_param-scheduler",
                   "--use-checkpoint-opt_param-scheduler", expect_rc=2)
        self.assertIn("both override and use-checkpoint are set", proc.stderr)


class TestOverrideIteration(unittest.TestCase):
    """--override-ckpt-iteration (Megatron core 0.19): the checkpoint continues as if saved at
    another iteration; its consumed samples are recomputed from the current global batch size,
    so the data loader replays from there, while the schedule and optimizer keep the
    checkpoint's."""

    def test_rewinds_the_data_not_the_schedule(self):
        ck = tmpdir("override")
        straight = iterations(run(1, "--eval-iters", "0"))
        run(1, "--save", ck, "--exit-interval", "10", "--eval-iters", "0")
        proc = run(1, "--load", ck, "--override-ckpt-iteration", "6", "--eval-iters", "0")
        self.assertIn("Overriding checkpoint iteration to 6 (consumed_train_samples = 24)",
                      proc.stdout)
        got = iterations(proc)
        self.assertEqual(sorted(got), list(range(7, 21)), proc.stdout[-2000:])
        # Iteration 7 reads the samples the straight run's iteration 7 read...
        self.assertEqual(got[7]["consumed samples"], straight[7]["consumed samples"])
        # ...at the learning rate of the checkpoint's next step (straight iteration 11).
        self.assertEqual(got[7]["learning rate"], straight[11]["learning rate"])
        self.assertNotEqual(got[7]["learning rate"], straight[7]["learning rate"])
        # The checkpoint records its global batch size: another one is refused, as Megatron
        # does; so is --finetune (which starts at iteration 0 anyway).
        proc = run(1, "--load", ck, "--override-ckpt-iteration", "6", "--eval-iters", "0",
                   "--global-batch-size", "8", "--override-opt_param-scheduler", expect_rc=2)
        self.assertIn("checkpoint global_batch_size (4) != current global_batch_size (8)",
                      proc.stderr)
        proc = run(1, "--load", ck, "--override-ckpt-iteration", "6", "--finetune", expect_rc=2)
        self.assertIn("Cannot override checkpoint iteration together with finetune flag",
                      proc.stderr)


class TestOptimizerStateMissing(unittest.TestCase):
    def test_no_save_optim_needs_no_load_optim(self):
        ck = tmpdir("ck")
        run(2, TP, "2", "--train-iters", "10", "--save", ck, "--no-save-optim")
        meta, saved = checkpoint_reader.read_checkpoint(ck)
        self.assertFalse(meta["has_optimizer_state"])
        self.assertEqual([k for k in saved if not k.startswith("model.")], [])

        refused = run(2, TP, "2", "--load", ck, expect_rc=2)
        self.assertIn("--no-load-optim", refused.stderr)
        self.assertEqual(iterations(refused), {}, "trained without the optimizer state")

        out = tmpdir("out")
        run(2, TP, "2", "--load", ck, "--no-load-optim", "--train-iters", "10", "--save", out)
        _, loaded = checkpoint_reader.read_checkpoint(out)
        for k, v in loaded.items():
            if k.startswith("model."):
                self.assertTrue(np.array_equal(v, saved[k]), k)
            else:  # --no-load-optim: the moments start at zero
                self.assertFalse(v.any(), k)
        resumed = run(2, TP, "2", "--load", ck, "--no-load-optim", "--exit-interval", "11")
        self.assertEqual(sorted(iterations(resumed)), [11], resumed.stdout[-2000:])


class TestUseCheckpointArgs(unittest.TestCase):
    """--use-checkpoint-args takes the model's architecture from the checkpoint: from the argument
    table's record ("arguments") of the run that saved it, or, in a checkpoint without that
    record (older saves, `megatron convert`), from its resolved model arguments ("args")."""

    def check_resumes_with_the_checkpoints_shape(self, ck, want):
        # Shape flags that disagree with the checkpoint: replaced (and said so), and the run
        # continues the saving run exactly; a run without the flag is refused.
        refused = run(1, "--load", ck, "--exit-interval", "7", expect_rc=2)
        self.assertIn("holds a different model", refused.stderr)
        resumed = run(1, "--load", ck, "--use-checkpoint-args", "--normalization", "LayerNorm",
                      "--exit-interval", "7")
        self.assertIn(" > --use-checkpoint-args: --num-layers 4 replaced by the checkpoint's 3",
                      resumed.stdout)
        self.assertIn(" > --use-checkpoint-args: --normalization LayerNorm replaced by the "
                      "checkpoint's RMSNorm", resumed.stdout)
        got = iterations(resumed)
        self.assertEqual(sorted(got), [6, 7], resumed.stdout[-2000:])
        for i in got:
            self.assertEqual(got[i], want[i], f"iteration {i}")

    def test_architecture_comes_from_the_checkpoint(self):
        shape = ["--num-layers", "3", "--normalization", "RMSNorm", "--swiglu",
                 "--position-embedding-type", "rope", "--disable-bias-linear"]
        straight = run(1, *shape, "--exit-interval", "7")
        want = iterations(straight)
        ck = tmpdir("ck")
        run(1, *shape, "--save", ck, "--exit-interval", "5")
        meta, _ = checkpoint_reader.read_checkpoint(os.path.join(ck, "iter_0000005"))
        self.assertEqual(meta["arguments"]["num_layers"], 3)
        self.assertEqual(meta["arguments"]["normalization"], "RMSNorm")
        self.assertIs(meta["arguments"]["disable_bias_linear"], True)
        self.assertEqual(meta["arguments"]["lr"], 2e-3)  # every argument, not only the model's
        self.check_resumes_with_the_checkpoints_shape(ck, want)
        # The same checkpoint without the table's record: the resolved "args" serve.
        legacy = tmpdir("legacy")
        shutil.copytree(ck, legacy, dirs_exist_ok=True)
        path = os.path.join(legacy, "iter_0000005", "metadata.json")
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        del meta["arguments"]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(meta, f)
        self.check_resumes_with_the_checkpoints_shape(legacy, want)

    def test_model_parallel_sizes_from_the_checkpoint(self):
        # --use-mp-args-from-checkpoint-args (with --use-checkpoint-args): a tp2 checkpoint
        # resumed on 2 ranks with --tensor-model-parallel-size 1 given runs at the checkpoint's
        # tp2 (Megatron's force=True), and prints the replacement; without --use-checkpoint-args
        # the flag is refused, naming it.
        ck = tmpdir("mp")
        run(2, TP, "2", "--save", ck, "--exit-interval", "5", "--eval-iters", "0")
        proc = run(2, TP, "1", "--load", ck, "--use-checkpoint-args",
                   "--use-mp-args-from-checkpoint-args", "--eval-iters", "0", "--exit-interval",
                   "6")
        self.assertIn(" > --use-mp-args-from-checkpoint-args: --tensor-model-parallel-size 1 "
                      "replaced by the checkpoint's 2", proc.stdout)
        self.assertRegex(proc.stdout, r"tensor_model_parallel_size \.+ 2\n")
        self.assertEqual(sorted(iterations(proc)), [6])
        proc = run(1, "--load", ck, "--use-mp-args-from-checkpoint-args", expect_rc=2)
        self.assertIn("add --use-checkpoint-args", proc.stderr)


class TestCheckpointReader(unittest.TestCase):
    """The reader's checks are what the other tests trust: each must fire on its corruption."""

    FC1 = "model.decoder.layers.0.mlp.linear_fc1.weight"  # [256, 64], two row boxes at tp2

    @classmethod
    def setUpClass(cls):
        cls.ck = tmpdir("ck")
        run(2, TP, "2", "--train-iters", "4", "--eval-iters", "0", "--save", cls.ck)
        cls.it_dir = os.path.join(cls.ck, "iter_0000004")

    def corrupted(self, mutate):
        """A copy of the checkpoint with mutate(iteration dir, metadata) applied."""
        copy = os.path.join(tmpdir("bad"), "iter_0000004")
        shutil.copytree(self.it_dir, copy)
        with open(os.path.join(copy, "metadata.json"), encoding="utf-8") as f:
            meta = json.load(f)
        mutate(copy, meta)
        with open(os.path.join(copy, "metadata.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        return copy

    def test_intact_checkpoint_assembles_its_boxes(self):
        meta, tensors = checkpoint_reader.read_checkpoint(self.ck)
        self.assertEqual(meta["iteration"], 4)
        shards = meta["tensors"][self.FC1]["shards"]
        self.assertEqual([s["offset"] for s in shards], [[0, 0], [128, 0]])
        halves = [checkpoint_reader.read_safetensors(os.path.join(self.it_dir, s["file"]))[0]
                  [s["key"]] for s in shards]
        self.assertTrue(np.array_equal(tensors[self.FC1], np.concatenate(halves)))

    def test_each_corruption_is_caught(self):
        def flip_byte(d, meta):
            with open(os.path.join(d, "rank_00001.safetensors"), "r+b") as f:
                f.seek(-5, os.SEEK_END)
                byte = f.read(1)
                f.seek(-5, os.SEEK_END)
                f.write(bytes([byte[0] ^ 1]))

        def truncate(d, meta):
            with open(os.path.join(d, "rank_00001.safetensors"), "r+b") as f:
                f.truncate(os.path.getsize(f.name) - 4)

        def unlisted_file(d, meta):
            shutil.copy(os.path.join(d, "rank_00001.safetensors"),
                        os.path.join(d, "rank_00002.safetensors"))

        def overlap(d, meta):
            meta["tensors"][self.FC1]["shards"][1]["offset"] = [64, 0]

        def gap(d, meta):
            del meta["tensors"][self.FC1]["shards"][1]

        def outside(d, meta):
            meta["tensors"][self.FC1]["shards"][1]["offset"] = [192, 0]

        def wrong_extent(d, meta):
            meta["tensors"][self.FC1]["shards"][1]["extent"] = [64, 64]

        for mutate, message in [(flip_byte, "sha256"), (truncate, "bytes, metadata.json says"),
                                (unlisted_file, "files on disk"),
                                (overlap, "covered more than once"), (gap, "uncovered"),
                                (outside, "outside the shape"), (wrong_extent, "stored shape")]:
            with self.subTest(corruption=mutate.__name__):
                with self.assertRaisesRegex(checkpoint_reader.CheckpointError, message):
                    checkpoint_reader.read_checkpoint(self.corrupted(mutate))


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
