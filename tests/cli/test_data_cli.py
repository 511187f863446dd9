#!/usr/bin/env python3
"""End-to-end tests of training on indexed datasets through the `megatron` binary.

What it is: `megatron preprocess` then `megatron train --data-path` on NullTokenizer documents with
a learnable rule, checking that validation loss falls and is printed in Megatron's format, that the
index cache is reused and rebuilt when stale, that masks and prefetching behave, and that corrupt
datasets and bad data flags exit 2 naming the file or flag. It shares test_cli.py's helpers.

What it is not: a check of sample order (tests/data/ compare every index with NumPy) or of the
tokenizers (tests/data/tokenizer_parity).

Usage: test_data_cli.py --megatron BUILD/megatron [unittest args]
"""

import argparse
import base64
import json
import math
import os
import random
import struct
import sys
import unittest

import test_cli
from test_cli import TINY, CliTestCase, iteration_lines, losses_of, megatron


# ------------------------------------------------------------------------------------------------
# training on indexed datasets: preprocess, train with validation, corruptions
# ------------------------------------------------------------------------------------------------

def read_indexed(prefix):
    """The token ids of each sequence of a Megatron .bin/.idx pair (int32 or uint16 tokens)."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00", prefix
    code = idx[17]
    count = struct.unpack_from("<Q", idx, 18)[0]
    lengths = struct.unpack_from(f"<{count}i", idx, 34)
    pointers = struct.unpack_from(f"<{count}q", idx, 34 + 4 * count)
    fmt, size = {8: ("H", 2), 4: ("i", 4)}[code]
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    return [list(struct.unpack_from(f"<{n}{fmt}", data, p)) for n, p in zip(lengths, pointers)]


class TestTikTokenizerData(CliTestCase):
    """--tokenizer-type TikTokenizer through preprocess and train (its encoding is checked against
    js-tiktoken by tests/data/tokenizer_parity)."""

    SPECIALS = 16

    def vocab(self):
        # The 256 bytes, then "th" 256, "he" 257, "the" 258, " t" 259, " the" 260.
        tokens = [bytes([b]) for b in range(256)] + [b"th", b"he", b"the", b" t", b" the"]
        path = os.path.join(self.tmp, "tik.json")
        with open(path, "w") as f:
            json.dump([{"rank": i, "token_bytes": base64.b64encode(t).decode(),
                        "token_str": t.decode("utf-8", "replace")} for i, t in enumerate(tokens)],
                      f)
        return path, ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", path,
                      "--tiktoken-pattern", "v2", "--tiktoken-num-special-tokens", self.SPECIALS,
                      "--vocab-size", len(tokens) + self.SPECIALS]

    def test_preprocess_writes_megatrons_ids_and_train_reads_them(self):
        vocab, flags = self.vocab()
        docs = ["the the", "then"] * 300
        path = os.path.join(self.tmp, "docs.jsonl")
        with open(path, "w") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        prefix = os.path.join(self.tmp, "tik")
        self.assertOk(megatron("preprocess", "--input", path, "--output-prefix", prefix, *flags,
                               "--append-eod", "--workers", "2"), "preprocess")
        seqs = read_indexed(prefix + "_text_document")
        # "the the": the pieces "the" and " the" are tokens; "then" merges th, then the, and
        # keeps n; ids are ranks + 16 special ids; EOD is </s> (2).
        off = self.SPECIALS
        self.assertEqual(seqs[:2], [[off + 258, off + 260, 2], [off + 258, off + ord("n"), 2]])
        self.assertEqual(len(seqs), len(docs))
        proc = megatron("train", *TINY, *flags, "--data-path", prefix + "_text_document",
                        "--split", "98,1,1", "--train-iters", "3", "--lr", "1e-3",
                        "--eval-iters", "1", "--eval-interval", "3", "--num-threads", "1",
                        "--log-interval", "1",
                        "--data-cache-path", os.path.join(self.tmp, "cache"))
        self.assertOk(proc, "train")
        # --use-checkpoint-args brings the tokenizer back too (type, model file, TikTokenizer's
        # pattern, special ids and vocabulary size), as Megatron's takes --tokenizer-model;
        # --no-use-tokenizer-model-from-checkpoint-args leaves the file to be given.
        ck = os.path.join(self.tmp, "ck")
        self.assertOk(megatron("train", *TINY, *flags, "--data-path", prefix + "_text_document",
                               "--split", "98,1,1", "--train-iters", "2", "--lr", "1e-3",
                               "--eval-iters", "0", "--num-threads", "1", "--save", ck,
                               "--data-cache-path", os.path.join(self.tmp, "cache")), "save")
        gen = megatron("generate", "--load", ck, "--use-checkpoint-args", "--prompts", "the then",
                       "--num-tokens-to-generate", "3", "--num-threads", "1")
        self.assertOk(gen, "generate")
        out = json.loads(gen.stdout.strip().splitlines()[-1])
        # "the then": "the", then " then" merged as th, the, " the", leaving n.
        self.assertEqual(out["tokens"][:3], [off + 258, off + 260, off + ord("n")])
        self.assertTrue(out["text"].startswith("the then"), out)
        bare = megatron("train", "--load", ck, "--use-checkpoint-args", "--data-path",
                        prefix + "_text_document", "--split", "98,1,1", "--train-iters", "3",
                        "--lr", "1e-3", "--num-threads", "1",
                        "--no-use-tokenizer-model-from-checkpoint-args")
        self.assertEqual(bare.returncode, 2, bare.stderr)
        self.assertIn("--tokenizer-type TikTokenizer needs --tokenizer-model", bare.stderr)
        # 277 ids, padded to Megatron's multiple of 128.
        self.assertIn("padded vocab (size: 277) with 107 dummy tokens (new size: 384)",
                      proc.stdout)
        self.assertEqual(len(losses_of(proc.stdout)), 3)
        bad = megatron("preprocess", "--input", path, "--output-prefix", prefix,
                       *[a for a in flags if a not in ("--tiktoken-pattern", "v2")],
                       "--workers", "1")
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertIn("--tiktoken-pattern v1 or v2", bad.stderr)


class TestIndexedData(CliTestCase):
    """megatron preprocess -> megatron train --data-path, with NullTokenizer documents that follow
    a learnable rule (each document counts up from a random start)."""

    VOCAB = 200
    MODEL = [*TINY, "--vocab-size", str(VOCAB), "--tokenizer-type", "NullTokenizer",
             "--num-threads", "1"]

    def make_dataset(self, name="ds", docs=120, reverse=False):
        rng = random.Random(7)
        rows = []
        for _ in range(docs):
            start, n = rng.randrange(1, 100), rng.randrange(5, 90)
            rows.append([1 + (start + i) % (self.VOCAB - 2) for i in range(n)])
        if reverse:  # reorders the training split's documents (the first 90%) only
            cut = docs * 9 // 10
            rows[:cut] = rows[:cut][::-1]
        path = os.path.join(self.tmp, name + ".jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for ids in rows:
                f.write(json.dumps({"text": " ".join(map(str, ids))}) + "\n")
        prefix = os.path.join(self.tmp, name)
        proc = megatron("preprocess", "--input", path, "--output-prefix", prefix,
                        "--tokenizer-type", "NullTokenizer", "--vocab-size", self.VOCAB,
                        "--append-eod", "--workers", "2")
        self.assertOk(proc, "preprocess")
        return prefix + "_text_document"

    def train(self, data_prefix, *extra):
        return megatron("train", *self.MODEL, "--data-path", data_prefix, "--split", "90,5,5",
                        "--data-cache-path", os.path.join(self.tmp, "cache"), *extra)

    def test_validation_loss_falls_and_cache_is_reused(self):
        prefix = self.make_dataset()
        args = ["--train-iters", "40", "--lr", "3e-3", "--lr-warmup-iters", "4",
                "--eval-interval", "10", "--eval-iters", "2", "--log-interval", "10",
                "--hidden-dropout", "0", "--attention-dropout", "0"]
        proc = self.train(prefix, *args)
        self.assertOk(proc, "train")
        valid = test_cli.megatron_log.validation_lines(proc.stdout)
        val = [float(f["lm loss value"]) for where, f in valid if where.startswith("iteration")
               and where.split()[-1].isdigit()]
        self.assertEqual(len(val), 4, proc.stdout[-3000:])  # every 10 of 40 iterations
        self.assertLess(val[-1], val[0] - 0.5, f"validation loss did not fall: {val}")
        self.assertEqual([w for w, _ in valid][-2:], ["iteration 40 on validation set",
                                                      "iteration 40 on test set"])
        for _, f in valid:
            self.assertAlmostEqual(math.exp(float(f["lm loss value"])), float(f["lm loss PPL"]),
                                   delta=1e-5 * float(f["lm loss PPL"]))
        # A second run loads the cached indices and prints the same losses.
        again = self.train(prefix, *args)
        self.assertOk(again, "train again")
        self.assertEqual(losses_of(again.stdout), losses_of(proc.stdout))
        self.assertNotIn("Build and save", again.stdout)

    def test_stale_cache_of_a_rewritten_dataset_is_rebuilt(self):
        # Same prefix, same documents in another order: every cache array keeps its shape, but
        # the cached indices describe the old data and must not be used.
        args = ["--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0"]
        prefix = self.make_dataset()
        self.assertOk(self.train(prefix, *args), "first run")
        self.make_dataset(reverse=True)
        proc = self.train(prefix, *args)
        self.assertOk(proc, "after rewriting the dataset")
        self.assertIn("rebuilding the cached GPTDataset train indices", proc.stdout)
        self.assertIn("Build and save", proc.stdout)

    def test_blend_surplus_sizes_the_blended_datasets(self):
        # --mid-level-dataset-surplus changes how many samples each blended dataset is built
        # with, so its cached indices (named by a description that holds that count) are built
        # anew for another surplus and loaded again for the first one.
        a, b = self.make_dataset("a"), self.make_dataset("b", reverse=True)
        blend = ["--data-path", "0.3", a, "0.7", b]
        args = ["--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0"]
        run = lambda *extra: megatron("train", *self.MODEL, *blend, "--split", "90,5,5",
                                      "--data-cache-path", os.path.join(self.tmp, "cache"),
                                      *args, *extra)
        first = run()
        self.assertOk(first, "default surplus")
        other = run("--mid-level-dataset-surplus", "0.5")
        self.assertOk(other, "surplus 0.5")
        self.assertIn("Build and save the GPTDataset train indices", other.stdout)
        again = run("--mid-level-dataset-surplus", "0.005")
        self.assertOk(again, "default surplus again")
        self.assertNotIn("Build and save", again.stdout)
        self.assertUsageError(run("--mid-level-dataset-surplus", "-1"),
                              "--mid-level-dataset-surplus must be >= 0")

    def test_reset_masks_and_workers_train(self):
        prefix = self.make_dataset()
        base = ["--train-iters", "3", "--lr", "1e-3", "--eval-iters", "0", "--log-interval", "1",
                "--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask"]
        sync = self.train(prefix, *base, "--num-workers", "0")
        ahead = self.train(prefix, *base, "--num-workers", "2")
        self.assertOk(sync, "train --num-workers 0")
        self.assertEqual(losses_of(sync.stdout), losses_of(ahead.stdout))
        plain = self.train(prefix, "--train-iters", "3", "--lr", "1e-3", "--eval-iters", "0",
                           "--log-interval", "1")
        self.assertNotEqual(losses_of(sync.stdout), losses_of(plain.stdout))

    def corrupt_and_expect(self, mutate, *needles):
        prefix = self.make_dataset("bad")
        mutate(prefix)
        proc = self.train(prefix, "--train-iters", "2", "--lr", "1e-3")
        self.assertUsageError(proc, *needles)
        self.assertEqual(iteration_lines(proc.stdout), [], "trained on corrupt data")

    def test_corrupt_datasets_exit_2_naming_the_file(self):
        def truncate_bin(prefix):
            with open(prefix + ".bin", "r+b") as f:
                f.truncate(os.path.getsize(prefix + ".bin") - 1)

        def flip_magic(prefix):
            with open(prefix + ".idx", "r+b") as f:
                f.write(b"X")

        def bad_pointer(prefix):
            with open(prefix + ".idx", "r+b") as f:
                f.seek(18)
                count = struct.unpack("<Q", f.read(8))[0]
                f.seek(34 + 4 * count + 8 * 3)  # sequence_pointers[3]
                value = struct.unpack("<q", f.read(8))[0]
                f.seek(34 + 4 * count + 8 * 3)
                f.write(struct.pack("<q", value + 2))

        self.corrupt_and_expect(truncate_bin, "bad_text_document.bin")
        self.corrupt_and_expect(flip_magic, "bad_text_document.idx")
        self.corrupt_and_expect(bad_pointer, "bad_text_document.idx", "sequence_pointers")
        self.corrupt_and_expect(lambda p: os.remove(p + ".bin"), "bad_text_document.bin")

    def test_data_args_files_equal_the_flags(self):
        # --data-args-path holds --data-path's words (a weighted blend here), and
        # --per-split-data-args-path the per-split lists (a list and strings): the same runs.
        a, b = self.make_dataset("a"), self.make_dataset("b", docs=150)
        run = ["--train-iters", "4", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "1",
               "--eval-interval", "2", "--data-cache-path", os.path.join(self.tmp, "cache")]
        blend = ["0.3", a, "0.7", b]
        with_flag = megatron("train", *self.MODEL, *run, "--data-path", *blend, "--split", "90,5,5")
        args_file = os.path.join(self.tmp, "data_args.txt")
        with open(args_file, "w", encoding="utf-8") as f:
            f.write(" ".join(blend[:2]) + "\n  " + " ".join(blend[2:]) + "\n")
        with_file = megatron("train", *self.MODEL, *run, "--data-args-path", args_file,
                             "--split", "90,5,5")
        self.assertOk(with_flag)
        self.assertOk(with_file)
        self.assertEqual(losses_of(with_flag.stdout), losses_of(with_file.stdout))
        self.assertEqual(len(losses_of(with_file.stdout)), 4)
        per_split = ["--train-data-path", "0.5", a, "0.5", b, "--valid-data-path", b,
                     "--test-data-path", a]
        with_flags = megatron("train", *self.MODEL, *run, *per_split)
        split_file = os.path.join(self.tmp, "splits.json")
        with open(split_file, "w", encoding="utf-8") as f:
            json.dump({"train": [0.5, a, "0.5", b], "valid": b, "test": a}, f)
        with_json = megatron("train", *self.MODEL, *run, "--per-split-data-args-path", split_file)
        self.assertOk(with_flags)
        self.assertOk(with_json)
        self.assertEqual(losses_of(with_flags.stdout), losses_of(with_json.stdout))
        base = [*self.MODEL, *run]
        self.assertUsageError(megatron("train", *base, "--data-args-path",
                                       os.path.join(self.tmp, "nope.txt")),
                              "--data-args-path", "nope.txt")
        self.assertUsageError(megatron("train", *base, "--data-args-path", args_file,
                                       "--data-path", a), "--data-args-path and --data-path")
        bad = os.path.join(self.tmp, "bad.json")
        with open(bad, "w", encoding="utf-8") as f:
            f.write('{"train": [1, 2,')
        self.assertUsageError(megatron("train", *base, "--per-split-data-args-path", bad),
                              "--per-split-data-args-path", "is not JSON")
        with open(bad, "w", encoding="utf-8") as f:
            json.dump({"train": [a], "valid": [a]}, f)
        self.assertUsageError(megatron("train", *base, "--per-split-data-args-path", bad),
                              "has no \"test\" entry")

    def test_bad_data_flags(self):
        prefix = self.make_dataset()
        # (The later --split replaces train()'s, as argparse's last value wins; Megatron's
        # re.findall reading takes "90,x" as [90], so the bad one is a malformed number.)
        self.assertUsageError(self.train(prefix, "--split", "1.2.3", "--train-iters", "2",
                                         "--lr", "1e-3"), "--split")
        self.assertUsageError(megatron("train", *self.MODEL, "--data-path",
                                       os.path.join(self.tmp, "missing"), "--train-iters", "2",
                                       "--lr", "1e-3"), "missing")
        self.assertUsageError(megatron("train", *self.MODEL, "--mock-data", "--data-path",
                                       prefix, "--train-iters", "2", "--lr", "1e-3"),
                              "--mock-data")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument("--megatron", required=True, help="the megatron binary")
    args, rest = parser.parse_known_args()
    test_cli.MEGATRON = os.path.abspath(args.megatron)
    if not os.path.exists(test_cli.MEGATRON):
        print(f"test_data_cli.py: error: {test_cli.MEGATRON} does not exist", file=sys.stderr)
        return 2
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
