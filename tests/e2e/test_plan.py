"""`megatron plan` end to end: ranked layouts, their launch lines, bad input, the trainer's check.

What it is: the planner on a GPU preset (a ranked JSON list; each layout's printed command,
evaluated again with --evaluate, predicts exactly what the list said, so the command is the
layout), on this machine (`--gpu cpu` under mpiexec measures the job's collectives; its best
two-rank command trains as printed), its refusals (nothing fits, nothing divides, an unknown
device, an impossible --evaluate layout: exit 2 with what would fit, no crash), the parameters a
rank holds under tensor parallelism against the trainer's own count, and the trainer's start-up
prediction and its check against the measured step. What it is not: a check of the predictions'
accuracy (bench/plan_vs_measured.py and bench/plan_published.py measure that).

Usage: test_plan.py --megatron BUILD/megatron --mpiexec MPIEXEC
"""
import json
import os
import re
import shlex
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402

MEGATRON = None
MPIEXEC = None
MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "64", "--max-position-embeddings", "64", "--vocab-size", "512"]
BIG = ["--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96",
       "--seq-length", "2048", "--max-position-embeddings", "2048", "--vocab-size", "51200",
       "--bf16"]


def plan(args, ranks=1, timeout=300):
    cmd = [MEGATRON, "plan", *args]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **megatron_job.MPI_ENV), check=False)


def launch_flags(command):
    """The megatron flags of a printed launch line (after `megatron pretrain_gpt`)."""
    words = shlex.split(command)
    return words[words.index("pretrain_gpt") + 1:]


