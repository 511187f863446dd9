#!/usr/bin/env python3
"""T5 end to end: `megatron preprocess --split-sentences` with a WordPiece vocabulary, then
`megatron pretrain_t5` (span corruption, sentinels from --vocab-extra-ids) as one process and
under `mpiexec` in the parallel layouts T5 has in Megatron r0.14 (no pipeline).

What it is:
- equivalence: tp2 (+ sequence parallel) and dp2 with the distributed optimizer (also with
  --overlap-param-gather) against the single process, dropout on, for Megatron's default T5 (learned positions, tied head) and the v1.1
  form (relative positions, RMSNorm, GeGLU, no biases, untied) with full recomputation; the
  layouts differ only in where the arithmetic happens, so the lm loss, grad norm and validation
  loss curves must agree within 1e-5 relative (the order of f32 sums across ranks moves the 7th
  digit over 12 Adam steps; a wrong shard, mask or reduction moves the 2nd);
- the model learns: the last iterations' lm loss is below the first ones';
- a checkpoint saved in tp2+sp resumes in dp2 and continues the single-process curve;
- `megatron generate` from a T5 checkpoint (prompts with <extra_id_N> sentinels, greedy) gives
  the same tokens in one process and in tp2, a sentinel the tokenizer lacks is refused; the
  checkpoint converted to a Hugging Face T5 directory and `megatron score`d on (prompt, generated
  tokens) gives the generation's log-probabilities;
- Megatron's examples/t5/train_t5_220m_distributed.sh, scaled down, runs as `megatron
  pretrain_t5` on a `_text_document` dataset (as the script's DATA_PATH) and its loss falls;
- bad input on every rank, exit 2 with a message naming the flag or file: pipeline parallelism
  (Megatron r0.14 removed it for T5), no sentinels (--vocab-extra-ids 0), a decoder longer than
  the position table, a missing --decoder-seq-length.

The corpus is test_bert.py's synthetic one (seeded sentences from a fixed word list).

Usage: test_t5.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_checks  # noqa: E402
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402
from test_bert import write_corpus, write_vocab  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 240
TP, PP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size"
ITERS = 12
V11 = ["--position-embedding-type", "relative", "--relative-attention-num-buckets", "16",
       "--relative-attention-max-distance", "32", "--normalization", "RMSNorm",
       "--gated-linear-unit", "--openai-gelu", "--disable-bias-linear",
       "--untie-embeddings-and-output-weights", "--softmax-scale", "1"]


class TestT5(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="megatron_t5_")
        corpus = write_corpus(cls.dir)
        cls.vocab = write_vocab(cls.dir)
        cmd = [MEGATRON, "preprocess", "--input", corpus, "--output-prefix",
               os.path.join(cls.dir, "corpus"), "--tokenizer-type", "BertWordPieceLowerCase",
               "--vocab-file", cls.vocab, "--workers", "1", "--split-sentences"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        cls.sentences = os.path.join(cls.dir, "corpus_text_sentence")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def base(self, cache):
        return ["--encoder-num-layers", "2", "--decoder-num-layers", "2", "--hidden-size", "64",
                "--num-attention-heads", "4", "--kv-channels", "16", "--ffn-hidden-size", "128",
                "--encoder-seq-length", "64", "--decoder-seq-length", "32",
                "--max-position-embeddings", "64", "--vocab-extra-ids", "50",
                "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(ITERS),
                "--log-interval", "1", "--lr", "2e-3", "--lr-warmup-iters", "3",
                "--eval-iters", "2", "--eval-interval", "6", "--num-threads", "1",
                "--data-path", self.sentences, "--split", "90,10,0",
                "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", self.vocab,
                "--data-cache-path", os.path.join(self.dir, cache)]

    def test_fp8_hybrid_trains_close_to_bf16_and_checkpoints_its_scales(self):
        # --fp8-format hybrid on T5's encoder and decoder GEMMs, cross-attention included
        # (Megatron's TE layers); measured worst difference from bf16 0.04%, tp2 iteration 1
        # equal (tests/testing/fp8_checks.py).
        fp8_checks.check_fp8_against_bf16(self, self.run_t5, self.base("cache_fp8"), self.dir,
                                          ITERS, 22, self.curves)

    def run_t5(self, ranks, args):
        return megatron_job.run_train(MEGATRON, MPIEXEC, ranks, args, TIMEOUT_S, "pretrain_t5")

    def curves(self, stdout, first=1, last=ITERS):
        return megatron_log.curves(stdout, ["lm loss", "grad norm"], first, last)

    def assert_same_curves(self, got, want, name):
        megatron_log.assert_same_curves(self, got, want, name)

    def check_layouts(self, extra, layouts):
        single = self.run_t5(1, [*self.base("cache1"), *extra])
        self.assertEqual(single.returncode, 0, single.stderr[-3000:])
        want = self.curves(single.stdout)
        mean = lambda its: sum(want[i]["lm loss"] for i in its) / len(its)
        self.assertLess(mean(range(ITERS - 2, ITERS + 1)), mean(range(1, 4)) - 0.2,
                        single.stdout[-3000:])
        want_valid = megatron_log.validation_lines(single.stdout)
        self.assertGreaterEqual(len(want_valid), 2)
        for name, ranks, flags in layouts:
            with self.subTest(layout=name):
                proc = self.run_t5(ranks, [*self.base("cache" + str(ranks)), *extra, *flags])
                self.assertEqual(proc.returncode, 0, f"{name}: {proc.stderr[-3000:]}")
                self.assert_same_curves(self.curves(proc.stdout), want, name)
                got_valid = megatron_log.validation_lines(proc.stdout)
                self.assertEqual(len(got_valid), len(want_valid), name)
                for (_, g), (where, w) in zip(got_valid, want_valid):
                    wv = megatron_log.number(w, "lm loss value")
                    self.assertAlmostEqual(megatron_log.number(g, "lm loss value"), wv,
                                           delta=1e-5 * wv, msg=f"{name} {where}")

    def test_megatron_default_layouts_match_single_process(self):
        self.check_layouts([], [
            ("tp2+sp", 2, [TP, "2", "--sequence-parallel"]),
            ("dp2 distributed optimizer", 2, ["--use-distributed-optimizer"]),
            ("dp2 overlapped param gather", 2,
             ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
              "--ddp-bucket-size", "2000"]),
            ("dp2 Megatron-FSDP ZeRO-3", 2,
             ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]),
        ])

    def test_v11_relative_layouts_match_single_process(self):
        self.check_layouts([*V11, "--recompute-granularity", "full", "--recompute-method",
                            "uniform", "--recompute-num-layers", "1"], [
            ("tp2+sp", 2, [TP, "2", "--sequence-parallel"]),
            ("tp2", 2, [TP, "2"]),
            ("dp2 distributed optimizer", 2, ["--use-distributed-optimizer"]),
            ("dp2 Megatron-FSDP ZeRO-3", 2,
             ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]),
        ])

    def test_checkpoint_saved_in_one_layout_resumes_in_another(self):
        single = self.run_t5(1, self.base("cache_ckpt"))
        self.assertEqual(single.returncode, 0, single.stderr[-3000:])
        want = self.curves(single.stdout, 7, ITERS)
        ckpt = os.path.join(self.dir, "ckpt")
        first = self.run_t5(2, [*self.base("cache_ckpt"), TP, "2", "--sequence-parallel",
                                "--save", ckpt, "--save-interval", "6", "--exit-interval", "6"])
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        resumed = self.run_t5(2, [*self.base("cache_ckpt"), "--use-distributed-optimizer",
                                  "--load", ckpt])
        self.assertEqual(resumed.returncode, 0, resumed.stderr[-3000:])
        self.assert_same_curves(self.curves(resumed.stdout, 7, ITERS), want, "tp2+sp -> dp2")

    def test_megatrons_t5_example_script_runs(self):
        # examples/t5/train_t5_220m_distributed.sh of Megatron-LM core_r0.14.0, its arrays in
        # order, sizes scaled down (12+12 layers of 768 -> 2+2 of 64, 512/128 positions -> 64/32,
        # batch 64/512 -> 2/8, 1e6 iterations -> 30, lr x 10 for a tiny model), on 2 ranks
        # instead of 8 GPUs, and its DATA_PATH a `_text_document` dataset as the script names it.
        doc_prefix = os.path.join(self.dir, "cased")
        proc = subprocess.run([MEGATRON, "preprocess", "--input",
                               os.path.join(self.dir, "corpus.jsonl"), "--output-prefix",
                               doc_prefix, "--tokenizer-type", "BertWordPieceCase",
                               "--vocab-file", self.vocab, "--workers", "1"],
                              capture_output=True, text=True, timeout=120, check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        ckpt, tb = os.path.join(self.dir, "example_ckpt"), os.path.join(self.dir, "example_tb")
        t5_args = ["--encoder-num-layers", "2", "--decoder-num-layers", "2", "--hidden-size", "64",
                   "--num-attention-heads", "4", "--kv-channels", "16", "--ffn-hidden-size", "256",
                   "--encoder-seq-length", "64", "--decoder-seq-length", "32",
                   "--max-position-embeddings", "64", "--micro-batch-size", "2",
                   "--global-batch-size", "8", "--lr", "0.001", "--train-iters", "30",
                   "--lr-decay-iters", "30", "--lr-decay-style", "linear", "--min-lr", "0.00001",
                   "--weight-decay", "1e-2", "--lr-warmup-fraction", ".01", "--clip-grad", "1.0",
                   "--bf16", "--vocab-extra-ids", "100", "--init-method-std", "0.015",
                   "--transformer-impl", "transformer_engine", "--tensor-model-parallel-size", "1",
                   "--pipeline-model-parallel-size", "1", "--attention-backend", "auto"]
        data_args = ["--data-path", doc_prefix + "_text_document", "--vocab-file", self.vocab,
                     "--tokenizer-type", "BertWordPieceCase", "--split", "99982,9,9",
                     "--data-cache-path", os.path.join(self.dir, "cache_example")]
        output_args = ["--log-interval", "1", "--tensorboard-dir", tb, "--save-interval", "15",
                       "--eval-interval", "15", "--eval-iters", "2"]
        proc = self.run_t5(2, [*t5_args, *data_args, *output_args, "--distributed-backend",
                               "nccl", "--save", ckpt, "--load", ckpt, "--num-threads", "1"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("one sequence per document", proc.stdout)  # the document-data warning
        curve = self.curves(proc.stdout, 1, 30)
        first = sum(curve[i]["lm loss"] for i in (1, 2, 3)) / 3
        last = sum(curve[i]["lm loss"] for i in (28, 29, 30)) / 3
        self.assertLess(last, first - 0.5, proc.stdout[-3000:])
        self.assertTrue(os.path.exists(os.path.join(ckpt, "latest_checkpointed_iteration.txt")))

    def generate(self, ranks, args):
        return megatron_job.run_train(MEGATRON, MPIEXEC, ranks, args, TIMEOUT_S, "generate")

    def test_generation_from_a_checkpoint_in_one_process_and_tp2(self):
        ckpt = os.path.join(self.dir, "ckpt_gen")
        train = self.run_t5(1, [*self.base("cache_gen"), *V11, "--save", ckpt,
                                "--save-interval", str(ITERS)])
        self.assertEqual(train.returncode, 0, train.stderr[-3000:])
        prompts = ["the man said <extra_id_0> to the <extra_id_1> .", "walking <extra_id_0>"]
        tok = ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", self.vocab,
               "--vocab-extra-ids", "50"]
        args = ["--load", ckpt, *tok, "--prompts", *prompts, "--num-tokens-to-generate", "6",
                "--top_k", "1", "--return-log-probs", "--num-threads", "1"]
        one = self.generate(1, args)
        self.assertEqual(one.returncode, 0, one.stderr[-3000:])
        lines = [json.loads(x) for x in one.stdout.splitlines() if x.strip()]
        self.assertEqual([x["prompt"] for x in lines], prompts)
        for x in lines:
            self.assertTrue(1 <= len(x["tokens"]) <= 6, x)
            self.assertEqual(len(x["logprobs"]), len(x["tokens"]))
            self.assertTrue(all(lp <= 0 for lp in x["logprobs"]), x)
        two = self.generate(2, [*args, TP, "2"])
        self.assertEqual(two.returncode, 0, two.stderr[-3000:])
        lines2 = [json.loads(x) for x in two.stdout.splitlines() if x.strip()]
        self.assertEqual([x["tokens"] for x in lines2], [x["tokens"] for x in lines])
        for a, b in zip(lines, lines2):
            for u, v in zip(a["logprobs"], b["logprobs"]):
                self.assertAlmostEqual(u, v, delta=1e-4)
        # The checkpoint as a Hugging Face T5 directory, scored on (prompt, generated tokens):
        # the training forward gives the generation's log-probabilities.
        hf = os.path.join(self.dir, "hf_gen")
        conv = subprocess.run([MEGATRON, "convert", "--load", ckpt, "--save-hf", hf],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        self.assertEqual(conv.returncode, 0, conv.stderr[-3000:])
        with open(self.vocab) as f:
            vocab = [line.rstrip("\n") for line in f]
        prompt_ids = [vocab.index("walk"), vocab.index("##ing"), len(vocab) + 2]  # <extra_id_0>
        pairs = os.path.join(self.dir, "pairs.txt")
        with open(pairs, "w") as f:
            f.write(" ".join(map(str, prompt_ids)) + "\t" +
                    " ".join(map(str, lines[1]["tokens"])) + "\n")
        score = subprocess.run([MEGATRON, "score", "--model", "t5", "--pretrained-checkpoint", hf,
                                *tok, "--input", pairs, "--num-threads", "1"],
                               capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        self.assertEqual(score.returncode, 0, score.stderr[-3000:])
        scored = json.loads(score.stdout.splitlines()[0])
        self.assertEqual(len(scored["logprobs"]), len(lines[1]["logprobs"]))
        for u, v in zip(scored["logprobs"], lines[1]["logprobs"]):
            self.assertAlmostEqual(u, v, delta=1e-4)
        bad = self.generate(1, ["--load", ckpt, *tok, "--prompts", "a <extra_id_99> b"])
        self.assertEqual(bad.returncode, 2, bad.stderr[-2000:])
        self.assertIn("--vocab-extra-ids", bad.stderr)

    def assert_refused(self, args, *needles):
        proc = self.run_t5(2, args)
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:] + proc.stderr[-2000:])
        for needle in needles:
            self.assertIn(needle, proc.stderr)
        self.assertEqual(proc.stderr.count("error:"), 2, proc.stderr)  # every rank says why

    def replaced(self, args, flag, value):
        at = args.index(flag)
        return [*args[:at], flag, value, *args[at + 2:]]

    def test_bad_input_is_refused_by_name_on_every_rank(self):
        args = self.base("cache_bad")
        self.assert_refused([*args, PP, "2"], "--pipeline-model-parallel-size",
                            "not supported for T5")
        self.assert_refused(self.replaced(args, "--vocab-extra-ids", "0"), "--vocab-extra-ids")
        self.assert_refused(self.replaced(args, "--decoder-seq-length", "80"),
                            "--decoder-seq-length", "--max-position-embeddings")
        at = args.index("--decoder-seq-length")
        self.assert_refused([*args[:at], *args[at + 2:]], "--decoder-seq-length")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
