#!/usr/bin/env python3
"""Independent oracle for Megatron's GPT dataset indices, in Python with NumPy.

Re-implements, from Megatron-LM's documented semantics, what megatron/core/datasets computes:
the split matrix and document ranges, the document / sample / shuffle indices of a GPTDataset
(numpy.random.RandomState is NumPy's own, so the shuffles are the real ones), the blending
indices of a BlendedDataset, the cache descriptions and their MD5, and the token content of
every sample. The C++ tests write a JSON list of cases, run this script, and compare what it
writes (.npy arrays and .json facts) with what the C++ code builds. It shares no code with the
C++ side; its sample-index walk is a plain Python loop over the token stream.

Usage: megatron_indices.py --spec cases.json --out DIR
"""

import argparse
import collections
import hashlib
import json
import math
import os
import re
import sys

import numpy as np

SPLITS = ["train", "valid", "test"]
LEGACY_DEFAULT_SPLIT = "969, 30, 1"


# ---- splits ---------------------------------------------------------------------------------


def split_matrix(split):
    """--split string -> [(begin, end) or None] * 3, begin of the first as the integer 0."""
    weights = [float(x) for x in re.findall(r"[.0-9]+", split)]
    assert len(weights) <= 3
    weights += [0.0] * (3 - len(weights))
    w = np.array(weights, dtype=np.float64)
    w = (w / np.sum(w)).tolist()
    edges = [0]
    for x in w:
        edges.append(edges[-1] + x)
    out = []
    for i in range(3):
        lo, hi = edges[i], edges[i + 1]
        out.append(None if hi <= lo else (lo, hi))
    return out


def document_ranges(matrix, num_docs):
    return [
        None if m is None else (int(round(m[0] * float(num_docs))), int(round(m[1] * float(num_docs))))
        for m in matrix
    ]


# ---- GPTDataset ----------------------------------------------------------------------------


def plan(lengths, begin, end, num_samples, seq_length, drop_last):
    tokens = int(np.sum(lengths[begin:end], dtype=np.int64))
    epochs = 1
    if num_samples is not None:
        while epochs * tokens < num_samples * seq_length + 1:
            epochs += 1
    separate = False
    sans_final = None
    if epochs > 1:
        sans_final = ((epochs - 1) * tokens - 1) // seq_length
        from_final = num_samples - sans_final
        per_epoch = (tokens - 1) // seq_length
        assert 0 <= from_final <= per_epoch + 1
        separate = from_final < int(0.8 * per_epoch)
    total = epochs * tokens - 1
    if drop_last:
        count = total // seq_length
    else:
        # helpers.cpp computes this in single precision.
        count = int(math.ceil(np.float32(total) / np.float32(seq_length)))
    return dict(tokens_per_epoch=tokens, num_epochs=epochs, separate_final_epoch=separate,
                num_samples_sans_final_epoch=sans_final, num_samples=count)


def document_index(begin, end, epochs, separate, rng):
    if separate and epochs > 1:
        first = document_index(begin, end, epochs - 1, False, rng)
        last = document_index(begin, end, 1, False, rng)
        return np.concatenate([first, last])
    docs = np.tile(np.arange(begin, end, dtype=np.int64), epochs).astype(np.int32)
    rng.shuffle(docs)
    return docs


def sample_index(lengths, doc_idx, seq_length, count):
    """Start (document-index position, offset) of each sample: walk the token stream."""
    dtype = np.int32 if max(len(doc_idx), int(lengths.max())) <= np.iinfo(np.int32).max else np.int64
    rows = [(0, 0)]
    pos, off = 0, 0
    while len(rows) <= count:
        need = seq_length + 1  # the sample's tokens plus the first label of the next
        while True:
            left_in_doc = int(lengths[doc_idx[pos]]) - off
            if need <= left_in_doc:
                # The sample ends inside this document; the next one starts on its last token.
                off += need - 1
                break
            need -= left_in_doc
            if pos == len(doc_idx) - 1:
                assert len(rows) == count  # only the kept partial last sample gets here
                off = int(lengths[doc_idx[pos]]) - 1
                break
            pos += 1
            off = 0
        rows.append((pos, off))
    return np.array(rows, dtype=dtype).reshape(count + 1, 2)


