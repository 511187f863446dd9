#!/usr/bin/env python3
"""An independent reader and writer of Megatron's indexed dataset, and end-to-end tests of
`megatron preprocess` built on them.

What this is: a second implementation of the MMIDIDX version-1 format (`<prefix>.idx` header,
sequence lengths, byte pointers, document indices; `<prefix>.bin` token ids back to back), written
from the format's description in Megatron-LM's megatron/core/datasets/indexed_dataset.py with
NumPy, so that our C++ reader and writer are checked against something that does not share their
code or their mistakes. The `preprocess` tests also recompute, from the JSON-lines input, what
tools/preprocess_data.py would write with the NullTokenizer (ids are the text's space-separated
integers), including its rules for list values and empty documents.

What this is not: it imports nothing from the project; it is not Megatron's own reader (that
needs PyTorch) and does not support the multimodal `sequence_modes` array.

Usage:
  idx_independent.py write --prefix P --dtype uint16 --seed 0 --expect OUT.json
      writes P.bin/P.idx with random documents and the documents as JSON
      ([[sequence, ...], ...], one list of sequences per document)
  idx_independent.py verify --prefix P --expect IN.json
      reads P.bin/P.idx, checks every invariant of the format and the documents; exit 0 if equal
  idx_independent.py preprocess-tests --megatron PATH/TO/megatron [unittest options]
      runs `megatron preprocess` on generated JSON lines and checks its output
"""

import argparse
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
HEADER_BYTES = 34
# Megatron's DType codes (indexed_dataset.py, class DType).
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
CODES = {np.dtype(t).name: c for c, t in DTYPES.items()}


class FormatError(Exception):
    pass


def write_dataset(prefix, documents, dtype):
    """documents: list of documents, each a list of sequences (lists of ints)."""
    dtype = np.dtype(dtype)
    lengths, docs, chunks = [], [0], []
    for doc in documents:
        for seq in doc:
            arr = np.asarray(seq, dtype=np.int64)
            assert np.all(arr.astype(dtype).astype(np.int64) == arr), "id does not fit dtype"
            chunks.append(arr.astype(dtype.newbyteorder("<")).tobytes())
            lengths.append(len(seq))
        docs.append(len(lengths))
    with open(prefix + ".bin", "wb") as f:
        f.write(b"".join(chunks))
    lengths = np.asarray(lengths, dtype="<i4")
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize)
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype.name]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(docs)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.asarray(docs, dtype="<i8").tobytes())


def read_dataset(prefix):
    """Returns (dtype, documents); raises FormatError on any violation of the format."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    if len(idx) < HEADER_BYTES:
        raise FormatError(f"idx is {len(idx)} bytes, shorter than the header")
    if idx[:9] != MAGIC:
        raise FormatError(f"bad magic {idx[:9]!r}")
    (version,) = struct.unpack_from("<Q", idx, 9)
    if version != 1:
        raise FormatError(f"version {version}")
    code = idx[17]
    if code not in DTYPES:
        raise FormatError(f"dtype code {code}")
    dtype = np.dtype(DTYPES[code]).newbyteorder("<")
    s, d = struct.unpack_from("<QQ", idx, 18)
    if len(idx) != HEADER_BYTES + 12 * s + 8 * d:
        raise FormatError(f"idx is {len(idx)} bytes, expected {HEADER_BYTES + 12 * s + 8 * d}")
    lengths = np.frombuffer(idx, "<i4", s, HEADER_BYTES).astype(np.int64)
    pointers = np.frombuffer(idx, "<i8", s, HEADER_BYTES + 4 * s)
    doc_idx = np.frombuffer(idx, "<i8", d, HEADER_BYTES + 12 * s)
    if np.any(lengths < 0):
        raise FormatError("negative sequence length")
    expect_ptr = np.concatenate([[0], np.cumsum(lengths * dtype.itemsize)[:-1]]) if s else []
    if not np.array_equal(pointers, np.asarray(expect_ptr, dtype=np.int64)):
        raise FormatError("pointers are not the prefix sums of the lengths")
    if d < 1 or doc_idx[0] != 0 or doc_idx[-1] != s or np.any(np.diff(doc_idx) < 0):
        raise FormatError(f"bad document indices {doc_idx[:4]}...{doc_idx[-4:]}")
    tokens = np.fromfile(prefix + ".bin", dtype=dtype)
    if os.path.getsize(prefix + ".bin") != int(lengths.sum()) * dtype.itemsize:
        raise FormatError(".bin size does not match the lengths")
    starts = pointers // dtype.itemsize
    seqs = [tokens[starts[i]:starts[i] + lengths[i]].astype(np.int64).tolist() for i in range(s)]
    documents = [seqs[doc_idx[k]:doc_idx[k + 1]] for k in range(d - 1)]
    return dtype, documents


def random_documents(seed, dtype, count=300):
    """Documents with every shape the format allows: empty documents, several sequences, empty
    sequences, and ids at both ends of the dtype's range."""
    rng = random.Random(seed)
    lo, hi = -1000, 1000  # float dtypes: integers they hold exactly
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        lo, hi = max(int(info.min), -(1 << 40)), min(int(info.max), 1 << 40)
    docs = []
    for k in range(count):
        if k % 17 == 3:
            docs.append([])
            continue
        doc = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            n = rng.choice([0, 1, 2, rng.randint(3, 40), rng.randint(40, 600)])
            doc.append([rng.choice([lo, hi, rng.randint(lo, hi)]) for _ in range(n)])
        docs.append(doc)
    return docs


