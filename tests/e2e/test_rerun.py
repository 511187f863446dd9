#!/usr/bin/env python3
"""Megatron's rerun state machine (--rerun-mode) end to end, alone and under mpiexec.

What it is: `megatron train` on mock data with a result made to fail validation, each job of
Megatron's diagnosis run in turn as a restart loop would run it. The node a rank runs on is
named by SLURMD_NODENAME, so "another node" is a restart with another name.
  - A reproducible Inf (`--inject-fault inf-grad`, on rank 1 of dp2 with the distributed
    optimizer): the in-place re-run reproduces it, every rank exits 16 after saving the last
    iteration with the machine's record; restarted on the same node it exits 16 again without
    saving; on another node the Inf reproduces (an application error, fatal): exit 17. The
    tracker file holds each step; a run given it skips that iteration and then trains exactly
    as a run told --iterations-to-skip does.
  - Injected errors: a transient one exits 17 after saving, and the resumed run's losses are
    those of a run never interrupted, bit for bit (with FP8 delayed scaling, whose state the
    re-run would otherwise have advanced); a persistent one exits 16, then 17 on
    another node; a correct spiky loss (not fatal) under pp2 exits 16, then the re-run on
    another node continues and the losses again equal the uninterrupted run's.
  - report_stats re-runs every iteration: with FP8 delayed scaling, the distributed optimizer
    and overlapped gradient reduction and weight gathering on dp2, every validated result is
    reported identical in the re-run and the losses equal those of --rerun-mode disabled and
    of the default mode (a re-run leaves no trace: batches, dropout, FP8 state).
  - disabled: a rejected result stops every rank (exit 1) naming rank, node, iteration and
    check; bad flag values exit 2 naming the flag.
What it is not: a check of the machine's transitions one by one (tests/train, unit test).

Usage: test_rerun.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import json
import os
import shutil
import sys
import tempfile
import unittest
import subprocess

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 300
ITERS = 6
TINY = ["--mock-data", "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
        "--global-batch-size", "4", "--log-interval", "1", "--lr", "2e-3",
        "--lr-warmup-iters", "3", "--eval-iters", "0", "--num-threads", "1",
        "--hidden-dropout", "0.1", "--train-iters", str(ITERS)]


def run(ranks, *args, node="node-a"):
    cmd = [MEGATRON, "train", *megatron_job.with_given_peak("train", [*TINY, *args])]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd]
    env = dict(os.environ, **megatron_job.MPI_ENV, SLURMD_NODENAME=node)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                          check=False)


def losses(proc, iterations):
    """{iteration: printed lm loss and grad norm} (exact text: bit-level comparisons)."""
    got = megatron_log.iteration_lines(proc.stdout)
    return {it: (got[it]["lm loss"], got[it]["grad norm"]) for it in iterations}


def printed_iterations(proc):
    return sorted(megatron_log.iteration_lines(proc.stdout))


def saved(root):
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        it = int(f.read())
    with open(os.path.join(root, f"iter_{it:07d}", "metadata.json")) as f:
        return it, json.load(f)


def tracker_lines(path):
    with open(path) as f:
        return [dict(kv.split("=", 1) for kv in line.split(" message=")[0].split(" ")[2:])
                for line in f]


class RerunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="rerun_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def expect(self, proc, code, *phrases):
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, code, out[-3000:])
        for p in phrases:
            self.assertIn(p, out)
        for crash in megatron_job.CRASH_MARKERS:
            self.assertNotIn(crash, proc.stderr)


class TestReproducibleFault(RerunTest):
    def test_reproducible_inf_is_diagnosed_over_three_jobs_then_skipped(self):
        ck, tracker = self.path("ck"), self.path("tracker.txt")
        args = ["--use-distributed-optimizer", "--save", ck, "--save-interval", "100",
                "--result-rejected-tracker-filename", tracker]
        fault = ["--inject-fault", "inf-grad:1:4"]
        first = run(2, *args, *fault)
        self.expect(first, 16, "Need to rerun step to check reproducibility",
                    "First rerun: unexpected result is reproducible within the tolerance "
                    "(inf = inf)", "Saving a checkpoint and exiting now")
        self.assertEqual(printed_iterations(first), [1, 2, 3])
        it, meta = saved(ck)
        self.assertEqual(it, 3)  # the last completed iteration
        record = meta["rerun_state_machine"]
        self.assertEqual(record["state"], 3)  # WILL_RERUN_FROM_CHECKPOINT
        self.assertEqual(record["current_iteration"], 4)
        self.assertIsNone(record["ranks"][0]["failed_validation_call"])
        failed = record["ranks"][1]["failed_validation_call"]
        self.assertRegex(failed["message"], r"^found Inf in local grad norm for bucket #\d+ ")
        self.assertEqual(record["ranks"][1]["suspicious_node"], "node-a")
        self.assertEqual(record["ranks"][1]["initial_result"], "inf")

        # The same node: 16 again, nothing saved.
        metadata = os.path.join(ck, "iter_0000003", "metadata.json")
        before = os.stat(metadata).st_mtime_ns
        again = run(2, "--load", ck, *args, *fault)
        self.expect(again, 16, "Got rescheduled on the same GPU",
                    "Please resume the job from the same checkpoint")
        self.assertEqual(printed_iterations(again), [])
        self.assertEqual(os.stat(metadata).st_mtime_ns, before)

        # Another node: the Inf reproduces, a correct result of a fatal check.
        elsewhere = run(2, "--load", ck, *args, *fault, node="node-b")
        self.expect(elsewhere, 17, "Second rerun: unexpected result is reproducible on a "
                    "different GPU", "Rank 1, node node-b, device 1: Correct result (but possible "
                    "Application error) (found Inf in local grad norm")
        statuses = [(l["rank"], l["iteration"], l["status"], l["node"])
                    for l in tracker_lines(tracker)]
        # (The restart on the same node decides nothing and logs nothing to the file.)
        self.assertEqual(statuses, [("1", "4", "initial_run", "node-a"),
                                    ("1", "4", "first_rerun_reproducible", "node-a"),
                                    ("1", "4", "second_rerun_reproducible", "node-b")])

        # The tracker shows iteration 4 rejected twice on rank 1: a run given it skips it (its
        # batch read and dropped) and trains as one told --iterations-to-skip 3 (Megatron's
        # count before the step) from the start.
        skipping = run(2, "--load", ck, "--use-distributed-optimizer",
                       "--result-rejected-tracker-filename", tracker)
        self.expect(skipping, 0, "Will skip these iterations from tracker file: [4]",
                    "Iteration 4, to be re-run from the checkpoint, is skipped")
        want = run(2, "--use-distributed-optimizer", "--iterations-to-skip", "3")
        self.expect(want, 0)
        self.assertEqual(printed_iterations(skipping), [5, 6])
        self.assertEqual(losses(skipping, [5, 6]), losses(want, [5, 6]))


class TestInjectedErrors(RerunTest):
    def test_transient_error_exits_17_and_the_resumed_run_is_unchanged(self):
        # With FP8 delayed scaling: the checkpoint holds the scaling state from before the
        # re-run iteration, so the resumed run repeats it exactly.
        ck = self.path("ck")
        fp8 = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4"]
        first = run(1, *fp8, "--save", ck, "--save-interval", "100", "--error-injection-rate", "1")
        # The first validated iteration is 2 (none on iteration 1, as Megatron).
        self.expect(first, 17, "Injecting error type Transient error", "Possible transient error",
                    "A checkpoint at the last iteration is being saved")
        it, meta = saved(ck)
        self.assertEqual(it, 1)
        self.assertNotIn("rerun_state_machine", meta)  # nothing to resume: iteration 2 reruns
        resumed = run(1, *fp8, "--load", ck)
        self.expect(resumed, 0)
        whole = run(1, *fp8)
        self.expect(whole, 0)
        self.assertEqual(losses(resumed, range(2, ITERS + 1)), losses(whole, range(2, ITERS + 1)))

    def test_persistent_error_exits_16_then_17_on_another_node(self):
        ck = self.path("ck")
        inject = ["--save", ck, "--save-interval", "100", "--error-injection-rate", "1",
                  "--error-injection-type", "persistent_error"]
        self.expect(run(1, *inject), 16, "Injecting error type Persistent error")
        self.assertEqual(saved(ck)[1]["rerun_state_machine"]["ranks"][0]["injected_error_type"],
                         "persistent_error")
        self.expect(run(1, "--load", ck, *inject, node="node-b"), 17,
                    "Second rerun: unexpected result is not reproducible on a different GPU",
                    "Possible persistent error")

    def test_correct_spiky_loss_continues_on_another_node_under_pp2(self):
        ck = self.path("ck")
        pp2 = ["--pipeline-model-parallel-size", "2", "--no-check-for-nan-in-loss-and-grad",
               "--check-for-spiky-loss"]
        inject = ["--save", ck, "--save-interval", "100", "--error-injection-rate", "1",
                  "--error-injection-type", "correct_result"]
        self.expect(run(2, *pp2, *inject), 16, "Injecting error type Expected result")
        self.assertEqual(saved(ck)[0], 1)
        # Resumed elsewhere without further injection: the spike reproduces, it is not fatal,
        # training continues from the re-run iteration on.
        resumed = run(2, *pp2, "--load", ck, "--save", ck, node="node-b")
        self.expect(resumed, 0, "Continuing normal execution because failed validation was not "
                    "fatal", "Correct result (but possible Application error) (Spiky loss)")
        whole = run(2, *pp2)
        self.expect(whole, 0)
        self.assertEqual(losses(resumed, range(2, ITERS + 1)), losses(whole, range(2, ITERS + 1)))


class TestReportStats(RerunTest):
    def test_every_iteration_reruns_identically_and_leaves_no_trace(self):
        layout = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len",
                  "4", "--use-distributed-optimizer", "--overlap-grad-reduce",
                  "--overlap-param-gather", "--check-for-spiky-loss", "--check-for-large-grads"]
        report = run(2, *layout, "--rerun-mode", "report_stats")
        self.expect(report, 0, "Stats on computation determinism in validation calls")
        stats = [l.strip() for l in report.stdout.splitlines() if l.startswith("  found ")
                 or l.startswith("  Spiky loss:")]
        # 3 reports (iterations 2, 4, 6): loss NaN/Inf/spiky and per bucket NaN/Inf/large.
        self.assertGreaterEqual(len(stats), 3 * 6, report.stdout[-3000:])
        for line in stats:
            self.assertTrue(line.endswith("samples, all identical"), line)
        # Rank 0's totals at iteration 6: every loss of 2 ranks x 2 micro-batches x 6 iterations.
        self.assertIn("  Spiky loss: 24 samples, all identical", report.stdout)
        disabled = run(2, *layout, "--rerun-mode", "disabled")
        default = run(2, *layout)
        self.expect(disabled, 0)
        self.expect(default, 0)
        want = losses(disabled, range(1, ITERS + 1))
        self.assertEqual(losses(report, range(1, ITERS + 1)), want)
        self.assertEqual(losses(default, range(1, ITERS + 1)), want)


    def test_moe_reruns_leave_no_trace(self):
        # Per-step MoE state (the auxiliary losses' tracker, tokens per expert for the expert
        # bias and the load log) is counted once, whatever the passes.
        moe = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
               "--expert-model-parallel-size", "2", "--moe-aux-loss-coeff", "1e-2",
               "--moe-z-loss-coeff", "1e-3", "--moe-input-jitter-eps", "0.1",
               "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
               "--log-expert-load", "--disable-bias-linear"]
        fields = ("lm loss", "load_balancing_loss", "z_loss", "grad norm", "expert load max/mean")
        got = {}
        for mode in ("report_stats", "disabled"):
            proc = run(2, *moe, "--rerun-mode", mode)
            self.expect(proc, 0)
            lines = megatron_log.iteration_lines(proc.stdout, range(1, ITERS + 1))
            got[mode] = {it: tuple(f[k] for k in fields) for it, f in lines.items()}
        self.assertEqual(got["report_stats"], got["disabled"])


class TestDisabledAndBadInput(RerunTest):
    def test_disabled_mode_stops_every_rank_naming_the_check(self):
        tracker = self.path("t.txt")
        proc = run(2, "--rerun-mode", "disabled", "--inject-fault", "inf-grad:0:3",
                   "--result-rejected-tracker-filename", tracker)
        self.expect(proc, 1, "Rank 0, node node-a, device 0, iteration 3: Unexpected result inf "
                    "(message='found Inf in local grad norm for bucket #")
        self.assertEqual([l["status"] for l in tracker_lines(tracker)], ["rerun_disabled"])

    def test_bad_values_exit_2_naming_the_flag(self):
        for args, flag in ((["--rerun-mode", "report_determinism_stats"], "--rerun-mode"),
                           (["--error-injection-type", "flaky"], "--error-injection-type"),
                           (["--error-injection-rate", "-1"], "--error-injection-rate"),
                           (["--result-rejected-tracker-filename", self.path("no/such/t.txt")],
                            "--result-rejected-tracker-filename")):
            proc = run(2, *args)
            self.expect(proc, 2, flag)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
