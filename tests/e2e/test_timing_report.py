"""The step-time report of --timing-log-level, in one process and as a tp2 job.

What it is: `megatron train` on mock data with --timing-log-level 1 and 2, checking Megatron's
"(min, max) time across ranks (ms)" block: level 1 has the step's phases, level 2 adds the time
inside each kind of kernel (gemm, attention, norms and elementwise, cross entropy, optimizer),
each positive, their sum within the step's time, GEMMs the largest; under mpiexec every rank
takes part (min <= max). What it is not: a benchmark (bench/) or a check of the values' accuracy.

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
MODEL = ["--mock-data", "--vocab-size", "512", "--num-layers", "2", "--hidden-size", "128",
         "--num-attention-heads", "4", "--seq-length", "64", "--micro-batch-size", "2",
         "--global-batch-size", "4", "--train-iters", "4", "--log-interval", "2", "--lr", "1e-3",
         "--eval-iters", "0", "--num-threads", "1", "--gemm-peak-gflops", "100"]
TIMER_RE = re.compile(r"^\s+(.+?) \.+: \(([0-9.]+), ([0-9.]+)\)$", re.M)
KERNELS = ["gemm", "attention", "norms and elementwise", "cross entropy", "optimizer"]
PHASES = ["batch-generator", "forward-backward", "all-grads-sync", "optimizer"]


def report(stdout):
    """The last report block: {name: (min, max)}. Other ranks' lines (the memory report) may be
    interleaved with it under mpiexec; only timer lines match TIMER_RE."""
    blocks = stdout.split("(min, max) time across ranks (ms):")
    if len(blocks) < 2:
        return {}
    return {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in TIMER_RE.finditer(blocks[-1])}


class TimingReport(unittest.TestCase):
    def run_train(self, ranks, extra):
        proc = megatron_job.run_train(MEGATRON, MPIEXEC, ranks, [*MODEL, *extra], timeout=180)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        return report(proc.stdout)

    def test_level_1_has_phases_only(self):
        timers = self.run_train(1, ["--timing-log-level", "1"])
        for name in PHASES:
            self.assertIn(name, timers)
        self.assertFalse([n for n in timers if n.startswith("kernels:")], timers)

    def check_kernels(self, timers):
        kernels = {k: timers[f"kernels: {k}"] for k in KERNELS}
        for name, (lo, hi) in kernels.items():
            self.assertGreater(lo, 0, name)
            self.assertLessEqual(lo, hi, name)
        step = sum(timers[p][1] for p in PHASES)
        self.assertLess(sum(lo for lo, _ in kernels.values()), step * 1.01, timers)
        self.assertEqual(max(kernels, key=lambda k: kernels[k][0]), "gemm", kernels)

    def test_level_2_adds_kernel_categories(self):
        self.check_kernels(self.run_train(1, ["--timing-log-level", "2"]))

    def test_level_2_on_every_rank_of_a_tp2_job(self):
        self.check_kernels(self.run_train(2, ["--timing-log-level", "2",
                                              "--tensor-model-parallel-size", "2"]))


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
