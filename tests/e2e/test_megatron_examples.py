#!/usr/bin/env python3
"""Megatron-LM's own example launch scripts, scaled down, run through `megatron pretrain_gpt`.

What it is: the flag sets of examples/gpt3/train_gpt3_175b_distributed.sh and
examples/llama/train_llama3_8b_h100_fp8.sh and examples/mixtral/train_mixtral_8x7b_distributed.sh of
Megatron-LM core_r0.14.0, written out here flag
for flag in the scripts' order, with only the sizes scaled down (layers, hidden size, heads,
sequence, batch, iterations, vocabulary) and the paths pointed at a temporary directory, run on 4
ranks under mpiexec as `megatron pretrain_gpt ARGS`:
- GPT-3 175B: fp16, --rampup-batch-size with --train-iters (which Megatron r0.14's own
  validate_args asserts against; we run it), --lr-warmup-fraction, tensor x pipeline parallel
  2 x 2, --save and --load the same directory, TensorBoard. Its data arguments name GPT-2 BPE
  files, which a fresh clone does not have (they are fetched by scripts/fetch_data.sh), so the
  data is a NullTokenizer dataset the test preprocesses: --tokenizer-type NullTokenizer
  --vocab-size replace --vocab-file/--merge-file. The script run again after an exit at the
  middle of the ramp-up (--exit-interval, as a requeued job) resumes from its checkpoint and
  prints the uninterrupted run's iteration lines from there on, digit for digit.
- Llama 3 8B, its bf16 branch (DTYPE other than fp8; FP8 comes with the CUDA device) with its
  MOCK data branch: sample-based schedule, --decoupled-lr, --apply-layernorm-1p,
  --calculate-per-token-loss, --use-distributed-optimizer --overlap-grad-reduce
  --overlap-param-gather, --grad-reduce-in-bf16, GQA with --kv-channels, and the GPU-only
  switches (--attention-backend fused, --cross-entropy-loss-fusion, --manual-gc,
  --empty-unused-memory-level, --profile, --no-mmap-bin-files, ...), each of which prints its
  start-up line; --tiktoken-pattern v2, read only by the TikTokenizer, is taken and unused with
  the mock data's NullTokenizer, as in Megatron. TP 2 x CP 2 with --sequence-parallel.
Each must train (exit 0) and its loss fall: the last logged loss below the first by the margin
stated in the test.
- Mixtral 8x7B: 8 experts, top-2, aux loss, --moe-grouped-gemm, the alltoall dispatcher, with
  --overlap-param-gather --overlap-grad-reduce, bf16, pipeline x expert parallel 2 x 2 with the
  distributed optimizer (and its --sequence-parallel at TP 1, switched off with a warning). It must
  train, its loss fall, and its load_balancing_loss stay near 1 (balanced routing).
- Mamba (examples/mamba/train.sh) as `megatron pretrain_mamba`: a hybrid of Mamba-2, attention
  and MLP layers from --hybrid-attention-ratio 0.08 --hybrid-mlp-ratio 0.5, its --spec, GQA
  attention without positions, bf16, TP 2 with --sequence-parallel x DP 2 with the distributed
  optimizer and both overlaps; the Mamba sizes (defaults 128 / 64 / 8 in the script) scaled down
  with the flags. It must train and its loss fall. Megatron core 0.19's version of the script
  (`megatron pretrain_hybrid`, --hybrid-layer-pattern without --num-layers, the
  megatron.core.models.hybrid spec) likewise.

Usage: test_megatron_examples.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 600
VOCAB = 512


def run(ranks, args, timeout=TIMEOUT_S, entry="pretrain_gpt"):
    cmd = [MEGATRON, entry, *megatron_job.with_given_peak(entry, args)]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **megatron_job.MPI_ENV), check=False)


def counting_dataset(tmp):
    """A NullTokenizer dataset: documents counting up in steps of 3 (learnable in a few dozen
    iterations), preprocessed with EOD appended."""
    rng = random.Random(5)
    jsonl = os.path.join(tmp, "docs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for _ in range(2000):
            start, n = rng.randrange(1, VOCAB - 2), rng.randrange(20, 200)
            f.write(json.dumps({"text": " ".join(str(1 + (start + 3 * i) % (VOCAB - 2))
                                                 for i in range(n))}) + "\n")
    prefix = os.path.join(tmp, "docs")
    proc = subprocess.run([MEGATRON, "preprocess", "--input", jsonl, "--output-prefix", prefix,
                           "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
                           "--append-eod", "--workers", "1"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"megatron preprocess failed:\n{proc.stderr[-3000:]}")
    return prefix + "_text_document"


def gpt3_args(tmp, data, checkpoint):
    """examples/gpt3/train_gpt3_175b_distributed.sh, its arrays in order, sizes scaled down."""
    gpt_model_args = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                      "--seq-length", "64", "--max-position-embeddings", "64",
                      "--attention-backend", "auto"]
    # 1536 -> 16 sequences, ramp-up 16 16 5859375 -> 4 4 240 samples, 500000 -> 60 iterations,
    # decay 430000 -> 50; lr 6e-5 -> 3e-3 and min-lr 6e-6 -> 3e-4 (a tiny model on 60 steps).
    training_args = ["--micro-batch-size", "1", "--global-batch-size", "16",
                     "--rampup-batch-size", "4", "4", "240", "--train-iters", "60",
                     "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
                     "--init-method-std", "0.006", "--clip-grad", "1.0", "--fp16",
                     "--lr", "3.0e-3", "--lr-decay-style", "cosine", "--min-lr", "3.0e-4",
                     "--lr-warmup-fraction", ".001", "--lr-decay-iters", "50"]
    model_parallel_args = ["--tensor-model-parallel-size", "2",
                           "--pipeline-model-parallel-size", "2"]
    data_args = ["--data-path", data, "--tokenizer-type", "NullTokenizer", "--vocab-size",
                 str(VOCAB), "--split", "949,50,1", "--data-cache-path",
                 os.path.join(tmp, "cache")]
    eval_and_logging_args = ["--log-interval", "1", "--save-interval", "20",
                             "--eval-interval", "20", "--save", checkpoint, "--load", checkpoint,
                             "--eval-iters", "2", "--tensorboard-dir", os.path.join(tmp, "tb")]
    return (gpt_model_args + training_args + model_parallel_args + data_args +
            eval_and_logging_args + ["--num-threads", "1"])


def llama3_args(tmp, checkpoint):
    """examples/llama/train_llama3_8b_h100_fp8.sh (bf16, MOCK data), in order, scaled down."""
    model_args = ["--use-mcore-models", "--num-layers", "4", "--hidden-size", "64",
                  "--ffn-hidden-size", "224", "--num-attention-heads", "4",
                  "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "32",
                  "--seq-length", "64", "--max-position-embeddings", "64",
                  "--position-embedding-type", "rope", "--rotary-base", "1000000",
                  "--rotary-percent", "1.0", "--attention-dropout", "0.0",
                  "--hidden-dropout", "0.0", "--swiglu", "--init-method-std", "0.0134",
                  "--attention-backend", "fused", "--apply-layernorm-1p",
                  "--untie-embeddings-and-output-weights", "--disable-bias-linear"]
    # 128 sequences -> 8; 1953125000 samples -> 400 (50 iterations); lr x 10 for a tiny model.
    training_args = ["--micro-batch-size", "1", "--global-batch-size", "8",
                     "--train-samples", "400", "--lr-decay-samples", "396",
                     "--lr-warmup-samples", "16", "--lr", "0.0015", "--min-lr", "0.0001",
                     "--decoupled-lr", "5.0e-3", "--decoupled-min-lr", "4.5e-4",
                     "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1",
                     "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16",
                     "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
                     "--calculate-per-token-loss", "--manual-gc", "--empty-unused-memory-level",
                     "1", "--exit-duration-in-mins", "235",
                     "--use-distributed-optimizer", "--overlap-grad-reduce",
                     "--overlap-param-gather"]
    model_parallel_args = ["--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                           "--sequence-parallel"]
    # Vocabulary 128256 -> 4096.
    data_args = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096",
                 "--data-cache-path", os.path.join(tmp, "cache"), "--tiktoken-pattern", "v2",
                 "--split", "99,1,0", "--no-create-attention-mask-in-dataloader",
                 "--no-mmap-bin-files", "--num-workers", "1"]
    eval_and_logging_args = ["--log-interval", "1", "--eval-iters", "2", "--eval-interval", "25",
                             "--save-interval", "1000", "--log-throughput", "--profile",
                             "--profile-step-start", "4", "--profile-step-end", "6",
                             "--ckpt-format", "torch_dist", "--distributed-timeout-minutes", "60",
                             "--save", checkpoint, "--load", checkpoint,
                             "--tensorboard-dir", os.path.join(tmp, "tb")]
    return (model_args + training_args + model_parallel_args + data_args +
            eval_and_logging_args + ["--num-threads", "1"])


def mixtral_args(tmp, data, checkpoint):
    """examples/mixtral/train_mixtral_8x7b_distributed.sh, its arrays in order, sizes scaled down:
    32 layers -> 4, hidden 4096 -> 64, 32 heads in 8 groups -> 4 in 2, ffn 14336 -> 224, 8
    experts kept; TP 1 x PP 4 x EP 8 on 64 GPUs -> PP 2 x EP 2 on 4 ranks."""
    model_args = ["--use-mcore-models", "--disable-bias-linear", "--seq-length", "64",
                  "--max-position-embeddings", "64", "--num-layers", "4", "--hidden-size", "64",
                  "--ffn-hidden-size", "224", "--num-attention-heads", "4",
                  "--init-method-std", "0.01", "--attention-dropout", "0.0",
                  "--hidden-dropout", "0.0", "--normalization", "RMSNorm",
                  "--position-embedding-type", "rope", "--swiglu",
                  "--untie-embeddings-and-output-weights", "--group-query-attention",
                  "--num-query-groups", "2", "--no-masked-softmax-fusion",
                  "--no-position-embedding", "--rotary-base", "1000000"]
    moe_args = ["--num-experts", "8", "--moe-router-topk", "2",
                "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2",
                "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall",
                "--overlap-param-gather", "--overlap-grad-reduce"]
    # The Llama 2 tokenizer -> NullTokenizer over the counting dataset (see gpt3_args).
    data_args = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
                 "--data-path", data, "--split", "99990,8,2",
                 "--data-cache-path", os.path.join(tmp, "cache")]
    # 256 sequences -> 8, 500000 iterations -> 40, lr 1e-4 -> 3e-3 (a tiny model on 40 steps).
    training_args = ["--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "3e-3",
                     "--train-iters", "40", "--lr-decay-iters", "32", "--lr-decay-style",
                     "cosine", "--min-lr", "3.0e-4", "--weight-decay", "0.1",
                     "--lr-warmup-iters", "4", "--clip-grad", "1.0", "--bf16"]
    model_parallel_args = ["--tensor-model-parallel-size", "1",
                           "--pipeline-model-parallel-size", "2",
                           "--expert-model-parallel-size", "2", "--use-distributed-optimizer",
                           "--sequence-parallel"]
    logging_args = ["--log-interval", "1", "--save-interval", "10000", "--eval-interval", "1000",
                    "--eval-iters", "2", "--save", checkpoint, "--load", checkpoint,
                    "--tensorboard-dir", os.path.join(checkpoint, "tensorboard"),
                    "--no-load-optim", "--no-load-rng"]
    return (model_args + moe_args + data_args + training_args + model_parallel_args +
            logging_args + ["--num-threads", "1"])


def mamba_args(tmp, data, checkpoint):
    """examples/mamba/train.sh's options, in order, sizes scaled down: 56 layers -> 8, hidden
    4096 -> 64, 32 heads in 8 groups -> 4 in 2, sequence 4096 -> 64, global batch 512 -> 8;
    the Mamba state, head size and groups (the script leaves Megatron's defaults 128, 64, 8) ->
    16, 16, 2. TP 8 on 8 GPUs -> TP 2 x DP 2."""
    options = ["--tensor-model-parallel-size", "2", "--sequence-parallel",
               "--pipeline-model-parallel-size", "1", "--use-distributed-optimizer",
               "--overlap-param-gather", "--overlap-grad-reduce",
               "--untie-embeddings-and-output-weights", "--init-method-std", "0.02",
               "--position-embedding-type", "none", "--num-layers", "8", "--hidden-size", "64",
               "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
               "--hybrid-attention-ratio", "0.08", "--hybrid-mlp-ratio", "0.5",
               "--seq-length", "64", "--max-position-embeddings", "64",
               "--train-samples", "400", "--lr-warmup-samples", "16", "--lr-decay-samples", "396",
               "--save", checkpoint, "--load", checkpoint, "--data-path", data,
               "--data-cache-path", os.path.join(tmp, "cache"), "--split", "99,1,0",
               "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
               "--distributed-backend", "nccl", "--micro-batch-size", "1",
               "--global-batch-size", "8", "--lr", "2.5e-3", "--min-lr", "2.5e-4",
               "--lr-decay-style", "cosine", "--weight-decay", "0.1", "--clip-grad", "1.0",
               "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--disable-bias-linear",
               "--normalization", "RMSNorm", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
               "--log-interval", "1", "--save-interval", "2000", "--eval-interval", "2000",
               "--eval-iters", "2", "--bf16", "--use-mcore-models",
               "--spec", "megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec",
               "--no-create-attention-mask-in-dataloader",
               "--tensorboard-dir", os.path.join(tmp, "tb")]
    return options + ["--mamba-state-dim", "16", "--mamba-head-dim", "16",
                      "--mamba-num-groups", "2", "--num-threads", "1"]


def hybrid_args(tmp, data, checkpoint):
    """Megatron core 0.19's examples/mamba/train.sh (run by pretrain_hybrid.py): mamba_args with
    the pattern given instead of the ratios and --num-layers (its 800M pattern's first 8 layers,
    an attention layer among them) and core 0.19's hybrid stack --spec."""
    dropped = {"--num-layers", "--hybrid-attention-ratio", "--hybrid-mlp-ratio", "--spec"}
    old = mamba_args(tmp, data, checkpoint)
    options, i = [], 0
    while i < len(old):
        if old[i] in dropped:
            i += 3 if old[i] == "--spec" else 2
            continue
        options.append(old[i])
        i += 1
    return options + ["--hybrid-layer-pattern", "M-M-M*-M", "--spec",
                      "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]


class MegatronExamplesTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="megatron_examples_")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def assertTrainsAndLearns(self, proc, iters, margin):
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        curve = megatron_log.loss_curve(proc.stdout, iters)
        # fp16 skips its first iterations while the dynamic loss scale comes down from 2^32:
        # they print no loss.
        losses = [curve[it][0] for it in sorted(curve) if curve[it][0] is not None]
        self.assertGreater(len(losses), iters // 2, "most iterations must have trained")
        first, last = losses[0], curve[iters][0]
        self.assertLess(last, first - margin, f"loss {first} -> {last}")
        return curve

    def test_gpt3_175b_script(self):
        data = counting_dataset(self.tmp)
        straight = run(4, gpt3_args(self.tmp, data, os.path.join(self.tmp, "straight")))
        # ln(512) = 6.24 at the start; the counting rule is learnable: at least 1.5 nats off.
        self.assertTrainsAndLearns(straight, 60, 1.5)
        sizes = [int(f["global batch size"])
                 for _, f in sorted(megatron_log.iteration_lines(straight.stdout).items())]
        self.assertEqual(sizes[0], 4)
        self.assertEqual(sizes[-1], 16)
        self.assertEqual(sorted(set(sizes)), [4, 8, 12, 16])
        # The same script, stopped in the middle of the ramp-up and launched again.
        requeued = os.path.join(self.tmp, "requeued")
        first = run(4, gpt3_args(self.tmp, data, requeued) + ["--exit-interval", "15"])
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        self.assertLess(sizes[14], 16, "iteration 15 must lie inside the ramp-up")
        again = run(4, gpt3_args(self.tmp, data, requeued))
        self.assertEqual(again.returncode, 0, again.stderr[-3000:])
        a = megatron_log.iteration_lines(straight.stdout)
        b = megatron_log.iteration_lines(again.stdout, range(16, 61))
        for it in b:
            for field in ("lm loss", "grad norm", "global batch size", "learning rate",
                          "loss scale", "consumed samples"):
                self.assertEqual(a[it].get(field), b[it].get(field), f"iteration {it} {field}")

    def test_llama3_8b_script(self):
        proc = run(4, llama3_args(self.tmp, os.path.join(self.tmp, "ckpt")))
        # ln(4096) = 8.3 at the start: the mock data's counting pattern takes 1.5 nats off in
        # 50 steps (1.85 measured).
        self.assertTrainsAndLearns(proc, 50, 1.5)
        lines = megatron_log.iteration_lines(proc.stdout)
        self.assertIn("decoupled learning rate", lines[1])
        for flag in ("--attention-backend fused", "--cross-entropy-loss-fusion", "--manual-gc",
                     "--empty-unused-memory-level 1", "--profile", "--no-mmap-bin-files",
                     "--use-mcore-models",
                     "--no-create-attention-mask-in-dataloader"):
            self.assertIn(f" > {flag}: ", proc.stdout, flag)
        self.assertIn("setting training iterations to 50", proc.stdout)

    def test_mixtral_8x7b_script(self):
        data = counting_dataset(self.tmp)
        proc = run(4, mixtral_args(self.tmp, data, os.path.join(self.tmp, "ckpt")))
        # ln(512) = 6.24 at the start; the counting rule takes at least 1 nat off in 40 steps.
        self.assertTrainsAndLearns(proc, 40, 1.0)
        lines = megatron_log.iteration_lines(proc.stdout)
        # Megatron's tracker: the aux loss / coeff, averaged over the layers, near 1 (balanced).
        balance = [float(f["load_balancing_loss"]) for f in lines.values()]
        self.assertTrue(all(0.9 < b < 2.0 for b in balance), balance)

    def test_mamba_script(self):
        data = counting_dataset(self.tmp)
        proc = run(4, mamba_args(self.tmp, data, os.path.join(self.tmp, "ckpt")),
                   entry="pretrain_mamba")
        # ln(512) = 6.24 at the start; the counting rule takes at least 1 nat off in 50 steps.
        self.assertTrainsAndLearns(proc, 50, 1.0)
        # Megatron's allocation of 8 layers at ratios 0.08 / 0.5.
        self.assertIn("Hybrid allocation (M is mamba, * is attention, - is mlp):\nM-M-*-M-\n", proc.stdout)

    def test_hybrid_script(self):
        # Megatron core 0.19's form of the same example: pretrain_hybrid.py, the pattern given.
        data = counting_dataset(self.tmp)
        proc = run(4, hybrid_args(self.tmp, data, os.path.join(self.tmp, "ckpt")),
                   entry="pretrain_hybrid")
        self.assertTrainsAndLearns(proc, 50, 1.0)
        self.assertRegex(proc.stdout, r"num_layers \.+ 8\n")

if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
