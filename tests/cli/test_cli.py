#!/usr/bin/env python3
"""End-to-end tests of the `megatron` command line: the binary is run as a user runs it.

What this is: black-box checks of `megatron train`, `score` and `convert` through their flags,
exit codes, stdout and stderr and the files they write. Training must lower the loss and be
bit-for-bit reproducible; the log must follow Megatron's formats (argument dump, padded-vocab
line, iteration line); gradient accumulation must match one big micro-batch; TensorBoard scalars
must equal the printed losses; bad input must exit 2 with a message naming the flag or file and
without a crash; `score` must reproduce PyTorch's log-probabilities from the reference oracle
(tests/reference/hf_oracle.py); `convert` must round-trip Hugging Face weights exactly (and
re-encode them to bfloat16 with round-to-nearest-even); a pretrained model must train and export.

What this is not: not a unit test of the C++ classes (tests/*/test_*.cpp do that), not a numerics
oracle of its own (it reuses the oracle's logits), and not a benchmark: throughput and timings
are only checked for their format. It parses safetensors files itself and imports nothing from
the project except by running tests/train/decode_tfevents.py as a separate process.

Usage: test_cli.py --megatron PATH/TO/megatron --oracle-dir DIR [unittest options]
       (DIR holds gpt2/ and llama/ as written by hf_oracle.py --arch ARCH --out DIR/ARCH)
"""

import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing: the given GEMM peak)
import megatron_log  # noqa: E402  (tests/testing: the shared log parser)

HERE = os.path.dirname(os.path.abspath(__file__))
DECODE_TFEVENTS = os.path.join(HERE, os.pardir, "train", "decode_tfevents.py")

MEGATRON = None  # set from --megatron
ORACLE = None  # set from --oracle-dir

TIMEOUT_S = 120

# A tiny GPT-2 style model; the "+1" rule of the mock data is learnable within a few dozen
# iterations at this vocabulary size.
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2"]
LLAMA_STYLE = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
               "--disable-bias-linear", "--group-query-attention", "--num-query-groups", "2",
               "--untie-embeddings-and-output-weights"]
# Everything `train` needs besides the model, for runs whose numbers do not matter.
QUICK = ["--mock-data", "--train-iters", "2", "--lr", "1e-3", "--num-threads", "1"]

# Signs of a crash rather than a handled error.
CRASH_MARKERS = ("terminate called", "Aborted", "core dumped", "Segmentation fault", "what():",
                 "internal error", "Traceback", "stack trace", "Assertion")

PARAMS_RE = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank "
                       r"\(0, 0\): (\d+)")


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

