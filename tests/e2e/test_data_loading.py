#!/usr/bin/env python3
"""Megatron's data-loader and validation flags, end to end: --dataloader-type cyclic (with and
without --no-data-sharding), --full-validation, --multiple-validation-sets and --sft.

What it checks (the sampler's order itself is checked against PyTorch's randperm in
tests/data/test_random_sampler.cpp):
- cyclic: the run reads other samples than the single sampler (the curves differ from the first
  step); a run saved at iteration 3 and resumed gives iterations 4-6 digit for digit as the
  straight run (the order is a function of the consumed samples); prefetching (--num-workers)
  changes nothing; dp2 with and without data sharding trains;
- --full-validation reads every validation sample exactly once: the validation loss of the same
  weights (--lr 0) is one number whatever the micro-batch size, the data-parallel size and the
  tensor/pipeline layout, including layouts whose last step runs past the end of the set (masked
  re-reads) — within 1e-5 relative, the float-sum-order tolerance of
  tests/e2e/test_parallel_equivalence.py; a missed or doubled sample moves it by about 1/N;
- --eval-iters 0 does not turn full validation off (Megatron's do_valid);
- --multiple-validation-sets: " validation-0/-1 loss" lines, each equal to a full validation of
  that prefix alone; without the flag the two prefixes' exhaustive blend is evaluated, whose loss
  is the sample-weighted mean of the two (every sample of each once);
- --sft: a run on conversations of tests/data/sft_oracle.py (whose samples test_sft_dataset.cpp
  checks) learns them (the loss falls below 0.6 of its start in 30 steps), tp2 follows one
  process, and a conversation the SFT tokenizer refuses stops the run with exit 2 naming it;
- the pad token (GPTDataset's rule: no loss where the label is the tokenizer's pad, pad ids read
  as 0), with NullTokenizer's --null-tokenizer-pad-id on documents of ids 1..98 and EOD 99: pad 0
  (no id of the documents) changes nothing, digit for digit; pad 4 trains the curve of pad 0 on
  the same documents with every 4 written as 0 (the pads became 0 and lost their loss), which
  without a pad is another curve; a pad equal to EOD is warned about and ignored (the curve of no
  pad), and with --allow-ambiguous-pad-tokens warned about and used;
- --fim-data (fill-in-the-middle, tests/data/test_fim_dataset.cpp checks the samples against
  Megatron's code restated) on code-like documents tokenized by the FIM oracle's tokenizer.json:
  a rate below NumPy's 2^-53 resolution (never drawn; Megatron refuses 0) with the cut at a
  token the data lacks trains the plain run's curve digit for digit (its indices cached apart,
  under Megatron's GPTFIMDataset name), --fim-rate 1 another one that still learns; with split
  files (--fim-split-sample, --fim-fragment-rate) the curve is not the plain run's, dp2 and tp2
  follow one process within 1e-5 (every sample draws from its own seed, whatever reads it), and
  a run resumed at iteration 3 prints the straight run's iterations 4-6 digit for digit;
  --fim-data with --mock-data, a NullTokenizer run, --fim-split-sample without
  --fim-fragment-rate, --fim-rate 0 or 1.5 and a FIM token the tokenizer lacks exit 2 naming
  the flag;
- --phase-transition-iterations: with the weights fixed (--lr 0, no dropout) a loss depends on
  the samples alone; a run with the transition at 3 saves and exits at 3 after the straight run's
  iterations 1-3, and the job resumed from it reads its phase's data from the start (its
  iterations 4-6 are the losses of 1-3), also when resumed within the phase (iteration 6 after
  a stop at 5); on another prefix the second phase reads that prefix's first samples; with
  --train-samples, two transitions and two data-parallel ranks each of the three jobs reads its
  phase from the start; transitions at or past the last iteration change nothing; a changed
  --global-batch-size, a malformed list and a skipped iteration at a transition exit 2;
- --dataloader-inter-document-masking: on documents preprocessed with EOD the dataset's document
  boundaries are the EODs, so it trains the curve of
  --reset-attention-mask --reset-position-ids digit for digit; on the same documents without EOD
  those flags change nothing while it still masks (another curve); tp2 and cp2 follow one
  process within 1e-5; a hybrid Mamba model with a multi-token-prediction depth (whose restarts
  and rolls per document tests/models/test_mamba_hf_oracle.cpp checks) trains another curve than
  unpacked, and tp2, cp2 and pp2 follow one process within 1e-5;
- core 0.19's --per-dataset-sequences-path (a file of the .idx headers' counts, as
  `megatron build_sequences_per_dataset` writes it for a weighted or a per-split blend) trains the
  plain curve digit for digit, a stale or missing entry exits 2 naming the prefix;
  --dataloader-fast-cache-load and --dataloader-defer-npy-index-mmap refuse what Megatron
  asserts (no --data-cache-path; --data-path with the fast path) and otherwise change nothing;
- refusals (exit 2, the flag named): --multiple-validation-sets without --full-validation,
  --full-validation with --mock-data or a weighted validation blend, --dataloader-type external,
  a --null-tokenizer-pad-id outside the vocabulary.

Usage: test_data_loading.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

SFT_ORACLE = os.path.join(HERE, "..", "data", "sft_oracle.py")
FIM_ORACLE = os.path.join(HERE, "..", "data", "fim_oracle.py")
MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 300
MODEL = {"--tokenizer-type": "NullTokenizer", "--vocab-size": "100", "--num-layers": "2",
         "--hidden-size": "64", "--num-attention-heads": "4", "--seq-length": "32",
         "--max-position-embeddings": "32", "--micro-batch-size": "2", "--global-batch-size": "4",
         "--train-iters": "6", "--log-interval": "1", "--lr": "1e-2", "--eval-iters": "1",
         "--eval-interval": "100", "--num-threads": "1", "--seed": "7"}
REL = 1e-5  # float-sum order across layouts (tests/e2e/test_parallel_equivalence.py)


class DataLoadingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="megatron_data_loading_")
        cls.tmp = cls._tmp.name
        cls.prefix = {}
        for name, seed, docs in (("a", 3, 400), ("b", 5, 60), ("c", 9, 90)):
            d = os.path.join(cls.tmp, name)
            os.makedirs(d)
            flags = megatron_job.counting_dataset(MEGATRON, d, 100, seed, documents=docs)
            cls.prefix[name] = flags[1]
        cls.cache = os.path.join(cls.tmp, "cache")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def data(self, split="80,20,0"):
        return {"--data-path": self.prefix["a"], "--split": split, "--data-cache-path": self.cache}

    def run_ok(self, ranks=1, extra=(), data=None, **overrides):
        base = {**MODEL, **(self.data() if data is None else data)}
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                      [*megatron_job.flags_with(base, **overrides), *extra],
                                      TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        return proc.stdout

    def refused(self, flag, extra=(), data=None, **overrides):
        base = {**MODEL, **(self.data() if data is None else data)}
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, 1,
                                      [*megatron_job.flags_with(base, **overrides), *extra],
                                      TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:] + proc.stderr[-2000:])
        self.assertIn(flag, proc.stderr)
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)

    # ---- --dataloader-type cyclic ----------------------------------------------------------

    def test_cyclic_differs_from_single_and_resumes_exactly(self):
        keys = ["lm loss", "grad norm"]
        single = megatron_log.curves(self.run_ok(), keys, 1, 6)
        straight_out = self.run_ok(dataloader_type="cyclic")
        straight = megatron_log.curves(straight_out, keys, 1, 6)
        self.assertNotEqual(single[1]["lm loss"], straight[1]["lm loss"],
                            "cyclic read the single sampler's first batch")
        # Prefetching never changes what is read.
        inline = megatron_log.curves(self.run_ok(dataloader_type="cyclic", num_workers=0), keys,
                                     1, 6)
        self.assertEqual(inline, straight)
        ckpt = os.path.join(self.tmp, "cyclic_ckpt")
        self.run_ok(dataloader_type="cyclic", exit_interval=3, save=ckpt, save_interval=3)
        resumed = megatron_log.curves(self.run_ok(dataloader_type="cyclic", load=ckpt), keys,
                                      4, 6)
        self.assertEqual(resumed, {it: straight[it] for it in (4, 5, 6)})

    def test_cyclic_data_parallel_with_and_without_sharding(self):
        for extra in ((), ("--no-data-sharding",)):
            out = self.run_ok(ranks=2, extra=extra, dataloader_type="cyclic")
            curve = megatron_log.curves(out, ["lm loss"], 1, 6)
            self.assertTrue(all(c["lm loss"] < 10 for c in curve.values()), out[-2000:])

    # ---- the pad token -----------------------------------------------------------------------

    def test_pad_tokens_lose_their_loss_and_read_as_zero(self):
        keys = ["lm loss", "grad norm"]
        # The documents of prefix "a" (ids 1..98, EOD 99) with every 4 written as 0.
        zeroed = os.path.join(self.tmp, "zeroed")
        os.makedirs(zeroed)
        fours = 0
        with open(os.path.join(self.tmp, "a", "docs.jsonl"), encoding="utf-8") as src, \
                open(os.path.join(zeroed, "docs.jsonl"), "w", encoding="utf-8") as dst:
            for line in src:
                ids = json.loads(line)["text"].split()
                fours += ids.count("4")
                dst.write(json.dumps({"text": " ".join("0" if t == "4" else t for t in ids)})
                          + "\n")
        self.assertGreater(fours, 100)
        proc = subprocess.run([MEGATRON, "preprocess", "--input", os.path.join(zeroed, "docs.jsonl"),
                               "--output-prefix", os.path.join(zeroed, "docs"), "--tokenizer-type",
                               "NullTokenizer", "--vocab-size", "100", "--append-eod",
                               "--workers", "1"], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        zeroed_data = {**self.data(), "--data-path": os.path.join(zeroed, "docs_text_document")}

        def curve(out):
            return megatron_log.curves(out, keys, 1, 6)

        plain = curve(self.run_ok())
        self.assertEqual(curve(self.run_ok(null_tokenizer_pad_id=0)), plain)
        masked = curve(self.run_ok(null_tokenizer_pad_id=4))
        self.assertNotEqual(masked[1]["lm loss"], plain[1]["lm loss"])
        self.assertEqual(curve(self.run_ok(data=zeroed_data, null_tokenizer_pad_id=0)), masked)
        self.assertNotEqual(curve(self.run_ok(data=zeroed_data))[1]["lm loss"],
                            masked[1]["lm loss"])
        # A pad that is also EOD (99, NullTokenizer's V - 1).
        out = self.run_ok(null_tokenizer_pad_id=99)
        self.assertIn("collides with another special token id", out)
        self.assertIn("avoid masking out any pad tokens", out)
        self.assertEqual(curve(out), plain)
        out = self.run_ok(extra=("--allow-ambiguous-pad-tokens",), null_tokenizer_pad_id=99)
        self.assertIn("Do not ignore this warning", out)
        self.assertNotEqual(curve(out)[1]["lm loss"], plain[1]["lm loss"])

    # ---- --dataloader-inter-document-masking -------------------------------------------------

    def test_inter_document_masking_takes_the_datasets_documents(self):
        keys = ["lm loss", "grad norm"]
        resets = ("--reset-attention-mask", "--reset-position-ids")
        inter = ("--dataloader-inter-document-masking",)

        def curve(extra=(), ranks=1, **overrides):
            return megatron_log.curves(self.run_ok(ranks, extra=extra, **overrides), keys, 1, 6)

        with_eod = curve(inter)
        self.assertEqual(with_eod, curve(resets))
        self.assertNotEqual(with_eod[1]["lm loss"], curve()[1]["lm loss"])
        no_eod = self.no_eod_data()
        plain = curve(data=no_eod)
        self.assertEqual(curve(resets, data=no_eod), plain)
        masked = curve(inter, data=no_eod)
        self.assertNotEqual(masked[1]["lm loss"], plain[1]["lm loss"])
        for ranks, overrides in ((2, {"tensor_model_parallel_size": 2}),
                                 (2, {"context_parallel_size": 2})):
            with self.subTest(**overrides):
                megatron_log.assert_same_curves(
                    self, curve(inter, ranks, data=no_eod, **overrides), masked, "inter", rel=REL)

    def no_eod_data(self):
        """The documents of prefix "a" preprocessed without EOD (once per class)."""
        bare = os.path.join(self.tmp, "no_eod")
        if not os.path.isdir(bare):
            os.makedirs(bare)
            proc = subprocess.run([MEGATRON, "preprocess", "--input",
                                   os.path.join(self.tmp, "a", "docs.jsonl"), "--output-prefix",
                                   os.path.join(bare, "docs"), "--tokenizer-type", "NullTokenizer",
                                   "--vocab-size", "100", "--workers", "1"],
                                  capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        return {**self.data(), "--data-path": os.path.join(bare, "docs_text_document")}

    def test_inter_document_masking_with_mamba_layers_and_mtp(self):
        # A hybrid model with a multi-token-prediction depth on packed documents: the Mamba layers
        # restart at each document and the depth rolls inside each (tests/models/
        # test_mamba_hf_oracle.cpp checks both against the documents run alone). Here: it is not
        # the unpacked run, and TP, CP (the mixers' all-to-all to whole sequences and the roll's
        # document ends, both gathered over CP) and PP (the depth on the last stage) follow one
        # process.
        keys = ["lm loss", "mtp_1 loss", "grad norm"]
        hybrid = ("--model", "mamba", "--mamba-state-dim", "8", "--mamba-head-dim", "16",
                  "--mamba-num-groups", "4", "--normalization", "RMSNorm",
                  "--position-embedding-type", "rope", "--disable-bias-linear")
        inter = ("--dataloader-inter-document-masking",)
        no_eod = self.no_eod_data()

        def curve(extra=(), ranks=1, pattern="M*M-/*-", **overrides):
            out = self.run_ok(ranks, extra=(*hybrid, "--hybrid-layer-pattern", pattern, *extra),
                              data=no_eod, num_layers=4, **overrides)
            return megatron_log.curves(out, keys, 1, 6)

        masked = curve(inter)
        self.assertIn("mtp_1 loss", masked[1])
        self.assertNotEqual(masked[1]["lm loss"], curve()[1]["lm loss"])
        for ranks, pattern, overrides in ((2, "M*M-/*-", {"tensor_model_parallel_size": 2}),
                                          (2, "M*M-/*-", {"context_parallel_size": 2}),
                                          (2, "M*|M-/*-", {"pipeline_model_parallel_size": 2})):
            with self.subTest(**overrides):
                megatron_log.assert_same_curves(
                    self, curve(inter, ranks, pattern, **overrides), masked, "inter", rel=REL)

    # ---- core 0.19's data-loader flags --------------------------------------------------------

    def test_sequences_per_dataset_and_the_cache_flags(self):
        # --per-dataset-sequences-path: Megatron's tools/build_sequences_per_dataset.py file (the
        # .idx header's sequence and document counts per prefix) trains the plain curve digit for
        # digit; a stale entry or a missing prefix exits 2 naming the prefix.
        keys = ["lm loss"]

        def curve(out):
            return megatron_log.curves(out, keys, 1, 6)

        def header(prefix):
            with open(prefix + ".idx", "rb") as f:
                f.read(9 + 8 + 1)  # magic, version, dtype code
                return list(struct.unpack("<QQ", f.read(16)))

        def write(entries):
            path = os.path.join(self.tmp, "sequences.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(entries, f)
            return path

        prefix = self.prefix["a"]
        counts = header(prefix)
        self.assertGreater(counts[0], 0)
        plain = curve(self.run_ok())
        good = write({prefix: counts, self.prefix["b"]: header(self.prefix["b"])})
        self.assertEqual(curve(self.run_ok(per_dataset_sequences_path=good)), plain)
        # `megatron build_sequences_per_dataset` (Megatron's tool) writes that file: every prefix
        # of a weighted blend and of per-split blends, once, in order of first appearance.
        built = os.path.join(self.tmp, "built.json")
        splits = os.path.join(self.tmp, "splits.json")
        with open(splits, "w", encoding="utf-8") as f:
            json.dump({"train": ["1", self.prefix["c"], "2", prefix], "valid": prefix,
                       "test": []}, f)
        for args, want in (
                (["--data-path", "1", prefix, "2", self.prefix["b"]],
                 [prefix, self.prefix["b"]]),
                (["--per-split-data-args-path", splits], [self.prefix["c"], prefix])):
            proc = subprocess.run([MEGATRON, "build_sequences_per_dataset", *args,
                                   "--per-dataset-sequences-path", built],
                                  capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
            with open(built, encoding="utf-8") as f:
                got = json.load(f)
            self.assertEqual(list(got), want)
            self.assertEqual(got, {p: header(p) for p in want})
        self.assertEqual(curve(self.run_ok(per_dataset_sequences_path=built)), plain)
        self.refused("the file is stale",
                     per_dataset_sequences_path=write({prefix: [counts[0] - 1, counts[1]]}))
        self.refused("has no entry for the dataset prefix",
                     per_dataset_sequences_path=write({self.prefix["b"]: counts}))
        self.refused("--per-dataset-sequences-path",
                     per_dataset_sequences_path=write({prefix: "many"}))
        # --dataloader-fast-cache-load and --dataloader-defer-npy-index-mmap: Megatron's
        # assertions, and otherwise the same curve (the caches are read when present here).
        self.refused("--data-cache-path must be provided", extra=("--dataloader-fast-cache-load",),
                     data={"--data-path": prefix, "--split": "80,20,0"})
        self.refused("cannot be used together", extra=("--dataloader-fast-cache-load",))
        self.refused("--dataloader-defer-npy-index-mmap",
                     extra=("--dataloader-defer-npy-index-mmap",),
                     data={"--data-path": prefix, "--split": "80,20,0"})
        per_split = {"--train-data-path": prefix, "--valid-data-path": self.prefix["b"],
                     "--data-cache-path": self.cache}
        want = curve(self.run_ok(data=per_split))
        self.assertEqual(curve(self.run_ok(extra=("--dataloader-fast-cache-load",
                                                  "--dataloader-defer-npy-index-mmap"),
                                           data=per_split)), want)

    # ---- --phase-transition-iterations -----------------------------------------------------

    def test_phase_transitions_read_each_phase_from_its_start(self):
        fixed = {"lr": 0, "hidden_dropout": 0, "attention_dropout": 0}
        phased = {**fixed, "phase_transition_iterations": "3"}
        keys = ["lm loss"]

        def losses(out, first, last):
            return [c["lm loss"] for _, c in sorted(megatron_log.curves(out, keys, first,
                                                                        last).items())]

        straight = losses(self.run_ok(**fixed), 1, 6)
        self.assertNotEqual(straight[3:], straight[:3])  # later samples give other losses
        ckpt = os.path.join(self.tmp, "phases")
        out = self.run_ok(save=ckpt, save_interval=100, **phased)
        self.assertIn("exiting program at iteration 3", out)
        self.assertNotIn("iteration        4/", out)
        self.assertEqual(losses(out, 1, 3), straight[:3])
        out = self.run_ok(load=ckpt, **phased)
        self.assertIn("data phase of iterations 3 to 6: 12 training samples", out)
        self.assertEqual(losses(out, 4, 6), straight[:3])
        # Resumed within the phase: iteration 6 reads the phase's third batch.
        mid = os.path.join(self.tmp, "phases_mid")
        self.run_ok(load=ckpt, save=mid, save_interval=100, exit_interval=5, **phased)
        self.assertEqual(losses(self.run_ok(load=mid, **phased), 6, 6), straight[2:3])
        # The second phase on other data reads that data's first samples.
        c_data = {**self.data(), "--data-path": self.prefix["c"]}
        other = losses(self.run_ok(load=ckpt, data=c_data, **phased), 4, 6)
        self.assertNotEqual(other, straight[:3])
        self.assertEqual(other, losses(self.run_ok(data=c_data, **fixed), 1, 3))
        self.refused("--phase-transition-iterations needs the same global batch size",
                     load=ckpt, global_batch_size=8, **phased)
        self.refused("--phase-transition-iterations takes comma-separated iterations",
                     phase_transition_iterations="3,x")
        self.refused("--iterations-to-skip 2 skips iteration 3", iterations_to_skip=2, **phased)
        # A transition at the last iteration or past it changes nothing.
        self.assertEqual(losses(self.run_ok(**{**fixed, "phase_transition_iterations": "6,9"}),
                                1, 6), straight)

    def test_phases_by_samples_on_two_ranks(self):
        # Megatron's form (--train-samples), two transitions, two data-parallel ranks: each of the
        # three jobs reads its phase's data from the start.
        fixed = {"lr": 0, "hidden_dropout": 0, "attention_dropout": 0, "train_iters": 0,
                 "train_samples": 24}
        phased = {**fixed, "phase_transition_iterations": "4, 2"}  # sorted, spaces allowed

        def losses(out, first, last):
            return [c["lm loss"] for _, c in sorted(
                megatron_log.curves(out, ["lm loss"], first, last).items())]

        straight = losses(self.run_ok(2, **fixed), 1, 6)
        self.assertNotEqual(straight[2:4], straight[:2])
        ckpt = os.path.join(self.tmp, "phases_dp2")
        out = self.run_ok(2, save=ckpt, save_interval=100, **phased)
        self.assertIn("exiting program at iteration 2", out)
        self.assertEqual(losses(out, 1, 2), straight[:2])
        out = self.run_ok(2, load=ckpt, save=ckpt, save_interval=100, **phased)
        self.assertIn("data phase of iterations 2 to 4: 8 training samples", out)
        self.assertEqual(losses(out, 3, 4), straight[:2])
        out = self.run_ok(2, load=ckpt, **phased)
        self.assertIn("data phase of iterations 4 to 6: 8 training samples", out)
        self.assertEqual(losses(out, 5, 6), straight[:2])

    # ---- --full-validation -------------------------------------------------------------------

    def full_validation_loss(self, ranks=1, extra=(), **overrides):
        # A wide initialisation makes the samples' losses differ (at the default one every
        # sample's loss is near ln(vocabulary)), so that a missed or doubled one shows.
        out = self.run_ok(ranks, extra=extra, lr=0, train_iters=1, eval_interval=1,
                          full_validation=True, init_method_std=0.5, **overrides)
        values = megatron_log.validation_losses(out)
        # At iteration 1 and at the end "on validation set": the same weights, the same loss.
        self.assertEqual(len(values), 2, out[-2000:])
        self.assertEqual(values[0][1], values[1][1])
        return values[0][1], out

    def test_full_validation_reads_every_sample_once_in_any_layout(self):
        want, out = self.full_validation_loss(micro_batch_size=1, global_batch_size=1)
        samples = int(re.search(r" > validation: +(\d+) samples", out)[1])
        self.assertGreater(samples, 50)
        layouts = [
            # (ranks, extra flags, overrides): each with a last step past the end of the set
            (1, (), {"micro_batch_size": 4, "global_batch_size": 8}),
            (2, (), {"micro_batch_size": 3, "global_batch_size": 6}),
            (4, ("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"),
             {"micro_batch_size": 2, "global_batch_size": 6}),
            (1, (), {"micro_batch_size": 2, "global_batch_size": 4, "eval_iters": 0}),
            (1, (), {"micro_batch_size": 2, "global_batch_size": 4,
                     "dataloader_type": "cyclic"}),
        ]
        for ranks, extra, overrides in layouts:
            with self.subTest(ranks=ranks, extra=extra, **overrides):
                self.assertNotEqual(samples % (overrides["global_batch_size"]), 0)
                got, _ = self.full_validation_loss(ranks, extra=extra, **overrides)
                self.assertAlmostEqual(got, want, delta=REL * abs(want))

    def test_multiple_validation_sets(self):
        per_split = {"--train-data-path": self.prefix["a"], "--data-cache-path": self.cache}
        alone = {}
        for name in ("b", "c"):
            loss, out = self.full_validation_loss(
                data={**per_split, "--valid-data-path": self.prefix[name]})
            alone[name] = (loss, int(re.search(r" > validation: +(\d+) samples", out)[1]))
        both = {**per_split, "--valid-data-path": [self.prefix["b"], self.prefix["c"]]}
        out = self.run_ok(data=both, extra=("--multiple-validation-sets",), lr=0, train_iters=1,
                          eval_interval=1, full_validation=True, init_method_std=0.5)
        lines = megatron_log.validation_set_lines(out)
        by_set = {}
        for index, place, fields in lines:
            by_set.setdefault(index, []).append(float(fields["lm loss value"]))
        self.assertEqual(sorted(by_set), [0, 1], out[-2000:])
        for index, name in ((0, "b"), (1, "c")):
            self.assertEqual(len(by_set[index]), 2)  # iteration 1, and the end of training
            for value in by_set[index]:
                self.assertAlmostEqual(value, alone[name][0], delta=REL * alone[name][0])
        # Without the flag: one blend of both, every sample of each once. Every sample has
        # --seq-length loss tokens (no --eod-mask-loss), so its loss is the sample-weighted mean.
        blended, _ = self.full_validation_loss(data=both)
        (lb, nb), (lc, nc) = alone["b"], alone["c"]
        want = (lb * nb + lc * nc) / (nb + nc)
        self.assertAlmostEqual(blended, want, delta=REL * want)

    # ---- Megatron core 0.19's evaluation flags --------------------------------------------------

    def validation_values(self, out):
        """[(place, lm loss)] of the plain validation lines, in order."""
        return [(place, float(fields["lm loss value"]))
                for _, place, fields in megatron_log.validation_set_lines(out)]

    def test_eval_batch_sizes(self):
        # An evaluation reads --eval-global-batch-size samples per iteration from where the last
        # one stopped; the micro-batch size only splits them (the loss is the token-weighted mean
        # either way), in one process, over two pipeline stages or two tensor-parallel ranks (whose
        # receiving rank allocates the evaluation's micro-batch).
        every2 = {"eval_interval": 2, "init_method_std": 0.5}
        plain_out = self.run_ok(**every2)
        plain = self.validation_values(plain_out)
        self.assertEqual([p for p, _ in plain],
                         ["iteration 2", "iteration 4", "iteration 6",
                          "iteration 6 on validation set"])
        train = megatron_log.curves(plain_out, ["lm loss"], 1, 6)
        for ranks, extra in ((1, ()), (2, ("--pipeline-model-parallel-size", "2")),
                             (2, ("--tensor-model-parallel-size", "2"))):
            with self.subTest(ranks=ranks):
                out = self.run_ok(ranks, extra=("--eval-micro-batch-size", "1", *extra), **every2)
                got = self.validation_values(out)
                self.assertEqual([p for p, _ in got], [p for p, _ in plain])
                for (_, a), (_, b) in zip(got, plain):
                    self.assertAlmostEqual(a, b, delta=REL * b)
                curve = megatron_log.curves(out, ["lm loss"], 1, 6)
                for it in train:
                    self.assertAlmostEqual(curve[it]["lm loss"], train[it]["lm loss"],
                                           delta=REL * train[it]["lm loss"])
        # One evaluation iteration of 8 samples reads what two of 4 read (the split is sized the
        # same: 4 evaluations x 8 samples either way).
        eight = self.validation_values(self.run_ok(extra=("--eval-global-batch-size", "8"),
                                                   **every2))
        two = self.validation_values(self.run_ok(eval_iters=2, **every2))
        for (_, a), (_, b) in zip(eight, two):
            self.assertAlmostEqual(a, b, delta=REL * b)
        self.assertNotAlmostEqual(eight[0][1], plain[0][1], delta=1e-3 * plain[0][1])
        self.refused("--eval-global-batch-size", extra=("--eval-global-batch-size", "6",
                                                         "--eval-micro-batch-size", "4"))

    def test_start_eval_at_iter(self):
        # Evaluations from iteration 4 on, the one after training always; the first reads the
        # split's first samples. With fixed weights (lr 0) the three evaluations are the plain
        # run's first three (which start at iteration 2), sample for sample.
        fixed = {"eval_interval": 2, "init_method_std": 0.5, "lr": 0}
        got = self.validation_values(self.run_ok(extra=("--start-eval-at-iter", "4"), **fixed))
        self.assertEqual([p for p, _ in got],
                         ["iteration 4", "iteration 6", "iteration 6 on validation set"])
        plain = self.validation_values(self.run_ok(**fixed))
        self.assertEqual(len(plain), 4)
        self.assertEqual([v for _, v in got], [v for _, v in plain[:3]])
        self.assertEqual(len({v for _, v in plain}), 4)  # each evaluation read other samples

    def test_validation_set_names(self):
        per_split = {"--train-data-path": self.prefix["a"], "--data-cache-path": self.cache,
                     "--valid-data-path": [self.prefix["b"], self.prefix["c"]]}
        flags = ("--multiple-validation-sets", "--validation-set-names", "wiki", "code")
        out = self.run_ok(data=per_split, extra=flags, lr=0, train_iters=1, eval_interval=1,
                          full_validation=True)
        named = [s for s, _, _ in megatron_log.validation_set_lines(out)]
        self.assertEqual(named, ["wiki", "code", "wiki", "code"])
        self.assertIn(" validation-wiki loss at iteration 1 |", out)
        self.refused("--validation-set-names", data=per_split,
                     extra=("--multiple-validation-sets", "--validation-set-names", "wiki"),
                     train_iters=1, eval_interval=1, full_validation=True)
        self.refused("--validation-set-names", data=per_split,
                     extra=("--validation-set-names", "wiki", "code"), train_iters=1,
                     eval_interval=1, full_validation=True)

    # ---- --sft -------------------------------------------------------------------------------

    def sft_fixture(self):
        """The byte-level tokenizer and conversations of tests/data/sft_oracle.py; good.jsonl
        holds the 13 conversations it accepts, conversations.jsonl also the 3 it refuses."""
        d = os.path.join(self.tmp, "sft")
        subprocess.run([sys.executable, SFT_ORACLE, "--out", d, "--seq-length", "64"],
                       check=True, timeout=TIMEOUT_S)
        with open(os.path.join(d, "conversations.jsonl"), encoding="utf-8") as f:
            lines = f.readlines()
        with open(os.path.join(d, "good.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(lines[:13])
        return d

    def test_sft(self):
        d = self.sft_fixture()
        data = {"--tokenizer-type": "SFTTokenizer", "--tokenizer-model": d,
                "--data-path": os.path.join(d, "good.jsonl"), "--split": "10,3,0"}
        base = {k: v for k, v in MODEL.items() if k != "--vocab-size"}
        base["--tokenizer-type"] = "SFTTokenizer"
        flags = dict(seq_length=64, max_position_embeddings=64, train_iters=30, eval_interval=10,
                     lr="3e-3", global_batch_size=4, micro_batch_size=2)

        def sft_run(ranks, extra=(), **over):
            args = [*megatron_job.flags_with({**base, **data, "--sft": None}, **{**flags, **over}),
                    *extra]
            proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, args, TIMEOUT_S)
            self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
            return proc.stdout

        one = sft_run(1)
        self.assertIn("SFT train split: conversations [0, 10)", one)
        curve = megatron_log.curves(one, ["lm loss"], 1, 30)
        # The assistant turns count up: the loss falls well below its start.
        self.assertLess(curve[30]["lm loss"], 0.6 * curve[1]["lm loss"])
        self.assertEqual(len(megatron_log.validation_losses(one)), 3 + 1)  # 10, 20, 30, end
        # Tensor parallelism reads the same batches (tokens, labels, masks broadcast over TP).
        two = sft_run(2, ("--tensor-model-parallel-size", "2"), train_iters=5)
        want = megatron_log.curves(sft_run(1, train_iters=5), ["lm loss"], 1, 5)
        megatron_log.assert_same_curves(self, megatron_log.curves(two, ["lm loss"], 1, 5), want,
                                        "tp2 sft")
        # A conversation Megatron's tokenizer refuses stops the run naming the file and line.
        bad = megatron_job.run_train(
            MEGATRON, MPIEXEC, 1,
            megatron_job.flags_with({**base, **data, "--sft": None,
                                     "--data-path": os.path.join(d, "conversations.jsonl"),
                                     "--split": "100,0,0"}, **flags), TIMEOUT_S)
        self.assertEqual(bad.returncode, 2, bad.stderr[-2000:])
        self.assertIn("conversations.jsonl line 14: empty assistant turn", bad.stderr)
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, bad.stderr)
        self.refused("--tokenizer-type SFTTokenizer", extra=("--sft",))

    def test_refusals(self):
        self.refused("--multiple-validation-sets", extra=("--multiple-validation-sets",))
        self.refused("--full-validation", data={"--mock-data": None}, full_validation=True)
        weighted = {"--train-data-path": self.prefix["a"],
                    "--valid-data-path": ["1", self.prefix["b"], "2", self.prefix["c"]],
                    "--data-cache-path": self.cache}
        self.refused("--full-validation", data=weighted, full_validation=True)
        self.refused("--dataloader-type", dataloader_type="external")
        self.refused("--null-tokenizer-pad-id 100", null_tokenizer_pad_id=100)


class FimDataTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="megatron_fim_")
        cls.tmp = cls._tmp.name
        cls.tokenizer = os.path.join(cls.tmp, "tokenizer.json")
        subprocess.run([sys.executable, FIM_ORACLE, "--write-tokenizer", cls.tokenizer],
                       check=True, timeout=TIMEOUT_S)
        # Repositories of 1 to 3 small source files, separated by <file_sep>.
        jsonl = os.path.join(cls.tmp, "repos.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            for r in range(300):
                files = [f"def f{r}_{k}(x):\n    return x * {r % 7 + k} + {k}  # caf\u00e9\n"
                         for k in range(1 + r % 3)]
                f.write(json.dumps({"text": "<file_sep>".join(files)}) + "\n")
        cls.prefix = os.path.join(cls.tmp, "repos")
        proc = subprocess.run([MEGATRON, "preprocess", "--input", jsonl, "--output-prefix",
                               cls.prefix, "--tokenizer-type", "HuggingFaceTokenizer",
                               "--tokenizer-model", cls.tokenizer, "--append-eod", "--workers",
                               "1"], capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        cls.flags = {**MODEL, "--tokenizer-type": "HuggingFaceTokenizer",
                     "--tokenizer-model": cls.tokenizer, "--seq-length": "64",
                     "--max-position-embeddings": "64", "--data-path": cls.prefix + "_text_document",
                     "--split": "90,10,0", "--data-cache-path": os.path.join(cls.tmp, "cache")}
        del cls.flags["--vocab-size"]

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def run_ok(self, ranks=1, extra=(), **overrides):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks,
                                      [*megatron_job.flags_with(self.flags, **overrides), *extra],
                                      TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        return proc.stdout

    def curve(self, out, last=6):
        return megatron_log.curves(out, ["lm loss", "grad norm"], 1, last)

    def test_an_undrawn_rate_is_the_plain_run_and_rate_one_learns(self):
        plain = self.curve(self.run_ok())
        # A rate NumPy's draws (multiples of 2^-53) never fall under, and the cut at a token the
        # data never holds (Megatron drops an EOD that ends an empty segment, so a sample
        # starting with EOD would change even without a permutation).
        out = self.run_ok(extra=("--fim-data",), fim_rate="1e-300", fim_eod_token="<fim_pad>")
        self.assertRegex(out, r"(Build and save|Load) the GPTFIMDataset train indices")
        self.assertTrue(any("-GPTFIMDataset-train-" in f
                            for f in os.listdir(os.path.join(self.tmp, "cache"))))
        self.assertEqual(self.curve(out), plain)
        fim = self.curve(self.run_ok(extra=("--fim-data",), fim_rate=1, train_iters=40), 40)
        self.assertNotEqual(fim[1]["lm loss"], plain[1]["lm loss"])
        self.assertLess(fim[40]["lm loss"], 0.6 * fim[1]["lm loss"])

    def test_layouts_and_resume_read_the_same_samples(self):
        fim = ("--fim-data", "--fim-split-sample", "<file_sep>", "--fim-fragment-rate", "0.7")
        one = self.curve(self.run_ok(extra=fim))
        self.assertNotEqual(one[1]["lm loss"], self.curve(self.run_ok())[1]["lm loss"])
        for ranks, overrides in ((2, {}), (2, {"tensor_model_parallel_size": 2})):
            with self.subTest(ranks=ranks, **overrides):
                got = self.curve(self.run_ok(ranks, extra=fim, **overrides))
                megatron_log.assert_same_curves(self, got, one, "fim", rel=REL)
        ckpt = os.path.join(self.tmp, "fim_ckpt")
        self.run_ok(extra=fim, exit_interval=3, save=ckpt, save_interval=3)
        resumed = megatron_log.curves(self.run_ok(extra=fim, load=ckpt),
                                      ["lm loss", "grad norm"], 4, 6)
        self.assertEqual(resumed, {it: one[it] for it in (4, 5, 6)})

    def refused(self, flag, extra=(), **overrides):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, 1,
                                      [*megatron_job.flags_with(self.flags, **overrides), *extra],
                                      TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:] + proc.stderr[-2000:])
        self.assertIn(flag, proc.stderr)
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)

    def test_refusals(self):
        mock = {k: v for k, v in self.flags.items() if k not in ("--data-path", "--split")}
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, 1,
                                      [*megatron_job.flags_with(mock, mock_data=True),
                                       "--fim-data"], TIMEOUT_S)
        self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
        self.assertIn("mock data is not supported with the FIM dataset", proc.stderr)
        self.refused("--fim-rate should be specified", extra=("--fim-data",), fim_rate=0)
        self.refused("--tokenizer-type HuggingFaceTokenizer", extra=("--fim-data",),
                     tokenizer_type="NullTokenizer", vocab_size=300)
        self.refused("--fim-fragment-rate", extra=("--fim-data", "--fim-split-sample",
                                                   "<file_sep>"))
        self.refused("--fim-rate 1.5", extra=("--fim-data",), fim_rate=1.5)
        self.refused("--fim-middle-token <mid> is no token", extra=("--fim-data",),
                     fim_middle_token="<mid>")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
