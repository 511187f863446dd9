#!/usr/bin/env python3
"""LLaVA's image splicing against a NumPy restatement of Megatron's arithmetic.

What it is: Megatron's LLaVAModel._preprocess_data (core_r0.14.0) restated line by line in NumPy
below (cumulative positions, the image mask, the left-shifted labels, the loss mask with image,
padding and before-image positions zeroed, padding for pipeline parallelism, truncation), and
image_splice_tool (models/llava/image_splice.h) run on the same cases: the image token at the
start, middle and end of a prompt, several images and tiles per sample, text-only samples in a
batch with images, truncation and pipeline padding, Megatron's docstring example, and 200 random
batches. Every output must be equal. Bad input (more image tokens than images): exit 2.
What it is not: the LLaVA model itself (not built yet).

Usage: test_image_splice.py --tool BUILD/tests/models/image_splice_tool [unittest args]
"""
import argparse
import json
import subprocess
import sys
import unittest

import numpy as np

TOOL = None
IMAGE, IGNORE = -200, -100


def megatron_preprocess(input_ids, labels, loss_mask, num_image_tiles, img_seq_len, max_len,
                        pad_to_max):
    """Megatron's _preprocess_data arithmetic (the parts that do not touch embeddings)."""
    batch, text_len = input_ids.shape
    image_token_mask = input_ids == IMAGE
    num_images_per_sample = image_token_mask.sum(axis=-1)
    splits = np.split(num_image_tiles, np.cumsum(num_images_per_sample)[:-1])
    tiles_per_sample = np.array([x.sum() for x in splits], dtype=np.int64)
    seq_lens = tiles_per_sample * img_seq_len - num_images_per_sample + text_len
    max_seq_len = int(seq_lens.max())
    if pad_to_max and max_seq_len < max_len:
        max_seq_len = max_len
    batch_indices, non_image_indices = np.where(~image_token_mask)
    mask_lens = image_token_mask.astype(np.int64)
    mask_lens[image_token_mask] = num_image_tiles * img_seq_len - 1
    new_position_ids = np.cumsum(mask_lens + 1, axis=-1) - 1
    text_position_ids = new_position_ids[batch_indices, non_image_indices]
    label_text_position_ids = text_position_ids - 1
    valid = label_text_position_ids >= 0
    label_text_position_ids = label_text_position_ids[valid]
    label_batch_indices = batch_indices[valid]
    label_non_image_indices = non_image_indices - 1
    label_non_image_indices = label_non_image_indices[label_non_image_indices >= 0]
    images_mask = np.full((batch, max_seq_len), True)
    images_mask[batch_indices, text_position_ids] = False
    first_padding_idx = new_position_ids[:, -1] + 1
    images_mask[np.arange(max_seq_len)[None, :].repeat(batch, 0) >= first_padding_idx[:, None]] = False
    final_labels = np.full((batch, max_seq_len), IGNORE, dtype=np.int64)
    final_loss_mask = np.zeros((batch, max_seq_len), dtype=np.float32)
    final_labels[label_batch_indices, label_text_position_ids] = labels[
        label_batch_indices, label_non_image_indices]
    final_loss_mask[batch_indices, text_position_ids] = loss_mask[batch_indices, non_image_indices]
    final_labels[np.arange(batch), seq_lens - 1] = labels[np.arange(batch), -1]
    final_loss_mask[images_mask] = 0
    bi, ii = np.where(image_token_mask)
    before = ii - 1
    ok = before >= 0
    final_loss_mask[bi[ok], new_position_ids[bi[ok], before[ok]]] = 0
    text_position = np.full((batch, text_len), -1, dtype=np.int64)
    text_position[batch_indices, non_image_indices] = text_position_ids
    return {"full_len": max_seq_len, "seq_len": min(max_seq_len, max_len),
            "text_position": text_position.reshape(-1).tolist(),
            "image_mask": images_mask.astype(int).reshape(-1).tolist(),
            "labels": final_labels[:, :max_len].reshape(-1).tolist(),
            "loss_mask": final_loss_mask[:, :max_len].reshape(-1).tolist()}


