#!/usr/bin/env python3
"""Context parallelism under MPI against the single-process run, and its refusals.

What it is: `megatron train` on mock data as one process and with --context-parallel-size 2 or 4
alone and combined with tensor + sequence parallelism, pipeline parallelism and data parallelism
with the distributed optimizer, with each --cp-comm-type (p2p, allgather, a2a), for a GPT-2-style
and a Llama-style (RoPE, GQA) tiny model, dropout on. Every sequence is split into 2 x cp chunks
(rank r holds r and 2cp-1-r); attention runs block by block at global positions and merges
through log-sum-exps; dropout masks are keyed by global elements; the loss of a rank is the mean
over its tokens, gradients average over dp x cp (Megatron r0.14). With mock data every rank holds
the same number of unmasked tokens, so the objective is the single-process one, and the loss,
grad-norm and validation curves must equal it up to the order of floating-point sums: 20
iterations within 1e-5 relative, as tests/e2e/test_parallel_equivalence.py (the block merge adds
exp-weighted f32 partial outputs in another order than the one-pass kernel; a wrong chunk, mask or
reduction moves the 2nd or 3rd digit).

Also: the refusals of bad context-parallel flags, exit 2 on every rank with the flag named.

Usage: test_context_parallel.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 180
# Flags as {"--flag": value or None}; model(...) merges them, later ones replacing earlier.
TINY = {"--mock-data": None, "--vocab-size": "128", "--num-layers": "4", "--hidden-size": "64",
        "--num-attention-heads": "4", "--seq-length": "32", "--micro-batch-size": "1",
        "--global-batch-size": "4", "--train-iters": "20", "--log-interval": "1", "--lr": "2e-3",
        "--lr-warmup-iters": "3", "--eval-iters": "2", "--eval-interval": "10",
        "--num-threads": "1"}
LLAMA = {"--position-embedding-type": "rope", "--normalization": "RMSNorm", "--swiglu": None,
         "--disable-bias-linear": None, "--num-attention-heads": "8",
         "--group-query-attention": None, "--num-query-groups": "4",
         "--untie-embeddings-and-output-weights": None}
DOCS = {"--reset-attention-mask": None, "--reset-position-ids": None, "--eod-mask-loss": None}


def model(*parts, **overrides):
    """The merged flag dicts as argv, with keyword overrides (megatron_job.flags_with)."""
    merged = {}
    for p in parts:
        merged.update(p)
    return megatron_job.flags_with(merged, **overrides)


CP, COMM = "--context-parallel-size", "--cp-comm-type"
TP, PP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size"
LAYOUTS = [
    ("cp2 p2p", 2, [CP, "2"]),
    ("cp4 p2p", 4, [CP, "4"]),
    ("cp2 allgather", 2, [CP, "2", COMM, "allgather"]),
    ("cp4 allgather", 4, [CP, "4", COMM, "allgather"]),
    ("cp2 a2a", 2, [CP, "2", COMM, "a2a"]),
    ("cp4 a2a", 4, [CP, "4", COMM, "a2a"]),
    ("cp2 tp2+sp", 4, [CP, "2", TP, "2", "--sequence-parallel"]),
    ("cp2 pp2", 4, [CP, "2", PP, "2"]),
    ("cp2 dp2 distributed optimizer", 4, [CP, "2", "--use-distributed-optimizer"]),
    ("cp2 selective recomputation", 2, [CP, "2", "--recompute-granularity", "selective"]),
    ("cp4 a2a+p2p (2 x 2)", 4,
     [CP, "4", COMM, "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2"]),
    ("cp2 one comm type per layer", 2, [CP, "2", COMM, "p2p", "allgather", "a2a", "p2p"]),
]


def run(ranks, *args):
    return megatron_job.run_train(MEGATRON, MPIEXEC, ranks, args, TIMEOUT_S)


class TestContextParallel(unittest.TestCase):
    def check_equivalent(self, model, layouts=LAYOUTS):
        single = run(1, *model)
        self.assertEqual(single.returncode, 0, single.stderr[-2000:])
        want = megatron_log.loss_curve(single.stdout, 20)
        want_valid = megatron_log.validation_losses(single.stdout)
        self.assertEqual(len(want_valid), 4)
        for name, ranks, flags in layouts:
            with self.subTest(layout=name):
                proc = run(ranks, *model, *flags)
                self.assertEqual(proc.returncode, 0, f"{name}: {proc.stderr[-2000:]}")
                got = megatron_log.loss_curve(proc.stdout, 20)
                for it, (wl, wn) in want.items():
                    gl, gn = got[it]
                    self.assertAlmostEqual(gl, wl, delta=1e-5 * wl, msg=f"{name} loss, iter {it}")
                    # The norm is printed with 3 decimals: one unit of the last digit.
                    self.assertAlmostEqual(gn, wn, delta=1e-5 * wn + 2e-3,
                                           msg=f"{name} grad norm, iter {it}")
                got_valid = megatron_log.validation_losses(proc.stdout)
                self.assertEqual([w for w, _ in got_valid], [w for w, _ in want_valid], name)
                for (where, g), (_, w) in zip(got_valid, want_valid):
                    self.assertAlmostEqual(g, w, delta=1e-5 * w, msg=f"{name} validation {where}")

    def test_gpt2_style(self):
        self.check_equivalent(model(TINY))

    def test_llama_style(self):
        self.check_equivalent(model(TINY, LLAMA))

    def test_document_masks(self):
        # Document starts are global positions: each key block is masked by them at its own
        # offset, so documents work in every comm type. (Mock documents are long, so few
        # sequences here hold a document start; tests/parallel/test_context_parallel.cpp checks
        # the masks densely against the reference.)
        self.check_equivalent(model(TINY, LLAMA, DOCS), [l for l in LAYOUTS if l[0] in
                                     ("cp2 p2p", "cp2 allgather", "cp2 a2a", "cp2 tp2+sp")])

    def test_checkpoints_reshard_across_context_parallel_layouts(self):
        # Saved at cp2 with the distributed optimizer (Adam moments sharded over dp x cp = 2),
        # resumed as one process and as cp2 x dp2 (moments over 4): iterations 5-8 equal the
        # uninterrupted run's, the optimizer state included.
        flags = {"--use-distributed-optimizer": None, "--train-iters": "8", "--eval-iters": "0",
                 "--eval-interval": "1000"}
        base = model(TINY, flags)
        full = run(1, *base)
        self.assertEqual(full.returncode, 0, full.stderr[-2000:])
        want = megatron_log.iteration_lines(full.stdout, range(1, 9))
        with tempfile.TemporaryDirectory() as ckpt:
            # The first 4 of the 8 iterations (--exit-interval: the same schedule, which a resume
            # must match, as in Megatron).
            saved = run(2, *model(TINY, flags, exit_interval=4), CP, "2", "--save", ckpt)
            self.assertEqual(saved.returncode, 0, saved.stderr[-2000:])
            for name, ranks in (("cp1", 1), ("cp2 dp2", 4)):
                extra = [] if ranks == 1 else [CP, "2"]
                proc = run(ranks, *base, "--load", ckpt, *extra)
                self.assertEqual(proc.returncode, 0, f"{name}: {proc.stderr[-2000:]}")
                got = megatron_log.iteration_lines(proc.stdout, range(5, 9))
                for it in range(5, 9):
                    for key in ("lm loss", "grad norm"):
                        self.assertAlmostEqual(megatron_log.number(got[it], key),
                                               megatron_log.number(want[it], key),
                                               delta=1e-5 * megatron_log.number(want[it], key),
                                               msg=f"{name} {key}, iteration {it}")

    def assertRefused(self, ranks, args, needle):
        proc = run(ranks, *args)
        self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
        lines = [ln for ln in proc.stderr.splitlines() if needle in ln]
        ranks_named = sorted(int(m.group(1)) for ln in lines
                             for m in [re.search(r"\[rank (\d+)\]", ln)] if m)
        self.assertEqual(ranks_named, list(range(ranks)), proc.stderr)

    def test_bad_flags_are_refused_on_every_rank(self):
        cp2 = {CP: "2"}
        self.assertRefused(2, model(TINY, cp2, seq_length=30),
                           "seq-length should be a multiple of 2 * context-parallel-size")
        self.assertRefused(2, model(TINY, cp2, cp_comm_type="a2a+p2p"),
                           "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes")
        self.assertRefused(2, model(TINY, cp2, cp_comm_type="ring"), "--cp-comm-type must be")
        self.assertRefused(2, model(TINY, cp2) + ["--hierarchical-context-parallel-sizes", "2", "4"],
                           "--hierarchical-context-parallel-sizes must multiply to")
        self.assertRefused(2, model(TINY, cp2) + [COMM, "a2a+p2p",
                                                  "--hierarchical-context-parallel-sizes", "2", "1"],
                           "--hierarchical-context-parallel-sizes takes sizes of at least 2")
        self.assertRefused(2, model(TINY, cp2) + [COMM, "p2p", "a2a"],
                           "--cp-comm-type takes one value for every layer or one per layer")
        self.assertRefused(4, model(TINY, {CP: "4"}, cp_comm_type="a2a", num_attention_heads=2),
                           "--cp-comm-type a2a splits")
        # The world must be divisible by tp x pp x cp.
        self.assertRefused(2, model(TINY, {CP: "4"}), "context")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
