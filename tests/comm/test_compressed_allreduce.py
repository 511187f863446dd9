#!/usr/bin/env python3
"""1-bit compressed all-reduce against a NumPy restatement of DeepSpeed's.

What it is: rounds of comm/compressed_allreduce.h run by compressed_allreduce_tool under
`mpiexec -n W` (W = 2, 3, 4: W lcm(W, 8) padding of 16, 72 and 32), one set of error buffers
carried through the rounds as 1-bit Adam carries them through its steps, on momenta that drift
from round to round, some with exact zeros (DeepSpeed counts a zero as +); against the same
rounds simulated here for all W workers at once, written from DeepSpeed's
deepspeed/runtime/comm/nccl.py compressed_allreduce:
  worker: x = pad(m) + worker_error; s = ||x|| / sqrt(padded); worker_error = x - s (2 (x >= 0) - 1)
  server j, its chunk: y = sum_i (2 b_i - 1) s_i / W + server_error; s_j = ||y|| / sqrt(chunk);
          server_error = y - s_j (2 (y >= 0) - 1)
  result: concat_j s_j (2 (y_j >= 0) - 1), truncated to n.
Every round's result on every rank, and the final worker and server errors, must agree.

Tolerance: both sides run the same float32 operations in the same order except the two norms
(float64 sums here and there, then rounded to float32), so results agree to a few float32 ulps:
1e-6 relative to each tensor's largest value. A sign that comes out differently (an element whose
compensated value is within rounding of 0) would differ by twice a scale; the inputs keep every
compensated value away from 0 except the exact zeros, whose sign both sides take as +, so no such
flip is allowed.

Usage: test_compressed_allreduce.py --tool BUILD/tests/comm/compressed_allreduce_tool --mpiexec M
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

TOOL = None
MPIEXEC = None
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_mpi_yield_when_idle": "1",
       "OMPI_MCA_pml": "ob1",
       "OMPI_MCA_odls_base_sigkill_timeout": "0"}  # as tests/testing/megatron_job.py's MPI_ENV


def padded_size(n, w):
    unit = w * (w * 8 // np.gcd(w, 8))
    return n if n % unit == 0 else n + unit - n % unit


def norm_scale(v):
    return np.float32(np.sqrt(np.sum(v.astype(np.float64) ** 2)) / np.sqrt(float(v.size)))


def sign(v):
    """DeepSpeed's (sign(x) + 1).bool() as +-1: zero counts as +."""
    return np.where(v >= 0, np.float32(1), np.float32(-1))


def deepspeed_rounds(inputs, n, w):
    """inputs[r][t]: rank r's momentum of round t. Returns (outputs[r][t], worker errors, server
    errors) after all rounds."""
    padded = padded_size(n, w)
    chunk = padded // w
    worker_error = [np.zeros(padded, np.float32) for _ in range(w)]
    server_error = [np.zeros(chunk, np.float32) for _ in range(w)]
    rounds = len(inputs[0])
    outputs = [[None] * rounds for _ in range(w)]
    for t in range(rounds):
        signs, scales = [], []
        for r in range(w):
            x = np.zeros(padded, np.float32)
            x[:n] = inputs[r][t]
            x = x + worker_error[r]
            s = norm_scale(x)
            worker_error[r] = x - s * sign(x)
            signs.append(sign(x))
            scales.append(s)
        server_signs, server_scales = [], []
        for j in range(w):
            y = np.zeros(chunk, np.float32)
            for i in range(w):
                y = y + signs[i][j * chunk:(j + 1) * chunk] * (scales[i] * np.float32(1.0 / w))
            y = y + server_error[j]
            s = norm_scale(y)
            server_error[j] = y - s * sign(y)
            server_signs.append(sign(y))
            server_scales.append(s)
        result = np.concatenate([server_signs[j] * server_scales[j] for j in range(w)])[:n]
        for r in range(w):
            outputs[r][t] = result
    return outputs, worker_error, server_error


class TestCompressedAllreduce(unittest.TestCase):
    def check(self, w, n, rounds):
        rng = np.random.default_rng(1000 + w)
        base = rng.standard_normal((w, n)).astype(np.float32)
        inputs = []
        for r in range(w):
            per_round = []
            for t in range(rounds):
                m = base[r] * np.float32(0.9 ** t) + rng.standard_normal(n).astype(np.float32) * 0.1
                m[::97] = 0  # exact zeros, as a momentum of parameters that get no gradient
                per_round.append(m.astype(np.float32))
            inputs.append(per_round)
        with tempfile.TemporaryDirectory(prefix="compressed_allreduce_") as d:
            for r in range(w):
                np.concatenate(inputs[r]).astype("<f4").tofile(os.path.join(d, f"in_{r}.f32"))
            proc = subprocess.run([MPIEXEC, "-n", str(w), "--oversubscribe", "--allow-run-as-root",
                                   TOOL, d, str(n), str(rounds)], capture_output=True, text=True,
                                  timeout=120, env=dict(os.environ, **ENV), check=False)
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            want_out, want_we, want_se = deepspeed_rounds(inputs, n, w)
            for r in range(w):
                got = np.fromfile(os.path.join(d, f"out_{r}.f32"), "<f4").reshape(rounds, n)
                for t in range(rounds):
                    want = want_out[r][t]
                    tol = 1e-6 * np.max(np.abs(want))
                    np.testing.assert_allclose(got[t], want, rtol=0, atol=tol,
                                               err_msg=f"W={w} rank {r} round {t}")
                we = np.fromfile(os.path.join(d, f"worker_error_{r}.f32"), "<f4")
                se = np.fromfile(os.path.join(d, f"server_error_{r}.f32"), "<f4")
                self.assertEqual(we.size, padded_size(n, w))
                self.assertEqual(se.size, padded_size(n, w) // w)
                np.testing.assert_allclose(we, want_we[r], rtol=0,
                                           atol=1e-6 * np.max(np.abs(want_we[r])))
                np.testing.assert_allclose(se, want_se[r], rtol=0,
                                           atol=1e-6 * np.max(np.abs(want_se[r])))

    def test_two_ranks(self):
        self.check(2, 1000, 6)

    def test_three_ranks_pad_to_72(self):
        self.check(3, 1000, 6)

    def test_four_ranks(self):
        self.check(4, 777, 6)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--mpiexec", required=True)
    args, rest = parser.parse_known_args()
    TOOL, MPIEXEC = os.path.abspath(args.tool), args.mpiexec
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
