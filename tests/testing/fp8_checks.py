"""The FP8 check every model's end-to-end test runs (test_bert.py, test_t5.py).

What it is: one function that trains a model three ways (bf16, hybrid FP8 with a checkpoint at
the end, hybrid FP8 at tp2) through the test's own runner and checks what holds for any model:
  - the FP8 loss stays within 5% of bf16 at every iteration (measured below 1% on these tiny
    models; FP8 rounds GEMM inputs to 3 or 2 mantissa bits, bf16 to 7) and differs from it
    (quantisation happens);
  - tp2 quantises with the single process's scales (delayed scaling reduces the amaxes over TP),
    so iteration 1 agrees to 1e-5 (the sum order only);
  - the checkpoint holds the delayed-scaling state of every FP8 GEMM, its scales moved from 1;
  - with the FP8 weights kept as codes (--fp8-param-gather, on the distributed optimizer) the
    losses are the FP8 run's, digit for digit (the same quantisation, done after the step).
What it is not: the FP8 recipes' own tests (tests/e2e/test_fp8.py, tests/parallel).
"""
import os
import sys

import checkpoint_reader


def check_fp8_against_bf16(test, run, base, directory, iters, fp8_gemms, curve):
    """test: the unittest.TestCase; run(ranks, args) -> CompletedProcess; base: the model's flags
    (bf16 added here); curve(stdout) -> {iteration: {"lm loss": float}}; fp8_gemms: how many
    GEMMs run in FP8 (the checkpoint's fp8_scale tensors)."""
    base = [*base, "--bf16"]
    fp8 = ["--fp8-format", "hybrid"]
    ck = os.path.join(directory, "fp8_checkpoint")
    runs = {}
    for name, ranks, extra in (("bf16", 1, []),
                               ("fp8", 1, [*fp8, "--save", ck, "--save-interval", str(iters)]),
                               ("tp2", 2, [*fp8, "--tensor-model-parallel-size", "2"]),
                               ("codes", 1, [*fp8, "--use-distributed-optimizer",
                                             "--fp8-param-gather"])):
        proc = run(ranks, [*base, *extra])
        test.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        runs[name] = {i: c["lm loss"] for i, c in curve(proc.stdout).items()}
    rel = [abs(runs["fp8"][i] - runs["bf16"][i]) / runs["bf16"][i] for i in runs["bf16"]]
    tp2 = abs(runs["tp2"][1] - runs["fp8"][1]) / runs["fp8"][1]
    print(f"fp8 hybrid vs bf16: worst {max(rel):.4f}, tp2 iteration 1 {tp2:.1e}", file=sys.stderr)
    test.assertLess(max(rel), 0.05, rel)
    test.assertGreater(max(rel), 0, rel)
    test.assertLess(tp2, 1e-5)
    test.assertEqual(runs["codes"], runs["fp8"])
    _, tensors = checkpoint_reader.read_checkpoint(ck)
    scales = {k: v for k, v in tensors.items() if k.endswith(".fp8_scale")}
    test.assertEqual(len(scales), fp8_gemms, sorted(scales))
    for name, value in scales.items():
        test.assertTrue(all(v != 1 for v in value), (name, value))
