#!/usr/bin/env python3
"""Sharded checkpoints under faults, and the graceful exits, end to end under mpiexec.

What it is: black-box runs of `megatron train` on 2 ranks (tp 2, so each rank writes its own
rank_NNNNN.safetensors) against a valid checkpoint made once:
- corrupt checkpoints (a shard one byte short, a flipped payload bit (caught by the per-tensor
  checksum by default, by the file's SHA-256 with --verify-integrity), a missing shard, a tracker
  holding 'abc' or naming a missing iteration, a truncated or missing metadata.json) exit 2 with
  the file's name, said once by rank 0 for all ranks (every rank agrees, then exits cleanly),
  never a hang; with --no-verify-integrity a flipped bit loads unnoticed; a leftover
  iter_N.staging is never loaded;
- a rank killed while writing an async save, and a rank whose write fails (ENOSPC), leave the
  previous checkpoint and the tracker as they were, and a resumed run continues the straight
  run's loss curve exactly;
- SIGTERM to mpirun and SIGUSR1 with --exit-signal SIGUSR1, --exit-duration-in-mins: one new
  checkpoint at the iteration where every rank stopped, exit 3 (on SIGTERM mpirun reports its
  own 1 instead), and resuming continues the straight run bit for bit;
- the watchdog ends a job whose rank hangs, naming the rank, the phase and the iteration;
- --load of an empty directory, and a checkpoint of another model shape.

Losses are compared as printed strings (7 significant digits), exactly: a resumed run repeats
the straight run's arithmetic in the same order on the same layout, so any difference is a
state that was not saved or not restored (the optimizer moments, the step count, the LR
schedule, the data position, the dropout seed).

Open MPI facts this relies on (mpirun 4.1): on SIGTERM, mpirun waits odls_base_sigkill_timeout
seconds, sends SIGTERM to the ranks, waits that long again, then SIGKILLs them, and exits 1
whatever they returned; SIGUSR1 is forwarded at once and mpirun exits with the ranks' code. And
once mpirun has its SIGTERM it stops reading the ranks' stdout (a pseudo-terminal): a rank that
fills it (logging every iteration does within a second or two) would block in write() and never
reach the save; the exit-signal handler makes the output non-blocking, so the SIGTERM run logs
every iteration and must still save (lines that did not fit may be dropped: the exit line is
required at most once, the checkpoint and the exact continuation always).

What it is not: the checkpoint format or resharding across layouts (test_checkpoint_resume.py),
or the safetensors reader (test_safetensors.cpp).

Usage: test_checkpoint_faults.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest options]
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402  (tests/testing, shared by the end-to-end tests)
import megatron_log  # noqa: E402

MEGATRON = None  # set from --megatron
MPIEXEC = None  # set from --mpiexec
RANKS = 2
# A refused checkpoint exits in a second or two and a 20-iteration run in a few; the limit only
# guards against a hang (ranks waiting in a collective for one that already left), itself the
# failure to catch.
TIMEOUT_S = 120
# Seconds mpirun waits between its SIGTERM and forwarding it, and again before SIGKILL: the
# ranks keep training for this long, then have this long to save (a save here takes ~50 ms: 4 s
# leaves two orders of magnitude for a loaded machine; each second here is two of the suite's).
SIGKILL_TIMEOUT_S = 4
# A tiny model at tp 2 on 2 ranks (dp 1, two micro-batches a step), dropout on (the default), so
# that resuming must restore the dropout seed too.
TINY = {"--mock-data": None, "--vocab-size": "128", "--num-layers": "4", "--hidden-size": "64",
        "--num-attention-heads": "4", "--seq-length": "32", "--micro-batch-size": "1",
        "--global-batch-size": "2", "--train-iters": "20", "--log-interval": "1", "--lr": "2e-3",
        "--lr-warmup-iters": "3", "--eval-iters": "0", "--num-threads": "1",
        "--tensor-model-parallel-size": "2"}
TRACKER = "latest_checkpointed_iteration.txt"
CRASH_MARKERS = megatron_job.CRASH_MARKERS


def argv(**overrides):
    """TINY with flags replaced or added (megatron_job.flags_with)."""
    return megatron_job.flags_with(TINY, **overrides)


def run(args, timeout=TIMEOUT_S):
    return megatron_job.run_train(MEGATRON, MPIEXEC, RANKS, args, timeout)


def losses(stdout):
    """{iteration: the printed lm loss}, as text: compared exactly. Every iteration line must be
    whole (megatron_log); callers check which iterations were printed."""
    return {it: f["lm loss"] for it, f in megatron_log.iteration_lines(stdout).items()}


def read_tracker(ckpt):
    path = os.path.join(ckpt, TRACKER)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def iter_dir(ckpt, iteration):
    return os.path.join(ckpt, f"iter_{iteration:07d}")


def committed(ckpt):
    """The iterations with a committed checkpoint: iter_NNNNNNN holding metadata.json."""
    out = []
    for name in sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []:
        m = re.fullmatch(r"iter_(\d{7})", name)
        if m and os.path.exists(os.path.join(ckpt, name, "metadata.json")):
            out.append(int(m[1]))
    return out


def leftovers(ckpt):
    """Entries of the checkpoint directory that are neither a committed checkpoint nor the
    tracker (staging directories, temporaries)."""
    return sorted(n for n in os.listdir(ckpt)
                  if n != TRACKER and not re.fullmatch(r"iter_\d{7}", n))


def tensor_data_offset(path):
    """Where a safetensors file's tensor bytes start: 8-byte header length, then the header."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
    return 8 + header_len


