#!/usr/bin/env python3
"""The parallel-layout flags of `megatron train`: bad layouts are refused by name on every rank.

What it is: black-box runs of the binary, alone and under `mpiexec -n 2` / `-n 4`, with tensor-,
pipeline- and virtual-pipeline layouts that Megatron's validate_args (and TransformerConfig, and
the interleaved schedule) refuse: the world size not divisible by tp x pp, heads or query groups
not divisible by tp, layers not divisible by pp or by the virtual stages, uneven splits that do
not add up (Megatron's --decoder-first/last-pipeline-num-layers rules), both virtual-stage
flags at once, interleaving at pp 1, micro-batches not divisible by pp when interleaving, a global
batch not divisible by micro batch x dp. Each must exit 2 before training starts (no argument
dump), with a message naming the flag and the numbers, printed by every rank ("[rank N] ...":
the check is arithmetic on the flags, so each rank refuses on its own without communicating).
Also: --sequence-parallel at tp 1 is switched off with Megatron's warning, printed once, and the
run trains; the new flags appear in --help and in the argument dump.

What it is not: a test of tensor or pipeline training itself (valid tp/pp layouts are the
trainer's business and tested with it), or of the numbers a run produces.

Usage: test_parallel_args.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest options]
"""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)

MEGATRON = None  # set from --megatron
MPIEXEC = None  # set from --mpiexec
# A refused layout exits within a second; the generous limit only guards against a hang (a rank
# waiting in a collective for one that already left), which is itself the failure to catch.
TIMEOUT_S = 120
# A tiny model whose shape every layout below starts from: 4 layers, 4 heads (2 query groups with
# GQA), one sequence per micro-batch; the global batch defaults to micro batch x dp.
TINY = {"--mock-data": None, "--vocab-size": "128", "--num-layers": "4", "--hidden-size": "64",
        "--num-attention-heads": "4", "--seq-length": "32", "--micro-batch-size": "1",
        "--train-iters": "2", "--log-interval": "1", "--lr": "1e-3", "--eval-iters": "0",
        "--num-threads": "1"}
DUMP_BANNER = "------------------------ arguments"
CRASH_MARKERS = megatron_job.CRASH_MARKERS
SP_WARNING = "WARNING: Disabling sequence parallelism because tensor model parallelism is disabled"


def argv(**overrides):
    """TINY with flags replaced or added (megatron_job.flags_with)."""
    return megatron_job.flags_with(TINY, **overrides)


def run(ranks, args):
    return megatron_job.run_train(MEGATRON, MPIEXEC, ranks, args, TIMEOUT_S)


