#!/usr/bin/env python3
"""Independent oracle for Megatron's T5 span-corruption dataset (sample index and samples).

A restatement, written from Megatron-LM core_v0.14.0, of:
  megatron/core/datasets/t5_dataset.py     T5MaskedWordPieceDataset (__init__, __getitem__,
                                           _get_token_mask, the key config attributes)
  megatron/core/datasets/masked_dataset.py MaskedWordPieceDataset._create_masked_lm_predictions
                                           as T5 configures it, and _build_sample_index
  megatron/core/datasets/megatron_dataset.py the unique description and its MD5
  pretrain_t5.py                           the dataset config (max n-gram 10, whole words,
                                           geometric span lengths, no permutation)
so that the C++ T5 dataset is checked against something that shares none of its code. Per-sample
randomness is NumPy's own numpy.random.RandomState, as in Megatron. From bert_samples.py (our
other oracle, equally independent of the C++) it takes only the plumbing: the MMIDIDX reader,
the vocabulary as _BertWordPieceTokenizer builds it, and helpers.cpp's build_mapping.

Usage:
  t5_samples.py --spec cases.json --out DIR      one DIR/<name>.json per case
  t5_samples.py --self-test                      builds a small dataset and checks invariants

A case: {"name", "prefix", "vocab_file", "vocab_extra_ids", "documents": [begin, end),
"num_samples" (int or null), "index_split" ("train"), "split" ("1" or null), "tokenizer" (any
JSON, default null), "seed", "sequence_length" (encoder), "sequence_length_decoder",
"masking_probability", "short_sequence_probability", "masking_max_ngram", "masking_do_full_word",
"masking_use_longer_ngrams", "masking_use_geometric_distribution", optional "max_samples_out"}.
A sample Megatron cannot make comes out as {"error": "sentinels" | "encoder" | "decoder"}: it runs
out of sentinels (IndexError popping the deque) or fails the padding-length assert.
"""

import argparse
import collections
import hashlib
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bert_samples import (  # noqa: E402
    INT32_MAX, U64, IndexedDataset, Vocab, build_mapping, write_dataset)

GEOMETRIC_P = 0.2  # SpanBERT's span-length distribution, fixed in Megatron


def t5_special_ids(vocab, extra_ids):
    """tokenizer.bos, .eos and .additional_special_tokens_ids (vocab.get of each name)."""
    sentinels = [vocab.vocab.get("<extra_id_%d>" % i) for i in range(extra_ids)]
    return vocab.vocab["[BOS]"], vocab.vocab["[EOS]"], sentinels


def sample_index_for(case, dataset):
    """_build_sample_index(sequence_length - 2, 1): [BOS]/[EOS] room, one sentence minimum."""
    begin, end = case["documents"]
    docs = dataset.document_indices[begin:end + 1]
    if case.get("num_samples") is None:
        num_epochs, max_num_samples = 1, U64
    else:
        num_epochs, max_num_samples = INT32_MAX - 1, int(case["num_samples"])
    index, _ = build_mapping(docs, dataset.sequence_lengths, num_epochs, max_num_samples,
                             case["sequence_length"] - 2, case["short_sequence_probability"],
                             case["seed"], 1)
    return index


# ---- span selection ---------------------------------------------------------------------------


def whole_words(tokens, vocab, full_word):
    """Lists of positions: a word and the "##" pieces after it; [CLS] and [SEP] never count."""
    words = []
    for pos, tid in enumerate(tokens):
        if tid == vocab.cls or tid == vocab.sep:
            continue
        if full_word and words and vocab.is_continuation(tid):
            words[-1].append(pos)
        else:
            words.append([pos])
    return words


def choose_spans(tokens, target, rs, vocab, cfg):
    """The n-grams Megatron masks, as position lists sorted by their first position.

    Draw order on rs: one shuffle of the word starts; per start visited, one geometric(0.2)
    (or one choice with P(n) ~ 1/n); T5's token mask is [MASK] with no draw; a second shuffle of
    the starts at the end (Megatron shuffles again for its unused permutation step).
    """
    words = whole_words(tokens, vocab, cfg["masking_do_full_word"])
    p_mask = cfg["masking_probability"]
    budget = min(p_mask * target, max(1, int(round(len(tokens) * p_mask))))
    max_n = cfg["masking_max_ngram"]
    n_values = np.arange(max_n, dtype=np.int64) + 1
    probs = 1.0 / n_values
    probs = probs / probs.sum(keepdims=True)
    if cfg["masking_use_longer_ngrams"]:
        probs = probs[::-1]
    # Megatron shuffles one list of n-gram lists per word; a list of the word numbers takes the
    # same draws (legacy shuffle of any sequence: j = random_interval(i), i = n-1 .. 1).
    starts = list(range(len(words)))
    rs.shuffle(starts)

    count = 0
    taken = set()
    spans = []
    for start in starts:
        if count >= budget:
            break
        if cfg["masking_use_geometric_distribution"]:
            n = min(int(rs.geometric(GEOMETRIC_P)), max_n)
        else:
            # Every start has max_n n-gram entries (cut short near the end), so the renormalised
            # head is the whole list.
            p = probs[:max_n] / probs[:max_n].sum(keepdims=True)
            n = int(rs.choice(n_values[:max_n], p=p))
        # The longest n-gram from n down that fits what is left of the budget.
        span = None
        while n > 0:
            cand = [pos for word in words[start:start + n] for pos in word]
            if budget >= count + len(cand):
                span = cand
                break
            n -= 1
        if span is None or any(pos in taken for pos in span):
            continue
        taken.update(span)
        count += len(span)
        spans.append(span)
    rs.shuffle(starts)
    assert count <= budget
    spans.sort(key=lambda s: s[0])
    masked = list(tokens)
    for span in spans:
        for pos in span:
            masked[pos] = vocab.mask
    return masked, spans


