#!/usr/bin/env python3
"""`megatron merge_datasets` (Megatron's tools/merge_datasets.py) against an independent writer.

What it is: datasets written by idx_independent.py's NumPy writer (random documents with empty
documents, empty sequences and ids at both ends of the dtype), merged by the command, and the
output compared byte for byte with the same writer's output for the concatenated documents in
sorted name order: what Megatron's IndexedDatasetBuilder.add_index writes (lengths and documents
appended with the sequence offset, the .bin bytes copied). Multimodal datasets (one int8 mode per
sequence after the document indices) likewise with --multimodal. Every refusal exits 2 naming
the file or flag and leaves no output behind.
What it is not: a test of the reader or builder alone (tests/data/test_indexed_dataset.cpp).

Also `megatron preprocess --partitions` (preprocess_data.py's partition files, per-partition
datasets and their merge, round-robin and --keep-sequential-samples, gzip inputs, reuse of
existing partition files), against Python's own text-mode reading of the inputs.

Usage: merge_datasets_test.py --megatron PATH/TO/megatron [unittest options]
"""
import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import idx_independent as idx  # noqa: E402

MEGATRON = None
TIMEOUT_S = 120
CRASH_MARKERS = idx.CRASH_MARKERS


def merge(*args):
    p = subprocess.run([MEGATRON, "merge_datasets", *[str(a) for a in args]],
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    for marker in CRASH_MARKERS:
        assert marker not in p.stderr, f"crash marker {marker!r} in stderr:\n{p.stderr}"
    return p


file_bytes = idx.file_bytes


def write_multimodal(prefix, documents, dtype, modes):
    """A multimodal dataset: the text format plus one int8 mode per sequence after the document
    indices (Megatron's _IndexWriter with sequence_modes)."""
    idx.write_dataset(prefix, documents, dtype)
    with open(prefix + ".idx", "ab") as f:
        f.write(np.asarray(modes, dtype=np.int8).tobytes())


class MergeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="megatron_merge_")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def folder(self, name):
        path = os.path.join(self.dir, name)
        os.makedirs(path)
        return path

    def assert_refused(self, proc, *fragments, output=None):
        self.assertEqual(proc.returncode, 2, proc.stderr)
        for fragment in fragments:
            self.assertIn(fragment, proc.stderr)
        if output:
            for ext in (".bin", ".idx"):
                self.assertFalse(os.path.exists(output + ext), output + ext)
            leftovers = [f for f in os.listdir(os.path.dirname(output))
                         if f.startswith(os.path.basename(output))]
            self.assertEqual(leftovers, [], "temporary files left behind")

    def test_merge_is_the_concatenation_in_sorted_order(self):
        for dtype, seeds in (("uint16", (1, 2, 3)), ("int32", (4, 5))):
            with self.subTest(dtype=dtype):
                src = self.folder("in_" + dtype)
                # Names that sort differently by length, case and dots; a sub-folder is skipped.
                names = ["b", "a.part", "B", "a"][:len(seeds) + 1]
                docs = {}
                for k, name in enumerate(names):
                    docs[name] = idx.random_documents(seeds[k % len(seeds)] + 10 * k,
                                                      np.dtype(dtype), count=150)
                    idx.write_dataset(os.path.join(src, name), docs[name], dtype)
                os.makedirs(os.path.join(src, "sub"))
                out = os.path.join(self.dir, "merged_" + dtype)
                p = merge("--input", src, "--output-prefix", out)
                self.assertEqual(p.returncode, 0, p.stderr)
                want = [d for name in sorted(names) for d in docs[name]]
                ref = os.path.join(self.dir, "ref_" + dtype)
                idx.write_dataset(ref, want, dtype)
                for ext in (".bin", ".idx"):
                    self.assertEqual(file_bytes(out + ext), file_bytes(ref + ext), ext)
                got_dtype, got = idx.read_dataset(out)
                self.assertEqual(got_dtype, np.dtype(dtype))
                self.assertEqual(got, want)
                self.assertIn(f"{len(want)} documents", p.stdout + p.stderr)

    def test_multimodal_modes_follow_their_sequences(self):
        src = self.folder("mm")
        rng = random.Random(7)
        docs, modes = {}, {}
        for name, seed in (("img", 8), ("txt", 9)):
            docs[name] = idx.random_documents(seed, np.dtype("uint16"), count=80)
            n = sum(len(d) for d in docs[name])
            modes[name] = [rng.randrange(-3, 4) for _ in range(n)]
            write_multimodal(os.path.join(src, name), docs[name], "uint16", modes[name])
        out = os.path.join(self.dir, "merged_mm")
        p = merge("--input", src, "--output-prefix", out, "--multimodal")
        self.assertEqual(p.returncode, 0, p.stderr)
        ref = os.path.join(self.dir, "ref_mm")
        write_multimodal(ref, docs["img"] + docs["txt"], "uint16", modes["img"] + modes["txt"])
        for ext in (".bin", ".idx"):
            self.assertEqual(file_bytes(out + ext), file_bytes(ref + ext), ext)
        # Without --multimodal the modes are not text: refused with the reason.
        out2 = os.path.join(self.dir, "merged_text")
        self.assert_refused(merge("--input", src, "--output-prefix", out2),
                            "sequence_modes of a multimodal dataset", output=out2)
        # And text datasets are not multimodal ones.
        text = self.folder("text")
        idx.write_dataset(os.path.join(text, "t"), docs["img"], "uint16")
        self.assert_refused(merge("--input", text, "--output-prefix", out2, "--multimodal"),
                            "no sequence_modes after document_indices", output=out2)

    def test_refusals_name_the_file_and_leave_nothing(self):
        out = os.path.join(self.dir, "out")
        mixed = self.folder("mixed")
        idx.write_dataset(os.path.join(mixed, "a"), [[[1, 2]]], "uint16")
        idx.write_dataset(os.path.join(mixed, "b"), [[[3]]], "int32")
        self.assert_refused(merge("--input", mixed, "--output-prefix", out),
                            "b.idx: dtype int32", "written as uint16", output=out)

        stray = self.folder("stray")
        idx.write_dataset(os.path.join(stray, "a"), [[[1]]], "uint16")
        with open(os.path.join(stray, "notes.txt"), "w") as f:
            f.write("x")
        self.assert_refused(merge("--input", stray, "--output-prefix", out),
                            ".idx file not provided for", "move notes.txt out of it",
                            output=out)

        lone = self.folder("lone")
        idx.write_dataset(os.path.join(lone, "a"), [[[1]]], "uint16")
        os.remove(os.path.join(lone, "a.idx"))
        self.assert_refused(merge("--input", lone, "--output-prefix", out),
                            ".idx file not provided for " + os.path.join(lone, "a"),
                            output=out)

        # Names split as os.path.splitext splits them: "..bin" has no extension, so it needs
        # a "..bin.idx" partner (the tool's rule), named in the refusal.
        dots = self.folder("dots")
        idx.write_dataset(os.path.join(dots, "a"), [[[1]]], "uint16")
        with open(os.path.join(dots, "..bin"), "wb") as f:
            f.write(b"")
        self.assert_refused(merge("--input", dots, "--output-prefix", out),
                            ".idx file not provided for " + os.path.join(dots, "..bin"),
                            output=out)

        empty = self.folder("empty")
        self.assert_refused(merge("--input", empty, "--output-prefix", out),
                            "holds no .bin/.idx pairs", output=out)
        self.assert_refused(merge("--input", os.path.join(self.dir, "missing"),
                                  "--output-prefix", out),
                            "is not a directory or does not exist")
        self.assert_refused(merge("--input", mixed, "--output-prefix",
                                  os.path.join(self.dir, "nowhere", "out")),
                            "--output-prefix", "is not a directory or does not exist")
        # The output over one of its inputs: refused before anything is written.
        same = self.folder("same")
        idx.write_dataset(os.path.join(same, "a"), [[[1, 2, 3]]], "uint16")
        before = file_bytes(os.path.join(same, "a.bin"))
        self.assert_refused(merge("--input", same, "--output-prefix", os.path.join(same, "a")),
                            "names the input")
        self.assertEqual(file_bytes(os.path.join(same, "a.bin")), before)
        # A corrupt input names itself; the output does not appear.
        bad = self.folder("bad")
        idx.write_dataset(os.path.join(bad, "a"), [[[1, 2, 3]]], "uint16")
        with open(os.path.join(bad, "a.bin"), "ab") as f:
            f.write(b"\x00\x00")
        self.assert_refused(merge("--input", bad, "--output-prefix", out), "a.bin: file is",
                            output=out)
        self.assert_refused(merge("--input", bad), "--output-prefix is required")


