#!/usr/bin/env python3
"""Unigram entropy (nats per token) of a Megatron indexed dataset: the loss of the best model that
ignores context, the bar a trained language model's validation loss should fall well below.

Reads PREFIX.idx / PREFIX.bin with NumPy straight from the format (MMIDIDX version 1), counts
token frequencies over the first --fraction of the documents (e.g. 0.969 for a 969,30,1 split's
training part) and prints -sum p log p. Not a model, not a perplexity of held-out text.

Usage: unigram_entropy.py PREFIX [--fraction F]
"""
import argparse
import struct

import numpy as np

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("prefix")
    p.add_argument("--fraction", type=float, default=1.0)
    args = p.parse_args()
    with open(args.prefix + ".idx", "rb") as f:
        head = f.read(34)
        assert head[:9] == b"MMIDIDX\x00\x00", "not a Megatron .idx file"
        _version, code, seqs, docs = struct.unpack("<QBQQ", head[9:34])
        lengths = np.frombuffer(f.read(4 * seqs), dtype=np.int32)
        f.read(8 * seqs)  # pointers
        doc_idx = np.frombuffer(f.read(8 * docs), dtype=np.int64)
    tokens = np.fromfile(args.prefix + ".bin", dtype=DTYPES[code])
    ndocs = int(round(args.fraction * (len(doc_idx) - 1)))
    end_seq = doc_idx[ndocs]
    end_tok = int(lengths[:end_seq].astype(np.int64).sum())
    counts = np.bincount(tokens[:end_tok].astype(np.int64))
    probs = counts[counts > 0] / end_tok
    entropy = float(-(probs * np.log(probs)).sum())
    print(f"unigram entropy of {end_tok} tokens in {ndocs} documents: {entropy:.4f} nats/token "
          f"(perplexity {np.exp(entropy):.1f})")


if __name__ == "__main__":
    main()