# ---- one sample --------------------------------------------------------------------------------


def t5_sample(idx, row, dataset, vocab, cfg):
    beg, end, target = (int(v) for v in row)
    s_enc, s_dec = cfg["sequence_length"], cfg["sequence_length_decoder"]
    assert target <= s_enc
    rs = np.random.RandomState((cfg["seed"] + idx) % 2 ** 32)
    tokens = [int(t) for i in range(beg, end) for t in dataset[i]]
    truncated = len(tokens) > target
    tokens = tokens[:target]
    masked, spans = choose_spans(tokens, target, rs, vocab, cfg)

    bos, eos, sentinels = t5_special_ids(vocab, cfg["vocab_extra_ids"])
    if len(spans) > len(sentinels):
        return {"error": "sentinels"}
    enc, dec_in, dec_out = [], [bos], []
    cursor = 0
    for sentinel, span in zip(sentinels, spans):
        originals = [tokens[pos] for pos in span]
        # The kept run before the span is a Python slice of the masked tokens: a [SEP] inside a
        # span (whole words join across it) is dropped with the span.
        enc += masked[cursor:span[0]] + [sentinel]
        dec_in += [sentinel] + originals
        dec_out += [sentinel] + originals
        cursor = span[-1] + 1
    enc += masked[cursor:]
    dec_out.append(eos)
    if len(enc) > s_enc:
        return {"error": "encoder"}
    if len(dec_in) > s_dec:
        return {"error": "decoder"}
    n_enc, n_dec = len(enc), len(dec_in)
    pad = vocab.pad
    return {
        "text_enc": enc + [pad] * (s_enc - n_enc),
        "text_dec": dec_in + [pad] * (s_dec - n_dec),
        "labels": dec_out + [-1] * (s_dec - n_dec),
        "loss_mask": [1] * n_dec + [0] * (s_dec - n_dec),
        "enc_mask": [1] * n_enc + [0] * (s_enc - n_enc),
        "dec_mask": [1] * n_dec + [0] * (s_dec - n_dec),
        "truncated": int(truncated),
    }


# ---- the description (MegatronDataset.unique_description) -------------------------------------


def description(case):
    split = case.get("split")
    if split is None:
        matrix = None
    elif split == "1":
        # get_split_matrix of "1": all documents train; the first book-end is the integer 0.
        matrix = [[0, 1.0], None, None]
    else:
        raise ValueError("the oracle knows the split matrix of '1' only")
    d = collections.OrderedDict()
    d["class"] = "T5MaskedWordPieceDataset"
    d["dataset_path"] = case["prefix"]
    d["num_samples"] = case.get("num_samples")
    d["index_split"] = case.get("index_split", "train")
    d["random_seed"] = case["seed"]
    d["sequence_length"] = case["sequence_length"]
    d["split"] = split
    d["split_matrix"] = matrix
    d["tokenizer"] = case.get("tokenizer")
    d["masking_probability"] = case["masking_probability"]
    d["short_sequence_probability"] = case["short_sequence_probability"]
    d["masking_max_ngram"] = case["masking_max_ngram"]
    d["masking_do_full_word"] = case["masking_do_full_word"]
    d["masking_do_permutation"] = False
    d["masking_use_longer_ngrams"] = case["masking_use_longer_ngrams"]
    d["masking_use_geometric_distribution"] = case["masking_use_geometric_distribution"]
    d["sequence_length_decoder"] = case["sequence_length_decoder"]
    text = json.dumps(d, indent=4)
    return text, hashlib.md5(text.encode("utf-8")).hexdigest()


# ---- driver ------------------------------------------------------------------------------------


def run_case(case):
    dataset = IndexedDataset(case["prefix"])
    vocab = Vocab(case["vocab_file"], case["vocab_extra_ids"])
    index = sample_index_for(case, dataset)
    count = len(index)
    if case.get("max_samples_out") is not None:
        count = min(count, int(case["max_samples_out"]))
    samples = [t5_sample(i, index[i], dataset, vocab, case) for i in range(count)]
    text, md5 = description(case)
    bos, eos, sentinels = t5_special_ids(vocab, case["vocab_extra_ids"])
    return {
        "sample_index": index.astype(np.int64).tolist(),
        "length": int(len(index)),
        "samples": samples,
        "description": text,
        "description_md5": md5,
        "special_ids": {"pad": vocab.pad, "mask": vocab.mask, "bos": bos, "eos": eos,
                        "sentinels": sentinels},
    }