class PreprocessPartitionsTest(unittest.TestCase):
    """`megatron preprocess --partitions N`: preprocess_data.py's partition files (written here
    with Python's own text-mode reading and writing, as the tool does), each partition's dataset,
    and the merged one, byte for byte."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="megatron_partitions_")
        self.records = idx.generate_records(99, 600, 1000)
        # Two inputs, one with CRLF line ends, one gzip-compressed; the glob matches both.
        self.inputs = [os.path.join(self.dir, "corpus_a.jsonl"),
                       os.path.join(self.dir, "corpus_b.jsonl.gz")]
        idx.write_jsonl(self.inputs[0], self.records[:350], newline="\r\n")
        plain = os.path.join(self.dir, "b.tmp")
        idx.write_jsonl(plain, self.records[350:])
        with open(plain, "rb") as f, gzip.open(self.inputs[1], "wb") as g:
            g.write(f.read())
        os.remove(plain)
        self.glob = os.path.join(self.dir, "corpus_*")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def preprocess(self, prefix, *extra, input_path=None):
        p = subprocess.run([MEGATRON, "preprocess", "--input", input_path or self.glob,
                            "--output-prefix", prefix, "--tokenizer-type", "NullTokenizer",
                            "--vocab-size", "1000", "--append-eod", "--workers", "2",
                            *[str(a) for a in extra]],
                           capture_output=True, text=True, timeout=TIMEOUT_S)
        for marker in CRASH_MARKERS:
            self.assertNotIn(marker, p.stderr)
        return p

    def python_partitions(self, n, sequential):
        """preprocess_data.py's partition contents: lines of the sorted inputs in text mode."""
        lines = []
        for name in sorted(self.inputs):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(name, "rt", encoding="utf-8") as f:
                lines.extend(f)
        parts = [[] for _ in range(n)]
        size = -(-len(lines) // n)
        for k, line in enumerate(lines):
            parts[k // size if sequential else k % n].append(line)
        return parts

    def test_round_robin_partitions_merge_in_partition_order(self):
        prefix = os.path.join(self.dir, "out")
        p = self.preprocess(prefix, "--partitions", 2)
        self.assertEqual(p.returncode, 0, p.stderr)
        parts = self.python_partitions(2, sequential=False)
        docs = []
        for i, lines in enumerate(parts):
            # The partition file is the --input string's root and extension around _<i> (the
            # tool's names, glob characters included): corpus_*_<i>.
            with open(f"{self.glob}_{i}", encoding="utf-8", newline="") as f:
                self.assertEqual(f.read(), "".join(lines), f"partition file {i}")
            records = [json.loads(line) for line in lines]
            want = idx.expected_documents(records, "text", 999)
            ref = os.path.join(self.dir, f"ref_{i}")
            idx.write_dataset(ref, want, "uint16")
            for ext in (".bin", ".idx"):
                self.assertEqual(file_bytes(f"{prefix}_{i}_text_document{ext}"),
                                 file_bytes(ref + ext), f"partition {i} {ext}")
            docs.extend(want)
        ref = os.path.join(self.dir, "ref_all")
        idx.write_dataset(ref, docs, "uint16")
        for ext in (".bin", ".idx"):
            self.assertEqual(file_bytes(f"{prefix}_text_document{ext}"), file_bytes(ref + ext), ext)
        # The merged order is not the input's: partition 0 holds lines 0, 2, 4, ...
        self.assertNotEqual(docs, idx.expected_documents(self.records, "text", 999))

        # Existing partition files are preprocessed as they are (the tool's reuse).
        with open(f"{self.glob}_1", "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": "5 6 7"}) + "\n")
        p = self.preprocess(prefix, "--partitions", 2)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("exist: preprocessing them as they are", p.stdout + p.stderr)
        _, got = idx.read_dataset(f"{prefix}_text_document")
        first = idx.expected_documents([json.loads(x) for x in parts[0]], "text", 999)
        self.assertEqual(got, first + [[[5, 6, 7, 999]]])

    def test_sequential_partitions_keep_the_input_order(self):
        whole = os.path.join(self.dir, "whole.jsonl")
        with open(whole, "w", encoding="utf-8") as f:
            for lines in self.python_partitions(1, sequential=True):
                f.writelines(lines)
        one = os.path.join(self.dir, "one")
        self.assertEqual(self.preprocess(one, input_path=whole).returncode, 0)
        three = os.path.join(self.dir, "three")
        p = self.preprocess(three, "--partitions", 3, "--keep-sequential-samples",
                            "--workers", 3)
        self.assertEqual(p.returncode, 0, p.stderr)
        for i, lines in enumerate(self.python_partitions(3, sequential=True)):
            with open(f"{self.glob}_{i}", encoding="utf-8", newline="") as f:
                self.assertEqual(f.read(), "".join(lines), f"partition file {i}")
            self.assertTrue(os.path.exists(f"{three}_{i}_text_document.idx"))
        for ext in (".bin", ".idx"):
            self.assertEqual(file_bytes(f"{three}_text_document{ext}"),
                             file_bytes(f"{one}_text_document{ext}"), ext)

    def test_odd_line_ends_and_bad_gzip(self):
        # A lone "\r" ends a line and the last line has no newline (Python's text mode): the
        # partition files hold what Python's dealing writes.
        odd = os.path.join(self.dir, "odd_1.jsonl")
        lines = [json.dumps({"text": f"{i} {i + 1}"}) for i in range(9)]
        with open(odd, "w", encoding="utf-8", newline="") as f:
            f.write("\r".join(lines[:4]) + "\r\n" + "\n".join(lines[4:]))
        prefix = os.path.join(self.dir, "odd")
        pattern = os.path.join(self.dir, "odd_*")
        p = self.preprocess(prefix, "--partitions", 2, input_path=pattern)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(odd, encoding="utf-8") as f:
            dealt = list(f)
        for i in range(2):
            with open(f"{pattern}_{i}", encoding="utf-8", newline="") as f:
                self.assertEqual(f.read(), "".join(dealt[i::2]), f"partition file {i}")
        _, got = idx.read_dataset(f"{prefix}_text_document")
        want = [[[k, k + 1, 999]] for k in list(range(0, 9, 2)) + list(range(1, 9, 2))]
        self.assertEqual(got, want)
        # A gzip input cut short is an error naming it, and no partition file is left to be
        # taken as complete by the next run.
        cut = os.path.join(self.dir, "cut_1.jsonl.gz")
        with open(self.inputs[1], "rb") as f:
            data = f.read()
        with open(cut, "wb") as f:
            f.write(data[:len(data) // 2])
        pattern = os.path.join(self.dir, "cut_*")
        p = self.preprocess(os.path.join(self.dir, "cut"), "--partitions", 2, input_path=pattern)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("the gzip stream is truncated", p.stderr)
        self.assertEqual([f for f in os.listdir(self.dir) if f.startswith("cut_*")], [])

    def test_refusals(self):
        prefix = os.path.join(self.dir, "bad")
        p = self.preprocess(prefix, "--partitions", 2,
                            input_path=os.path.join(self.dir, "none_*.jsonl"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("matches no file", p.stderr)
        p = self.preprocess(prefix, "--partitions", 2, "--workers", 3)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--workers (3) must be a multiple of --partitions (2)", p.stderr)
        p = self.preprocess(prefix, "--partitions", 0)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--partitions is 0", p.stderr)


def main():
    global MEGATRON
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megatron", required=True)
    args, rest = parser.parse_known_args()
    MEGATRON = os.path.abspath(args.megatron)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
