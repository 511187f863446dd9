"""The step-time report of --timing-log-level, in one process and as a tp2 job.

What it is: `megatron train` on mock data with --timing-log-level 1 and 2, checking Megatron's
"(min, max) time across ranks (ms)" block: level 1 has the step's phases, level 2 adds the time
inside each kind of kernel (gemm, attention, norms and elementwise, cross entropy, optimizer),
each positive, their sum within the step's time, GEMMs the largest; under mpiexec every rank
takes part (min <= max); at the end of a level-2 run the time by op (each op positive, matmul the
largest, their sum within the mean step time) and the GEMMs by shape (their sum the matmul line,
the calls the model's), absent at level 1. What it is not: a benchmark (bench/) or a check of the values' accuracy.

Usage: test_timing_report.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402

MEGATRON = None
MPIEXEC = None
# Hidden size 256: the GEMMs take 4x the attention's time (16 vs 3.9 ms per step alone on a
# 2-core Zen 5), so check_kernels' "gemm is the largest category" holds under a loaded suite; at
# 128 they were 4.2 vs 3.5 ms and two parallel tests once reversed them.
MODEL = ["--mock-data", "--vocab-size", "512", "--num-layers", "2", "--hidden-size", "256",
         "--num-attention-heads", "4", "--seq-length", "64", "--micro-batch-size", "2",
         "--global-batch-size", "4", "--train-iters", "4", "--log-interval", "2", "--lr", "1e-3",
         "--eval-iters", "0", "--num-threads", "1", "--gemm-peak-gflops", "100"]
TIMER_RE = re.compile(r"^\s+(.+?) \.+: \(([0-9.]+), ([0-9.]+)\)$", re.M)
KERNELS = ["gemm", "attention", "norms and elementwise", "cross entropy", "optimizer"]
PHASES = ["batch-generator", "forward-backward", "all-grads-sync", "optimizer"]
OP_RE = re.compile(r"^    (\w+) \.+: ([0-9.]+)$", re.M)
ELAPSED_RE = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
SHAPE_RE = re.compile(r"^    (\d+x\d+x\d+ [NT][NT] \w+(?: \+=)?) \.+: ([0-9.]+) \(([0-9.]+), ([0-9.]+)\)$",
                      re.M)



def report(stdout):
    """The last report block: {name: (min, max)}. Other ranks' lines (the memory report) may be
    interleaved with it under mpiexec; only timer lines match TIMER_RE."""
    blocks = stdout.split("(min, max) time across ranks (ms):")
    if len(blocks) < 2:
        return {}
    return {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in TIMER_RE.finditer(blocks[-1])}


def ops_table(stdout):
    """The time-by-op table at the end of a level-2 run: {op: ms per step}, or None."""
    _, found, tail = stdout.partition("time by op on rank 0, ms per training step")
    if not found:
        return None
    table = tail.split("[after training is done]")[0].split("GEMMs by shape")[0]
    return {m.group(1): float(m.group(2)) for m in OP_RE.finditer(table)}


def gemm_table(stdout):
    """The GEMMs by shape after the op table: {shape: (ms per step, calls per step, GFLOP/s)}."""
    _, found, tail = stdout.partition("GEMMs by shape, ms per training step")
    if not found:
        return None
    table = tail.split("[after training is done]")[0]
    return {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
            for m in SHAPE_RE.finditer(table)}


class TimingReport(unittest.TestCase):
    def run_train(self, ranks, extra, with_stdout=False):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, [*MODEL, *extra], timeout=180)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        return (report(proc.stdout), proc.stdout) if with_stdout else report(proc.stdout)


    def test_level_1_has_phases_only(self):
        timers, stdout = self.run_train(1, ["--timing-log-level", "1"], with_stdout=True)
        for name in PHASES:
            self.assertIn(name, timers)
        self.assertFalse([n for n in timers if n.startswith("kernels:")], timers)
        self.assertIsNone(ops_table(stdout))
        self.assertIsNone(gemm_table(stdout))


    def check_kernels(self, timers):
        kernels = {k: timers[f"kernels: {k}"] for k in KERNELS}
        for name, (lo, hi) in kernels.items():
            self.assertGreater(lo, 0, name)
            self.assertLessEqual(lo, hi, name)
        step = sum(timers[p][1] for p in PHASES)
        self.assertLess(sum(lo for lo, _ in kernels.values()), step * 1.01, timers)
        self.assertEqual(max(kernels, key=lambda k: kernels[k][0]), "gemm", kernels)

    def test_level_2_adds_kernel_categories(self):
        timers, stdout = self.run_train(1, ["--timing-log-level", "2"], with_stdout=True)
        self.check_kernels(timers)
        # The table: steps 2-4 (the first is left out); each op's mean, their sum within the
        # mean of those steps' times (1% for the rounding of the printed times).
        ops = ops_table(stdout)
        self.assertIsNotNone(ops, stdout[-2000:])
        for op in ("matmul", "attention_forward", "attention_backward", "adamw_step",
                   "cross_entropy_forward", "layernorm_forward"):
            self.assertGreater(ops.get(op, 0), 0, (op, ops))
        self.assertEqual(max(ops, key=ops.get), "matmul", ops)
        elapsed = [float(x) for x in ELAPSED_RE.findall(stdout)]
        self.assertEqual(len(elapsed), 2)  # --log-interval 2: iterations 1-2 and 3-4
        # Steps 2-4 take at most iterations 1-4's time: their mean is below (2 e1 + 2 e2) / 3.
        self.assertLess(sum(ops.values()), 1.01 * (2 * elapsed[0] + 2 * elapsed[1]) / 3,
                        (ops, elapsed))
        # The GEMMs by shape add up to the matmul line (each printed to 0.01 ms: 15 shapes).
        gemms = gemm_table(stdout)
        self.assertIsNotNone(gemms, stdout[-2000:])
        self.assertAlmostEqual(sum(ms for ms, _, _ in gemms.values()), ops["matmul"],
                               delta=0.01 * len(gemms), msg=gemms)
        # 2 micro-batches of 128 tokens, hidden 256, 2 layers: the QKV forward (out 768) twice
        # per micro-batch; its weight gradient written into the zeroed gradient in the first
        # micro-batch and accumulated in the second; in all, three GEMMs for each of the 2 x 4
        # linear layers and the output layer in each micro-batch; every rate positive.
        self.assertEqual(gemms.get("128x768x256 NT f32", (0, 0, 0))[1], 4, gemms)
        self.assertEqual(gemms.get("768x256x128 TN f32", (0, 0, 0))[1], 2, gemms)
        self.assertEqual(gemms.get("768x256x128 TN f32 +=", (0, 0, 0))[1], 2, gemms)
        self.assertEqual(sum(calls for _, calls, _ in gemms.values()), 2 * 3 * (2 * 4 + 1), gemms)
        self.assertTrue(all(rate > 0 for _, _, rate in gemms.values()), gemms)


    def test_level_2_on_every_rank_of_a_tp2_job(self):
        self.check_kernels(self.run_train(2, ["--timing-log-level", "2",
                                              "--tensor-model-parallel-size", "2"]))


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
