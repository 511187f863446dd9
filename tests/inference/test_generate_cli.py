#!/usr/bin/env python3
"""`megatron generate` end to end: greedy generation through the KV cache against PyTorch's
argmax of full forward passes without a cache, in every layout; seeded sampling; refusals.

What it is:
  - The oracle (tests/reference/generate_oracle.py) writes a tiny GPT-2-style, Llama-style,
    Mixtral-style, DeepSeek-V3-style, Llama-Nemotron-style (heterogeneous layers) and gpt-oss
    (sliding windows of 4 keys, sinks) model as Hugging Face directories, four prompts of 1 to 12
    tokens and, for each,
    PyTorch's greedy continuation of 10 tokens where every token is the argmax of a full forward
    pass over the sequence so far (no cache), with the log-probabilities of a full forward.
  - `megatron generate --top_k 1` of the four prompts in one batch (different lengths: prefill of
    the shortest, then one position per step through the cache) must give exactly those tokens,
    from the HF directory in one process, and from a converted checkpoint at tp1, tp2, pp2,
    tp2 x pp2 and pp3 split unevenly (and ep2 for the MoE models); also one prompt per batch. The oracle refuses a model
    whose best and second-best logits ever come closer than 1e-3, so f32 rounding (~1e-6) cannot
    flip a choice and an exact token match is a fair demand.
  - logprobs within 1e-4 of PyTorch's (f64 log-softmax of f32 logits; ours are f32 through a
    different summation order: the logits agree to ~1e-6, log-probabilities of ~-8 to ~1e-5).
  - Sampling (--top_k 5 / --top_p 0.9 at temperature 0.7): a fixed --seed gives the same tokens
    twice and in the tp2 layout; another seed gives other tokens.
  - A Megatron launch line's training flags (MEGATRON_LINE) are accepted and change no token,
    each with its start-up line; --inference-max-requests sets the batch size.
  - Bad input: exit 2 with the flag named (top-k with top-p, prompt plus tokens beyond the
    positions or --inference-max-seq-length, the batch size's two names disagreeing, context
    parallelism, a flag Megatron removed, no prompts, a missing prompt file, bad JSON in it, no
    weights), on every rank.
What it is not: the sampling distributions (tests/inference/test_sampling.cpp).

Usage: test_generate_cli.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "..", "reference", "generate_oracle.py")
MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 180
TMP = None
LOGPROB_TOL = 1e-4  # see the module docstring


def run(args, ranks=1):
    cmd = [MEGATRON, *args]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=dict(os.environ, **megatron_job.MPI_ENV), check=False)


def oracle(arch):
    """The oracle's directory for arch (written once), its expectations, the prompt file and a
    converted checkpoint of the same weights."""
    out = os.path.join(TMP, arch)
    if not os.path.isdir(out):
        subprocess.run(["/usr/bin/python3", ORACLE, "--arch", arch, "--out", out], check=True,
                       timeout=TIMEOUT_S)
        with open(os.path.join(out, "expected.json")) as f:
            expected = json.load(f)
        with open(os.path.join(out, "prompts.txt"), "w") as f:
            for p in expected["prompts"]:
                f.write(" ".join(map(str, p)) + "\n")
        r = run(["convert", "--load-hf", os.path.join(out, "model"),
                 "--save", os.path.join(out, "ckpt")])
        assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "expected.json")) as f:
        return out, json.load(f)


# Flags of a Megatron text-generation launch line (tools/run_text_generation_server.py and the
# static-inference examples parse all of arguments.py) that mean nothing to generation here.
MEGATRON_LINE = ["--micro-batch-size", "1", "--seed", "42", "--use-checkpoint-args",
                 "--no-load-rng", "--no-load-optim", "--exit-on-missing-checkpoint",
                 "--inference-max-seq-length", "22", "--enable-cuda-graph",
                 "--context-parallel-size", "1", "--lr", "1e-4", "--train-iters", "10"]


def generate(weights, prompt_file, ranks=1, extra=()):
    r = run(["generate", *weights, "--tokenizer-type", "NullTokenizer", "--prompt-file",
             prompt_file, "--num-tokens-to-generate", "10", "--num-threads", "1", *extra], ranks)
    return r, [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


class TestGreedyAgainstPyTorch(unittest.TestCase):
    LAYOUTS = [  # (name, ranks, flags, from checkpoint)
        ("hf", 1, [], False),
        ("tp1", 1, [], True),
        ("tp1-batch1", 1, ["--inference-max-batch-size", "1"], True),
        # A launch line written for Megatron's tools (its whole parser): training flags are
        # accepted and change nothing; --inference-max-requests is the batch size.
        ("tp1-megatron-line", 1, MEGATRON_LINE + ["--inference-max-requests", "3"], True),
        ("tp2", 2, ["--tensor-model-parallel-size", "2"], True),
        ("pp2", 2, ["--pipeline-model-parallel-size", "2"], True),
        ("tp2pp2", 4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                       "2"], True),
        # An uneven split of the 2 layers: stage 0 only embeds, stages 1 and 2 one layer each.
        ("pp3 embedding counted", 3, ["--pipeline-model-parallel-size", "3",
                                      "--account-for-embedding-in-pipeline-split"], True),
    ]

    def check_arch(self, arch, layouts):
        out, expected = oracle(arch)
        prompts = os.path.join(out, "prompts.txt")
        for name, ranks, flags, from_ckpt in layouts:
            with self.subTest(arch=arch, layout=name):
                weights = (["--load", os.path.join(out, "ckpt")] if from_ckpt else
                           ["--pretrained-checkpoint", os.path.join(out, "model")])
                r, results = generate(weights, prompts, ranks, flags)
                self.assertEqual(r.returncode, 0, r.stderr[-3000:])
                if "--use-checkpoint-args" in flags:
                    self.assertIn(" > --lr 1e-4: a training flag: no effect on `megatron "
                                  "generate`", r.stderr)
                    self.assertIn(" > --enable-cuda-graph: CUDA graphs are not captured",
                                  r.stderr)
                    self.assertIn("batch 1 (3 prompts)", r.stderr)
                self.assertEqual(len(results), len(expected["greedy"]))
                for res, want, want_lp, prompt in zip(results, expected["greedy"],
                                                      expected["logprobs"], expected["prompts"]):
                    self.assertEqual(res["tokens"], want)
                    self.assertEqual(res["tokens"][:len(prompt)], prompt)
                    self.assertEqual(res["text"], " ".join(map(str, want)))
                    self.assertEqual(res["segments"], [str(t) for t in want])
                    self.assertEqual(len(res["logprobs"]), len(want) - 1)
                    err = max(abs(a - b) for a, b in zip(res["logprobs"], want_lp))
                    self.assertLess(err, LOGPROB_TOL)

    def test_gpt2(self):
        self.check_arch("gpt2", self.LAYOUTS)

    def test_llama(self):
        self.check_arch("llama", self.LAYOUTS)

    def test_mixtral(self):
        self.check_arch("mixtral", self.LAYOUTS[:2] + [
            ("ep2", 2, ["--expert-model-parallel-size", "2", "--tensor-model-parallel-size",
                        "2", "--expert-tensor-parallel-size", "1"], True),
            ("pp2", 2, ["--pipeline-model-parallel-size", "2"], True)])


    def test_gpt_oss(self):
        # gpt-oss: the KV cache's attention masks the sliding window (prompts and continuations
        # of up to 22 tokens against windows of 4) and adds the sinks; the biased router and
        # experts under expert parallelism.
        self.check_arch("gpt-oss", self.LAYOUTS[:2] + [
            ("tp2 ep2", 2, ["--expert-model-parallel-size", "2", "--tensor-model-parallel-size",
                            "2", "--expert-tensor-parallel-size", "1"], True),
            ("pp2", 2, ["--pipeline-model-parallel-size", "2"], True)])

    def test_nemotron_nas(self):
        # Llama-Nemotron's heterogeneous layers: a KV cache only for the whole attentions, each
        # with its own query groups (2 and 1); the linear and no-op branches keep nothing.
        self.check_arch("nemotron-nas", self.LAYOUTS[:3] + [
            ("pp2", 2, ["--pipeline-model-parallel-size", "2"], True),
            ("pp4", 4, ["--pipeline-model-parallel-size", "4"], True)])
        # A converted checkpoint from before the model record kept use_rope_scaling (Llama 3.1's
        # switch; only its factor was there): the positive factor turns the scaling on.
        out, expected = oracle("nemotron-nas")
        legacy = os.path.join(out, "ckpt_legacy")
        shutil.copytree(os.path.join(out, "ckpt"), legacy, dirs_exist_ok=True)
        meta_path = os.path.join(legacy, "iter_0000000", "metadata.json")
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        del meta["args"]["use_rope_scaling"]
        with open(meta_path, "w", encoding="utf-8") as f:
            json.dump(meta, f)
        r, results = generate(["--load", legacy], os.path.join(out, "prompts.txt"))
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual([res["tokens"] for res in results], expected["greedy"])
        err = max(abs(a - b) for res, want in zip(results, expected["logprobs"])
                  for a, b in zip(res["logprobs"], want))
        self.assertLess(err, LOGPROB_TOL)

    def test_deepseek_v3(self):
        # Multi-latent attention's KV cache holds the up-projected keys and values of every head;
        # its rotary key is shared by the heads (summed over TP in training, copied here).
        self.check_arch("deepseek-v3", self.LAYOUTS[:2] + [
            ("tp2", 2, ["--tensor-model-parallel-size", "2"], True),
            ("pp3", 3, ["--pipeline-model-parallel-size", "3"], True),
            ("ep2", 2, ["--expert-model-parallel-size", "2", "--tensor-model-parallel-size",
                        "2", "--expert-tensor-parallel-size", "1"], True)])


class TestSampling(unittest.TestCase):
    def sample(self, seed, ranks=1, extra=()):
        out, _ = oracle("llama")
        r, results = generate(["--load", os.path.join(out, "ckpt")],
                              os.path.join(out, "prompts.txt"), ranks,
                              ["--temperature", "0.7", "--seed", str(seed), *extra])
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return [res["tokens"] for res in results]

    def test_seed_reproduces(self):
        for mode in (["--top_k", "5"], ["--top_k", "0", "--top_p", "0.9"]):
            with self.subTest(mode=mode):
                a = self.sample(42, extra=mode)
                self.assertEqual(a, self.sample(42, extra=mode))
                self.assertEqual(a, self.sample(42, 2, ["--tensor-model-parallel-size", "2",
                                                        *mode]))
                self.assertNotEqual(a, self.sample(43, extra=mode))


class TestRefusals(unittest.TestCase):
    def refused(self, args, needle, ranks=1):
        r = run(["generate", "--tokenizer-type", "NullTokenizer", *args], ranks)
        self.assertEqual(r.returncode, 2, r.stdout[-2000:] + r.stderr[-2000:])
        self.assertIn(needle, r.stderr)
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, r.stderr)
        return r

    def test_refusals(self):
        out, _ = oracle("gpt2")
        ckpt = ["--load", os.path.join(out, "ckpt")]
        prompts = ["--prompt-file", os.path.join(out, "prompts.txt")]
        bad_json = os.path.join(TMP, "bad.jsonl")
        with open(bad_json, "w") as f:
            f.write('{"prompt": "1 2 3"}\n{"prompt": \n')
        cases = [
            (ckpt + prompts + ["--top_k", "2", "--top_p", "0.5"], "top-p and top-k"),
            (ckpt + prompts + ["--temperature", "0"], "--temperature"),
            (ckpt + prompts + ["--num-tokens-to-generate", "60"], "positions"),
            (ckpt, "--prompts"),
            (ckpt + ["--prompt-file", os.path.join(TMP, "missing.txt")], "--prompt-file"),
            (ckpt + ["--prompt-file", bad_json], "bad.jsonl:2"),
            (ckpt + ["--prompts", "1 2 5000"], "outside [0, 1000)"),
            (prompts, "--load"),
            (ckpt + prompts + ["--tensor-model-parallel-size", "2"], "ranks"),
            # The longest prompt has 12 tokens: 12 + 10 to generate is 22.
            (ckpt + prompts + ["--inference-max-seq-length", "21"],
             "--inference-max-seq-length 21"),
            (ckpt + prompts + ["--inference-max-requests", "2", "--inference-max-batch-size",
                               "3"], "two names of the batch size"),
            (ckpt + prompts + ["--inference-max-requests", "0"], "--inference-max-requests"),
            (ckpt + prompts + ["--context-parallel-size", "2"], "without context parallelism"),
            (ckpt + prompts + ["--batch-size", "4"], "--batch-size 4: removed in Megatron"),
        ]
        for args, needle in cases:
            with self.subTest(args=args[2:]):
                self.refused(args, needle)
        with self.subTest("every rank"):
            r = self.refused(ckpt + prompts + ["--tensor-model-parallel-size", "2", "--top_k",
                                               "2", "--top_p", "0.5"], "top-p and top-k", 2)
            self.assertIn("[rank 1]", r.stderr)


_TMP = None


def setUpModule():
    global TMP, _TMP
    _TMP = tempfile.TemporaryDirectory()
    TMP = _TMP.name


def tearDownModule():
    _TMP.cleanup()


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