def run_spec(spec, out):
    with open(spec) as f:
        cases = json.load(f)
    os.makedirs(out, exist_ok=True)
    for case in cases:
        with open(os.path.join(out, case["name"] + ".json"), "w") as f:
            json.dump(run_case(case), f)


# ---- self-test ---------------------------------------------------------------------------------


def _check(cond, what):
    if not cond:
        raise AssertionError(what)


def self_test():
    # The start-list shuffle draws as Megatron's shuffle of nested n-gram lists.
    for seed in range(30):
        a, b = np.random.RandomState(seed), np.random.RandomState(seed)
        nested = [[[i], [i, i + 1]] for i in range(seed % 17)]
        flat = list(range(seed % 17))
        a.shuffle(nested)
        b.shuffle(flat)
        _check([x[0][0] for x in nested] == flat and a.random() == b.random(), "shuffle draws")

    with tempfile.TemporaryDirectory() as tmp:
        tokens = ["[UNK]", "[CLS]", "[PAD]", "[SEP]", "[MASK]", "[EOS]"]
        tokens += ["w%d" % i if i % 3 else "##p%d" % i for i in range(6, 200)]
        vocab_path = os.path.join(tmp, "vocab.txt")
        with open(vocab_path, "w") as f:
            f.write("\n".join(tokens) + "\n")
        rnd = np.random.RandomState(5)
        docs = []
        for k in range(50):
            docs.append([[int(t) for t in rnd.randint(6, 200, int(rnd.randint(1, 40)))]
                         for _ in range(int(rnd.randint(0, 6)))])
        prefix = os.path.join(tmp, "ds_text_sentence")
        write_dataset(prefix, docs)
        dataset = IndexedDataset(prefix)
        case = {"name": "self", "prefix": prefix, "vocab_file": vocab_path, "vocab_extra_ids": 100,
                "documents": [0, 50], "num_samples": 300, "split": "1", "seed": 1234,
                "sequence_length": 96, "sequence_length_decoder": 64,
                "masking_probability": 0.15, "short_sequence_probability": 0.1,
                "masking_max_ngram": 10, "masking_do_full_word": True,
                "masking_use_longer_ngrams": False, "masking_use_geometric_distribution": True}
        facts = run_case(case)
        vocab = Vocab(vocab_path, 100)
        bos, eos, sentinels = t5_special_ids(vocab, 100)
        _check(bos == len(tokens) and eos == 5 and sentinels[0] == len(tokens) + 1,
               "[BOS] appended, [EOS] kept, sentinels after")
        index = facts["sample_index"]
        _check(facts["length"] >= 300 and all(2 <= t <= 94 for _, _, t in index), "index")
        spans_total = 0
        for i, s in enumerate(facts["samples"]):
            _check("error" not in s, "sample %d fits" % i)
            beg, end, target = index[i]
            n_enc, n_dec = sum(s["enc_mask"]), sum(s["dec_mask"])
            enc, dec_in, dec_out = s["text_enc"][:n_enc], s["text_dec"][:n_dec], s["labels"][:n_dec]
            _check(s["loss_mask"] == s["dec_mask"] and dec_in[0] == bos and dec_out[-1] == eos and
                   dec_in[1:] == dec_out[:-1], "decoder input is the labels shifted")
            used = [t for t in enc if t in sentinels]
            _check(used == sentinels[:len(used)] and
                   [t for t in dec_in if t in sentinels] == used, "sentinels in order")
            spans_total += len(used)
            # Filling each sentinel with its span gives back the (truncated) sentences.
            fill, k = {}, 1
            while k < len(dec_in):
                sentinel, k = dec_in[k], k + 1
                run = []
                while k < len(dec_in) and dec_in[k] not in sentinels:
                    run.append(dec_in[k])
                    k += 1
                fill[sentinel] = run
            restored = [x for t in enc for x in (fill[t] if t in sentinels else [t])]
            original = [int(t) for j in range(beg, end) for t in dataset[j]]
            _check(restored == original[:target] and
                   s["truncated"] == int(len(original) > target), "spans restore the text")
            budget = min(0.15 * target, max(1, int(round(min(len(original), target) * 0.15))))
            _check(n_dec - 1 - len(used) <= budget, "masked within the budget")
        _check(spans_total > 200, "spans were made")
        # The decoder assert and sentinel exhaustion come out as errors.
        short = run_case(dict(case, sequence_length_decoder=4, max_samples_out=50))
        _check(any(s.get("error") == "decoder" for s in short["samples"]), "decoder too short")
        few = run_case(dict(case, vocab_extra_ids=1, max_samples_out=50))
        _check(any(s.get("error") == "sentinels" for s in few["samples"]), "sentinels run out")
    print("t5_samples self-test: ok")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec")
    parser.add_argument("--out")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.spec or not args.out:
        parser.error("--spec and --out are required (or --self-test)")
    run_spec(args.spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
