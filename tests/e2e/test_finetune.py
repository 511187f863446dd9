#!/usr/bin/env python3
"""`megatron finetune --task classification` end to end on a synthetic topic task.

What it is:
- from random weights the classifier learns the task: validation accuracy well above the
  majority class (the sentences of each class draw half their words from the class's own list,
  so the task is learnable in a few epochs);
- tp2 + sequence parallel, pp2 and dp2 give the single-process loss, accuracy and validation
  curves (1e-5 relative: the order of f32 sums across ranks; a wrong shard moves the 2nd digit);
- a `pretrain_bert` checkpoint starts the classifier (--pretrained-checkpoint): its encoder is
  read, the missing classification head is reported and initialised (Megatron's strict=False);
- TSV input with a header, and bad input refused by name with exit 2: a validation label the
  training data lacks, a TSV without the label column, an unknown --task.

Usage: test_finetune.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 240
TP, PP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size"
TOPICS = {"sport": "team ball game win score run match goal player coach".split(),
          "food": "bread eat cook meal taste salt fish fruit dinner kitchen".split(),
          "music": "song sing band note drum piano sound voice music choir".split()}
COMMON = "the a of and to in is was it that with for on".split()


def sentence(rng, topic):
    n = rng.randint(5, 14)
    return " ".join(rng.choice(TOPICS[topic]) if rng.random() < 0.5 else rng.choice(COMMON)
                    for _ in range(n))


class TestFinetune(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="megatron_finetune_")
        rng = random.Random(3)
        cls.valid_labels = []
        # Class sizes differ (the majority baseline is then not 1/3).
        weights = {"sport": 0.5, "food": 0.3, "music": 0.2}
        for name, n in (("train", 320), ("valid", 96)):
            with open(os.path.join(cls.dir, f"{name}.jsonl"), "w") as f:
                for _ in range(n):
                    t = rng.choices(list(weights), weights=list(weights.values()))[0]
                    if name == "valid":
                        cls.valid_labels.append(t)
                    f.write(json.dumps({"text": sentence(rng, t), "label": t}) + "\n")
        with open(os.path.join(cls.dir, "train.tsv"), "w") as f:
            f.write("text_a\tlabel\n")
            for _ in range(64):
                t = rng.choice(list(TOPICS))
                f.write(f"{sentence(rng, t)}\t{t}\n")
        tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tokens += sorted(set(sum(TOPICS.values(), []) + COMMON))
        cls.vocab = os.path.join(cls.dir, "vocab.txt")
        with open(cls.vocab, "w") as f:
            f.write("\n".join(tokens) + "\n")
        # A sentence corpus for pretraining: documents of topic sentences.
        with open(os.path.join(cls.dir, "corpus.jsonl"), "w") as f:
            for d in range(80):
                t = rng.choice(list(TOPICS))
                # Capitalised sentences: a full stop before a lower-case word ends no sentence.
                text = " ".join(sentence(rng, t).capitalize() + "."
                                for _ in range(rng.randint(2, 6)))
                f.write(json.dumps({"text": text}) + "\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def model(self):
        return ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                "--seq-length", "32", "--max-position-embeddings", "32",
                "--micro-batch-size", "4", "--global-batch-size", "16", "--lr", "1e-3",
                "--log-interval", "1", "--num-threads", "1",
                "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", self.vocab]

    def finetune_args(self, train="train.jsonl", valid="valid.jsonl", epochs="3"):
        return ["--task", "classification", "--train-data", os.path.join(self.dir, train),
                "--valid-data", os.path.join(self.dir, valid), "--epochs", epochs, *self.model()]

    def run_cmd(self, ranks, command, args):
        cmd = [MEGATRON, command, *megatron_job.with_given_peak(command, args)]
        if ranks > 1:
            cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env=dict(os.environ, **megatron_job.MPI_ENV), check=False)

    def accuracy(self, stdout):
        lines = megatron_log.validation_lines(stdout)
        self.assertTrue(lines, stdout[-2000:])
        return megatron_log.number(lines[-1][1], "accuracy value")

    def test_learns_well_above_the_majority_class(self):
        proc = self.run_cmd(1, "finetune", self.finetune_args())
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        majority = max(collections.Counter(self.valid_labels).values()) / len(self.valid_labels)
        acc = self.accuracy(proc.stdout)
        print(f"validation accuracy {acc:.3f}, majority class {majority:.3f}", file=sys.stderr)
        self.assertGreater(acc, majority + 0.25)
        # 320 examples / 16 per batch x 3 epochs; every evaluation sees all 96 examples once, so
        # the last in-training evaluation and the final one agree exactly.
        lines = megatron_log.iteration_lines(proc.stdout)
        self.assertEqual(max(lines), 60)
        vals = megatron_log.validation_lines(proc.stdout)
        self.assertEqual(megatron_log.number(vals[-1][1], "accuracy value"),
                         megatron_log.number(vals[-2][1], "accuracy value"))

    def test_layouts_match_single_process(self):
        args = self.finetune_args(epochs="1")
        single = self.run_cmd(1, "finetune", args)
        self.assertEqual(single.returncode, 0, single.stderr[-3000:])
        want = megatron_log.iteration_lines(single.stdout)
        for name, ranks, flags in (("tp2+sp", 2, [TP, "2", "--sequence-parallel"]),
                                   ("pp2", 2, [PP, "2"]), ("dp2", 2, [])):
            with self.subTest(layout=name):
                proc = self.run_cmd(ranks, "finetune", [*args, *flags])
                self.assertEqual(proc.returncode, 0, f"{name}: {proc.stderr[-3000:]}")
                got = megatron_log.iteration_lines(proc.stdout)
                self.assertEqual(sorted(got), sorted(want))
                for it in want:
                    for key in ("lm loss", "accuracy"):
                        w = megatron_log.number(want[it], key)
                        self.assertAlmostEqual(megatron_log.number(got[it], key), w,
                                               delta=1e-5 * abs(w) + 1e-7,
                                               msg=f"{name} {key} at {it}")
                self.assertAlmostEqual(self.accuracy(proc.stdout), self.accuracy(single.stdout),
                                       delta=1e-9, msg=name)

    def test_starts_from_a_pretrain_bert_checkpoint(self):
        prefix = os.path.join(self.dir, "corpus")
        proc = self.run_cmd(1, "preprocess", [
            "--input", os.path.join(self.dir, "corpus.jsonl"), "--output-prefix", prefix,
            "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", self.vocab,
            "--split-sentences", "--workers", "1"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        ckpt = os.path.join(self.dir, "pretrained")
        proc = self.run_cmd(1, "pretrain_bert", [
            *self.model(), "--train-iters", "10", "--data-path", prefix + "_text_sentence",
            "--split", "100,0,0", "--save", ckpt, "--save-interval", "10",
            "--data-cache-path", os.path.join(self.dir, "cache")])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        args = self.finetune_args(epochs="1")
        tuned = self.run_cmd(2, "finetune", [*args, "--pretrained-checkpoint", ckpt, TP, "2"])
        self.assertEqual(tuned.returncode, 0, tuned.stderr[-3000:])
        self.assertIn(f"***WARNING*** could not find classification_head.weight in {ckpt}",
                      tuned.stdout)
        self.assertNotIn("could not find encoder.", tuned.stdout)
        # The pretrained encoder changes the start: the first loss differs from random weights.
        scratch = self.run_cmd(1, "finetune", args)
        first = lambda out: megatron_log.number(megatron_log.iteration_lines(out)[1], "lm loss")
        self.assertNotAlmostEqual(first(tuned.stdout), first(scratch.stdout), places=4)

    def test_tsv_input(self):
        proc = self.run_cmd(1, "finetune", self.finetune_args(train="train.tsv", epochs="1"))
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("64 training examples, 3 classes", proc.stdout)

    def assert_refused(self, args, *needles):
        proc = self.run_cmd(2, "finetune", args)
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:] + proc.stderr[-2000:])
        for needle in needles:
            self.assertIn(needle, proc.stderr)

    def test_bad_input_is_refused_by_name(self):
        odd = os.path.join(self.dir, "odd.jsonl")
        with open(odd, "w") as f:
            f.write(json.dumps({"text": "the ball", "label": "poetry"}) + "\n")
        self.assert_refused(self.finetune_args(valid="odd.jsonl"), "--valid-data", "'poetry'")
        nolabel = os.path.join(self.dir, "nolabel.tsv")
        with open(nolabel, "w") as f:
            f.write("text_a\tclass\nthe ball\tsport\n")
        self.assert_refused(self.finetune_args(train="nolabel.tsv"), nolabel, "'label'")
        args = self.finetune_args()
        args[args.index("classification")] = "SST9"
        self.assert_refused(args, "--task SST9")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
