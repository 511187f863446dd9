#!/usr/bin/env python3
"""`megatron evaluate` end to end against a PyTorch restatement of Megatron's metrics.

What it is: the generation oracle's tiny GPT-2-style model (tests/reference/generate_oracle.py,
NullTokenizer: the text is token ids) and small task files written here:
  - WIKITEXT103: ~150 tokens on several lines (so Megatron's word count differs from the token
    count and the token ratio is not 1), --seq-length 32, --overlapping-eval 8 (windows overlap,
    the last is padded) and 32 (no overlap);
  - LAMBADA: texts ending in the model's greedy next token (correct) or in another token
    (wrong), strict and not;
  - MULTIPLE_CHOICE: contexts with four continuations each.
The restatement recomputes each metric from Megatron's definitions (tasks/zeroshot_gpt:
_LMDataset's windows and masks, avg loss / ppl / adjusted ppl / token ratio, all-targets-correct
accuracy) with full PyTorch forwards of the same weights, and the JSON summary must agree: losses
within 1e-5 relative (f32 forwards in two implementations: the per-token losses agree to ~1e-6),
counts exactly (the oracle's logits have clear argmax gaps; a flipped count would need a gap of
1e-6). Then the same at tp2 and pp2 from a converted checkpoint and with a Megatron launch
line's training flags (accepted, no effect), Megatron's printed block, and
the refusals (unknown task, missing file, bad JSON line, a LAMBADA text beyond --seq-length).

Usage: test_evaluate_cli.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import generate_oracle  # noqa: E402
import megatron_job  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 180
REL_TOL = 1e-5
SEQ = 32
_TMP = None
DIR = None
CFG = WEIGHTS = FORWARD = None


def setUpModule():
    global _TMP, DIR, CFG, WEIGHTS, FORWARD
    _TMP = tempfile.TemporaryDirectory()
    DIR = _TMP.name
    out = os.path.join(DIR, "gpt2")
    subprocess.run(["/usr/bin/python3", generate_oracle.__file__, "--arch", "gpt2", "--out", out],
                   check=True, timeout=TIMEOUT_S)
    subprocess.run([MEGATRON, "convert", "--load-hf", os.path.join(out, "model"), "--save",
                    os.path.join(out, "ckpt")], check=True, timeout=TIMEOUT_S,
                   capture_output=True)
    CFG, WEIGHTS, FORWARD, _ = generate_oracle.model("gpt2", 7)
    torch.set_num_threads(1)


def tearDownModule():
    _TMP.cleanup()


def logits_of(ids):
    with torch.no_grad():
        return FORWARD(CFG, WEIGHTS, torch.tensor([ids]))[0, :, :CFG["vocab_size"]].double()


def evaluate(task, path, ranks=1, layout=(), extra=()):
    weights = (["--pretrained-checkpoint", os.path.join(DIR, "gpt2", "model")] if ranks == 1
               else ["--load", os.path.join(DIR, "gpt2", "ckpt")])
    cmd = [MEGATRON, "evaluate", "--tokenizer-type", "NullTokenizer", *weights, "--task", task,
           "--valid-data", path, "--seq-length", str(SEQ), "--num-threads", "1",
           "--micro-batch-size", "3", *layout, *extra]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=dict(os.environ, **megatron_job.MPI_ENV), check=False)


def summary(r):
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(lines[-1])


# The last: flags of Megatron's zero-shot launch line (examples/evaluate_zeroshot_gpt.sh; tasks/
# main.py parses all of arguments.py) that mean nothing to evaluation, accepted.
LAYOUTS = [(1, ()), (2, ("--tensor-model-parallel-size", "2")),
           (2, ("--pipeline-model-parallel-size", "2")),
           (1, ("--log-interval", "10", "--no-load-optim", "--no-load-rng"))]


class TestWikiText(unittest.TestCase):
    def restate(self, tokens, raw, stride):
        # Megatron's _LMDataset and evaluate_and_print_results, restated.
        total_targets = len(tokens) - 1
        windows = max(math.ceil(max(total_targets - stride, 0) / stride) + 1, 1)
        loss = 0.0
        for idx in range(windows):
            chunk = tokens[idx * stride: idx * stride + SEQ + 1]
            mask = [1] * len(chunk)
            pad = SEQ + 1 - len(chunk)
            chunk = chunk + [CFG["vocab_size"] - 1] * pad
            mask = mask + [0] * pad
            mask = mask[1:]
            if stride != SEQ and idx != 0:
                mask[:-stride] = [0] * len(mask[:-stride])
            lp = F.log_softmax(logits_of(chunk[:-1]), dim=-1)
            for t, m in enumerate(mask):
                if m:
                    loss -= lp[t, chunk[t + 1]].item()
        n, original = len(tokens), len(raw.strip().split(" "))
        avg = loss / (n - 1)
        ratio = (n - 1) / (original - 1)
        return {"avg_loss": avg, "ppl": math.exp(min(20, avg)),
                "adjusted_ppl": math.exp(min(20, avg * ratio)), "token_ratio": ratio,
                "windows": windows}

    def test_perplexity(self):
        g = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, 998, (150,), generator=g).tolist()
        lines = [tokens[i:i + 20] for i in range(0, len(tokens), 20)]
        raw = "\n".join(" ".join(map(str, ln)) for ln in lines) + "\n"
        path = os.path.join(DIR, "wiki.test.tokens")
        with open(path, "w") as f:
            f.write(raw)
        for stride in (8, 32):
            want = self.restate(tokens, raw, stride)
            for ranks, layout in LAYOUTS:
                with self.subTest(stride=stride, layout=layout):
                    r = evaluate("WIKITEXT103", path, ranks, layout,
                                 ["--overlapping-eval", str(stride)])
                    got = summary(r)
                    self.assertEqual(got["windows"], want["windows"])
                    self.assertEqual(got["detokenizer"], "wiki")
                    for key in ("avg_loss", "ppl", "adjusted_ppl", "token_ratio"):
                        self.assertAlmostEqual(got[key] / want[key], 1.0, delta=REL_TOL, msg=key)
                    self.assertIn(" validation results on WIKITEXT103 | avg loss: ", r.stdout)
                    if "--log-interval" in layout:
                        self.assertIn(" > --log-interval 10: a training flag: no effect on "
                                      "`megatron evaluate`", r.stdout)
                    self.assertIn("| token ratio: %r |" % want["token_ratio"], r.stdout)


class TestLambadaAndChoices(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        g = torch.Generator().manual_seed(5)
        cls.texts = []
        for i in range(7):
            ctx = torch.randint(0, 998, (int(3 + 2 * i),), generator=g).tolist()
            greedy = int(torch.argmax(logits_of(ctx)[-1]))
            last = greedy if i % 2 == 0 else (greedy + 1 + i) % 998
            cls.texts.append(" ".join(map(str, ctx + [last])))
        cls.lambada = os.path.join(DIR, "lambada_test.jsonl")
        with open(cls.lambada, "w") as f:
            for t in cls.texts:
                f.write(json.dumps({"text": t}) + "\n")
        cls.items = []
        for i in range(6):
            ctx = torch.randint(0, 998, (4 + i,), generator=g).tolist()
            choices = [" ".join(map(str, torch.randint(0, 998, (1 + (i + c) % 3,),
                                                       generator=g).tolist()))
                       for c in range(4)]
            cls.items.append({"context": " ".join(map(str, ctx)), "choices": choices,
                              "answer": i % 4})
        cls.choices = os.path.join(DIR, "choices.jsonl")
        with open(cls.choices, "w") as f:
            for it in cls.items:
                f.write(json.dumps(it) + "\n")

    def test_lambada(self):
        # Megatron's accuracy: every target position's argmax right. With NullTokenizer the
        # strict target (the tokens of " " + the last word) is the last token too.
        correct = 0
        for t in self.texts:
            ids = list(map(int, t.split()))
            correct += int(torch.argmax(logits_of(ids[:-1])[-1])) == ids[-1]
        self.assertTrue(0 < correct < len(self.texts))
        for strict in (False, True):
            for ranks, layout in LAYOUTS:
                with self.subTest(strict=strict, layout=layout):
                    r = evaluate("LAMBADA", self.lambada, ranks, layout,
                                 ["--strict-lambada"] if strict else [])
                    got = summary(r)
                    self.assertEqual((got["correct"], got["total"]), (correct, len(self.texts)))
                    self.assertIn("number correct: %.4E | total examples: %.4E | avg accuracy: "
                                  "%.4E" % (correct, len(self.texts), correct / len(self.texts)),
                                  r.stdout)

    def test_multiple_choice(self):
        acc = acc_norm = 0
        for it in self.items:
            ctx = list(map(int, it["context"].split()))
            scores, norms = [], []
            for c in it["choices"]:
                ids = ctx + list(map(int, c.split()))
                lp = F.log_softmax(logits_of(ids[:-1]), dim=-1)
                ll = sum(lp[t - 1, ids[t]].item() for t in range(len(ctx), len(ids)))
                scores.append(ll)
                norms.append(ll / len(c))
            acc += max(range(4), key=lambda k: (scores[k], -k)) == it["answer"]
            acc_norm += max(range(4), key=lambda k: (norms[k], -k)) == it["answer"]
        for ranks, layout in LAYOUTS:
            with self.subTest(layout=layout):
                got = summary(evaluate("MULTIPLE_CHOICE", self.choices, ranks, layout))
                self.assertEqual((got["correct"], got["correct_norm"], got["total"]),
                                 (acc, acc_norm, len(self.items)))


class TestRefusals(unittest.TestCase):
    def test_refusals(self):
        bad = os.path.join(DIR, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"text": "1 2 3"}\n{"text": 5}\n')
        broken = os.path.join(DIR, "broken.jsonl")
        with open(broken, "w") as f:
            f.write('{"text": "1 2"}\n{"text"\n')
        long_text = os.path.join(DIR, "long.jsonl")
        with open(long_text, "w") as f:
            f.write(json.dumps({"text": " ".join(["7"] * 40)}) + "\n")
        for task, path, needle in [("SQUAD", bad, "--task"),
                                   ("LAMBADA", os.path.join(DIR, "none.jsonl"), "--valid-data"),
                                   ("LAMBADA", bad, "bad.jsonl:2"),
                                   ("LAMBADA", broken, "broken.jsonl:2: not valid JSON"),
                                   ("LAMBADA", long_text, "--seq-length"),
                                   ("MULTIPLE_CHOICE", bad, "\"choices\"")]:
            with self.subTest(task=task, path=os.path.basename(path)):
                r = evaluate(task, path)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(needle, r.stderr)
                for marker in megatron_job.CRASH_MARKERS:
                    self.assertNotIn(marker, r.stderr)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