class Plan(unittest.TestCase):
    def refused(self, proc, *phrases):
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:] + proc.stderr[-2000:])
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)
        for phrase in phrases:
            self.assertIn(phrase, proc.stderr)

    def test_muon_layouts_leave_out_the_layer_wise_optimizer(self):
        # Muon's --use-distributed-optimizer is its layer-wise optimizer, whose memory and
        # traffic the planner does not model: no layout proposes it, and evaluating it says so.
        gpu = ["--gpu", "a100-80", "--num-nodes", "2", "--gpus-per-node", "4"]
        args = [*gpu, *MODEL, "--bf16", "--global-batch-size", "32", "--optimizer", "muon"]
        proc = plan([*args, "--json", "--top", "1000"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        layouts = json.loads(proc.stdout)["layouts"]
        self.assertGreater(len(layouts), 20)
        self.assertEqual({l["layout"]["sharding"] for l in layouts}, {"ddp"})
        self.refused(plan([*args, "--use-distributed-optimizer", "--evaluate"]),
                     "the planner does not model the layer-wise distributed optimizer")
        # Its state: 4 bytes per element of the split (matrix) weights where Adam keeps 8. MODEL
        # (4 layers, h 128, ffn 512, biases) has 4 x 197504 of them at tp 1, 8 of its tensors
        # being biases the estimate counts among the matrices (4 x 1280 elements).
        one = ["--gpu", "a100-80", "--num-nodes", "1", "--gpus-per-node", "1", *MODEL, "--bf16",
               "--global-batch-size", "4", "--evaluate", "--json"]
        memory = {}
        for optimizer in ("adam", "muon"):
            proc = plan([*one, "--optimizer", optimizer])
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            memory[optimizer] = json.loads(proc.stdout)["layouts"][0]["memory_bytes"]
        self.assertAlmostEqual(memory["adam"]["weights_and_optimizer"] -
                               memory["muon"]["weights_and_optimizer"], 4 * 4 * 197504, delta=1)

    def test_ranked_layouts_and_their_commands(self):
        gpu = ["--gpu", "a100-80", "--num-nodes", "2", "--gpus-per-node", "4"]
        proc = plan([*gpu, *MODEL, "--bf16", "--global-batch-size", "32", "--json", "--top",
                     "0"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        doc = json.loads(proc.stdout)
        layouts = doc["layouts"]
        self.assertEqual(len(layouts), doc["candidates"])
        self.assertGreater(len(layouts), 20)
        fitting = [l for l in layouts if l["fits"]]
        steps = [l["step_seconds"] for l in fitting]
        self.assertEqual(steps, sorted(steps))
        names = {l["name"] for l in layouts}
        self.assertEqual(len(names), len(layouts), "a layout listed twice")
        for l in layouts:
            d = l["layout"]
            self.assertEqual(d["tp"] * d["cp"] * d["pp"] * d["dp"], 8, l["name"])
            self.assertEqual(32 % (d["micro_batch_size"] * d["dp"]), 0, l["name"])
            self.assertGreater(l["memory_bytes"]["total"], l["memory_bytes"]["activations"])
        # Each command is its layout: evaluated again, the same prediction (printed to 17
        # digits, the same arithmetic).
        for l in fitting[:3] + fitting[-2:]:
            again = plan([*gpu, *launch_flags(l["command"]), "--evaluate", "--json"])
            self.assertEqual(again.returncode, 0, again.stderr[-3000:])
            mine = json.loads(again.stdout)["layouts"][0]
            self.assertEqual(mine["name"], l["name"])
            self.assertAlmostEqual(mine["step_seconds"], l["step_seconds"], places=12)
            self.assertAlmostEqual(mine["memory_bytes"]["total"], l["memory_bytes"]["total"],
                                   delta=1.0)

    def test_fixed_flags_restrict_the_search(self):
        proc = plan(["--gpu", "h100-80", "--gpus-per-node", "8", *MODEL, "--bf16",
                     "--global-batch-size", "32", "--tensor-model-parallel-size", "2",
                     "--recompute-granularity", "full", "--json", "--top", "0"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        for l in json.loads(proc.stdout)["layouts"]:
            self.assertEqual(l["layout"]["tp"], 2)
            self.assertEqual(l["layout"]["recompute"], "full")

    def test_the_table_names_the_best_command(self):
        proc = plan(["--gpu", "b200", *MODEL, "--bf16", "--global-batch-size", "64"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("valid layouts", proc.stdout)
        self.assertRegex(proc.stdout, r"best 1: mpiexec -n 8 megatron pretrain_gpt .*"
                                      r"--micro-batch-size")
        self.assertRegex(proc.stdout, r"\n10: mpiexec -n 8 megatron pretrain_gpt ")

    def test_cpu_plan_measures_the_job_and_its_best_command_trains(self):
        proc = plan(["--gpu", "cpu", "--gpus-per-node", "2", *MODEL, "--global-batch-size", "8",
                     "--json", "--top", "1"], ranks=2)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        doc = json.loads(proc.stdout)
        self.assertEqual(doc["cluster"]["device"], "cpu")
        self.assertGreater(doc["cluster"]["intra_node"]["bandwidth"], 0)
        best = doc["layouts"][0]
        self.assertTrue(best["fits"])
        words = shlex.split(best["command"])
        self.assertEqual(words[:3], ["mpiexec", "-n", "2"])
        flags = launch_flags(best["command"])
        run = megatron_job.run_train(MEGATRON, MPIEXEC, 2,
                                     [*flags, "--mock-data", "--lr", "1e-3", "--train-iters", "2",
                                      "--eval-iters", "0"], timeout=300, command="pretrain_gpt")
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        self.assertIn("iteration        2/       2", run.stdout)

    def test_parameters_on_a_tensor_parallel_rank_match_the_trainer(self):
        layout = ["--tensor-model-parallel-size", "2", "--global-batch-size", "4",
                  "--micro-batch-size", "2"]
        proc = plan(["--gpu", "h100-80", "--gpus-per-node", "2", *MODEL, *layout, "--evaluate",
                     "--json"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        predicted = json.loads(proc.stdout)["layouts"][0]["parameters_on_rank"]
        run = megatron_job.run_train(MEGATRON, MPIEXEC, 2,
                                     [*MODEL, *layout, "--mock-data", "--lr", "1e-3",
                                      "--train-iters", "1", "--eval-iters", "0"], timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        counts = re.findall(r"model parallel rank \(\d+, \d+\): (\d+)", run.stdout)
        self.assertEqual(len(counts), 2, run.stdout[-3000:])
        self.assertEqual({int(c) for c in counts}, {int(predicted)})

    def test_uneven_pipeline_split(self):
        # --decoder-first-pipeline-num-layers 3 of 4 layers: stage 0 holds 3 layers and the
        # embedding, the most loaded stage, whose parameters are the trainer's count there.
        layout = ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers",
                  "3", "--global-batch-size", "4", "--micro-batch-size", "2"]
        proc = plan(["--gpu", "h100-80", "--gpus-per-node", "2", *MODEL, *layout, "--evaluate",
                     "--json"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        got = json.loads(proc.stdout)["layouts"][0]
        self.assertIn("first3", got["name"])
        self.assertEqual(got["memory_bytes"]["stage"], 0)
        run = megatron_job.run_train(MEGATRON, MPIEXEC, 2,
                                     [*MODEL, *layout, "--mock-data", "--lr", "1e-3",
                                      "--train-iters", "1", "--eval-iters", "0"], timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        counts = re.findall(r"model parallel rank \(0, (\d+)\): (\d+)", run.stdout)
        self.assertEqual(len(counts), 2, run.stdout[-3000:])
        by_stage = {int(stage): int(n) for stage, n in counts}
        self.assertGreater(by_stage[0], by_stage[1])
        self.assertEqual(by_stage[0], int(got["parameters_on_rank"]))
        # The search keeps the split for every layout, and refuses what it cannot split.
        proc = plan(["--gpu", "h100-80", "--gpus-per-node", "6", *MODEL, "--global-batch-size",
                     "12", "--decoder-first-pipeline-num-layers", "2", "--json", "--top", "0"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        pps = {l["layout"]["pp"] for l in json.loads(proc.stdout)["layouts"]}
        self.assertEqual(pps, {2, 3})  # 2 + 2, 2 + 1 + 1; pp1 and pp6 cannot split so
        self.refused(plan(["--gpu", "h100-80", "--gpus-per-node", "2", *MODEL, *layout[:2],
                           "--decoder-first-pipeline-num-layers", "5", "--global-batch-size",
                           "4", "--evaluate"]), "--decoder-first-pipeline-num-layers (5)")
        # A layout string: its stages fix pp x V; the best command quotes it for the shell and,
        # evaluated again, is the same layout.
        proc = plan(["--gpu", "h100-80", "--gpus-per-node", "2", *MODEL, "--global-batch-size",
                     "4", "--pipeline-model-parallel-layout", "E|tt|t|tL", "--json"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        best = json.loads(proc.stdout)["layouts"][0]
        self.assertEqual((best["layout"]["pp"], best["layout"]["vpp"]), (2, 2))
        self.assertIn("'E|tt|t|tL'", best["command"])
        self.assertNotIn("--num-virtual-stages-per-pipeline-rank", best["command"])
        again = plan(["--gpu", "h100-80", "--gpus-per-node", "2",
                      *launch_flags(best["command"]), "--evaluate", "--json"])
        self.assertEqual(again.returncode, 0, again.stderr[-3000:])
        self.assertEqual(json.loads(again.stdout)["layouts"][0]["name"], best["name"])
        # The search takes the layout's virtual stages, beyond the 8 it tries otherwise.
        proc = plan(["--gpu", "h100-80", "--gpus-per-node", "2", "--num-layers", "20",
                     *MODEL[2:], "--global-batch-size", "4", "--pipeline-model-parallel-layout",
                     "E(t|)*19tL", "--json"])
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        got = json.loads(proc.stdout)["layouts"][0]["layout"]
        self.assertEqual((got["pp"], got["vpp"]), (2, 10))

    def test_the_trainer_prints_its_prediction_and_checks_it(self):
        run = megatron_job.run_train(MEGATRON, MPIEXEC, 1,
                                     [*MODEL, "--mock-data", "--lr", "1e-3", "--micro-batch-size",
                                      "4", "--global-batch-size", "8", "--train-iters", "4",
                                      "--log-interval", "2", "--eval-iters", "0"], timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        self.assertRegex(run.stdout, r"planner prediction for this layout: step [0-9.]+ ms .*"
                                     r"peak memory [0-9.]+ MB per rank")
        check = re.search(r"planner vs measured: step ([0-9.]+) ms predicted, ([0-9.]+) ms "
                          r"measured \(([-+0-9.]+)%\); peak memory ([0-9.]+) MB predicted, "
                          r"([0-9.]+) MB max resident", run.stdout)
        self.assertIsNotNone(check, run.stdout[-3000:])
        self.assertGreater(float(check.group(2)), 0)
        self.assertGreater(float(check.group(5)), 0)

    def test_nothing_fits(self):
        self.refused(plan(["--gpu", "a100-80", "--gpus-per-node", "1", *BIG,
                           "--global-batch-size", "8"]),
                     "no layout fits in 80 GiB per device", "--num-nodes")

    def test_nothing_divides(self):
        # 7 devices: tp 7 breaks the heads, pp 7 the layers, dp 7 the batch.
        self.refused(plan(["--gpu", "h100-80", "--gpus-per-node", "7", *MODEL,
                           "--global-batch-size", "8"]),
                     "no layout of this model runs on 7 devices", "--global-batch-size")

    def test_unknown_device_and_impossible_layout(self):
        self.refused(plan(["--gpu", "v100", *MODEL, "--global-batch-size", "8"]),
                     "--gpu v100", "h100-80")
        self.refused(plan(["--gpu", "h100-80", "--gpus-per-node", "8", *MODEL,
                           "--global-batch-size", "8", "--tensor-model-parallel-size", "3",
                           "--evaluate"]),
                     "--tensor-model-parallel-size")
        self.refused(plan(["--gpu", "h100-80", *MODEL]), "--global-batch-size")


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
