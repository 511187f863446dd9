#!/usr/bin/env python3
"""`megatron serve` end to end, through a real HTTP client (http.client).

What it is: the server on the generation oracle's tiny GPT-2-style model (NullTokenizer, 1000
tokens, 64 positions; tests/reference/generate_oracle.py), one process and tp2 under mpiexec:
  - PUT /api greedy (top_k 1) gives PyTorch's argmax-of-full-forwards tokens, with Megatron's
    response fields (text, tokens, segments, logprobs of every token after the first, within 1e-4
    of PyTorch's: see tests/inference/test_generate_cli.py); scoring (tokens_to_generate 0); the
    default tokens_to_generate (64) shows in the positions refusal; random_seed reproduces.
  - Every validation rule of Megatron's PUT /api, each a 400 with its message.
  - POST /completions: temperature 0 is greedy, echo, stop strings, top-n log-probabilities when
    scoring, its refusals. GET /health.
  - 16 concurrent requests all answered, each as it is alone (batched with the others); malformed
    JSON (400), an oversized body (413), an unknown path (404), a request timeout (504), a full
    queue (503), and the server still answering afterwards.
  - SIGTERM while a request runs: it is answered, later ones are refused, exit 0 (mpirun exits 1
    on SIGTERM whatever its ranks do; under it the drain shows in the log).
  - A port in use: exit 2 naming --port.
  - A Megatron launch line (training flags with the static context's --inference-max-requests
    and --inference-max-seq-length): served, the same tokens, the length limit a 400.

Usage: test_serve_cli.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "..", "reference", "generate_oracle.py")
MEGATRON = None
MPIEXEC = None
TIMEOUT_S = 120
LOGPROB_TOL = 1e-4
_TMP = None
MODEL = None  # the oracle's output directory
EXPECTED = None


def setUpModule():
    global _TMP, MODEL, EXPECTED
    _TMP = tempfile.TemporaryDirectory()
    MODEL = os.path.join(_TMP.name, "gpt2")
    subprocess.run(["/usr/bin/python3", ORACLE, "--arch", "gpt2", "--out", MODEL], check=True,
                   timeout=TIMEOUT_S)
    subprocess.run([MEGATRON, "convert", "--load-hf", os.path.join(MODEL, "model"), "--save",
                    os.path.join(MODEL, "ckpt")], check=True, timeout=TIMEOUT_S,
                   capture_output=True)
    with open(os.path.join(MODEL, "expected.json")) as f:
        EXPECTED = json.load(f)


def tearDownModule():
    _TMP.cleanup()


def text(ids):
    return " ".join(map(str, ids))


class Server:
    """A `megatron serve` process (or mpiexec job) on a free port."""

    def __init__(self, ranks=1, extra=()):
        cmd = [MEGATRON, "serve", "--tokenizer-type", "NullTokenizer", "--port", "0",
               "--num-threads", "1", *extra]
        if ranks == 1:
            cmd += ["--pretrained-checkpoint", os.path.join(MODEL, "model")]
        else:
            cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", *cmd,
                   "--load", os.path.join(MODEL, "ckpt"), "--tensor-model-parallel-size",
                   str(ranks)]
        # Stopped by SIGTERM to mpirun, which passes it on after odls_base_sigkill_timeout
        # seconds and SIGKILLs the ranks as long again later: the drain needs mpirun's default
        # grace (1 s), which MPI_ENV takes away for the refusal-heavy tests.
        env = {**os.environ, **megatron_job.MPI_ENV, "OMPI_MCA_odls_base_sigkill_timeout": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.lines = []
        self.port = None
        deadline = time.time() + TIMEOUT_S
        while self.port is None and time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("server exited: " + self.proc.stderr.read())
            self.lines.append(line)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def request(self, method, path, body=None, raw=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT_S)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        payload = r.read().decode()
        conn.close()
        return r.status, json.loads(payload) if payload else None

    def api(self, body):
        return self.request("PUT", "/api", body)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=TIMEOUT_S)
        self.reader.join(timeout=10)
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc, "".join(self.lines), err


class TestApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        rc, _, err = cls.server.stop()
        assert rc == 0, err

    def test_greedy_matches_pytorch(self):
        prompts = [text(p) for p in EXPECTED["prompts"]]
        status, r = self.server.api({"prompts": prompts, "tokens_to_generate": 10, "top_k": 1,
                                     "logprobs": True})
        self.assertEqual(status, 200, r)
        self.assertEqual(sorted(r), ["logprobs", "segments", "text", "tokens"])
        for i, want in enumerate(EXPECTED["greedy"]):
            self.assertEqual(r["tokens"][i], want)
            self.assertEqual(r["text"][i], text(want))
            self.assertEqual(r["segments"][i], [str(t) for t in want])
            self.assertEqual(len(r["logprobs"][i]), len(want) - 1)
            err = max(abs(a - b) for a, b in zip(r["logprobs"][i], EXPECTED["logprobs"][i]))
            self.assertLess(err, LOGPROB_TOL)
        status, r = self.server.api({"prompts": prompts[:1], "tokens_to_generate": 10,
                                     "top_k": 1})
        self.assertEqual(status, 200)
        self.assertNotIn("logprobs", r)  # only when asked for

    def test_scoring(self):
        seq = EXPECTED["greedy"][1]
        status, r = self.server.api({"prompts": [text(seq)], "tokens_to_generate": 0,
                                     "logprobs": True})
        self.assertEqual(status, 200, r)
        self.assertEqual(r["tokens"][0], seq)
        err = max(abs(a - b) for a, b in zip(r["logprobs"][0], EXPECTED["logprobs"][1]))
        self.assertLess(err, LOGPROB_TOL)

    def test_default_tokens_to_generate_and_positions(self):
        # Megatron's default is 64 tokens; 3 + 64 exceeds the model's 64 positions.
        status, r = self.server.api({"prompts": ["1 2 3"]})
        self.assertEqual(status, 400)
        self.assertIn("tokens_to_generate 64", r["message"])
        status, r = self.server.api({"prompts": ["1 2 3"], "tokens_to_generate": 61})
        self.assertEqual(status, 200, r)
        self.assertLessEqual(len(r["tokens"][0]), 64)

    def test_random_seed_reproduces(self):
        body = {"prompts": ["5 6 7", "8"], "tokens_to_generate": 12, "temperature": 0.8,
                "random_seed": 11}
        a = self.server.api(body)[1]["tokens"]
        self.assertEqual(a, self.server.api(body)[1]["tokens"])
        self.assertNotEqual(a, self.server.api(dict(body, random_seed=12))[1]["tokens"])
        # top_p with decay and bound, add_BOS (the end-of-document id first)
        status, r = self.server.api(dict(body, top_p=0.9, top_p_decay=0.9, top_p_bound=0.5,
                                         add_BOS=True))
        self.assertEqual(status, 200, r)
        self.assertEqual(r["tokens"][0][:4], [999, 5, 6, 7])

    def test_validation(self):
        P = {"prompts": ["1 2"]}
        cases = [
            ({"tokens_to_generate": 1}, "prompts argument required"),
            (dict(P, max_len=3), "max_len is no longer used"),
            (dict(P, sentences=["a"]), "sentences is no longer used"),
            ({"prompts": "1 2"}, "prompts is not a list of strings"),
            ({"prompts": [1, 2]}, "prompts is not a list of strings"),
            ({"prompts": []}, "prompts is empty"),
            ({"prompts": ["1"] * 129}, "Maximum number of prompts is 128"),
            (dict(P, tokens_to_generate=1.5), "tokens_to_generate must be an integer"),
            (dict(P, tokens_to_generate=-1), "greater than or equal to 0"),
            (dict(P, logprobs="yes"), "logprobs must be a boolean value"),
            (dict(P, tokens_to_generate=0), "tokens_to_generate=0 implies logprobs"),
            (dict(P, temperature="hot"), "temperature must be a positive number"),
            (dict(P, temperature=0), "less than or equal to 100.0"),
            (dict(P, temperature=101), "less than or equal to 100.0"),
            (dict(P, top_k=1.5), "top_k must be an integer"),
            (dict(P, top_k=1001), "top_k must be equal to or greater than 0"),
            (dict(P, top_p=1), "top_p must be a positive float"),
            (dict(P, top_k=2, top_p=0.5), "cannot set both top-k and top-p samplings."),
            (dict(P, top_p=1.5), "top_p must be less than or equal to 1.0"),
            (dict(P, top_p_decay=0.5), "top_p_decay cannot be set without top_p"),
            (dict(P, top_p=0.5, top_p_decay=1.5), "top_p_decay must be less than or equal"),
            (dict(P, top_p=0.5, top_p_decay=1), "top_p_decay must be a positive float"),
            (dict(P, top_p_bound=0.1), "top_p_bound cannot be set without top_p"),
            (dict(P, top_p=0.5, top_p_bound=0.6), "top_p_bound must be greater than 0"),
            (dict(P, add_BOS=1), "add_BOS must be a boolean value"),
            ({"prompts": ["1", ""]}, "Empty prompts require add_BOS=true"),
            (dict(P, stop_on_eol="no"), "stop_on_eol must be a boolean value"),
            (dict(P, stop_on_double_eol=0), "stop_on_double_eol must be a boolean value"),
            (dict(P, prevent_newline_after_colon=0), "prevent_newline_after_colon must be"),
            (dict(P, random_seed="x"), "random_seed must be integer"),
            (dict(P, random_seed=-2), "random_seed must be a positive integer"),
            (dict(P, no_log=1), "no_log must be a boolean value"),
            (dict(P, beam_width="2"), "beam_width must be integer"),
            (dict(P, beam_width=0), "beam_width must be an integer > 1"),
            ({"prompts": ["1", "2"], "beam_width": 2}, "batch size must be 1"),
            (dict(P, stop_token="x"), "stop_token must be an integer"),
            (dict(P, length_penalty=1), "length_penalty must be a float"),
            (dict(P, top_k=1000, tokens_to_generate=1), "larger than the vocabulary"),
            ({"prompts": ["1 2 5000"], "tokens_to_generate": 1}, "outside [0, 1000)"),
        ]
        for body, needle in cases:
            with self.subTest(body=str(body)[:80]):
                status, r = self.server.api(body)
                self.assertEqual(status, 400, r)
                self.assertIn(needle, r["message"])

    def test_completions(self):
        prompt = EXPECTED["prompts"][0]
        want = EXPECTED["greedy"][0]
        status, r = self.server.request("POST", "/completions",
                                        {"prompt": text(prompt), "max_tokens": 10,
                                         "temperature": 0})
        self.assertEqual(status, 200, r)
        choice = r["choices"][0]
        gen = want[len(prompt):]
        self.assertEqual(choice["text"], " " + text(gen))
        self.assertEqual(choice["logprobs"]["tokens"], [str(t) for t in gen])
        lp = EXPECTED["logprobs"][0][len(prompt) - 1:]
        self.assertLess(max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"],
                                                       lp)), LOGPROB_TOL)
        # Token ids as the prompt, echo, a stop string: the text ends before its first match.
        stop = " " + str(gen[3])
        status, r = self.server.request("POST", "/completions",
                                        {"prompt": prompt, "max_tokens": 10, "temperature": 0,
                                         "echo": True, "stop": stop})
        self.assertEqual(status, 200, r)
        full = text(want)
        self.assertEqual(r["choices"][0]["text"], full[:full.index(stop, len(text(prompt)))])
        self.assertIsNone(r["choices"][0]["logprobs"]["token_logprobs"][0])
        # Scoring with the top-3 log-probabilities at every position after the first.
        status, r = self.server.request("POST", "/completions",
                                        {"prompt": text(want), "max_tokens": 0, "echo": True,
                                         "logprobs": 3})
        self.assertEqual(status, 200, r)
        top = r["choices"][0]["logprobs"]["top_logprobs"]
        self.assertIsNone(top[0])
        for k in range(1, len(want)):
            self.assertEqual(len(top[k]), 3)
            if k >= len(prompt):  # greedy tokens are the most likely ones
                best = max(top[k], key=top[k].get)
                self.assertEqual(best, str(want[k]))
        for body, needle in [({"prompt": "1", "max_tokens": 2, "best_of": 2}, "best_of > 1"),
                             ({"prompt": "1", "max_tokens": 2, "n": 2}, "num_completions > 1"),
                             ({"prompt": "1", "max_tokens": 0}, "echo=False not supported"),
                             ({"prompt": "1", "max_tokens": 2, "logprobs": 2}, "cannot return"),
                             ({"prompt": "1", "max_tokens": 0, "echo": True, "logprobs": 11},
                              "> 10 not supported"),
                             ({"prompt": "1"}, "max_tokens is required"),
                             ({"prompt": [], "max_tokens": 1}, "no items"),
                             ({"prompt": {"a": 1}, "max_tokens": 1}, "Unknown prompt type")]:
            with self.subTest(body=body):
                status, r = self.server.request("POST", "/completions", body)
                self.assertEqual(status, 400, r)
                self.assertIn(needle, r["message"])

    def test_bad_requests_leave_the_server_alive(self):
        for method, path, raw, code in [("PUT", "/api", "{not json", 400),
                                        ("PUT", "/api", "x" * (2 << 20), 413),
                                        ("PUT", "/api", "[1, 2]", 400),
                                        ("GET", "/nowhere", None, 404),
                                        ("POST", "/api", "{}", 404)]:
            with self.subTest(path=path, code=code):
                status, r = self.server.request(method, path, raw=raw)
                self.assertEqual(status, code, r)
                self.assertIn("message", r)
        status, r = self.server.request("GET", "/health")
        self.assertEqual((status, r["status"]), (200, "ok"))
        status, r = self.server.api({"prompts": ["1 2"], "tokens_to_generate": 2})
        self.assertEqual(status, 200)

    def test_concurrent_requests(self):
        # 16 clients at once, each a different greedy prompt; every answer equals the same
        # request made alone.
        prompts = [text([7 * i + 1, 3 * i + 2]) for i in range(16)]
        alone = [self.server.api({"prompts": [p], "tokens_to_generate": 8, "top_k": 1})[1]
                 for p in prompts]
        answers = [None] * 16

        def client(i):
            answers[i] = self.server.api({"prompts": [prompts[i]], "tokens_to_generate": 8,
                                          "top_k": 1})

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=TIMEOUT_S)
        for i in range(16):
            self.assertEqual(answers[i][0], 200)
            self.assertEqual(answers[i][1]["tokens"], alone[i]["tokens"])


class TestLimits(unittest.TestCase):
    def test_timeout_and_full_queue(self):
        server = Server(extra=["--request-timeout", "0.02", "--max-queued-requests", "2",
                               "--inference-max-batch-size", "1", "--no-request-batching"])
        try:
            codes = []
            lock = threading.Lock()

            def client(i):
                # 8 prompts one at a time, 24 steps each: well beyond 20 ms on any CPU here
                status, _ = server.api({"prompts": [text([i + 1] * 40)] * 8,
                                        "tokens_to_generate": 24, "top_k": 1, "no_log": True})
                with lock:
                    codes.append(status)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=TIMEOUT_S)
            self.assertEqual(len(codes), 12)
            self.assertIn(504, codes)  # waited beyond --request-timeout
            self.assertIn(503, codes)  # found the queue full
            self.assertTrue(set(codes) <= {200, 503, 504}, codes)
            status, _ = server.request("GET", "/health")
            self.assertEqual(status, 200)
        finally:
            rc, _, err = server.stop()
        self.assertEqual(rc, 0, err)


class TestShutdown(unittest.TestCase):
    def check_drain(self, ranks):
        server = Server(ranks)
        result = {}

        def long_request():
            result["answer"] = server.api({"prompts": [text([5] * 10)] * 8,
                                           "tokens_to_generate": 50, "top_k": 1})

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.3)  # the request is running
        rc, out, err = server.stop()
        t.join(timeout=TIMEOUT_S)
        self.assertEqual(result["answer"][0], 200)
        self.assertEqual(len(result["answer"][1]["tokens"]), 8)
        self.assertIn("server stopped after", out)
        for marker in megatron_job.CRASH_MARKERS:
            self.assertNotIn(marker, err)
        return rc

    def test_sigterm_drains_and_exits_0(self):
        self.assertEqual(self.check_drain(1), 0)

    def test_sigterm_drains_under_mpiexec(self):
        self.check_drain(2)  # mpirun's own exit code on SIGTERM is 1

    def test_greedy_at_tp2(self):
        server = Server(2)
        try:
            prompts = [text(p) for p in EXPECTED["prompts"]]
            status, r = server.api({"prompts": prompts, "tokens_to_generate": 10, "top_k": 1})
            self.assertEqual(status, 200, r)
            self.assertEqual(r["tokens"], EXPECTED["greedy"])
        finally:
            server.stop()

    def test_megatron_launch_line(self):
        # tools/run_text_generation_server.py parses all of arguments.py, so its launch lines
        # carry training flags: accepted, each with its start-up line, changing no token;
        # --inference-max-requests and --inference-max-seq-length are the static context's.
        server = Server(extra=["--tensor-model-parallel-size", "1", "--micro-batch-size", "1",
                               "--seed", "42", "--no-load-rng", "--no-load-optim",
                               "--exit-on-missing-checkpoint", "--inference-max-requests", "2",
                               "--inference-max-seq-length", "20", "--enable-cuda-graph"])
        try:
            prompts = [text(p) for p in EXPECTED["prompts"]]
            # The longest prompt has 12 tokens: 8 more reach the 20 allowed.
            status, r = server.api({"prompts": prompts, "tokens_to_generate": 8, "top_k": 1})
            self.assertEqual(status, 200, r)
            for got, want, prompt in zip(r["tokens"], EXPECTED["greedy"], EXPECTED["prompts"]):
                self.assertEqual(got, want[:len(prompt) + 8])
            status, r = server.api({"prompts": prompts, "tokens_to_generate": 9, "top_k": 1})
            self.assertEqual(status, 400)
            self.assertIn("--inference-max-seq-length 20", r["message"])
        finally:
            rc, out, err = server.stop()
        self.assertEqual(rc, 0, err)
        self.assertIn(" > --micro-batch-size 1: a training batch size", out)
        self.assertIn(" > --no-load-optim: inference loads the model's weights only", out)

    def test_port_in_use(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            port = s.getsockname()[1]
            r = subprocess.run([MEGATRON, "serve", "--tokenizer-type", "NullTokenizer",
                                "--pretrained-checkpoint", os.path.join(MODEL, "model"),
                                "--port", str(port)], capture_output=True, text=True,
                               timeout=TIMEOUT_S)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--port", r.stderr)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
