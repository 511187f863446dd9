#!/usr/bin/env python3
"""Megatron's flag table: every flag of Megatron's arguments.py has an answer, and the docs agree.

What it is: checks of `megatron flags` and of `megatron train` against src/cli/megatron_flags.tsv
and megatron_flags_core019.tsv (Megatron-LM r0.14's arguments.py flags, then the flags Megatron
core 0.19 added, with our status for each):
- `megatron flags --check` passes (the table and the flags `megatron train` registers agree:
  implemented rows are registered flags, our own flags are listed as ours);
- docs/FLAGS.md is exactly `megatron flags --markdown` (so the page cannot drift);
- every accepted flag, all given at once to a real run, trains and prints its start-up line;
- a refused flag (one of each group and note) exits 2 naming the flag, before training;
- an "only V" flag runs with V and is refused with another value;
- an unknown flag exits 2 naming it, with "did you mean" when a known flag is close.

Usage: test_megatron_flags.py --megatron BUILD/megatron
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TSVS = [os.path.join(ROOT, "src", "cli", name)
        for name in ("megatron_flags.tsv", "megatron_flags_core019.tsv")]
DOC = os.path.join(ROOT, "docs", "FLAGS.md")
MEGATRON = None
TIMEOUT_S = 120
# The GEMM peak given rather than measured: measuring takes 0.4 s of each run's start-up.
BASE = ["--mock-data", "--vocab-size", "128", "--num-layers", "2", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
        "--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0", "--num-threads", "1",
        "--gemm-peak-gflops", "100"]
CRASH_MARKERS = ("terminate called", "core dumped", "Segmentation fault", "what():")


def rows():
    out = []
    for tsv in TSVS:
        release = "core_r0.14.0"
        with open(tsv, encoding="utf-8") as f:
            for line in f:
                if line.startswith("#release "):
                    release = line.split()[1]
                if line.startswith("#") or not line.strip():
                    continue
                flag, values, group, status, note = line.rstrip("\n").split("\t")
                out.append(dict(flag=flag, values=values, group=group, status=status, note=note,
                                release=release))
    return out


def run(*args):
    return subprocess.run([MEGATRON, *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)


def with_value(row, value="1"):
    """The flag as argv: a switch alone, otherwise with `value`."""
    return [row["flag"]] if row["values"] == "0" else [row["flag"], value]


class MegatronFlagsTest(unittest.TestCase):
    def assertRefused(self, proc, *needles):
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:] + proc.stderr[-2000:])
        for n in needles:
            self.assertIn(n, proc.stderr)
        for m in CRASH_MARKERS:
            self.assertNotIn(m, proc.stderr)
        self.assertNotIn("training ...", proc.stdout)

    def test_table_agrees_with_train(self):
        proc = run("flags", "--check")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        table = rows()
        self.assertEqual(len({r["flag"] for r in table}), len(table), "a flag listed twice")
        # arguments.py r0.14 has 513 flags and one alias; core 0.19's parser adds 358 spellings.
        r014 = [r for r in table if r["release"] == "core_r0.14.0"]
        core019 = [r for r in table if r["release"] == "core_v0.19.0"]
        self.assertEqual(len(r014), 514)
        self.assertEqual(len(core019), 358)

    def test_docs_are_generated_from_the_table(self):
        proc = run("flags", "--markdown")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(DOC, encoding="utf-8") as f:
            self.assertEqual(f.read(), proc.stdout,
                             "docs/FLAGS.md is stale: regenerate it with "
                             "`build/megatron flags --markdown > docs/FLAGS.md`")
        for r in rows():
            self.assertIn(f"| `{r['flag']}` | {r['group']} | {r['status']} |", proc.stdout)

    def test_every_accepted_flag_trains_and_says_what_it_means(self):
        accepted = [r for r in rows() if r["status"] == "accepted"]
        argv = list(BASE)
        for r in accepted:
            argv += with_value(r)
        proc = run("train", *argv)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("iteration        2/", proc.stdout)
        lines = proc.stdout.splitlines()
        for r in accepted:
            given = r["flag"] + ("" if r["values"] == "0" else " 1")
            self.assertIn(f" > {given}: {r['note']}", lines, r["flag"])

    def test_refused_flags_exit_2_naming_the_flag(self):
        seen = set()
        for r in rows():
            if r["status"] != "refused" or (r["group"], r["note"]) in seen:
                continue
            seen.add((r["group"], r["note"]))
            with self.subTest(flag=r["flag"]):
                self.assertRefused(run("train", *BASE, *with_value(r, "2")), r["flag"], r["note"])
        self.assertGreater(len(seen), 20)  # a real sweep (fewer as flags get implemented)

    def test_only_one_value(self):
        only = [r for r in rows() if r["status"].startswith("only ")]
        self.assertGreaterEqual(len(only), 2)  # (--main-grads-dtype, --main-params-dtype)
        for r in only:
            value = r["status"][len("only "):]
            with self.subTest(flag=r["flag"]):
                ok = run("train", *BASE, r["flag"], value)
                self.assertEqual(ok.returncode, 0, ok.stderr[-2000:])
                self.assertIn(f" > {r['flag']} {value}: {r['note']}", ok.stdout.splitlines())
                self.assertRefused(run("train", *BASE, r["flag"], "other"), r["flag"],
                                   f"only {value} is accepted")

    def test_core019_second_spellings(self):
        """Core 0.19's second spellings of r0.14 switches set the same argument."""
        spellings = {"--disable-fp8-wgrad": "no_fp8_wgrad",
                     "--override-opt-param-scheduler": "override_opt_param_scheduler",
                     "--disable-log-loss-scale-to-tensorboard": "log_loss_scale_to_tensorboard"}
        plain = run("train", *BASE)
        self.assertEqual(plain.returncode, 0, plain.stderr[-2000:])
        given = run("train", *BASE, *spellings)
        self.assertEqual(given.returncode, 0, given.stderr[-2000:])

        def dumped(proc, dest):
            return [l.split()[-1] for l in proc.stdout.splitlines()
                    if l.strip().startswith(dest + " ")]
        for flag, dest in spellings.items():
            with self.subTest(flag=flag):
                self.assertEqual(len(dumped(given, dest)), 1)  # one line per argument
                self.assertNotEqual(dumped(plain, dest), dumped(given, dest))

    def test_core019_logging_and_timeout_flags(self):
        # --log-memory-interval: the memory report after the first interval and at every
        # multiple of the interval (iterations 1, 2, 4 of 4); it must divide by --log-interval.
        # --distributed-timeout-seconds-after-init: the watchdog's limit after iteration 1 (a
        # run within it finishes; the limit's expiry is tests/train/test_watchdog.cpp's).
        args = [*BASE, "--train-iters", "4", "--log-interval", "1"]
        proc = run("train", *args, "--log-memory-interval", "2",
                   "--distributed-timeout-seconds-after-init", "60")
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        reports = [l for l in proc.stdout.splitlines() if "memory (MB)" in l]
        self.assertEqual([re.search(r"after (\d+) iterations", l)[1] for l in reports],
                         ["1", "2", "4"])
        self.assertRefused(run("train", *args, "--log-interval", "2", "--log-memory-interval",
                               "3"), "--log-memory-interval")
        self.assertRefused(run("train", *args, "--distributed-timeout-seconds-after-init", "-1"),
                           "--distributed-timeout-seconds-after-init")
        # --start-eval-at-iter past the run on mock data (a split without surplus): no evaluation
        # in the loop, the one after training still runs; a start at an evaluation iteration
        # (Megatron's count one short) has its samples too.
        for start, want in (("100", ["iteration 4 on validation set", "iteration 4 on test set"]),
                            ("2", ["iteration 2", "iteration 4", "iteration 4 on validation set",
                                   "iteration 4 on test set"])):
            proc = run("train", *args, "--eval-iters", "1", "--eval-interval", "2",
                       "--start-eval-at-iter", start)
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
            self.assertEqual(re.findall(r" validation loss at (.+?) \|", proc.stdout), want)

    def test_unknown_flags(self):
        proc = run("train", *BASE, "--lr-warmup-iter", "3")
        self.assertRefused(proc, "unknown flag --lr-warmup-iter",
                           "did you mean --lr-warmup-iters?")
        self.assertNotIn("'3'", proc.stderr)  # the unknown flag's value is not a second error
        proc = run("train", *BASE, "--tensor-model-paralel-size", "2")
        self.assertRefused(proc, "did you mean --tensor-model-parallel-size?")
        proc = run("train", *BASE, "--no-such-flag")
        self.assertRefused(proc, "unknown flag --no-such-flag")
        self.assertNotIn("did you mean", proc.stderr)

    def test_heterogeneous_layers_flags(self):
        # Megatron's check that the flags repeat the config.json, and what the block list cannot
        # hold, exit 2 naming the flag or key; the JSON text works as well as the path (a layer's
        # groups against the TP size: test_parallel_equivalence.py, which has the ranks).
        config = {"hidden_act": "silu", "num_hidden_layers": 2, "hidden_size": 64,
                  "num_attention_heads": 4, "tie_word_embeddings": False, "rope_theta": 10000.0,
                  "rope_scaling": {"factor": 8.0},
                  "block_configs": [
                      {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 2.0}},
                      {"attention": {"replace_with_linear": True}, "ffn": {"no_op": True}}]}
        llama = [*BASE, "--position-embedding-type", "rope", "--normalization", "RMSNorm",
                 "--swiglu", "--disable-bias-linear", "--group-query-attention",
                 "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
                 "--use-rope-scaling", "--use-rotary-position-embeddings"]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(config, f)
            flag = ["--heterogeneous-layers-config-path", path]
            ok = run("train", *llama, *flag)
            self.assertEqual(ok.returncode, 0, ok.stderr[-2000:])
            text = run("train", *llama, "--heterogeneous-layers-config-encoded-json",
                       json.dumps(config))
            self.assertEqual(text.returncode, 0, text.stderr[-2000:])
            self.assertRefused(run("train", *llama[:-1], *flag), "Arguments differ",
                               "--use-rotary-position-embeddings false (provided) != true")
            self.assertRefused(run("train", *llama, *flag, "--num-query-groups", "4"),
                               "--num-query-groups 4 (provided) != 2 (expected)")
            self.assertRefused(run("train", *llama, "--heterogeneous-layers-config-path",
                                   os.path.join(tmp, "missing.json")),
                               "--heterogeneous-layers-config-path", "cannot read")
            self.assertRefused(run("train", *llama, *flag, "--num-experts", "2"),
                               "--num-experts")
            config["block_configs"][1]["attention"]["window_length"] = 64
            with open(path, "w", encoding="utf-8") as f:
                json.dump(config, f)
            self.assertRefused(run("train", *llama, *flag), "block_configs[1].attention.window_length")

    def test_hybrid_mamba_flags(self):
        # Megatron's Mamba stack spec runs as pretrain_mamba; other specs and hybrid flags on
        # other models, bad patterns, sizes and layouts exit 2 naming the flag.
        mamba = [*BASE, "--mamba-state-dim", "8", "--mamba-head-dim", "16",
                 "--mamba-num-groups", "2"]
        spec = ["--spec", "megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"]
        ok = run("pretrain_mamba", *mamba, *spec, "--hybrid-override-pattern", "M*")
        self.assertEqual(ok.returncode, 0, ok.stderr[-2000:])
        self.assertIn("Hybrid allocation (M is mamba, * is attention, - is mlp):\nM*\n", ok.stdout)
        self.assertRefused(run("train", *BASE, "--spec", "my.module", "my_spec"), "--spec",
                           "Python module specs cannot be loaded")
        self.assertRefused(run("train", *BASE, *spec), "--spec", "pretrain_mamba")
        # Megatron core 0.19's names: pretrain_hybrid and the megatron.core.models.hybrid spec.
        hybrid_spec = ["--spec", "megatron.core.models.hybrid.hybrid_layer_specs",
                       "hybrid_stack_spec"]
        ok = run("pretrain_hybrid", *mamba, *hybrid_spec, "--hybrid-layer-pattern", "M*")
        self.assertEqual(ok.returncode, 0, ok.stderr[-2000:])
        self.assertIn("Hybrid allocation (M is mamba, * is attention, - is mlp):\nM*\n", ok.stdout)
        self.assertRefused(run("train", *BASE, *hybrid_spec), "--spec", "pretrain_hybrid")
        self.assertRefused(run("pretrain_hybrid", *mamba, "--spec", "local",
                               "--hybrid-layer-pattern", "M*"), "--spec local")
        self.assertRefused(run("train", *BASE, "--hybrid-override-pattern", "M*"),
                           "--hybrid-override-pattern", "pretrain_mamba")
        # The pattern gives the layer count (Megatron core 0.17): a different --num-layers is
        # replaced, with Megatron's warning.
        longer = run("pretrain_mamba", *mamba, "--hybrid-override-pattern", "M*-")
        self.assertEqual(longer.returncode, 0, longer.stderr[-2000:])
        self.assertIn("ignoring --num-layers (2) and using the layer count derived from the "
                      "pattern (3)", longer.stdout + longer.stderr)
        self.assertIn("Hybrid allocation (M is mamba, * is attention, - is mlp):\nM*-\n",
                      longer.stdout)
        self.assertRefused(run("pretrain_mamba", *mamba, "--hybrid-override-pattern", "MX"),
                           "--hybrid-override-pattern", "not a layer symbol")
        self.assertRefused(run("pretrain_mamba", *mamba, "--hybrid-attention-ratio", "0.5",
                               "--hybrid-override-pattern", "MM"),
                           "--hybrid-override-pattern", "as many of each layer type")
        self.assertRefused(run("pretrain_mamba", *mamba, "--mamba-num-groups", "3"),
                           "--mamba-num-groups")
        self.assertRefused(run("pretrain_mamba", *mamba, "--num-experts", "4"), "--num-experts")
        # FP8: Megatron's in-projection width rule (2 x 128 + 2 x 2 x 8 + 8 heads = 296).
        self.assertRefused(run("pretrain_mamba", *mamba, "--bf16", "--fp8-format", "hybrid"),
                           "--fp8-format", "multiple of 16")
        fp8 = run("pretrain_mamba", *BASE, "--mamba-state-dim", "8", "--mamba-head-dim", "8",
                  "--mamba-num-groups", "2", "--hybrid-override-pattern", "M*", "--bf16",
                  "--fp8-format", "hybrid", "--micro-batch-size", "8")
        self.assertEqual(fp8.returncode, 0, fp8.stderr[-2000:])

    def test_legacy_rope_flags(self):
        # --use-rotary-position-embeddings is Megatron's legacy --position-embedding-type rope;
        # --no-position-embedding is allowed with rope only.
        proc = run("train", *BASE, "--use-rotary-position-embeddings", "--no-position-embedding")
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        self.assertRegex(proc.stdout, r"position_embedding_type \.+ rope")
        self.assertRefused(run("train", *BASE, "--no-position-embedding"),
                           "--no-position-embedding is deprecated")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--megatron", required=True)
    args, rest = parser.parse_known_args()
    MEGATRON = os.path.abspath(args.megatron)
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
