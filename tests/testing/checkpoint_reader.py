"""An independent reader of megatron-cpp's sharded checkpoints, in plain Python and NumPy.

What it is: `read_checkpoint(DIR)` loads one saved iteration (DIR/iter_NNNNNNN, or the checkpoint
root, whose latest_checkpointed_iteration.txt names the iteration) the way a third party would,
from the format alone: metadata.json gives every tensor's global shape and the boxes
(offset, extent) that tile it, each box a dense tensor under its key in one rank's
.safetensors file (8-byte little-endian header length, JSON header, raw little-endian bytes),
parsed here with struct, json and numpy.frombuffer. It checks what a loader must be able to
trust: each file's size and SHA-256 equal metadata.json's, no file is missing or unlisted, each
box lies inside its tensor and matches its stored tensor's dtype and shape, the boxes of a
tensor cover every element exactly once, and every stored tensor belongs to a box. It returns
the global tensors.

What it is not: the trainer's loader (src/checkpoint/, written in C++; this file shares no code
with it, so a bug in the writer is not hidden by the same bug in the reader), a resharder, or a
converter to other formats (--save-hf writes Hugging Face directories).
"""
import hashlib
import json
import os
import re
import struct

import numpy as np

# safetensors dtype -> NumPy dtype (all little-endian). The trainer writes F32 only; BF16 has no
# NumPy dtype and is rejected rather than guessed.
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "?"}


class CheckpointError(AssertionError):
    """A checkpoint that breaks its own metadata (an AssertionError, so tests report it as a
    failure with the message)."""


def _check(cond, msg):
    if not cond:
        raise CheckpointError(msg)


def iteration_dir(path):
    """path itself if it holds metadata.json, else path/iter_NNNNNNN for the iteration named by
    path/latest_checkpointed_iteration.txt."""
    if os.path.isfile(os.path.join(path, "metadata.json")):
        return path
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    _check(os.path.isfile(tracker), f"{path}: neither metadata.json nor {tracker}")
    with open(tracker, encoding="utf-8") as f:
        text = f.read().strip()
    _check(text.isdigit(), f"{tracker}: expected an iteration number, got {text!r}")
    return os.path.join(path, f"iter_{int(text):07d}")


def read_safetensors(path):
    """{key: np.ndarray} of one safetensors file (read-only views of its bytes), and the header's
    __metadata__ (or {}). Checks that every tensor's byte range lies in the data section, has
    the size its dtype and shape imply, and that the ranges do not overlap."""
    with open(path, "rb") as f:
        blob = f.read()
    _check(len(blob) >= 8, f"{path}: {len(blob)} bytes, shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    _check(8 + header_len <= len(blob),
           f"{path}: header length {header_len} runs past the end of the {len(blob)}-byte file")
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    meta = header.pop("__metadata__", {})
    tensors, ranges = {}, []
    for key, info in header.items():
        _check(info["dtype"] in DTYPES, f"{path}: {key}: unsupported dtype {info['dtype']}")
        dtype = np.dtype(DTYPES[info["dtype"]])
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
        _check(0 <= begin <= end <= len(data),
               f"{path}: {key}: data_offsets [{begin}, {end}) outside the {len(data)}-byte data")
        _check(end - begin == int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
               f"{path}: {key}: {end - begin} bytes for shape {list(shape)} of {info['dtype']}")
        tensors[key] = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape)
        ranges.append((begin, end, key))
    ranges.sort()
    for (_, end_a, key_a), (begin_b, _, key_b) in zip(ranges, ranges[1:]):
        _check(end_a <= begin_b, f"{path}: the bytes of {key_a} and {key_b} overlap")
    return tensors, meta


def _check_files(it_dir, files):
    """Every file metadata.json lists exists with its size and SHA-256; no other rank file."""
    on_disk = {n for n in os.listdir(it_dir) if n.endswith(".safetensors")}
    _check(on_disk == set(files),
           f"{it_dir}: files on disk {sorted(on_disk)} differ from metadata.json's {sorted(files)}")
    for name, info in files.items():
        path = os.path.join(it_dir, name)
        size = os.path.getsize(path)
        _check(size == info["bytes"], f"{path}: {size} bytes, metadata.json says {info['bytes']}")
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        _check(digest.hexdigest() == info["sha256"],
               f"{path}: sha256 {digest.hexdigest()}, metadata.json says {info['sha256']}")


def read_checkpoint(path):
    """(metadata, {tensor name: np.ndarray of its global shape}) of the checkpoint at path (an
    iteration directory or a checkpoint root, see iteration_dir). Raises CheckpointError when the
    files, boxes or stored tensors disagree with metadata.json."""
    it_dir = iteration_dir(path)
    with open(os.path.join(it_dir, "metadata.json"), encoding="utf-8") as f:
        metadata = json.load(f)
    m = re.fullmatch(r"iter_(\d{7})", os.path.basename(os.path.normpath(it_dir)))
    _check(m is None or int(m[1]) == metadata["iteration"],
           f"{it_dir}: metadata.json says iteration {metadata['iteration']}")
    _check_files(it_dir, metadata["files"])
    stored = {name: read_safetensors(os.path.join(it_dir, name))[0] for name in metadata["files"]}
    used = {name: set() for name in stored}

    tensors = {}
    for name, info in metadata["tensors"].items():
        _check(info["dtype"] in DTYPES, f"{name}: unsupported dtype {info['dtype']}")
        dtype = np.dtype(DTYPES[info["dtype"]])
        shape = tuple(int(d) for d in info["shape"])
        out = np.zeros(shape, dtype=dtype)
        covered = np.zeros(shape, dtype=np.int32)  # how many boxes hold each element
        for shard in info["shards"]:
            where = f"{name}: box {shard['key']} in {shard['file']}"
            offset = [int(o) for o in shard["offset"]]
            extent = [int(e) for e in shard["extent"]]
            _check(len(offset) == len(extent) == len(shape),
                   f"{where}: offset {offset} / extent {extent} for a rank-{len(shape)} tensor")
            _check(all(0 <= o and e >= 0 and o + e <= d for o, e, d in zip(offset, extent, shape)),
                   f"{where}: offset {offset} + extent {extent} outside the shape {list(shape)}")
            _check(shard["file"] in stored, f"{where}: file not listed in metadata.json files")
            _check(shard["key"] in stored[shard["file"]], f"{where}: key not in the file")
            _check(shard["key"] not in used[shard["file"]], f"{where}: key used by two boxes")
            used[shard["file"]].add(shard["key"])
            value = stored[shard["file"]][shard["key"]]
            _check(value.dtype == dtype, f"{where}: stored as {value.dtype}, metadata {dtype}")
            _check(list(value.shape) == extent,
                   f"{where}: stored shape {list(value.shape)}, metadata extent {extent}")
            box = tuple(slice(o, o + e) for o, e in zip(offset, extent))
            out[box] = value
            covered[box] += 1
        if covered.size:
            _check(covered.min() == 1 and covered.max() == 1,
                   f"{name}: boxes must cover each element of {list(shape)} once; "
                   f"{int((covered == 0).sum())} uncovered, {int((covered > 1).sum())} covered "
                   f"more than once")
        tensors[name] = out
    for name, keys in used.items():
        orphans = sorted(set(stored[name]) - keys)
        _check(not orphans, f"{name}: stored tensors no box of metadata.json names: {orphans[:5]}")
    return metadata, tensors