class TestParallelArgs(unittest.TestCase):
    def assertRefused(self, ranks, args, *needles):
        """Exit 2 before training, every needle in the message, the message from every rank."""
        proc = run(ranks, args)
        self.assertEqual(proc.returncode, 2, f"expected exit 2, got {proc.returncode}\n"
                                             f"stderr:\n{proc.stderr[-3000:]}")
        for n in needles:
            self.assertIn(n, proc.stderr, f"stderr does not name {n!r}:\n{proc.stderr}")
        for marker in CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr, f"crash marker {marker!r} in stderr")
        self.assertNotIn(DUMP_BANNER, proc.stdout, "refused after start-up, not in validation")
        lines = [ln for ln in proc.stderr.splitlines() if needles[0] in ln]
        if ranks == 1:
            self.assertEqual(len(lines), 1, proc.stderr)
            self.assertTrue(proc.stderr.startswith("error: "), proc.stderr)
            return lines[0]
        # Every rank refuses by itself: one "[rank N]" line each, all with the same text.
        got = sorted(int(m.group(1)) for ln in lines for m in [re.search(r"\[rank (\d+)\]", ln)]
                     if m)
        self.assertEqual(got, list(range(ranks)), f"one line per rank expected:\n{proc.stderr}")
        texts = {re.sub(r"\[rank \d+\] ", "", ln) for ln in lines}
        self.assertEqual(len(texts), 1, f"ranks disagree:\n{proc.stderr}")
        return lines[0]

    # ---- world size vs tp x pp ----

    def test_world_not_divisible_by_tp_times_pp(self):
        line = self.assertRefused(4, argv(tensor_model_parallel_size=3), "world size (4)",
                                  "--tensor-model-parallel-size (3)",
                                  "--pipeline-model-parallel-size (1)")
        self.assertIn("total_model_size (3)", line)
        self.assertRefused(4, argv(tensor_model_parallel_size=2, pipeline_model_parallel_size=4),
                           "world size (4)", "total_model_size (8)",
                           "--pipeline-model-parallel-size (4)")

    def test_single_process_with_tp2_names_the_world_size(self):
        self.assertRefused(1, argv(tensor_model_parallel_size=2), "world size (1)",
                           "--tensor-model-parallel-size (2)")

    def test_non_positive_sizes(self):
        self.assertRefused(2, argv(tensor_model_parallel_size=0),
                           "--tensor-model-parallel-size must be >= 1, got 0")
        self.assertRefused(2, argv(pipeline_model_parallel_size=-1),
                           "--pipeline-model-parallel-size must be >= 1, got -1")

    # ---- tensor parallel: heads and query groups ----

    def test_heads_not_divisible_by_tp(self):
        self.assertRefused(2, argv(tensor_model_parallel_size=2, num_attention_heads=3,
                                   hidden_size=48),
                           "num_attention_heads (3) must be a multiple of "
                           "tensor_model_parallel_size (2)", "--num-attention-heads")

    def test_query_groups_not_divisible_by_tp(self):
        self.assertRefused(4, argv(tensor_model_parallel_size=4, group_query_attention=True,
                                   num_query_groups=2),
                           "num_query_groups (2) must be a multiple of "
                           "tensor_model_parallel_size (4)", "--num-query-groups")

    # ---- pipeline parallel and virtual stages ----

    def test_layers_not_divisible_by_pp(self):
        self.assertRefused(2, argv(pipeline_model_parallel_size=2, num_layers=3),
                           "Number of layers should be divisible by the pipeline-model-parallel "
                           "size", "--num-layers (3)", "--pipeline-model-parallel-size (2)")

    def test_layers_per_stage_not_divisible_by_layers_per_virtual_stage(self):
        # 4 layers over pp 2: 2 per stage, which 3-layer chunks cannot cover.
        self.assertRefused(2, argv(pipeline_model_parallel_size=2,
                                   num_layers_per_virtual_pipeline_stage=3),
                           "number of layers per pipeline stage must be divisible by number of "
                           "layers per virtual pipeline stage",
                           "--num-layers-per-virtual-pipeline-stage (3)")

    def test_layers_not_divisible_by_pp_times_virtual_stages(self):
        self.assertRefused(2, argv(pipeline_model_parallel_size=2,
                                   num_virtual_stages_per_pipeline_rank=4),
                           "--num-virtual-stages-per-pipeline-rank (4)", "multiple of 8")

    def test_uneven_pipeline_splits(self):
        # Megatron's rules for --decoder-first/last-pipeline-num-layers and the account-for flags
        # (TransformerConfig), each naming the flags. TINY has 4 layers.
        self.assertRefused(4, argv(pipeline_model_parallel_size=4,
                                   decoder_first_pipeline_num_layers=2),
                           "number of layers at middle stage: 2 must be divisible by the middle "
                           "pipeline model parallel size 3")
        self.assertRefused(2, argv(pipeline_model_parallel_size=2,
                                   decoder_first_pipeline_num_layers=1,
                                   decoder_last_pipeline_num_layers=1),
                           "Mismatch: 2 middle layers remaining but 0 middle PP stages")
        self.assertRefused(2, argv(pipeline_model_parallel_size=2,
                                   decoder_first_pipeline_num_layers=1,
                                   num_virtual_stages_per_pipeline_rank=2),
                           "--decoder-first-pipeline-num-layers (1)",
                           "virtual pipeline parallel degree 2")
        self.assertRefused(2, argv(pipeline_model_parallel_size=2,
                                   decoder_first_pipeline_num_layers=2,
                                   num_layers_per_virtual_pipeline_stage=1),
                           "please use --num-virtual-stages-per-pipeline-rank")
        self.assertRefused(2, [*argv(pipeline_model_parallel_size=2),
                               "--account-for-embedding-in-pipeline-split"],
                           "Number of layers should be divisible by the pipeline-model-parallel "
                           "size", "plus the embedding (--account-for-embedding-in-pipeline-"
                           "split) = 5")
        self.assertRefused(2, [*argv(pipeline_model_parallel_size=2,
                                     decoder_first_pipeline_num_layers=2),
                               "--account-for-loss-in-pipeline-split"],
                           "cannot be set at the same time with "
                           "--account-for-embedding-in-pipeline-split")
        layout = ["--pipeline-model-parallel-layout", "Et|tt|tL"]
        self.assertRefused(2, [*argv(pipeline_model_parallel_size=2), *layout],
                           "The length of pipeline_model_parallel_layout must be divisible by "
                           "pipeline_model_parallel_size", "3 stages")
        self.assertRefused(3, [*argv(pipeline_model_parallel_size=3, num_layers=5), *layout],
                           "Number of decoder layers 4", "--num-layers 5")
        self.assertRefused(3, [*argv(pipeline_model_parallel_size=3,
                                     num_virtual_stages_per_pipeline_rank=1), *layout],
                           "No more than one of the following arguments")
        self.assertRefused(1, [*argv(), "--pipeline-model-parallel-layout", "Et|tm|tL"],
                           "multi-token prediction layers (m) are not implemented")

    def test_both_virtual_stage_flags(self):
        self.assertRefused(2, argv(pipeline_model_parallel_size=2,
                                   num_layers_per_virtual_pipeline_stage=1,
                                   num_virtual_stages_per_pipeline_rank=2),
                           "cannot be set at the same time",
                           "--num-layers-per-virtual-pipeline-stage (1)",
                           "--num-virtual-stages-per-pipeline-rank (2)")

    def test_interleaving_needs_pp_of_at_least_2(self):
        # World 2 at pp 1 is dp 2: there is no pipeline to interleave.
        self.assertRefused(2, argv(num_layers_per_virtual_pipeline_stage=2),
                           "pipeline-model-parallel size should be greater than 1",
                           "--num-layers-per-virtual-pipeline-stage")
        self.assertRefused(2, argv(num_virtual_stages_per_pipeline_rank=2),
                           "pipeline-model-parallel size should be greater than 1",
                           "--num-virtual-stages-per-pipeline-rank")

    def test_microbatches_not_divisible_by_pp_when_interleaving(self):
        # pp 2, dp 1, 2 chunks per rank; a global batch of 3 is 3 micro-batches.
        self.assertRefused(2, argv(pipeline_model_parallel_size=2,
                                   num_layers_per_virtual_pipeline_stage=1, global_batch_size=3),
                           "number of microbatches (3) is not divisible by "
                           "pipeline-model-parallel-size (2) when using interleaved schedule",
                           "--global-batch-size (3)")
        # tp 2 x pp 2 on 4 ranks is dp 1, V = 2 given directly, micro-batches of 2: a global
        # batch of 6 is 3 micro-batches.
        self.assertRefused(4, argv(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                   num_layers=8, num_virtual_stages_per_pipeline_rank=2,
                                   micro_batch_size=2, global_batch_size=6),
                           "number of microbatches (3) is not divisible by "
                           "pipeline-model-parallel-size (2) when using interleaved schedule",
                           "--micro-batch-size (2)", "data parallel size (1)")

    # ---- data parallel ----

    def test_global_batch_not_divisible_by_micro_batch_times_dp(self):
        # World 4 at tp 2 is dp 2; 3 sequences cannot be shared by 2 replicas.
        self.assertRefused(4, argv(tensor_model_parallel_size=2, global_batch_size=3),
                           "data parallel size (2)", "--global-batch-size")

    def test_negative_ddp_bucket_size(self):
        self.assertRefused(2, argv(ddp_bucket_size=-1), "--ddp-bucket-size must be >= 0")

    # ---- sequence parallel at tp 1, the flags in --help and the dump ----

    def test_sequence_parallel_at_tp1_warns_and_trains(self):
        for ranks in (1, 2):
            proc = run(ranks, argv(sequence_parallel=True))
            self.assertEqual(proc.returncode, 0, f"{ranks} ranks:\n{proc.stderr[-3000:]}")
            out = proc.stdout + proc.stderr
            self.assertEqual(out.count(SP_WARNING), 1, f"{ranks} ranks: the warning once, from "
                                                       f"rank 0:\n{out[-3000:]}")
            self.assertLess(proc.stdout.index(SP_WARNING), proc.stdout.index(DUMP_BANNER))
            self.assertRegex(proc.stdout, r"sequence_parallel \.+ False")
            self.assertEqual(proc.stdout.count("] iteration "), 2, proc.stdout[-3000:])

    def test_new_flags_in_help_and_dump(self):
        proc = subprocess.run([MEGATRON, "train", "--help"], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for flag in ("--num-layers-per-virtual-pipeline-stage",
                     "--num-virtual-stages-per-pipeline-rank", "--overlap-grad-reduce",
                     "--ddp-bucket-size", "--sequence-parallel"):
            self.assertIn(flag, proc.stdout)
        proc = run(1, argv(overlap_grad_reduce=True, ddp_bucket_size=1000, train_iters=1))
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertRegex(proc.stdout, r"overlap_grad_reduce \.+ True")
        self.assertRegex(proc.stdout, r"ddp_bucket_size \.+ 1000")
        self.assertRegex(proc.stdout, r"num_layers_per_virtual_pipeline_stage \.+ 0")
        self.assertRegex(proc.stdout, r"num_virtual_stages_per_pipeline_rank \.+ 0")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