class Job:
    """An mpiexec job whose stdout is read as it comes, to signal mpirun mid-run."""

    def __init__(self, args, env=None):
        # The command line of megatron_job.run_train, started with Popen instead.
        cmd = [MPIEXEC, "-n", str(RANKS), "--oversubscribe", "--allow-run-as-root", MEGATRON,
               "train", *megatron_job.with_given_peak("train", args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True,
                                     env={**os.environ, **megatron_job.MPI_ENV, **(env or {})})
        self.out, self.err = [], []
        self.seen = threading.Event()
        self.pattern = None
        self.readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out)),
                        threading.Thread(target=self._read, args=(self.proc.stderr, self.err))]
        for t in self.readers:
            t.start()

    def _read(self, stream, lines):
        for line in stream:
            lines.append(line)
            if self.pattern and stream is self.proc.stdout and self.pattern.search(line):
                self.seen.set()
        self.seen.set()  # end of output: the waiter must not wait for a line that never comes

    def signal_after(self, pattern, signum, timeout=TIMEOUT_S):
        """Sends signum to mpirun once a stdout line matches pattern; False if it never did."""
        self.pattern = re.compile(pattern)
        if any(self.pattern.search(ln) for ln in list(self.out)):
            self.seen.set()
        self.seen.wait(timeout)
        if self.proc.poll() is not None or not any(self.pattern.search(ln) for ln in self.out):
            return False
        self.proc.send_signal(signum)
        return True

    def wait(self, timeout=TIMEOUT_S):
        """(exit code, stdout, stderr); kills the job and raises TimeoutExpired on a hang."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        finally:
            for t in self.readers:
                t.join(30)
            self.proc.stdout.close()
            self.proc.stderr.close()
        return self.proc.returncode, "".join(self.out), "".join(self.err)


class TestCheckpointFaults(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="checkpoint_faults_")
        # The straight run: its loss curve is the reference for every resume of 20 iterations,
        # its checkpoints (5, 10, 15, 20) the valid checkpoint each corruption case copies.
        cls.base = os.path.join(cls.tmp, "base")
        proc = run(argv(save=cls.base, save_interval=5))
        assert proc.returncode == 0, f"the reference run failed:\n{proc.stderr[-3000:]}"
        cls.ref = losses(proc.stdout)
        assert sorted(cls.ref) == list(range(1, 21)), proc.stdout[-3000:]
        assert committed(cls.base) == [5, 10, 15, 20] and read_tracker(cls.base) == "20"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def fresh_dir(self, name):
        path = os.path.join(self.tmp, f"{self.id().rsplit('.', 1)[-1]}_{name}")
        shutil.rmtree(path, ignore_errors=True)
        return path

    def copy_base(self, name):
        path = self.fresh_dir(name)
        shutil.copytree(self.base, path)
        return path

    def assertNoCrash(self, stderr):
        for marker in CRASH_MARKERS:
            self.assertNotIn(marker, stderr, f"crash marker {marker!r} in stderr:\n{stderr}")

    def assertAgreedError(self, proc, code, *needles):
        """Exit `code`, every needle in the message, said once for every rank: rank 0 prints
        one "error: [rank 0] all N ranks stopped: ..." line holding needles[0] (with "rank R: "
        before the part that came from rank R when R failed, not rank 0), no other rank prints
        it. Returns the lines."""
        self.assertEqual(proc.returncode, code, f"expected exit {code}, got {proc.returncode}\n"
                                                f"stderr:\n{proc.stderr[-3000:]}")
        for n in needles:
            self.assertIn(n, proc.stderr, f"stderr does not name {n!r}:\n{proc.stderr}")
        self.assertNoCrash(proc.stderr)
        lines = [ln for ln in proc.stderr.splitlines()
                 if ln.startswith("error: [rank ") and needles[0] in ln]
        self.assertEqual(len(lines), 1, f"one line, from rank 0, expected:\n{proc.stderr}")
        self.assertTrue(lines[0].startswith(f"error: [rank 0] all {RANKS} ranks stopped: "),
                        lines[0])
        return lines

    def assertContinues(self, proc, first, last, ref):
        """The run printed exactly iterations first..last, each loss equal to ref's."""
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        got = losses(proc.stdout)
        self.assertEqual(sorted(got), list(range(first, last + 1)), proc.stdout[-3000:])
        for it in range(first, last + 1):
            self.assertEqual(got[it], ref[it], f"iteration {it}: resumed {got[it]}, straight "
                                               f"{ref[it]}")

    # ---- corrupt checkpoints: exit 2, the file named, on every rank ----

    def test_corrupt_checkpoints_are_refused_by_name(self):
        def truncate(path, size):
            with open(path, "r+b") as f:
                f.truncate(size)

        def flip_byte(path):
            at = tensor_data_offset(path)
            with open(path, "r+b") as f:
                f.seek(at)
                b = f.read(1)[0]
                f.seek(at)
                f.write(bytes([b ^ 0x01]))  # the lowest mantissa bit of a float: same size

        def write_tracker(ckpt, text):
            with open(os.path.join(ckpt, TRACKER), "w", encoding="utf-8") as f:
                f.write(text)

        def rank_file(ckpt, rank):
            return os.path.join(iter_dir(ckpt, 20), f"rank_{rank:05d}.safetensors")

        def meta(ckpt):
            return os.path.join(iter_dir(ckpt, 20), "metadata.json")

        # (name, corruption, extra flags, needles): the first needle is on every rank's line.
        cases = [
            ("shard one byte short",
             lambda d: truncate(rank_file(d, 1), os.path.getsize(rank_file(d, 1)) - 1), {},
             lambda d: [f"checkpoint shard {rank_file(d, 1)} is "
                        f"{os.path.getsize(rank_file(d, 1))} bytes but {meta(d)} records "
                        f"{os.path.getsize(rank_file(d, 1)) + 1}", "truncated"]),
            ("flipped bit", lambda d: flip_byte(rank_file(d, 1)), {},
             lambda d: [f"checkpoint shard {rank_file(d, 1)}: tensor ",
                        "fails its checksum (XXH3-64"]),
            ("flipped byte, --verify-integrity", lambda d: flip_byte(rank_file(d, 1)),
             {"verify_integrity": True},
             lambda d: [f"checkpoint shard {rank_file(d, 1)} fails --verify-integrity",
                        "SHA-256"]),
            ("missing shard", lambda d: os.remove(rank_file(d, 0)), {},
             lambda d: [f"checkpoint shard {rank_file(d, 0)} is missing"]),
            ("tracker holds 'abc'", lambda d: write_tracker(d, "abc\n"), {},
             lambda d: [f"the checkpoint tracker {os.path.join(d, TRACKER)} holds 'abc'",
                        "--ckpt-step"]),
            ("tracker names a missing iteration", lambda d: write_tracker(d, "30\n"), {},
             lambda d: [f"checkpoint directory {iter_dir(d, 30)} does not exist"]),
            ("metadata.json truncated",
             lambda d: truncate(meta(d), os.path.getsize(meta(d)) // 2), {},
             lambda d: [f"checkpoint manifest {meta(d)} is unreadable"]),
            ("metadata.json removed", lambda d: os.remove(meta(d)), {},
             lambda d: [f"checkpoint directory {iter_dir(d, 20)} has no metadata.json",
                        "never completed"]),
        ]
        for name, corrupt, extra, needles in cases:
            with self.subTest(case=name):
                d = self.copy_base(re.sub(r"\W+", "_", name))
                corrupt(d)
                start = time.monotonic()
                proc = run(argv(load=d, **extra))
                self.assertAgreedError(proc, 2, *needles(d))
                self.assertNotIn("successfully loaded", proc.stdout)
                self.assertEqual(losses(proc.stdout), {}, "refused before any training")
                self.assertLess(time.monotonic() - start, 60, "the refusal took too long")

        # With --no-verify-integrity the flipped bit goes unnoticed: the size matches the
        # manifest and only the checksums, which that flag skips, could tell. The run loads the
        # perturbed weight and goes on.
        d = self.copy_base("flipped_unverified")
        flip_byte(rank_file(d, 1))
        # (One more iteration than the checkpoint's run: its schedule's length is overridden, as
        # Megatron asks.)
        proc = run([*argv(load=d, train_iters=21, no_verify_integrity=True),
                    "--override-opt_param-scheduler"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn(f"successfully loaded checkpoint from {d}", proc.stdout)
        self.assertEqual(sorted(losses(proc.stdout)), [21])

    def test_an_uncommitted_iteration_is_never_loaded(self):
        # A save that died before its commit leaves iter_N.staging (with or without a
        # metadata.json: rank 0 writes it just before the rename). The tracker still names the
        # previous checkpoint, which is what loads; asking for N is refused by name.
        for with_metadata in (False, True):
            with self.subTest(staging_has_metadata=with_metadata):
                d = self.copy_base(f"staging_{with_metadata}")
                staging = iter_dir(d, 25) + ".staging"
                shutil.copytree(iter_dir(d, 20), staging)
                if not with_metadata:
                    os.remove(os.path.join(staging, "metadata.json"))
                proc = run([*argv(load=d, train_iters=21), "--override-opt_param-scheduler"])
                self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
                self.assertIn(f"loading checkpoint from {d} at iteration 20", proc.stdout)
                self.assertEqual(sorted(losses(proc.stdout)), [21])
                proc = run(argv(load=d, ckpt_step=25, train_iters=30))
                self.assertAgreedError(proc, 2, f"checkpoint directory {iter_dir(d, 25)} does "
                                                "not exist")

    # ---- a rank dies or fails while saving ----

    def test_kill_during_async_save_keeps_the_previous_checkpoint(self):
        d = self.fresh_dir("ckpt")
        start = time.monotonic()
        proc = run(argv(save=d, save_interval=5, async_save=True,
                        inject_fault="kill-in-save:1:10"))
        self.assertNotEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertLess(time.monotonic() - start, 60, "the job took too long to go down")
        self.assertIn("saving checkpoint at iteration      10", proc.stdout)
        self.assertNotIn("successfully saved checkpoint from iteration      10", proc.stdout)
        self.assertEqual(read_tracker(d), "5")
        self.assertEqual(committed(d), [5])
        self.assertFalse(os.path.exists(iter_dir(d, 10)), "iteration 10 was committed")
        staging = iter_dir(d, 10) + ".staging"
        self.assertFalse(os.path.exists(os.path.join(staging, "metadata.json")))
        # Resume into the same directory: from 5, the straight run's curve, and the stale
        # staging directory replaced by the committed iteration 10.
        proc = run(argv(load=d, save=d, save_interval=5, async_save=True))
        self.assertIn(f"loading checkpoint from {d} at iteration 5", proc.stdout)
        self.assertContinues(proc, 6, 20, self.ref)
        self.assertEqual(committed(d), [5, 10, 15, 20])
        self.assertEqual(read_tracker(d), "20")
        self.assertEqual(leftovers(d), [])

    def test_failed_write_is_agreed_and_discarded(self):
        for mode in ("sync", "async"):
            with self.subTest(save=mode):
                d = self.fresh_dir(mode)
                extra = {"async_save": True} if mode == "async" else {}
                proc = run(argv(save=d, save_interval=5, inject_fault="fail-in-save:1:10",
                                **extra))
                lines = self.assertAgreedError(
                    proc, 1, "saving the checkpoint of iteration 10 failed",
                    "No space left on device")
                self.assertIn("[rank 1] injected fault (--inject-fault fail-in-save)",
                              proc.stderr)
                self.assertTrue(any(ln.startswith("error: [rank 0] ") and "rank 1: " in ln
                                    for ln in lines), f"rank 0 names the failing rank:\n{lines}")
                self.assertEqual(read_tracker(d), "5")
                self.assertEqual(committed(d), [5])
                self.assertEqual(leftovers(d), [], "the failed save's staging is removed")
                # Iteration 5 still loads, and continues the straight run.
                proc_load = run(argv(load=d, exit_interval=6))
                self.assertContinues(proc_load, 6, 6, self.ref)
                # A real ENOSPC names the file ("cannot write safetensors file PATH: writing
                # failed: ..."); the injected one should read the same, so that this test checks
                # what an operator would see.
                for ln in lines:
                    self.assertRegex(ln, r"iter_0000010[^ ]*/rank_00001\.safetensors",
                                     "the failed write's message should name the file")

    # ---- graceful exits: signals, duration ----

    def check_one_checkpoint_at(self, d, stdout, lines_may_drop=False):
        """One committed checkpoint, the tracker's; returns its iteration. lines_may_drop: the
        output was non-blocking after the signal, so the save's log line may be missing."""
        k = read_tracker(d)
        self.assertIsNotNone(k, "no tracker written")
        k = int(k)
        self.assertEqual(committed(d), [k], os.listdir(d))
        self.assertEqual(leftovers(d), [])
        with open(os.path.join(iter_dir(d, k), "metadata.json"), encoding="utf-8") as f:
            meta = json.load(f)
        self.assertEqual(meta["iteration"], k)
        self.assertEqual(len(meta["files"]), RANKS, meta["files"])  # every rank saved at k
        for name in meta["files"]:
            self.assertTrue(os.path.exists(os.path.join(iter_dir(d, k), name)), name)
        saved = stdout.count("successfully saved checkpoint from iteration")
        self.assertIn(saved, (0, 1) if lines_may_drop else (1,))
        return k

    def check_resume_continues(self, d, k, train_iters, straight_prefix=None):
        """Straight run to k + 10 and resumed run from d's checkpoint k: equal losses after k
        (and the interrupted run's, where it printed them, equal the straight run's up to k)."""
        flags = {"train_iters": train_iters, "exit_interval": k + 10}
        straight = run(argv(**flags))
        self.assertEqual(straight.returncode, 0, straight.stderr[-3000:])
        ref = losses(straight.stdout)
        self.assertEqual(sorted(ref), list(range(1, k + 11)))
        if straight_prefix is not None:
            self.assertEqual(straight_prefix, {i: ref[i] for i in straight_prefix})
        resumed = run(argv(load=d, **flags))
        self.assertIn(f"loading checkpoint from {d} at iteration {k}", resumed.stdout)
        self.assertContinues(resumed, k + 1, k + 10, ref)

    def test_sigterm_to_mpirun_saves_and_resumes(self):
        d = self.fresh_dir("ckpt")
        # Long enough to be still training when mpirun passes the signal on, SIGKILL_TIMEOUT_S
        # later; logging every iteration, which fills the output mpirun no longer reads.
        job = Job(argv(save=d, exit_signal_handler=True, train_iters=100000, log_interval=1),
                  env={"OMPI_MCA_odls_base_sigkill_timeout": str(SIGKILL_TIMEOUT_S)})
        self.assertTrue(job.signal_after(r"^training \.\.\.", signal.SIGTERM),
                        "the run ended before it was signalled")
        start = time.monotonic()
        rc, out, err = job.wait(TIMEOUT_S)
        elapsed = time.monotonic() - start
        # mpirun exits 1 on SIGTERM whatever the ranks returned; the ranks' code 3 is not seen.
        self.assertNotEqual(rc, 0, err[-3000:])
        self.assertLess(elapsed, 2 * SIGKILL_TIMEOUT_S + 30)
        self.assertNoCrash(err)
        self.assertLessEqual(out.count("[exiting program after receiving SIGTERM.] datetime: "),
                             1, out[-3000:])
        k = self.check_one_checkpoint_at(d, out, lines_may_drop=True)
        print(f"SIGTERM: saved at iteration {k}, mpirun exited {rc} {elapsed:.1f} s after the "
              "signal", file=sys.stderr)
        self.check_resume_continues(d, k, 100000)

    def test_sigusr1_exit_signal_saves_and_exits_3(self):
        d = self.fresh_dir("ckpt")
        job = Job(argv(save=d, exit_signal_handler=True, exit_signal="SIGUSR1", train_iters=200))
        self.assertTrue(job.signal_after(r"\] iteration +5/", signal.SIGUSR1),
                        "the run ended before it was signalled")
        rc, out, err = job.wait(TIMEOUT_S)
        self.assertEqual(rc, 3, err[-3000:])
        self.assertNoCrash(err)
        self.assertEqual(out.count("[exiting program after receiving SIGUSR1.] datetime: "), 1,
                         out[-3000:])
        k = self.check_one_checkpoint_at(d, out)
        print(f"SIGUSR1: signalled after iteration 5, saved at iteration {k}", file=sys.stderr)
        self.assertLess(k, 190, "the signal came too late to leave room for the resume")
        # Every rank stopped at k: the save at k is collective, and its checkpoint holds a file
        # of every rank (check_one_checkpoint_at); nothing was printed after it.
        self.assertEqual(max(losses(out)), k)
        self.check_resume_continues(d, k, 200, straight_prefix=losses(out))

    def test_exit_duration_saves_and_exits_3(self):
        d = self.fresh_dir("ckpt")
        proc = run(argv(save=d, exit_duration_in_mins=0.02, train_iters=100000))
        self.assertEqual(proc.returncode, 3, proc.stderr[-3000:])
        self.assertNoCrash(proc.stderr)
        self.assertEqual(proc.stdout.count("[exiting program after "), 1)
        self.assertRegex(proc.stdout, r"\[exiting program after [0-9.]+ minutes\] datetime: ")
        k = self.check_one_checkpoint_at(d, proc.stdout)
        self.assertEqual(max(losses(proc.stdout)), k)

    # ---- the watchdog ----

    def test_watchdog_ends_a_hung_job(self):
        start = time.monotonic()
        proc = run(argv(inject_fault="hang:1:3", distributed_timeout_minutes=0.05), timeout=60)
        elapsed = time.monotonic() - start
        # MPI_Abort(1) from the watchdog's thread: mpirun exits with that code.
        self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
        # 3 s of limit, detected within a quarter of it, plus start-up and the abort.
        self.assertLess(elapsed, 30, f"the job took {elapsed:.0f} s to go down")
        self.assertIn("injected fault (--inject-fault): rank 1 hangs at the start of iteration 3",
                      proc.stderr)
        lines = re.findall(r"\[rank (\d+)\] watchdog: no progress for [0-9.]+ s \(limit "
                           r"--distributed-timeout-minutes = 0.05 min\) in phase '([\w-]+)' at "
                           r"iteration (\d+)", proc.stderr)
        self.assertTrue(lines, proc.stderr)
        for rank, phase, it in lines:
            self.assertIn(int(rank), range(RANKS))
            self.assertEqual((phase, it), ("train-step", "3"), proc.stderr)
        self.assertLessEqual(max(losses(proc.stdout)), 2, "no iteration after the hang")

    # ---- nothing to load, or another model ----

    def test_load_without_a_checkpoint(self):
        empty = self.fresh_dir("empty")
        os.makedirs(empty)
        missing = self.fresh_dir("missing")
        for d in (empty, missing):
            with self.subTest(load=os.path.basename(d)):
                proc = run(argv(load=d, exit_interval=2))
                self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
                out = proc.stdout
                self.assertEqual(out.count("WARNING: could not find the metadata file "
                                           f"{os.path.join(d, TRACKER)}"), 1, out[-3000:])
                self.assertIn("will not load any checkpoints and will start from random", out)
                # From random is from scratch: the straight run's first iterations.
                self.assertContinues(proc, 1, 2, self.ref)
                proc = run(argv(load=d, exit_on_missing_checkpoint=True))
                self.assertAgreedError(proc, 2, f"--load {d} has no checkpoint",
                                       "--exit-on-missing-checkpoint")
                self.assertEqual(losses(proc.stdout), {})

    def test_checkpoint_of_another_model_is_refused(self):
        proc = run(argv(load=self.base, num_layers=6, hidden_size=96))
        self.assertAgreedError(proc, 2, f"checkpoint {iter_dir(self.base, 20)} holds a "
                                        "different model", "--use-checkpoint-args")
        # The differences follow on lines of their own, once (rank 0 speaks for every rank).
        for diff in ("num_layers: checkpoint 4, this run 6",
                     "hidden_size: checkpoint 64, this run 96"):
            self.assertEqual(proc.stderr.count(diff), 1, proc.stderr)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