# --------------------------------------------------------------------------------------------
# megatron preprocess, end to end

MEGATRON = None  # set from --megatron
TIMEOUT_S = 300
CRASH_MARKERS = ("terminate called", "Aborted", "core dumped", "Segmentation fault",
                 "internal error", "Traceback")
PROGRESS_RE = re.compile(r"^Processed (\d+) documents \(([0-9.]+) docs/s, ([0-9.]+) MB/s\)\.$",
                         re.M)


def null_ids(text):
    """NullTokenizer: the text's whitespace-separated integers; empty text gives no ids (as a
    real tokenizer does, which is the case preprocess_data.py's rules are about)."""
    return [int(x) for x in text.split()]


def expected_documents(records, key, eod):
    """What preprocess_data.py's Encoder.encode makes of each line for `key` (eod None: no
    --append-eod): a string is one sentence, a list one sentence per element; sentences that
    tokenize to nothing are dropped; EOD goes at the end of a document that has any token."""
    docs = []
    for rec in records:
        value = rec[key]
        sentences = value if isinstance(value, list) else [value]
        seqs = [null_ids(s) for s in sentences]
        seqs = [s for s in seqs if s]
        if seqs and eod is not None:
            seqs[-1] = seqs[-1] + [eod]
        docs.append(seqs)
    return docs


def random_text(rng, vocab, n):
    return " ".join(str(rng.randrange(vocab)) for _ in range(n))