def shuffle_index(first, total, rng):
    dtype = np.int64 if total >= np.iinfo(np.uint32).max - 1 else np.uint32
    a = np.arange(0, first, dtype=dtype)
    rng.shuffle(a)
    if first == total:
        return a
    b = np.arange(first, total, dtype=dtype)
    rng.shuffle(b)
    return np.concatenate([a, b])


def gpt_indices(lengths, begin, end, num_samples, seq_length, seed, drop_last):
    p = plan(lengths, begin, end, num_samples, seq_length, drop_last)
    rng = np.random.RandomState(seed)
    d = document_index(begin, end, p["num_epochs"], p["separate_final_epoch"], rng)
    s = sample_index(lengths, d, seq_length, p["num_samples"])
    first = p["num_samples_sans_final_epoch"] if p["separate_final_epoch"] else p["num_samples"]
    sh = shuffle_index(first, p["num_samples"], rng)
    return p, d, s, sh


def gpt_samples(tokens, lengths, d, s, sh, seq_length, pad=-1, parts=None):
    """Every sample's seq_length + 1 tokens, cut from the concatenated token stream; with
    `parts` (a list), each sample's piece lengths appended to it (Megatron's document_lengths)."""
    starts = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    out = np.full((len(sh), seq_length + 1), pad, dtype=np.int64)
    for i, j in enumerate(sh):
        (p0, o0), (p1, o1) = s[j], s[j + 1]
        pieces = []
        for p in range(int(p0), int(p1) + 1):
            doc = int(d[p])
            lo = int(o0) if p == p0 else 0
            hi = int(o1) + 1 if p == p1 else int(lengths[doc])
            pieces.append(tokens[starts[doc] + lo: starts[doc] + hi])
        text = np.concatenate(pieces)
        out[i, : len(text)] = text
        if parts is not None:
            parts.append([len(piece) for piece in pieces])
    return out


# ---- blending ------------------------------------------------------------------------------


