#!/usr/bin/env python3
"""Image preprocessing against Pillow: decoding, bicubic resize and Megatron's CLIP transform.

What it is: Pillow (Debian's python3-pil) writes JPEG and PNG files of every kind the decoder
takes that Pillow can write (RGB and gray JPEG; RGB, RGBA, L, LA, 8- and 4-bit palette and
1-bit PNG), of noisy gradients so that every pixel differs, and `image_tool`
(tests/image/image_tool.cpp) decodes, resizes and transforms them. Checked exactly, byte for byte and float for float:
  - decoding: the pixels Pillow opens (palette and 1-bit images as their RGB colours);
  - resizing to smaller, larger and mixed sizes: Image.resize(size, BICUBIC), which is what
    torchvision's Resize(interpolation=BICUBIC) calls on a PIL image (premultiplied alpha for
    RGBA and LA, nearest neighbour for palette and 1-bit images, as Pillow does);
  - the CLIP transform of examples/multimodal/image_processing.py: resize, convert("RGB"),
    ToTensor (v / 255 in float32) and Normalize(CLIP mean, std) restated in NumPy float32.
  - bad files (truncated JPEG and PNG, a text file, a missing file, a 16-bit gray PNG): exit 2
    with the file named, no crash.
What it is not: the vision encoder (none yet), or speed.

Usage: test_pil_parity.py --tool BUILD/tests/image/image_tool [unittest args]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from PIL import Image

TOOL = None
TMP = None
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def noisy(w, h, channels, seed):
    """A gradient plus noise, every channel different: [h, w, channels] uint8."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    out = np.empty((h, w, channels), dtype=np.float64)
    for c in range(channels):
        out[..., c] = (x * (3 + c) + y * (5 - c)) * 255.0 / (w * 3 + h * 5) + rng.normal(0, 25, (h, w))
    return np.clip(out, 0, 255).astype(np.uint8)


def make_images():
    """{name: path} of the files Pillow writes."""
    files = {}

    def save(name, img, **kw):
        path = os.path.join(TMP.name, name)
        img.save(path, **kw)
        files[name] = path

    save("rgb.jpg", Image.fromarray(noisy(97, 61, 3, 1)), quality=90)
    save("gray.jpg", Image.fromarray(noisy(50, 37, 1, 2)[..., 0]), quality=85)
    save("rgb.png", Image.fromarray(noisy(61, 43, 3, 3)))
    rgba = noisy(40, 29, 4, 4)
    rgba[:5, :, 3] = 0      # fully transparent rows
    rgba[5:9, :, 3] = 255   # opaque rows
    save("rgba.png", Image.fromarray(rgba, "RGBA"))
    save("gray.png", Image.fromarray(noisy(33, 20, 1, 5)[..., 0]))
    save("la.png", Image.fromarray(noisy(21, 17, 2, 6), "LA"))
    save("palette.png", Image.fromarray(noisy(45, 31, 3, 7)).quantize(colors=16))
    save("palette4.png", Image.fromarray(noisy(27, 19, 3, 10)).quantize(colors=12), bits=4)
    save("bits.png", Image.fromarray(noisy(30, 22, 1, 8)[..., 0]).convert("1"))
    return files


def tool(*args):
    return subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, timeout=60)


def read_u8(path, h, w):
    data = np.fromfile(path, dtype=np.uint8)
    return data.reshape(h, w, -1)


def pil_pixels(img):
    """What our decoder keeps: palette and 1-bit images as RGB, the rest in their own mode."""
    if img.mode in ("P", "1"):
        img = img.convert("RGB")
    a = np.asarray(img)
    return a.reshape(a.shape[0], a.shape[1], -1)


class TestPilParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.files = make_images()

    def test_decode(self):
        for name, path in self.files.items():
            out = os.path.join(TMP.name, name + ".decoded")
            proc = tool("decode", path, out)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            w, h, mode = proc.stdout.split()
            img = Image.open(path)
            want_mode = {"1": "P"}.get(img.mode, img.mode)
            self.assertEqual((int(w), int(h), mode), (img.width, img.height, want_mode), name)
            np.testing.assert_array_equal(read_u8(out, int(h), int(w)), pil_pixels(img), name)

    def test_bicubic_resize(self):
        for name, path in self.files.items():
            img = Image.open(path)
            for size in ((24, 16), (160, 112), (img.width, 13), (7, img.height), (224, 224)):
                out = os.path.join(TMP.name, f"{name}.{size[0]}x{size[1]}")
                proc = tool("resize", path, size[0], size[1], out)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                want = pil_pixels(img.resize(size, Image.BICUBIC))
                np.testing.assert_array_equal(read_u8(out, size[1], size[0]), want,
                                              f"{name} to {size}")

    def test_clip_transform(self):
        for name, path in self.files.items():
            for h, w in ((224, 224), (48, 64)):
                out = os.path.join(TMP.name, f"{name}.clip{h}x{w}")
                proc = tool("clip", path, h, w, out)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                got = np.fromfile(out, dtype=np.float32).reshape(3, h, w)
                rgb = Image.open(path).resize((w, h), Image.BICUBIC).convert("RGB")
                x = np.asarray(rgb).astype(np.float32) / np.float32(255)
                want = ((x - MEAN) / STD).transpose(2, 0, 1)
                np.testing.assert_array_equal(got, want, f"{name} at {h}x{w}")

    def test_bad_files_are_refused_by_name(self):
        jpg = open(self.files["rgb.jpg"], "rb").read()
        png = open(self.files["rgb.png"], "rb").read()
        bad = {}
        for name, data in (("cut.jpg", jpg[:len(jpg) // 3]), ("cut.png", png[:len(png) // 2]),
                           ("text.jpg", b"not an image\n"), ("empty.png", b"")):
            bad[name] = os.path.join(TMP.name, name)
            with open(bad[name], "wb") as f:
                f.write(data)
        deep = os.path.join(TMP.name, "gray16.png")
        Image.fromarray((noisy(9, 7, 1, 9)[..., 0].astype(np.uint16) * 257), "I;16").save(deep)
        bad["gray16.png"] = deep
        bad["missing.png"] = os.path.join(TMP.name, "no_such_file.png")
        for name, path in bad.items():
            proc = tool("clip", path, 32, 32, os.path.join(TMP.name, "unused"))
            self.assertEqual(proc.returncode, 2, f"{name}: {proc.stderr}")
            self.assertIn(path, proc.stderr, name)
            self.assertNotIn("Segmentation", proc.stderr, name)


def main():
    global TOOL, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    args, rest = ap.parse_known_args()
    TOOL = args.tool
    TMP = tempfile.TemporaryDirectory(prefix="image_")
    try:
        return unittest.main(argv=[sys.argv[0], *rest], exit=False).result.wasSuccessful()
    finally:
        TMP.cleanup()


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
