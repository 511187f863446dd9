#!/usr/bin/env python3
"""`megatron scenes`: the scenes task's images carry what their captions say.

What it is: `megatron scenes` writes scenes as a JSONL manifest with PNG files and as WebDataset
tar shards; Pillow reads the images and an independent analysis of the pixels (the background is
the most common colour; the shape is the rest) recovers each attribute: the colour from the
shape's mean RGB, the size from its pixel count, the place from its bounding box's centre, the
shape from how much of its bounding box it fills (a square all of it, a circle pi/4, a triangle half). Every
caption must equal the one the pixels give. Also: the shards hold the same samples as the
manifest (Python's tarfile reads them), a seed's scenes are the same in any range (a held-out
range is disjoint and reproducible), and bad flags exit 2 naming the flag.
What it is not: training on the scenes (the vision-language model does not exist yet).

Usage: test_scenes.py --megatron BUILD/megatron --mpiexec MPIEXEC [unittest args]
"""
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import megatron_job  # noqa: E402

MEGATRON = None
MPIEXEC = None
SIDE = 48


def scenes(*args, expect=0):
    proc = subprocess.run([MEGATRON, "scenes", *map(str, args)], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != expect:
        raise AssertionError(f"scenes {' '.join(map(str, args))}: exit {proc.returncode}\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def caption_from_pixels(img):
    a = np.asarray(img.convert("RGB")).astype(np.int64)
    flat = a.reshape(-1, 3)
    colours, counts = np.unique(flat, axis=0, return_counts=True)
    background = colours[np.argmax(counts)]
    mask = np.any(a != background, axis=2)
    ys, xs = np.nonzero(mask)
    n = len(xs)
    r, g, b = a[mask].mean(axis=0)
    colour = "yellow" if r > 150 and g > 120 else ("red", "green", "blue")[int(np.argmax([r, g, b]))]
    size = "small" if n < 120 else "large"
    fill = n / ((xs.max() - xs.min() + 1) * (ys.max() - ys.min() + 1))
    # A square fills its bounding box exactly; a circle leaves the corners (pi/4 at large sizes,
    # more at small ones); a triangle half.
    shape = "square" if fill > 0.99 else "circle" if fill > 0.65 else "triangle"
    # The bounding box's centre (a triangle's centroid sits a third of its half-height low).
    cx = (xs.min() + xs.max() + 1) / 2 / SIDE
    cy = (ys.min() + ys.max() + 1) / 2 / SIDE
    horizontal = "left" if cx < 0.4 else "right" if cx > 0.6 else ""
    vertical = "top" if cy < 0.4 else "bottom" if cy > 0.6 else ""
    place = "in the center" if not horizontal and not vertical else f"at the {vertical} {horizontal}"
    return f"a {size} {colour} {shape} {place}"


def manifest(directory):
    with open(os.path.join(directory, "scenes.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


class TestScenes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="scenes_")
        cls.jsonl = os.path.join(cls.tmp.name, "jsonl")
        scenes("--output-dir", cls.jsonl, "--num-samples", 120, "--seed", 5, "--img-size", SIDE)
        cls.rows = manifest(cls.jsonl)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_captions_say_what_the_pixels_show(self):
        self.assertEqual(len(self.rows), 120)
        words = set()
        for row in self.rows:
            img = Image.open(os.path.join(self.jsonl, row["image"]))
            self.assertEqual(img.size, (SIDE, SIDE))
            self.assertEqual(caption_from_pixels(img), row["text"], row["id"])
            words.update(row["text"].split())
        # Every value of every attribute occurs in 120 scenes.
        for w in ("circle", "square", "triangle", "red", "green", "blue", "yellow", "small",
                  "large", "top", "bottom", "left", "right", "center"):
            self.assertIn(w, words)

    def test_webdataset_shards_hold_the_same_samples(self):
        wds = os.path.join(self.tmp.name, "wds")
        scenes("--output-dir", wds, "--num-samples", 120, "--seed", 5, "--img-size", SIDE,
               "--format", "wds", "--samples-per-shard", 50)
        shards = sorted(f for f in os.listdir(wds) if f.endswith(".tar"))
        self.assertEqual(shards, ["scenes-000000.tar", "scenes-000001.tar", "scenes-000002.tar"])
        got = {}
        for shard in shards:
            with tarfile.open(os.path.join(wds, shard)) as tar:
                for m in tar.getmembers():
                    key, ext = m.name.split(".", 1)
                    got.setdefault(key, {})[ext] = tar.extractfile(m).read()
        self.assertEqual(sorted(got), [r["id"] for r in self.rows])
        for row in self.rows:
            sample = got[row["id"]]
            self.assertEqual(sample["txt"].decode(), row["text"])
            want = np.asarray(Image.open(os.path.join(self.jsonl, row["image"])))
            np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(sample["png"]))), want)

    def test_a_held_out_range_is_disjoint_and_reproducible(self):
        held = os.path.join(self.tmp.name, "held")
        scenes("--output-dir", held, "--num-samples", 10, "--seed", 5, "--img-size", SIDE,
               "--first-index", 110)
        rows = manifest(held)
        self.assertEqual([r["id"] for r in rows], [f"{i:08d}" for i in range(110, 120)])
        for row, same in zip(rows, self.rows[110:]):
            self.assertEqual(row["text"], same["text"])
            a = open(os.path.join(held, row["image"]), "rb").read()
            b = open(os.path.join(self.jsonl, same["image"]), "rb").read()
            self.assertEqual(a, b)
        other = os.path.join(self.tmp.name, "other_seed")
        scenes("--output-dir", other, "--num-samples", 20, "--seed", 6, "--img-size", SIDE)
        self.assertNotEqual([r["text"] for r in manifest(other)],
                            [r["text"] for r in self.rows[:20]])

    def test_bad_flags(self):
        out = os.path.join(self.tmp.name, "bad")
        for args, needle in ((["--img-size", 8], "--img-size"), (["--num-samples", 0],
                                                                 "--num-samples"),
                             (["--format", "zip"], "--format")):
            flags = {"--num-samples": 5, **{args[0]: args[1]}}
            proc = scenes("--output-dir", out, *[x for kv in flags.items() for x in kv],
                          expect=2)
            self.assertIn(needle, proc.stderr + proc.stdout, args)


if __name__ == "__main__":
    sys.exit(megatron_job.main(sys.modules[__name__]))