def normalize(weights):
    w = np.array(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def blending_indices(weights, size):
    """Greedy: each sample goes to the dataset furthest behind its share (ties: lowest index)."""
    taken = [0] * len(weights)
    which = np.zeros(size, dtype=np.int16)
    nth = np.zeros(size, dtype=np.int64)
    for k in range(size):
        scale = max(float(k), 1.0)
        errors = [w * scale - float(c) for w, c in zip(weights, taken)]
        best = max(range(len(weights)), key=lambda i: (errors[i], -i))
        which[k] = best
        nth[k] = taken[best]
        taken[best] += 1
    return which, nth


def exhaustive_blending_indices(sizes):
    """A blend without a size: every sample of every dataset once. The same greedy race over the
    shares size / total, among the datasets not yet spent (ties: lowest index)."""
    total = sum(sizes)
    shares = [n / float(total) for n in sizes]
    taken = [0] * len(sizes)
    which = np.zeros(total, dtype=np.int16)
    nth = np.zeros(total, dtype=np.int64)
    for k in range(total):
        scale = max(float(k), 1.0)
        live = [i for i in range(len(sizes)) if taken[i] < sizes[i]]
        best = max(live, key=lambda i: (shares[i] * scale - float(taken[i]), -i))
        which[k] = best
        nth[k] = taken[best]
        taken[best] += 1
    return which, nth


# ---- descriptions --------------------------------------------------------------------------


def gpt_identifiers(dataset_path, num_samples, split, seed, seq_length, split_string, tokenizer):
    ids = collections.OrderedDict()
    ids["class"] = "GPTDataset"
    ids["dataset_path"] = dataset_path
    ids["num_samples"] = num_samples
    ids["index_split"] = split
    ids["random_seed"] = seed
    ids["sequence_length"] = seq_length
    ids["split"] = split_string
    ids["split_matrix"] = None if split_string is None else split_matrix(split_string)
    ids["tokenizer"] = tokenizer
    return ids


def blended_identifiers(datasets, split, weights, size):
    ids = collections.OrderedDict()
    ids["class"] = "BlendedDataset"
    ids["datasets"] = datasets
    ids["split"] = split
    ids["weights"] = weights
    ids["size"] = size
    return ids


def describe(ids):
    text = json.dumps(ids, indent=4)
    return text, hashlib.md5(text.encode("utf-8")).hexdigest()


# ---- the builder, end to end ---------------------------------------------------------------


def build_split(sources, weights, split_idx, count, seq_length, seed, surplus):
    """Samples [N, seq+1] of one split, as BlendedMegatronDatasetBuilder would serve them."""
    def one(src, n):
        rng_range = src["ranges"][split_idx]
        p, d, s, sh = gpt_indices(src["lengths"], rng_range[0], rng_range[1], n, seq_length,
                                  seed, True)
        return gpt_samples(src["tokens"], src["lengths"], d, s, sh, seq_length)

    if count == 0:
        return None
    # Our builder leaves out a dataset whose split holds no complete sample (Megatron would loop
    # forever); the remaining ones keep their weights.
    keep = [k for k, src in enumerate(sources)
            if src["ranges"][split_idx] is not None and
            int(np.sum(src["lengths"][src["ranges"][split_idx][0]:src["ranges"][split_idx][1]])) >= 2]
    if not keep:
        return None
    if weights is not None:
        weights = [weights[k] for k in keep] if len(keep) < len(sources) else weights
    sources = [sources[k] for k in keep]
    if len(sources) == 1 and weights is None:
        return one(sources[0], count)
    if weights is not None:
        w = normalize(weights)
        wanted = [int(math.ceil(math.ceil(count * x) * (1 + surplus))) for x in w]
        parts = [one(src, n) for src, n in zip(sources, wanted)]
        size = sum(int(math.ceil(count * x)) for x in w)
        blend_w = normalize(w)
    else:
        parts = [one(src, None) for src in sources]
        size = min(count, sum(len(p) for p in parts))
        blend_w = normalize([len(p) for p in parts])
    which, nth = blending_indices(blend_w, size)
    return np.stack([parts[a][b] for a, b in zip(which, nth)])


# ---- driver --------------------------------------------------------------------------------


def save(out, name, array):
    np.save(os.path.join(out, name), array)


def run_case(case, out):
    op, name = case["op"], case["name"]
    facts = {}
    if op == "shuffle":
        rng = np.random.RandomState(case["seed"])
        arrays = []
        for n in case["sizes"]:
            a = np.arange(n, dtype=case["dtype"])
            rng.shuffle(a)
            arrays.append(a)
        save(out, name + ".npy", np.concatenate(arrays).astype(case["dtype"]))
    elif op == "randint":
        rng = np.random.RandomState(case["seed"])
        vals = rng.randint(0, case["max"] + 1, size=case["count"], dtype=np.uint64)
        save(out, name + ".npy", vals.astype(np.int64))
    elif op == "binomial":
        # fim_dataset.py's draws: scalar binomial(1, p) calls, each followed by a
        # randint(low=0, high=n + 1, size=2) (its character boundaries), n cycling.
        rng = np.random.RandomState(case["seed"])
        vals = []
        for k in range(case["count"]):
            p = case["ps"][k % len(case["ps"])]
            n = case["ns"][k % len(case["ns"])]
            vals.append(int(rng.binomial(1, p)))
            vals.extend(int(v) for v in rng.randint(low=0, high=n + 1, size=2))
        save(out, name + ".npy", np.array(vals, dtype=np.int64))
    elif op == "gpt":
        lengths = np.load(case["lengths"])
        drop_last = case["split"] != "valid" or case.get("drop_last_partial_validation_sequence", True)
        p, d, s, sh = gpt_indices(lengths, case["begin"], case["end"], case["num_samples"],
                                  case["seq_length"], case["seed"], drop_last)
        save(out, name + ".document_index.npy", d)
        save(out, name + ".sample_index.npy", s)
        save(out, name + ".shuffle_index.npy", sh)
        if "tokens" in case:
            tokens = np.load(case["tokens"])
            parts = []
            save(out, name + ".samples.npy",
                 gpt_samples(tokens, lengths, d, s, sh, case["seq_length"], parts=parts))
            # Ragged: each sample's piece lengths, zero-filled to the longest list.
            table = np.zeros((len(parts), max(len(q) for q in parts)), dtype=np.int64)
            for i, q in enumerate(parts):
                table[i, : len(q)] = q
            save(out, name + ".document_lengths.npy", table)
        facts = p
    elif op == "blend":
        w = normalize(case["weights"])
        which, nth = blending_indices(w, case["size"])
        save(out, name + ".dataset_index.npy", which)
        save(out, name + ".dataset_sample_index.npy", nth)
        facts = {"weights": w}
    elif op == "exhaustive_blend":
        which, nth = exhaustive_blending_indices(case["sizes"])
        save(out, name + ".dataset_index.npy", which)
        save(out, name + ".dataset_sample_index.npy", nth)
    elif op == "split":
        m = split_matrix(case["split"])
        facts = {"ranges": document_ranges(m, case["num_docs"]), "matrix": m}
    elif op == "gpt_description":
        ids = gpt_identifiers(case["dataset_path"], case["num_samples"], case["index_split"],
                              case["seed"], case["seq_length"], case["split"], case["tokenizer"])
        facts["text"], facts["md5"] = describe(ids)
    elif op == "blended_description":
        datasets = [
            gpt_identifiers(d["dataset_path"], d["num_samples"], case["index_split"], case["seed"],
                            case["seq_length"], case["split"], case["tokenizer"])
            for d in case["datasets"]
        ]
        # Without a size Megatron keeps the weights as given: the datasets' len() values.
        w = normalize(case["weights"]) if case["size"] is not None else case["weights"]
        facts["text"], facts["md5"] = describe(blended_identifiers(datasets, case["index_split"],
                                                                   w, case["size"]))
    elif op == "npy_check":
        # Our file must load in NumPy with the expected content and be byte-identical to np.save's.
        expected = np.array(case["values"], dtype=case["dtype"]).reshape(case["shape"])
        ours = np.load(case["path"])
        facts["loads"] = bool(ours.dtype == expected.dtype and ours.shape == expected.shape and
                              np.array_equal(ours, expected))
        reference = os.path.join(out, name + ".numpy.npy")
        np.save(reference, expected)
        with open(reference, "rb") as a, open(case["path"], "rb") as b:
            facts["same_bytes"] = a.read() == b.read()
    elif op == "e2e":
        sources = []
        for src in case["sources"]:
            lengths = np.load(src["lengths"])
            sources.append({"lengths": lengths, "tokens": np.load(src["tokens"])})
        per_split = case.get("per_split")
        for i in range(3):
            if per_split is None:
                split_string = case["split"] or LEGACY_DEFAULT_SPLIT
                m = split_matrix(split_string)
                if m[i] is None:
                    continue
                for src in sources:
                    src["ranges"] = document_ranges(m, len(src["lengths"]))
                chosen, weights = sources, case["weights"]
            else:
                if per_split[i] is None:
                    continue
                chosen = [sources[k] for k in per_split[i]["sources"]]
                weights = per_split[i]["weights"] if len(chosen) > 1 else None
                for src in chosen:
                    src["ranges"] = [(0, len(src["lengths"]))] * 3
            samples = build_split(chosen, weights, i, case["num_samples"][i], case["seq_length"],
                                  case["seed"], case["surplus"])
            if samples is not None:
                save(out, "%s.%s.samples.npy" % (name, SPLITS[i]), samples)
    else:
        raise ValueError("unknown op " + op)
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(facts, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.spec) as f:
        cases = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    for case in cases:
        run_case(case, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
