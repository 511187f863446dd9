#!/usr/bin/env python3
"""BERT end to end: `megatron preprocess --split-sentences` with a WordPiece vocabulary, then
`megatron pretrain_bert` as one process and under `mpiexec` in the parallel layouts.

What it is:
- equivalence: tp2 + sequence parallel, pp2, dp2 with the distributed optimizer (also with
  --overlap-param-gather, where the embedding and heads must wait for their gathers) and tp2pp2
  against the single process, for Megatron's pre-LN BERT and the post-LN variant, dropout on;
  the layouts differ only in where the arithmetic happens (TP-invariant initialisation, dropout
  keyed by global indices, Megatron's sampler share per rank), so the lm loss, sop loss, grad norm
  and validation curves must agree within 1e-5 relative (the order of f32 sums across ranks
  moves the 7th digit over 12 Adam steps; a wrong shard, mask or reduction moves the 2nd);
- a checkpoint saved in one layout and resumed in another continues the single-process curve;
- --bert-no-binary-head trains with the masked-LM loss alone;
- bad input on every rank, exit 2 with a message naming the flag or file: a vocabulary without
  [MASK], a `_text_document` dataset (preprocessed without --split-sentences), a GPT tokenizer.

The corpus is synthetic (sentences drawn from a fixed word list, seeded), so the test needs no
download; words of the list are split into WordPiece continuations so whole-word masking acts.

Usage: test_bert.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import fp8_checks  # noqa: E402
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 240
TP, PP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size"
ITERS = 12

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "so no will more out up what said about time into could them some only other new then "
         "these two may first any like now my over such our man me even most made after also did "
         "many before must through years where much your way well down should because each just "
         "those people how too little state good very make world still own see men work long get "
         "here between both life being under never day same another know while last might us "
         "great old year off come since against go came right used take three").split()
# Pieces that exist only as continuations: "walking" is walk ##ing, and so on.
STEMS = ["walk", "talk", "play", "jump", "read", "sing", "call", "help", "turn", "open"]
SUFFIXES = ["##ing", "##ed", "##s", "##er"]


def write_corpus(directory, docs=160, seed=7):
    rng = random.Random(seed)
    path = os.path.join(directory, "corpus.jsonl")
    with open(path, "w") as f:
        for d in range(docs):
            sentences = []
            for _ in range(rng.randint(2, 9)):
                words = []
                for _ in range(rng.randint(4, 16)):
                    if rng.random() < 0.2:
                        words.append(rng.choice(STEMS) + rng.choice(SUFFIXES)[2:])
                    else:
                        words.append(rng.choice(WORDS))
                s = " ".join(words)
                sentences.append(s[0].upper() + s[1:] + rng.choice([".", ".", "?", "!"]))
            f.write(json.dumps({"text": " ".join(sentences), "id": f"doc{d}"}) + "\n")
    return path


def write_vocab(directory, name="vocab.txt", drop=()):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?", "!"]
    tokens += sorted(set(WORDS)) + STEMS + SUFFIXES
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("\n".join(t for t in tokens if t not in drop) + "\n")
    return path


class TestBert(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="megatron_bert_")
        corpus = write_corpus(cls.dir)
        cls.vocab = write_vocab(cls.dir)
        for split, suffix in ((True, "sentence"), (False, "document")):
            cmd = [MEGATRON, "preprocess", "--input", corpus, "--output-prefix",
                   os.path.join(cls.dir, "corpus"), "--tokenizer-type", "BertWordPieceLowerCase",
                   "--vocab-file", cls.vocab, "--workers", "1"]
            if split:
                cmd.append("--split-sentences")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            assert proc.returncode == 0, proc.stderr
            assert os.path.exists(os.path.join(cls.dir, f"corpus_text_{suffix}.idx"))
        cls.sentences = os.path.join(cls.dir, "corpus_text_sentence")
        cls.documents = os.path.join(cls.dir, "corpus_text_document")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def base(self, cache):
        return ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                "--seq-length", "64", "--max-position-embeddings", "64",
                "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", str(ITERS),
                "--log-interval", "1", "--lr", "2e-3", "--lr-warmup-iters", "3",
                "--eval-iters", "2", "--eval-interval", "6", "--num-threads", "1",
                "--data-path", self.sentences, "--split", "90,10,0",
                "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", self.vocab,
                "--data-cache-path", os.path.join(self.dir, cache)]

    def test_fp8_hybrid_trains_close_to_bf16_and_checkpoints_its_scales(self):
        # --fp8-format hybrid on BERT's encoder GEMMs (Megatron's TE layers); measured worst
        # difference from bf16 0.18%, tp2 iteration 1 equal (tests/testing/fp8_checks.py).
        fp8_checks.check_fp8_against_bf16(self, self.run_bert, self.base("cache_fp8"), self.dir,
                                          ITERS, 16, self.curves)

    def run_bert(self, ranks, args):
        return megatron_job.run_train(MEGATRON, MPIEXEC, ranks, args, TIMEOUT_S, "pretrain_bert")

    def curves(self, stdout, first=1, last=ITERS, sop=True):
        keys = ["lm loss", "grad norm"] + (["sop loss"] if sop else [])
        return megatron_log.curves(stdout, keys, first, last)

    def assert_same_curves(self, got, want, name):
        megatron_log.assert_same_curves(self, got, want, name)

    def check_layouts(self, extra, layouts):
        single = self.run_bert(1, [*self.base("cache1"), *extra])
        self.assertEqual(single.returncode, 0, single.stderr[-3000:])
        want = self.curves(single.stdout)
        # The model learns (the unigram statistics of random word lists, within 12 steps): the
        # masked-LM loss of the last three iterations is below that of the first three.
        mean = lambda its: sum(want[i]["lm loss"] for i in its) / len(its)
        self.assertLess(mean(range(ITERS - 2, ITERS + 1)), mean(range(1, 4)), single.stdout[-3000:])
        want_valid = megatron_log.validation_lines(single.stdout)
        self.assertGreaterEqual(len(want_valid), 2)
        for name, ranks, flags in layouts:
            with self.subTest(layout=name):
                proc = self.run_bert(ranks, [*self.base("cache" + str(ranks)), *extra, *flags])
                self.assertEqual(proc.returncode, 0, f"{name}: {proc.stderr[-3000:]}")
                self.assert_same_curves(self.curves(proc.stdout), want, name)
                got_valid = megatron_log.validation_lines(proc.stdout)
                self.assertEqual(len(got_valid), len(want_valid), name)
                for (_, g), (where, w) in zip(got_valid, want_valid):
                    for key in ("lm loss value", "sop loss value"):
                        wv = megatron_log.number(w, key)
                        self.assertAlmostEqual(megatron_log.number(g, key), wv,
                                               delta=1e-5 * wv, msg=f"{name} {key} {where}")

    def test_pre_ln_layouts_match_single_process(self):
        self.check_layouts([], [
            ("tp2+sp", 2, [TP, "2", "--sequence-parallel"]),
            ("pp2", 2, [PP, "2"]),
            ("dp2 distributed optimizer", 2, ["--use-distributed-optimizer"]),
            ("dp2 overlapped param gather", 2,
             ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
              "--ddp-bucket-size", "2000"]),
            ("tp2pp2", 4, [TP, "2", PP, "2"]),
            ("dp2 Megatron-FSDP ZeRO-3", 2,
             ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]),
        ])

    def test_post_ln_layouts_match_single_process(self):
        self.check_layouts(["--transformer-block-type", "post_ln", "--recompute-granularity",
                            "full", "--recompute-method", "uniform", "--recompute-num-layers",
                            "1"], [
            ("tp2+sp", 2, [TP, "2", "--sequence-parallel"]),
            ("pp2", 2, [PP, "2"]),
            ("dp2 Megatron-FSDP ZeRO-2", 2,
             ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"]),
        ])

    def test_checkpoint_saved_in_one_layout_resumes_in_another(self):
        single = self.run_bert(1, self.base("cache_ckpt"))
        self.assertEqual(single.returncode, 0, single.stderr[-3000:])
        want = self.curves(single.stdout, 7, ITERS)
        ckpt = os.path.join(self.dir, "ckpt")
        first = self.run_bert(2, [*self.base("cache_ckpt"), TP, "2", "--sequence-parallel",
                                  "--save", ckpt, "--save-interval", "6", "--exit-interval", "6"])
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        resumed = self.run_bert(2, [*self.base("cache_ckpt"), PP, "2", "--load", ckpt])
        self.assertEqual(resumed.returncode, 0, resumed.stderr[-3000:])
        self.assert_same_curves(self.curves(resumed.stdout, 7, ITERS), want, "tp2+sp -> pp2")

    def tensorboard_tags(self, directory):
        decoder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train",
                               "decode_tfevents.py")
        dec = subprocess.run([sys.executable, decoder, directory], capture_output=True,
                             text=True, timeout=60, check=False)
        self.assertEqual(dec.returncode, 0, dec.stderr)
        return {json.loads(line)["tag"] for line in dec.stdout.splitlines() if line.strip()}

    def test_both_losses_reach_tensorboard(self):
        tb = os.path.join(self.dir, "tb")
        proc = self.run_bert(1, [*self.base("cache_tb"), "--tensorboard-dir", tb])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        tags = self.tensorboard_tags(tb)
        for tag in ("lm loss", "sop loss", "lm loss validation", "sop loss validation"):
            self.assertIn(tag, tags)

    def test_without_binary_head_only_the_masked_lm_loss(self):
        proc = self.run_bert(2, [*self.base("cache_nohead"), "--bert-no-binary-head", TP, "2"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        curve = self.curves(proc.stdout, sop=False)
        self.assertEqual(len(curve), ITERS)
        self.assertNotIn("sop loss", proc.stdout)

    def assert_refused(self, args, *needles):
        proc = self.run_bert(2, args)
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:] + proc.stderr[-2000:])
        for needle in needles:
            self.assertIn(needle, proc.stderr)

    def test_bad_input_is_refused_by_name_on_every_rank(self):
        no_mask = write_vocab(self.dir, "no_mask.txt", drop=("[MASK]",))
        args = self.base("cache_bad")
        self.assert_refused([*args[:args.index("--vocab-file")], "--vocab-file", no_mask],
                            "--vocab-file", "[MASK]")
        at = args.index("--data-path")
        docs = [*args[:at + 1], self.documents, *args[at + 2:]]
        self.assert_refused(docs, self.documents, "--split-sentences")
        gpt = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "300"]
        t = args.index("--tokenizer-type")
        self.assert_refused([*args[:t], *gpt], "BertWordPieceLowerCase")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