def tool(case):
    return subprocess.run([TOOL], input=json.dumps(case), capture_output=True, text=True,
                          timeout=60)


def check(test, ids, labels, loss_mask, tiles, img_seq_len, max_len, pad=False):
    ids, labels = np.array(ids, dtype=np.int64), np.array(labels, dtype=np.int64)
    loss_mask = np.array(loss_mask, dtype=np.float32)
    tiles = np.array(tiles, dtype=np.int64)
    case = {"batch": ids.shape[0], "text_len": ids.shape[1], "input_ids": ids.reshape(-1).tolist(),
            "labels": labels.reshape(-1).tolist(), "loss_mask": loss_mask.reshape(-1).tolist(),
            "num_image_tiles": tiles.tolist(), "img_seq_len": img_seq_len,
            "language_max_seq_len": max_len, "pad_to_max": pad}
    proc = tool(case)
    test.assertEqual(proc.returncode, 0, proc.stderr)
    got = json.loads(proc.stdout)
    want = megatron_preprocess(ids, labels, loss_mask, tiles, img_seq_len, max_len, pad)
    test.assertEqual(got, want, case)
    return got


class TestImageSplice(unittest.TestCase):
    def test_megatrons_docstring_example(self):
        got = check(self, [[0, 1, IMAGE, 2, 3]], [[1, IMAGE, 2, 3, 4]], [[1] * 5], [1], 1, 64)
        self.assertEqual(got["labels"], [1, IGNORE, 2, 3, 4])
        self.assertEqual(got["loss_mask"], [1, 0, 0, 1, 1])

    def test_image_token_at_start_middle_and_end(self):
        for ids in ([IMAGE, 5, 6, 7, 8], [5, 6, IMAGE, 7, 8], [5, 6, 7, 8, IMAGE]):
            labels = [6, 7, 8, 9, 10]
            got = check(self, [ids], [labels], [[1] * 5], [1], 4, 64)
            self.assertEqual(got["full_len"], 8)
            self.assertEqual(sum(got["image_mask"]), 4)

    def test_batches_with_tiles_text_only_samples_truncation_and_pipeline_padding(self):
        ids = [[IMAGE, 3, 4, IMAGE, 5, 6], [7, 8, 9, 10, 11, 12], [13, IMAGE, 14, 15, 16, 17]]
        labels = [[3, 4, 5, 5, 6, 1], [8, 9, 10, 11, 12, 1], [2, 14, 15, 16, 17, 1]]
        mask = [[1, 1, 0, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1]]
        for max_len, pad in ((64, False), (64, True), (9, False), (20, True)):
            check(self, ids, labels, mask, [2, 1, 3], 3, max_len, pad)

    def test_random_batches(self):
        rng = np.random.default_rng(0)
        for _ in range(200):
            b, s = int(rng.integers(1, 4)), int(rng.integers(1, 9))
            ids = rng.integers(0, 50, (b, s))
            ids[rng.random((b, s)) < 0.25] = IMAGE
            n = int((ids == IMAGE).sum())
            labels = rng.integers(0, 50, (b, s))
            mask = (rng.random((b, s)) < 0.8).astype(np.float32)
            tiles = rng.integers(1, 4, n)
            img_seq_len = int(rng.integers(1, 6))
            check(self, ids, labels, mask, tiles, img_seq_len, int(rng.integers(1, 40)),
                  bool(rng.integers(0, 2)))

    def test_more_image_tokens_than_images_is_refused(self):
        proc = tool({"batch": 1, "text_len": 3, "input_ids": [IMAGE, 1, IMAGE],
                     "num_image_tiles": [1], "img_seq_len": 4, "language_max_seq_len": 32})
        self.assertEqual(proc.returncode, 2)
        self.assertIn("2 image token(s)", proc.stderr)
        self.assertIn("but 1 image(s)", proc.stderr)


def main():
    global TOOL
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    args, rest = ap.parse_known_args()
    TOOL = args.tool
    return unittest.main(argv=[sys.argv[0], *rest], exit=False).result.wasSuccessful()


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