def megatron(*args, timeout=TIMEOUT_S):
    """Runs the binary; returns the CompletedProcess (text mode)."""
    args = [str(a) for a in args]
    if args:
        args = [args[0], *megatron_job.with_given_peak(args[0], args[1:])]
    return subprocess.run([MEGATRON, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def losses_of(stdout):
    """The printed lm loss of every iteration line, in iteration order (megatron_log: every line
    whole, none twice)."""
    lines = megatron_log.iteration_lines(stdout)
    return [lines[it]["lm loss"] for it in sorted(lines)]


def iteration_lines(stdout):
    """The iteration lines as printed, after megatron_log has checked that each is whole."""
    megatron_log.iteration_lines(stdout)
    return [line for line in stdout.splitlines() if "] iteration " in line]


_SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8"),
                       "BF16": np.dtype("<u2"), "F16": np.dtype("<f2")}


def read_safetensors(path):
    """name -> (dtype tag, shape list, raw bytes); metadata under the key None."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {None: header.pop("__metadata__", None)}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], list(e["shape"]), blob[base + b:base + end])
    return out


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> (dtype tag, shape, raw bytes), written in dict order."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def as_array(entry):
    """A safetensors entry as a numpy array (BF16 widened to float32)."""
    dtype, shape, data = entry
    a = np.frombuffer(data, dtype=_SAFETENSORS_DTYPES[dtype]).reshape(shape)
    if dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a


def bf16_round_bits(f32):
    """float32 array -> uint16 bfloat16 bits, round to nearest, ties to even (finite inputs)."""
    u = np.ascontiguousarray(f32, dtype="<f4").view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def oracle_tokens(arch):
    return as_array(read_safetensors(os.path.join(ORACLE, arch, "expected.safetensors"))["tokens"])


def reference_logprobs(arch):
    """Per row of the oracle's tokens: log p(t_{i+1} | t_<=i) from PyTorch's logits, in float64."""
    exp = read_safetensors(os.path.join(ORACLE, arch, "expected.safetensors"))
    tokens = as_array(exp["tokens"])
    logits = as_array(exp["logits"]).astype(np.float64)  # [B, S, V]
    m = logits.max(axis=-1, keepdims=True)
    logsm = logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
    rows = []
    for b in range(tokens.shape[0]):
        nxt = tokens[b, 1:]
        rows.append(logsm[b, np.arange(len(nxt)), nxt])
    return tokens, rows


def write_token_file(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(" ".join(str(int(t)) for t in r) + "\n")


def score(model_dir, input_path, *extra):
    return megatron("score", "--pretrained-checkpoint", model_dir, "--input", input_path,
                    "--num-threads", "1", *extra)


class CliTestCase(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="megatron_cli_")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def assertOk(self, proc, what=""):
        self.assertEqual(proc.returncode, 0,
                         f"{what}: exit {proc.returncode}\nstderr:\n{proc.stderr[-3000:]}")

    def assertUsageError(self, proc, *needles):
        """Exit code 2, every needle in stderr, and no sign of a crash."""
        self.assertEqual(proc.returncode, 2,
                         f"expected exit 2, got {proc.returncode}\nstderr:\n{proc.stderr[-3000:]}")
        for n in needles:
            self.assertIn(n, proc.stderr, f"stderr does not name {n!r}:\n{proc.stderr}")
        for marker in CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr, f"crash marker {marker!r} in stderr")
        self.assertTrue(proc.stderr.startswith("error: "),
                        f"stderr should start with 'error: ':\n{proc.stderr}")


# ------------------------------------------------------------------------------------------------
# 1. training lowers the loss, reproducibly
# ------------------------------------------------------------------------------------------------

LEARN = ["--mock-data", *TINY, "--vocab-size", "128", "--train-iters", "60", "--lr", "1e-3",
         "--lr-warmup-iters", "5", "--log-interval", "1", "--num-threads", "1"]


class TestLossFallsAndReproducible(CliTestCase):
    def check_learns(self, proc, what):
        self.assertOk(proc, what)
        losses = [float(x) for x in losses_of(proc.stdout)]
        self.assertEqual(len(losses), 60, f"{what}: expected 60 iteration lines")
        for v in losses:
            self.assertTrue(math.isfinite(v), f"{what}: non-finite loss {v}")
        # Untrained, the loss is about ln(vocab).
        self.assertAlmostEqual(losses[0], math.log(128), delta=0.3, msg=what)
        last10 = sum(losses[-10:]) / 10
        self.assertLess(last10, losses[0] - 0.5, f"{what}: loss did not fall: {losses}")
        windows = [sum(losses[i:i + 20]) / 20 for i in (0, 20, 40)]
        self.assertTrue(windows[0] > windows[1] > windows[2],
                        f"{what}: 20-iteration means do not fall steadily: {windows}")
        return proc

    def test_gpt2_style_learns_and_is_reproducible(self):
        first = self.check_learns(megatron("train", *LEARN), "gpt2 style")
        second = megatron("train", *LEARN)
        self.assertOk(second, "second run")
        self.assertEqual(losses_of(first.stdout), losses_of(second.stdout),
                         "the same command printed different losses")
        # The comparison above is not vacuous: another seed gives other numbers.
        other = megatron("train", *LEARN, "--seed", "4321")
        self.assertOk(other, "other seed")
        self.assertNotEqual(losses_of(first.stdout), losses_of(other.stdout))
        # h=64, padded V=128, 32 positions, 2 layers of LayerNorm + biased QKV/proj/MLP (ffn 256).
        self.assertEqual(PARAMS_RE.search(first.stdout).group(1), "110336")

    def test_megatron_entry_point_is_train_with_its_model(self):
        # A launch line's `pretrain_gpt.py ARGS` runs as `megatron pretrain_gpt ARGS`: the same
        # run as `megatron train --model gpt ARGS` (and as plain train, gpt being the default).
        args = [a if a != "60" else "8" for a in LEARN]
        entry = megatron("pretrain_gpt", *args)
        self.assertOk(entry, "pretrain_gpt")
        self.assertIn("Usage: pretrain_gpt", megatron("pretrain_gpt", "--help").stdout)
        for other in (megatron("train", "--model", "gpt", *args), megatron("train", *args)):
            self.assertOk(other, "train")
            self.assertEqual(losses_of(entry.stdout), losses_of(other.stdout))
        self.assertEqual(len(losses_of(entry.stdout)), 8)

    def test_reproducible_with_two_threads(self):
        args = [*LEARN[:LEARN.index("--train-iters")], "--train-iters", "10", "--lr", "1e-3",
                "--log-interval", "1", "--num-threads", "2"]
        a, b = megatron("train", *args), megatron("train", *args)
        self.assertOk(a)
        self.assertOk(b)
        self.assertEqual(len(losses_of(a.stdout)), 10)
        self.assertEqual(losses_of(a.stdout), losses_of(b.stdout))

    def test_llama_style_learns(self):
        proc = self.check_learns(megatron("train", *LEARN, *LLAMA_STYLE), "llama style")
        # RMSNorm (no bias), 4 query heads in 2 groups of head dim 16, SwiGLU ffn
        # int(4*64*2/3/64)*64 = 128, no biases, separate output layer.
        self.assertEqual(PARAMS_RE.search(proc.stdout).group(1), "90432")
        gpt = megatron("train", *LEARN)
        self.assertNotEqual(losses_of(gpt.stdout), losses_of(proc.stdout),
                            "the Llama-style flags changed nothing")


# ------------------------------------------------------------------------------------------------
# 2. output formats
# ------------------------------------------------------------------------------------------------

class TestOutputFormat(CliTestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc = megatron("train", "--mock-data", *TINY, "--vocab-size", "500",
                            "--train-iters", "4", "--lr", "1e-3", "--log-interval", "2",
                            "--global-batch-size", "4", "--num-threads", "1")

    def test_exit_code(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)

    def test_argument_dump(self):
        lines = self.proc.stdout.splitlines()
        start = lines.index("------------------------ arguments ------------------------")
        end = lines.index("-------------------- end of arguments ---------------------")
        self.assertLess(start, end)
        rows = {}
        names = []
        for line in lines[start + 1:end]:
            # Names of 48 characters or more get no dots (Megatron's '.' * (48 - len(name))).
            m = re.fullmatch(r"  (\w+) (\.*) (.*)", line)
            self.assertIsNotNone(m, f"malformed dump line {line!r}")
            name, dots, value = m.groups()
            self.assertEqual(len(dots), max(0, 48 - len(name)), line)
            rows[name] = value
            names.append(name)
        self.assertEqual(names, sorted(names, key=str.lower), "the dump is not sorted by name")
        self.assertIn("  num_layers " + "." * (48 - len("num_layers")) + " 2", lines)
        expected = {"num_layers": "2", "hidden_size": "64", "num_attention_heads": "4",
                    "seq_length": "32", "micro_batch_size": "2", "global_batch_size": "4",
                    "vocab_size": "500", "lr": "0.001", "norm_epsilon": "1e-05",
                    "hidden_dropout": "0.1", "init_method_std": "0.02", "adam_beta2": "0.999",
                    "fp16": "False", "mock_data": "True", "swiglu": "False",
                    "tensorboard_dir": "None", "train_iters": "4"}
        for k, v in expected.items():
            self.assertEqual(rows.get(k), v, f"argument dump: {k}")

    def test_padded_vocab_line(self):
        self.assertIn(" > padded vocab (size: 500) with 12 dummy tokens (new size: 512)",
                      self.proc.stdout.splitlines())

    def test_iteration_line_field_order(self):
        lines = iteration_lines(self.proc.stdout)
        self.assertEqual(len(lines), 2, self.proc.stdout)
        fields = [
            r"iteration +(\d+)/ +(\d+)",
            r"consumed samples: +(\d+)",
            r"elapsed time per iteration \(ms\): ([0-9.]+)",
            r"throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+)",
            r"learning rate: ([0-9]\.[0-9]{6}E[+-][0-9]{2})",
            r"global batch size: +(\d+)",
            r"lm loss: ([0-9]\.[0-9]{6}E[+-][0-9]{2})",
            r"loss scale: ([0-9.]+)",
            r"grad norm: ([0-9.]+)",
            r"number of skipped iterations: +(\d+)",
            r"number of nan iterations: +(\d+)",
        ]
        pattern = re.compile(r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] " +
                             r" \| ".join(fields) + r" \|")
        for k, line in enumerate(lines):
            m = pattern.match(line)
            self.assertIsNotNone(m, f"iteration line does not follow Megatron's order:\n{line}")
            it = 2 * (k + 1)
            self.assertEqual(int(m.group(1)), it)
            self.assertEqual(int(m.group(2)), 4)
            self.assertEqual(int(m.group(3)), it * 4, "consumed samples")
            self.assertEqual(int(m.group(7)), 4, "global batch size")
            self.assertEqual(float(m.group(9)), 1.0, "loss scale")
            self.assertEqual(int(m.group(11)), 0)
            self.assertEqual(int(m.group(12)), 0)


# ------------------------------------------------------------------------------------------------
# 3. gradient accumulation
# ------------------------------------------------------------------------------------------------

class TestRepeatedFlags(CliTestCase):
    def test_the_last_value_wins_as_with_argparse(self):
        # A launch script that appends an override repeats a flag: argparse keeps the last value,
        # and so do we (a repeated switch is harmless).
        proc = megatron("train", "--mock-data", *TINY, "--vocab-size", "128", "--train-iters",
                        "1", "--lr", "1e-3", "--num-threads", "1", "--num-layers", "3",
                        "--lr", "2e-3", "--swiglu", "--swiglu")
        self.assertOk(proc, "repeated flags")
        self.assertIn("  num_layers " + "." * (48 - len("num_layers")) + " 3", proc.stdout)
        self.assertIn("  lr " + "." * (48 - len("lr")) + " 0.002", proc.stdout)

    def test_the_last_of_a_flag_pair_wins(self):
        # --yarn-correction-range-round-to-int and its --no- form set one dest: the last given
        # wins, in either order, and the dump has one line for it.
        name = "yarn_correction_range_round_to_int"
        for flags, value in ((["--no-" + name.replace("_", "-"), "--" + name.replace("_", "-")],
                              "True"),
                             (["--" + name.replace("_", "-"), "--no-" + name.replace("_", "-")],
                              "False")):
            proc = megatron("train", "--mock-data", *TINY, "--vocab-size", "128",
                            "--train-iters", "1", "--lr", "1e-3", "--num-threads", "1",
                            "--position-embedding-type", "yarn", *flags)
            self.assertOk(proc, " ".join(flags))
            line = "  " + name + " " + "." * (48 - len(name)) + " "
            self.assertIn(line + value, proc.stdout)
            self.assertEqual(proc.stdout.count(line), 1)


class TestGradientAccumulation(CliTestCase):
    def test_four_micro_batches_equal_one(self):
        common = ["--mock-data", "--num-layers", "2", "--hidden-size", "64",
                  "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "512",
                  "--train-iters", "5", "--lr", "1e-3", "--log-interval", "1",
                  "--hidden-dropout", "0", "--attention-dropout", "0", "--num-threads", "1"]
        acc = megatron("train", *common, "--micro-batch-size", "2", "--global-batch-size", "8")
        one = megatron("train", *common, "--micro-batch-size", "8", "--global-batch-size", "8")
        self.assertOk(acc, "4 micro-batches")
        self.assertOk(one, "1 micro-batch")
        la = [float(x) for x in losses_of(acc.stdout)]
        lo = [float(x) for x in losses_of(one.stdout)]
        self.assertEqual(len(la), 5)
        self.assertEqual(len(lo), 5)
        self.assertLess(abs(la[0] - lo[0]), 1e-5 * abs(lo[0]), f"iteration 1: {la[0]} vs {lo[0]}")
        for a, o in zip(la, lo):
            self.assertLess(abs(a - o), 1e-4 * abs(o), f"curves differ: {la} vs {lo}")
        # Both consumed 8 samples per iteration.
        for line in iteration_lines(acc.stdout) + iteration_lines(one.stdout):
            self.assertRegex(line, r"global batch size: +8 \|")


# ------------------------------------------------------------------------------------------------
# 4. TensorBoard
# ------------------------------------------------------------------------------------------------

class TestTensorBoard(CliTestCase):
    def test_scalars_match_the_log(self):
        tb = os.path.join(self.tmp, "tb")
        iters = 6
        proc = megatron("train", "--mock-data", *TINY, "--vocab-size", "128",
                        "--train-iters", iters, "--lr", "1e-3", "--lr-warmup-iters", "2",
                        "--log-interval", "1", "--num-threads", "1", "--tensorboard-dir", tb)
        self.assertOk(proc)
        dec = subprocess.run([sys.executable, DECODE_TFEVENTS, tb, "--expect-tags",
                              "lm loss,learning-rate,grad-norm,loss-scale,batch-size"],
                             capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        self.assertEqual(dec.returncode, 0, dec.stderr)
        points = [json.loads(line) for line in dec.stdout.splitlines() if line.strip()]
        by_tag = {}
        for p in points:
            by_tag.setdefault(p["tag"], {})[p["step"]] = p["value"]

        printed = [float(x) for x in losses_of(proc.stdout)]
        self.assertEqual(len(printed), iters)
        tb_loss = by_tag["lm loss"]
        self.assertEqual(sorted(tb_loss), list(range(1, iters + 1)))
        for step, value in tb_loss.items():
            want = printed[step - 1]
            self.assertLess(abs(value - want), 1e-6 * abs(want),
                            f"step {step}: TensorBoard {value} vs log {want}")
        lrs = [float(m) for m in re.findall(r"learning rate: ([0-9.E+-]+)", proc.stdout)]
        for step, value in by_tag["learning-rate"].items():
            self.assertLess(abs(value - lrs[step - 1]), 1e-6 * max(abs(lrs[step - 1]), 1e-12),
                            f"learning-rate at step {step}")
        self.assertEqual(set(by_tag["batch-size"].values()), {2.0})
        self.assertEqual(set(by_tag["loss-scale"].values()), {1.0})


# ------------------------------------------------------------------------------------------------
# 5. bad input
# ------------------------------------------------------------------------------------------------

class TestBenchGemm(CliTestCase):
    def test_shapes_and_transposes(self):
        # One line per (dtype, shape) in the order given, then the best rate per dtype.
        proc = megatron("bench", "gemm", "--shapes", "64x32x16:TN", "48x40x24", "--dtypes", "f32",
                        "--seconds", "0.01", "--num-threads", "1")
        self.assertOk(proc, "bench gemm --shapes")
        rates = re.findall(r"^gemm f32\s+(\S+)\s+threads=1:\s+([0-9.]+) GFLOP/s$", proc.stdout,
                           re.M)
        self.assertEqual([r[0] for r in rates], ["64x32x16:TN", "48x40x24:NT"], proc.stdout)
        self.assertTrue(all(float(r[1]) > 0 for r in rates), proc.stdout)
        peak = re.search(r"^gemm f32\s+peak: ([0-9.]+) GFLOP/s$", proc.stdout, re.M)
        self.assertEqual(float(peak.group(1)), max(float(r[1]) for r in rates))
        self.assertNotIn("bf16", proc.stdout)


class TestBadInput(CliTestCase):
    BASE = ["--mock-data", *TINY, "--vocab-size", "128", "--train-iters", "2", "--lr", "1e-3",
            "--num-threads", "1"]

    def test_unknown_flag(self):
        self.assertUsageError(megatron("train", *self.BASE, "--no-such-flag"), "--no-such-flag")

    def test_heads_do_not_divide_hidden(self):
        proc = megatron("train", "--mock-data", "--num-layers", "2", "--hidden-size", "100",
                        "--num-attention-heads", "3", "--seq-length", "32", "--vocab-size", "128",
                        "--train-iters", "2", "--lr", "1e-3", "--num-threads", "1")
        self.assertUsageError(proc, "--hidden-size", "--num-attention-heads")

    def test_seq_length_beyond_positions(self):
        proc = megatron("train", "--mock-data", "--num-layers", "2", "--hidden-size", "64",
                        "--num-attention-heads", "4", "--seq-length", "128",
                        "--max-position-embeddings", "64", "--vocab-size", "128",
                        "--train-iters", "2", "--lr", "1e-3", "--num-threads", "1")
        self.assertUsageError(proc, "--seq-length", "--max-position-embeddings")

    def test_global_batch_not_divisible(self):
        proc = megatron("train", *self.BASE, "--global-batch-size", "7")
        self.assertUsageError(proc, "--global-batch-size", "--micro-batch-size")

    def test_missing_lr(self):
        args = list(self.BASE)
        del args[args.index("--lr"):args.index("--lr") + 2]
        self.assertUsageError(megatron("train", *args), "--lr")

    def test_fp16_and_bf16(self):
        self.assertUsageError(megatron("train", *self.BASE, "--fp16", "--bf16"), "--fp16", "--bf16")

    def test_verify_and_no_verify_integrity(self):
        proc = megatron("train", *self.BASE, "--verify-integrity", "--no-verify-integrity")
        self.assertUsageError(proc, "--verify-integrity", "--no-verify-integrity")

    def test_multi_latent_attention_and_prediction_refusals(self):
        rope = ["--position-embedding-type", "rope"]
        mla = [*rope, "--multi-latent-attention", "--kv-lora-rank", "8", "--qk-head-dim", "8",
               "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8"]
        self.assertUsageError(megatron("train", *self.BASE, *rope, "--rope-type", "yarn"),
                              "--rope-type yarn", "--multi-latent-attention")
        self.assertUsageError(megatron("train", *self.BASE, *mla, "--rope-type", "ntk"),
                              "--rope-type", "rope or yarn")
        self.assertUsageError(megatron("train", *self.BASE, *mla, "--group-query-attention",
                                       "--num-query-groups", "2"), "--num-query-groups")
        self.assertUsageError(megatron("train", *self.BASE, *mla, "--rotary-interleaved"),
                              "--rotary-interleaved")
        self.assertUsageError(megatron("train", *self.BASE, *mla, "--qk-pos-emb-head-dim", "3"),
                              "--qk-pos-emb-head-dim")
        self.assertUsageError(megatron("train", *self.BASE, *mla, "--cache-mla-latents"),
                              "--cache-mla-latents")
        self.assertUsageError(megatron("train", *self.BASE, *mla, "--model", "bert"),
                              "--multi-latent-attention", "--model gpt")
        self.assertUsageError(megatron("train", *self.BASE, "--mtp-num-layers", "1"),
                              "--mtp-num-layers", "--position-embedding-type")

    def test_two_warmups(self):
        proc = megatron("train", *self.BASE, "--lr-warmup-fraction", "0.1",
                        "--lr-warmup-iters", "5")
        self.assertUsageError(proc, "--lr-warmup-fraction", "--lr-warmup-iters")

    def test_device_unknown(self):
        self.assertUsageError(megatron("train", *self.BASE, "--device", "gpu"), "--device", "gpu")

    def test_device_cuda_without_a_gpu(self):
        # Where a GPU is visible the run trains on it; elsewhere the flag is refused, naming why
        # (a build without the CUDA device, or the CUDA runtime's reason) and the fix.
        smi = shutil.which("nvidia-smi")
        if smi and subprocess.run([smi], capture_output=True).returncode == 0:
            self.skipTest("a GPU is visible")
        proc = megatron("train", *self.BASE, "--device", "cuda")
        self.assertUsageError(proc, "--device cuda", "--device cpu")

    def test_bench_gemm_bad_shape(self):
        for bad in ("64x32", "64x32x0", "64x32x16:NX", "64x32x16:", "axbxc"):
            proc = megatron("bench", "gemm", "--shapes", bad, "--seconds", "0.01")
            self.assertUsageError(proc, "--shapes", bad)
        proc = megatron("bench", "gemm", "--shapes", "64x32x16", "--sizes", "128")
        self.assertUsageError(proc, "--shapes", "--sizes")

    def test_unknown_command(self):
        proc = megatron("nosuchcommand")
        self.assertUsageError(proc, "nosuchcommand")

    def test_no_command(self):
        proc = megatron()
        self.assertEqual(proc.returncode, 2)
        self.assertIn("usage: megatron", proc.stderr)

    def test_flag_value_not_a_number(self):
        args = list(self.BASE)
        args[args.index("--num-layers") + 1] = "abc"
        self.assertUsageError(megatron("train", *args), "--num-layers", "abc")

    def test_help(self):
        proc = megatron("train", "--help")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("--num-layers", proc.stdout)
        self.assertIn("--pretrained-checkpoint", proc.stdout)
        for cmd in ("score", "convert"):
            sub = megatron(cmd, "--help")
            self.assertEqual(sub.returncode, 0, f"{cmd} --help: {sub.stderr}")
            self.assertIn("--pretrained-checkpoint", sub.stdout)
        top = megatron("--help")
        self.assertEqual(top.returncode, 0)
        self.assertIn("train", top.stdout)

    def test_unknown_model_is_refused_listing_the_known_ones(self):
        self.assertUsageError(megatron("train", *self.BASE, "--model", "retro"),
                              "--model: unknown model 'retro'", "choose one of gpt")

    def test_version_names_what_decides_the_arithmetic(self):
        proc = megatron("--version")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertRegex(proc.stdout, r"^megatron-cpp: compiled for x86-64\S* with \S+ [0-9.]+; "
                                      r"oneDNN [0-9.]+ kernels \w+; L1d \d+ KiB, L2 \d+ KiB\n$")

    # An architecture that --save-hf cannot export (here GPT-2 style with RMSNorm) must be refused
    # before the first iteration, not after the whole run.
    def test_unexportable_model_rejected_before_training(self):
        out = os.path.join(self.tmp, "out")
        proc = megatron("train", *self.BASE, "--normalization", "RMSNorm", "--save-hf", out)
        self.assertUsageError(proc, "Hugging Face")
        self.assertEqual(iteration_lines(proc.stdout), [],
                         "--save-hf was validated only after training")


class TestBadCheckpoint(CliTestCase):
    """--pretrained-checkpoint pointing at broken Hugging Face directories."""

    def train_from(self, model_dir, *extra):
        return megatron("train", "--mock-data", "--pretrained-checkpoint", model_dir,
                        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2",
                        "--lr", "1e-4", "--num-threads", "1", *extra)

    def copy_oracle(self, arch="gpt2"):
        dst = os.path.join(self.tmp, arch)
        shutil.copytree(os.path.join(ORACLE, arch, "model"), dst)
        return dst

    def test_missing_directory(self):
        missing = os.path.join(self.tmp, "does-not-exist")
        self.assertUsageError(self.train_from(missing), "--pretrained-checkpoint", missing)

    def test_no_config(self):
        d = os.path.join(self.tmp, "empty")
        os.makedirs(d)
        self.assertUsageError(self.train_from(d), "config.json")

    def test_malformed_config(self):
        d = self.copy_oracle()
        path = os.path.join(d, "config.json")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:len(text) // 2])
        self.assertUsageError(self.train_from(d), "config.json")

    def test_unknown_model_type(self):
        d = self.copy_oracle()
        path = os.path.join(d, "config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        cfg["model_type"] = "bert"
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        self.assertUsageError(self.train_from(d), "config.json", "bert")

    def test_truncated_weights(self):
        d = self.copy_oracle()
        path = os.path.join(d, "model.safetensors")
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 1)
        self.assertUsageError(self.train_from(d), "model.safetensors")

    def test_missing_tensor(self):
        d = self.copy_oracle()
        path = os.path.join(d, "model.safetensors")
        tensors = read_safetensors(path)
        meta = tensors.pop(None)
        del tensors["h.1.mlp.c_fc.bias"]
        write_safetensors(path, tensors, meta)
        self.assertUsageError(self.train_from(d), "h.1.mlp.c_fc.bias")
        # score and convert read the same way.
        tokens = os.path.join(self.tmp, "tokens.txt")
        write_token_file(tokens, [[1, 2, 3]])
        self.assertUsageError(score(d, tokens), "h.1.mlp.c_fc.bias")
        self.assertUsageError(megatron("convert", "--pretrained-checkpoint", d, "--save-hf",
                                       os.path.join(self.tmp, "out")), "h.1.mlp.c_fc.bias")

    def test_wrong_shape(self):
        d = self.copy_oracle()
        path = os.path.join(d, "model.safetensors")
        tensors = read_safetensors(path)
        meta = tensors.pop(None)
        dtype, shape, data = tensors["h.0.mlp.c_fc.weight"]
        self.assertEqual(shape, [64, 256])
        # Same bytes, Linear orientation instead of Conv1D's: a plausible exporter mistake.
        tensors["h.0.mlp.c_fc.weight"] = (dtype, [256, 64], data)
        write_safetensors(path, tensors, meta)
        self.assertUsageError(self.train_from(d), "h.0.mlp.c_fc.weight")

    def test_flag_contradicts_config(self):
        model = os.path.join(ORACLE, "gpt2", "model")
        self.assertUsageError(self.train_from(model, "--num-layers", "4"),
                              "--num-layers", "config.json")

    def test_flag_agreeing_with_config_is_fine(self):
        model = os.path.join(ORACLE, "gpt2", "model")
        self.assertOk(self.train_from(model, "--num-layers", "2", "--hidden-size", "64"))


# ------------------------------------------------------------------------------------------------
# 6. score matches PyTorch
# ------------------------------------------------------------------------------------------------

class TestScore(CliTestCase):
    def check_arch(self, arch):
        tokens, ref = reference_logprobs(arch)
        path = os.path.join(self.tmp, "tokens.txt")
        write_token_file(path, tokens)
        proc = score(os.path.join(ORACLE, arch, "model"), path)
        self.assertOk(proc, f"score {arch}")
        outs = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        self.assertEqual(len(outs), tokens.shape[0])
        for b, (out, want) in enumerate(zip(outs, ref)):
            got = np.array(out["logprobs"], dtype=np.float64)
            self.assertEqual(got.shape, want.shape, f"{arch} line {b + 1}")
            err = np.abs(got - want).max()
            self.assertLess(err, 1e-4, f"{arch} line {b + 1}: max |logprob error| {err}")
            want_loss = -want.mean()
            self.assertLess(abs(out["loss"] - want_loss), 1e-5 * abs(want_loss),
                            f"{arch} line {b + 1}: loss {out['loss']} vs {want_loss}")

    def test_gpt2_matches_pytorch(self):
        self.check_arch("gpt2")

    def test_llama_matches_pytorch(self):
        self.check_arch("llama")

    def test_token_outside_vocab(self):
        path = os.path.join(self.tmp, "bad.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("1 2 3\n4 1000 5\n")
        proc = score(os.path.join(ORACLE, "gpt2", "model"), path)
        self.assertUsageError(proc, f"{path}:2", "1000")

    def test_non_integer_token(self):
        path = os.path.join(self.tmp, "bad.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("1 2 3\n4 5\n6 7x 8\n")
        proc = score(os.path.join(ORACLE, "gpt2", "model"), path)
        self.assertUsageError(proc, f"{path}:3", "7x")

    # An id too large for int64 is reported as written, not as the clamped 9223372036854775807.
    def test_token_id_overflowing_int64(self):
        path = os.path.join(self.tmp, "bad.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("1 99999999999999999999999\n")
        proc = score(os.path.join(ORACLE, "gpt2", "model"), path)
        self.assertUsageError(proc, f"{path}:1", "99999999999999999999999")

    def test_sequence_longer_than_learned_positions(self):
        path = os.path.join(self.tmp, "long.txt")
        write_token_file(path, [list(range(70))])  # 69 inputs; the gpt2 oracle has 64 positions
        proc = score(os.path.join(ORACLE, "gpt2", "model"), path)
        self.assertUsageError(proc, f"{path}:1", "64")

    def test_missing_input_file(self):
        path = os.path.join(self.tmp, "absent.txt")
        proc = score(os.path.join(ORACLE, "gpt2", "model"), path)
        self.assertUsageError(proc, "--input", path)

    def test_single_token_line(self):
        path = os.path.join(self.tmp, "one.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("42\n1 2\n")
        proc = score(os.path.join(ORACLE, "gpt2", "model"), path)
        self.assertOk(proc)
        outs = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        self.assertEqual(len(outs), 2)
        self.assertIsNone(outs[0]["loss"])
        self.assertEqual(outs[0]["logprobs"], [])
        self.assertEqual(len(outs[1]["logprobs"]), 1)
        self.assertAlmostEqual(outs[1]["loss"], -outs[1]["logprobs"][0], places=9)

    def test_missing_pretrained_checkpoint(self):
        path = os.path.join(self.tmp, "t.txt")
        write_token_file(path, [[1, 2]])
        proc = megatron("score", "--input", path, "--num-threads", "1")
        self.assertUsageError(proc, "--pretrained-checkpoint")


# ------------------------------------------------------------------------------------------------
# 7. convert round trip
# ------------------------------------------------------------------------------------------------

class TestConvert(CliTestCase):
    def convert(self, arch, out, *extra):
        return megatron("convert", "--pretrained-checkpoint", os.path.join(ORACLE, arch, "model"),
                        "--save-hf", out, *extra)

    def test_round_trip_is_exact(self):
        for arch in ("gpt2", "llama"):
            with self.subTest(arch=arch):
                out = os.path.join(self.tmp, arch)
                self.assertOk(self.convert(arch, out), f"convert {arch}")
                src = read_safetensors(os.path.join(ORACLE, arch, "model", "model.safetensors"))
                dst = read_safetensors(os.path.join(out, "model.safetensors"))
                src.pop(None)
                dst.pop(None)
                self.assertEqual(sorted(src), sorted(dst), "tensor names")
                for name in src:
                    self.assertEqual(src[name][0], dst[name][0], f"{name}: dtype")
                    self.assertEqual(src[name][1], dst[name][1], f"{name}: shape")
                    self.assertTrue(src[name][2] == dst[name][2], f"{name}: bytes differ")
                with open(os.path.join(ORACLE, arch, "model", "config.json"), encoding="utf-8") as f:
                    src_cfg = json.load(f)
                with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
                    dst_cfg = json.load(f)
                for k, v in src_cfg.items():
                    self.assertEqual(dst_cfg.get(k), v, f"config.json: {k}")

    def test_bfloat16(self):
        out = os.path.join(self.tmp, "bf16")
        self.assertOk(self.convert("gpt2", out, "--dtype", "bfloat16"))
        src = read_safetensors(os.path.join(ORACLE, "gpt2", "model", "model.safetensors"))
        dst = read_safetensors(os.path.join(out, "model.safetensors"))
        src.pop(None)
        dst.pop(None)
        self.assertEqual(sorted(src), sorted(dst))
        for name, entry in src.items():
            dtype, shape, data = dst[name]
            self.assertEqual(dtype, "BF16", name)
            self.assertEqual(shape, entry[1], name)
            want = bf16_round_bits(as_array(entry))
            got = np.frombuffer(data, dtype="<u2").reshape(shape)
            self.assertTrue(np.array_equal(got, want),
                            f"{name}: {int((got != want).sum())} values not rounded to nearest even")
        with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")

        # The bf16 model scores close to the f32 one.
        tokens = oracle_tokens("gpt2")
        path = os.path.join(self.tmp, "tokens.txt")
        write_token_file(path, tokens)
        f32 = score(os.path.join(ORACLE, "gpt2", "model"), path)
        bf16 = score(out, path)
        self.assertOk(f32)
        self.assertOk(bf16)
        lf = [json.loads(x)["loss"] for x in f32.stdout.splitlines() if x.strip()]
        lb = [json.loads(x)["loss"] for x in bf16.stdout.splitlines() if x.strip()]
        self.assertEqual(len(lf), tokens.shape[0])
        self.assertEqual(len(lb), len(lf))
        for a, b in zip(lf, lb):
            self.assertLess(abs(a - b), 2e-2, f"bf16 loss {b} vs f32 loss {a}")
        self.assertNotEqual(lf, lb, "bf16 weights scored exactly like f32: not re-encoded?")

    def test_unknown_dtype(self):
        proc = self.convert("gpt2", os.path.join(self.tmp, "x"), "--dtype", "int8")
        self.assertUsageError(proc, "--dtype", "int8")


# ------------------------------------------------------------------------------------------------
# 8. train from a pretrained model, export, score
# ------------------------------------------------------------------------------------------------

class TestFinetuneAndExport(CliTestCase):
    def test_llama_finetune_export_score(self):
        src = os.path.join(ORACLE, "llama", "model")
        out = os.path.join(self.tmp, "finetuned")
        lr = 1e-4
        proc = megatron("train", "--pretrained-checkpoint", src, "--mock-data", "--seq-length",
                        "16", "--micro-batch-size", "2", "--train-iters", "3", "--lr", lr,
                        "--log-interval", "1", "--num-threads", "1", "--save-hf", out)
        self.assertOk(proc, "train from pretrained")
        # The vocabulary comes from config.json (1000), padded to a multiple of 128.
        self.assertIn(" > padded vocab (size: 1000) with 24 dummy tokens (new size: 1024)",
                      proc.stdout.splitlines())
        self.assertIn("loaded pretrained weights", proc.stdout)
        losses = [float(x) for x in losses_of(proc.stdout)]
        self.assertEqual(len(losses), 3)
        # The oracle's weights are near-random: the first loss is about ln(1000).
        self.assertAlmostEqual(losses[0], math.log(1000), delta=0.5)

        with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
            src_cfg = json.load(f)
        with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
            out_cfg = json.load(f)
        for k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                  "num_key_value_heads", "intermediate_size", "vocab_size",
                  "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings"):
            self.assertEqual(out_cfg.get(k), src_cfg[k], f"exported config.json: {k}")

        a = read_safetensors(os.path.join(src, "model.safetensors"))
        b = read_safetensors(os.path.join(out, "model.safetensors"))
        a.pop(None)
        b.pop(None)
        self.assertEqual(sorted(a), sorted(b))
        max_diff = 0.0
        for name in a:
            self.assertEqual(a[name][1], b[name][1], name)
            max_diff = max(max_diff, float(np.abs(as_array(a[name]) - as_array(b[name])).max()))
        # Three AdamW steps move each weight by about lr per step, no more.
        self.assertGreater(max_diff, 0.0, "training did not change the exported weights")
        self.assertLess(max_diff, 10 * 3 * lr, "exported weights moved more than 3 steps allow")

        tokens = oracle_tokens("llama")
        path = os.path.join(self.tmp, "tokens.txt")
        write_token_file(path, tokens)
        before, after = score(src, path), score(out, path)
        self.assertOk(before)
        self.assertOk(after, "score the exported model")
        lb = [json.loads(x)["loss"] for x in before.stdout.splitlines() if x.strip()]
        la = [json.loads(x)["loss"] for x in after.stdout.splitlines() if x.strip()]
        self.assertEqual(len(la), tokens.shape[0])
        for x, y in zip(lb, la):
            self.assertTrue(math.isfinite(y))
            self.assertLess(abs(x - y), 0.1, f"finetuned loss {y} far from the original {x}")


def main():
    global MEGATRON, ORACLE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument("--megatron", required=True, help="the megatron binary")
    parser.add_argument("--oracle-dir", required=True,
                        help="directory with gpt2/ and llama/ written by hf_oracle.py")
    args, rest = parser.parse_known_args()
    MEGATRON = os.path.abspath(args.megatron)
    ORACLE = os.path.abspath(args.oracle_dir)
    for needed in (MEGATRON, *(os.path.join(ORACLE, a, f) for a in ("gpt2", "llama")
                               for f in ("model/config.json", "model/model.safetensors",
                                         "expected.safetensors"))):
        if not os.path.exists(needed):
            print(f"test_cli.py: error: {needed} does not exist", file=sys.stderr)
            return 2
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