def generate_records(seed, count, vocab):
    rng = random.Random(seed)
    records = []
    for i in range(count):
        r = rng.random()
        if r < 0.03:
            text = []  # an empty document
        elif r < 0.05:
            text = ""  # an empty document too: no sequence, and no EOD
        elif r < 0.15:
            # One sequence per element; empty elements are dropped.
            text = [random_text(rng, vocab, rng.randint(1, 30)) for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.3:
                text.insert(rng.randrange(len(text) + 1), "")
        else:
            text = random_text(rng, vocab, rng.choice([1, 2, rng.randint(3, 100),
                                                        rng.randint(100, 2000)]))
        title = random_text(rng, vocab, rng.randint(1, 8))
        # Other keys, escapes and non-ASCII text must pass through untouched and unread.
        records.append({"id": i, "text": text, "title": title, "meta": {"src": "w\u00e9b \"q\""}})
    return records


def write_jsonl(path, records, newline="\n", trailing=True, ensure_ascii_every=2):
    with open(path, "w", encoding="utf-8", newline="") as f:
        lines = [json.dumps(r, ensure_ascii=(i % ensure_ascii_every == 0))
                 for i, r in enumerate(records)]
        f.write(newline.join(lines) + (newline if trailing else ""))


def run_preprocess(args):
    p = subprocess.run([MEGATRON, "preprocess"] + [str(a) for a in args], capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    for marker in CRASH_MARKERS:
        assert marker not in p.stderr, f"crash marker {marker!r} in stderr:\n{p.stderr}"
    return p


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


class PreprocessTest(unittest.TestCase):
    # Large enough to span several of the reader's 1 MiB chunks, so out-of-order completion
    # across workers is exercised.
    COUNT = 6000

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="megatron_preprocess_")
        cls.records = generate_records(1234, cls.COUNT, 1000)
        cls.jsonl = os.path.join(cls.dir, "input.jsonl")
        write_jsonl(cls.jsonl, cls.records)
        assert os.path.getsize(cls.jsonl) > 3 << 20, "input must span several chunks"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def preprocess(self, name, extra, input_path=None, vocab=1000):
        prefix = os.path.join(self.dir, name)
        p = run_preprocess(["--input", input_path or self.jsonl, "--output-prefix", prefix,
                            "--tokenizer-type", "NullTokenizer", "--vocab-size", vocab] + extra)
        return prefix, p

    def infer_eod(self, documents):
        for doc in documents:
            if doc:
                return doc[-1][-1]
        self.fail("no non-empty document")

    def check_content(self, prefix, key, records, eod_appended, vocab, want_dtype):
        dtype, docs = read_dataset(f"{prefix}_{key}_document")
        self.assertEqual(dtype, np.dtype(want_dtype))
        eod = None
        if eod_appended:
            eod = self.infer_eod(docs)
            # Megatron's NullTokenizer has used both conventions: eod = vocab_size - 1, or an
            # extra id eod = vocab_size.
            self.assertIn(eod, (vocab - 1, vocab))
        want = expected_documents(records, key, eod)
        self.assertEqual(len(docs), len(want))
        for k, (got, exp) in enumerate(zip(docs, want)):
            self.assertEqual(got, exp, f"document {k} (line {k + 1}) differs")

    def test_workers_byte_identical_and_content(self):
        outs = {}
        for workers in (1, 2, 4):
            prefix, p = self.preprocess(f"w{workers}", ["--append-eod", "--workers", workers,
                                                        "--log-interval", 1000])
            self.assertEqual(p.returncode, 0, p.stderr)
            outs[workers] = (file_bytes(prefix + "_text_document.bin"),
                             file_bytes(prefix + "_text_document.idx"))
            progress = PROGRESS_RE.findall(p.stderr)
            self.assertEqual([int(n) for n, _, _ in progress],
                             list(range(1000, self.COUNT + 1, 1000)), p.stderr)
        self.assertEqual(outs[1], outs[2], "--workers 2 output differs from --workers 1")
        self.assertEqual(outs[1], outs[4], "--workers 4 output differs from --workers 1")
        self.check_content(os.path.join(self.dir, "w1"), "text", self.records, True, 1000,
                           np.uint16)
        # Only the requested key is written.
        self.assertFalse(os.path.exists(os.path.join(self.dir, "w1_title_document.bin")))
        # No temporary files are left behind.
        self.assertEqual([f for f in os.listdir(self.dir) if ".tmp" in f], [])

    def test_without_eod(self):
        prefix, p = self.preprocess("noeod", ["--workers", 2])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.check_content(prefix, "text", self.records, False, 1000, np.uint16)

    def test_int32_for_large_vocab(self):
        records = generate_records(7, 500, 70000)
        path = os.path.join(self.dir, "big_vocab.jsonl")
        write_jsonl(path, records)
        prefix, p = self.preprocess("int32", ["--append-eod", "--workers", 2], path, vocab=70000)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.check_content(prefix, "text", records, True, 70000, np.int32)
        with open(prefix + "_text_document.idx", "rb") as f:
            self.assertEqual(f.read(18)[17], 4)  # int32's code

    def test_several_keys(self):
        prefix, p = self.preprocess("keys", ["--json-keys", "text", "title", "--append-eod",
                                             "--workers", 3])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.check_content(prefix, "text", self.records, True, 1000, np.uint16)
        self.check_content(prefix, "title", self.records, True, 1000, np.uint16)

    def test_crlf_and_no_trailing_newline(self):
        records = self.records[:50]
        path = os.path.join(self.dir, "crlf.jsonl")
        write_jsonl(path, records, newline="\r\n", trailing=False)
        prefix, p = self.preprocess("crlf", ["--append-eod", "--workers", 2], path)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.check_content(prefix, "text", records, True, 1000, np.uint16)

    def test_empty_input(self):
        path = os.path.join(self.dir, "empty.jsonl")
        open(path, "w").close()
        prefix, p = self.preprocess("empty", ["--append-eod"], path)
        self.assertEqual(p.returncode, 0, p.stderr)
        _, docs = read_dataset(prefix + "_text_document")
        self.assertEqual(docs, [])

    def expect_input_error(self, name, lines, *needles, extra=()):
        path = os.path.join(self.dir, name + ".jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        prefix, p = self.preprocess(name, ["--workers", 4] + list(extra), path)
        self.assertEqual(p.returncode, 2, p.stderr)
        for needle in needles:
            self.assertIn(needle, p.stderr)
        # Nothing is written when any line fails.
        self.assertFalse(os.path.exists(prefix + "_text_document.bin"))
        self.assertFalse(os.path.exists(prefix + "_text_document.idx"))
        self.assertEqual([f for f in os.listdir(self.dir) if ".tmp" in f], [])
        return p

    def test_bad_json_names_file_and_line(self):
        good = json.dumps({"text": "1 2 3"})
        self.expect_input_error("badjson", [good] * 6 + ['{"text": "1 2'] + [good] * 3,
                                "badjson.jsonl:7:", "JSON")

    def test_first_bad_line_reported(self):
        # Bad lines in different chunks: whichever worker finishes first, line 3 is reported.
        good = json.dumps({"text": random_text(random.Random(0), 1000, 3000)})
        lines = [good] * 2 + ["{oops"] + [good] * 2000 + ["{oops again"]
        self.expect_input_error("firstbad", lines, "firstbad.jsonl:3:")

    def test_missing_key_names_key_file_and_line(self):
        self.expect_input_error("nokey", [json.dumps({"text": "1"}), json.dumps({"body": "2"})],
                                "nokey.jsonl:2:", "'text'", "--json-keys")

    def test_wrong_value_types(self):
        self.expect_input_error("numval", [json.dumps({"text": 5})], "numval.jsonl:1:", "'text'",
                                "string")
        self.expect_input_error("listnum", [json.dumps({"text": ["1", 2]})], "listnum.jsonl:1:",
                                "element 1")
        self.expect_input_error("notobj", ["[1, 2]"], "notobj.jsonl:1:", "object")

    def test_blank_line(self):
        self.expect_input_error("blank", [json.dumps({"text": "1"}), ""], "blank.jsonl:2:",
                                "empty")

    def test_missing_input_and_bad_flags(self):
        prefix, p = self.preprocess("missing", [], os.path.join(self.dir, "nope.jsonl"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("nope.jsonl", p.stderr)
        p = run_preprocess(["--input", self.jsonl, "--tokenizer-type", "NullTokenizer",
                            "--vocab-size", 1000])
        self.assertEqual(p.returncode, 2)
        self.assertIn("--output-prefix", p.stderr)
        prefix, p = self.preprocess("kn", ["--keep-newlines"])
        self.assertEqual(p.returncode, 2)
        self.assertIn("--keep-newlines applies to --split-sentences", p.stderr)
        p = run_preprocess(["--input", self.jsonl, "--output-prefix",
                            os.path.join(self.dir, "no", "such", "dir", "x"),
                            "--tokenizer-type", "NullTokenizer", "--vocab-size", 1000])
        self.assertEqual(p.returncode, 2)
        self.assertIn("no/such/dir", p.stderr)


# --------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--prefix", required=True)
    w.add_argument("--dtype", required=True, choices=sorted(CODES))
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--expect", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--prefix", required=True)
    v.add_argument("--expect", required=True)
    v.add_argument("--dtype")
    t = sub.add_parser("preprocess-tests")
    t.add_argument("--megatron", required=True)
    args, rest = parser.parse_known_args()

    if args.command == "write":
        docs = random_documents(args.seed, np.dtype(args.dtype))
        write_dataset(args.prefix, docs, args.dtype)
        with open(args.expect, "w") as f:
            json.dump(docs, f)
        return 0
    if args.command == "verify":
        with open(args.expect) as f:
            want = json.load(f)
        try:
            dtype, docs = read_dataset(args.prefix)
        except FormatError as e:
            print(f"{args.prefix}: {e}", file=sys.stderr)
            return 1
        if args.dtype and dtype != np.dtype(args.dtype):
            print(f"{args.prefix}: dtype {dtype}, expected {args.dtype}", file=sys.stderr)
            return 1
        if docs != want:
            bad = next((k for k, (a, b) in enumerate(zip(docs, want)) if a != b), min(len(docs),
                                                                                    len(want)))
            print(f"{args.prefix}: {len(docs)} documents (expected {len(want)}); first "
                  f"difference at document {bad}", file=sys.stderr)
            return 1
        return 0
    global MEGATRON
    MEGATRON = os.path.abspath(args.megatron)
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
