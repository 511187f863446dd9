#!/usr/bin/env python3
"""Independent oracle for Megatron's BERT dataset (samples index and samples), with NumPy.

A restatement, written from Megatron-LM core_v0.14.0, of:
  megatron/core/datasets/helpers.cpp     build_mapping / build_mapping_impl (the sample index)
  megatron/core/datasets/masked_dataset.py MaskedWordPieceDataset._build_sample_index and
                                           _create_masked_lm_predictions
  megatron/core/datasets/bert_dataset.py BERTMaskedWordPieceDataset.__getitem__
  megatron/training/tokenizer/           how _BertWordPieceTokenizer builds vocab / inv_vocab
so that the C++ BERT dataset is checked against something that shares none of its code. The C++
tests write the indexed dataset (MMIDIDX v1, one sequence per sentence) and a vocab.txt, write a
JSON list of cases, run this script and compare what it writes.

The per-sample draws use numpy.random.RandomState, NumPy's own, exactly as Megatron does. Next to
it lives a restatement of the few legacy RandomState calls Megatron makes (random, randint,
shuffle of a list, choice with p, geometric) on a plain MT19937, because that is what the C++ side
has to mirror; --self-test runs every case with both and requires identical output. The two
generators of helpers.cpp (std::mt19937, std::mt19937_64) are restated the same way and checked
against the values the C++ standard fixes.

Usage:
  bert_samples.py --spec cases.json --out DIR      one DIR/<name>.json per case
  bert_samples.py --self-test                      builds a small dataset and checks invariants

A case: {"name", "prefix", "vocab_file", "vocab_extra_ids" (0), "documents": [begin, end),
"num_samples" (int or null), "seed", "sequence_length", "masking_probability",
"short_sequence_probability", "masking_max_ngram", "masking_do_full_word",
"masking_do_permutation", "masking_use_longer_ngrams", "masking_use_geometric_distribution",
"classification_head", optional "max_samples_out", "trace_rng", "global_numpy_seed"}.
"""

import argparse
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np

# ---- std::mt19937 and std::mt19937_64 -------------------------------------------------------
#
# helpers.cpp draws target lengths from std::mt19937(seed) and shuffles with
# std::mt19937_64(seed + 1). Both are restated here with the parameters the C++ standard fixes
# ([rand.predef]); the twist runs on whole NumPy arrays in the three chunks whose inputs are
# already final, which gives the same words as the element-by-element recurrence.

U32 = 0xFFFFFFFF
U64 = 0xFFFFFFFFFFFFFFFF


class MT19937:
    """std::mt19937: seed with init_genrand; operator() is the next tempered 32-bit word."""

    N, M = 624, 397

    def __init__(self, seed):
        s = seed & U32  # the standard seeds with value mod 2^32
        key = [s]
        for i in range(1, self.N):
            s = (1812433253 * (s ^ (s >> 30)) + i) & U32
            key.append(s)
        self.state = np.array(key, dtype=np.uint32)
        self.out = []
        self.pos = 0

    def _twist(self):
        mt, n, m = self.state, self.N, self.M
        upper, lower, a = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0x9908B0DF)
        zero = np.uint32(0)
        # New word i reads old i, old i+1 and word (i+M) mod N, which is already new for i >= N-M.
        for lo, hi in ((0, n - m), (n - m, 2 * (n - m)), (2 * (n - m), n - 1), (n - 1, n)):
            i = np.arange(lo, hi)
            y = (mt[i] & upper) | (mt[(i + 1) % n] & lower)
            mt[i] = mt[(i + m) % n] ^ (y >> np.uint32(1)) ^ np.where(y & np.uint32(1), a, zero)
        y = mt.copy()
        y ^= y >> np.uint32(11)
        y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
        y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
        y ^= y >> np.uint32(18)
        self.out = y.tolist()
        self.pos = 0

    def __call__(self):
        if self.pos == len(self.out):
            self._twist()
        v = self.out[self.pos]
        self.pos += 1
        return v


class MT19937_64:
    """std::mt19937_64: seed with the 64-bit init_genrand64; operator() gives 64-bit words."""

    N, M = 312, 156

    def __init__(self, seed):
        s = seed & U64
        key = [s]
        for i in range(1, self.N):
            s = (6364136223846793005 * (s ^ (s >> 62)) + i) & U64
            key.append(s)
        self.state = np.array(key, dtype=np.uint64)
        self.out = np.zeros(0, dtype=np.uint64)
        self.pos = 0

    def _twist(self):
        mt, n, m = self.state, self.N, self.M
        upper = np.uint64(0xFFFFFFFF80000000)
        lower = np.uint64(0x7FFFFFFF)
        a, zero, one = np.uint64(0xB5026F5AA96619E9), np.uint64(0), np.uint64(1)
        for lo, hi in ((0, n - m), (n - m, n - 1), (n - 1, n)):
            i = np.arange(lo, hi)
            x = (mt[i] & upper) | (mt[(i + 1) % n] & lower)
            mt[i] = mt[(i + m) % n] ^ (x >> one) ^ np.where(x & one, a, zero)
        x = mt.copy()
        x ^= (x >> np.uint64(29)) & np.uint64(0x5555555555555555)
        x ^= (x << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
        x ^= (x << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
        x ^= x >> np.uint64(43)
        self.out = x
        self.pos = 0

    def block(self, count):
        """The next `count` outputs as a uint64 array."""
        parts, need = [], count
        while need > 0:
            if self.pos == len(self.out):
                self._twist()
            take = min(need, len(self.out) - self.pos)
            parts.append(self.out[self.pos:self.pos + take])
            self.pos += take
            need -= take
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    def __call__(self):
        return int(self.block(1)[0])


# ---- numpy.random.RandomState, the calls Megatron makes, restated ----------------------------
#
# RandomState(int) seeds its MT19937 with init_genrand, the same as std::mt19937(seed) (only an
# array seed goes through init_by_array). Each call below consumes 32-bit words exactly as
# NumPy's legacy code does; --self-test compares them with NumPy over many seeds.


def _mask_of(v):
    """Smallest all-ones mask >= v."""
    v |= v >> 1
    v |= v >> 2
    v |= v >> 4
    v |= v >> 8
    v |= v >> 16
    v |= v >> 32
    return v


class LegacyRandomState:
    def __init__(self, seed):
        if not 0 <= seed <= U32:
            raise ValueError("Seed must be between 0 and 2**32 - 1")
        self.mt = MT19937(seed)

    def random(self):
        """random_sample(): 53 bits from two words, (a >> 5) * 2^26 + (b >> 6), over 2^53."""
        a = self.mt() >> 5
        b = self.mt() >> 6
        return (a * 67108864.0 + b) / 9007199254740992.0

    def _bounded(self, rng):
        """A value in [0, rng] by masked rejection on 32-bit words (no draw when rng == 0)."""
        if rng == 0:
            return 0
        if rng > U32:
            raise NotImplementedError("ranges above 2^32 draw 64-bit words; not needed here")
        mask = _mask_of(rng)
        while True:
            v = self.mt() & mask
            if v <= rng:
                return v

    def randint(self, low, high):
        """randint(low, high) for the default int64 dtype: low + bounded(high - 1 - low)."""
        return low + self._bounded(high - 1 - low)

    def shuffle(self, x):
        """shuffle(list): for i = n-1 .. 1, j = random_interval(i), swap x[i], x[j]."""
        for i in reversed(range(1, len(x))):
            j = self._bounded(i)
            x[i], x[j] = x[j], x[i]

    def choice(self, values, p):
        """choice(values, p=p): one random(), index = #(cdf <= u), cdf = cumsum(p) / its last."""
        cdf, acc = [], 0.0
        for q in p:
            acc += float(q)
            cdf.append(acc)
        last = cdf[-1]
        cdf = [c / last for c in cdf]
        u = self.random()
        return values[sum(1 for c in cdf if c <= u)]

    def geometric(self, p):
        """geometric(p): search for p >= 1/3, else ceil(log1p(-U) / log(1 - p))."""
        if p >= 0.333333333333333333333333:
            x, s, prod, q = 1, p, p, 1.0 - p
            u = self.random()
            while u > s:
                prod *= q
                s += prod
                x += 1
            return x
        return int(math.ceil(math.log1p(-self.random()) / math.log(1.0 - p)))


class TracingRandomState:
    """Forwards to a RandomState and records every call, in order, for a C++ port to compare."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def random(self):
        v = float(self.inner.random())
        self.calls.append(["random", v])
        return v

    def randint(self, low, high):
        v = int(self.inner.randint(low, high))
        self.calls.append(["randint", int(low), int(high), v])
        return v

    def shuffle(self, x):
        self.inner.shuffle(x)
        self.calls.append(["shuffle", len(x)])

    def choice(self, values, p):
        v = self.inner.choice(values, p=p) if isinstance(self.inner, np.random.RandomState) \
            else self.inner.choice(values, p)
        self.calls.append(["choice", int(v)])
        return v

    def geometric(self, p):
        v = int(self.inner.geometric(p))
        self.calls.append(["geometric", v])
        return v


def _choice(rs, values, p):
    # NumPy's RandomState takes p by keyword; the restated one positionally.
    if isinstance(rs, np.random.RandomState):
        return rs.choice(np.asarray(values, dtype=np.int64), p=np.asarray(p, dtype=np.float64))
    return rs.choice(values, p)


# ---- float64 sums as NumPy's add.reduce makes them --------------------------------------------
#
# The n-gram probabilities are normalised with ndarray.sum(), whose order of additions is
# NumPy's pairwise summation: 0.0 + sum, where a run under 8 is added left to right, up to 128
# with eight interleaved accumulators, and longer runs split in two halves (a multiple of 8).
# It matters once masking_max_ngram >= 8 (T5 uses 10).


def _pairwise(a, lo, n):
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r = list(a[lo:lo + 8])
        i = 8
        while i < n - (n % 8):
            for k in range(8):
                r[k] += a[lo + i + k]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            res += a[lo + i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2) + _pairwise(a, lo + n2, n - n2)


def numpy_sum(values):
    values = [float(v) for v in values]
    return 0.0 + _pairwise(values, 0, len(values))


def ngram_probabilities(max_ngram, longer):
    """nprobs of _create_masked_lm_predictions: 1/n normalised, reversed for longer n-grams."""
    nprobs = [1.0 / n for n in range(1, max_ngram + 1)]
    total = numpy_sum(nprobs)
    nprobs = [q / total for q in nprobs]
    if longer:
        nprobs = nprobs[::-1]
    return nprobs


# ---- the indexed dataset and the vocabulary ---------------------------------------------------

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}


class IndexedDataset:
    """MMIDIDX v1: sequence_lengths (int32), byte pointers, document_indices (int64)."""

    def __init__(self, prefix):
        with open(prefix + ".idx", "rb") as f:
            idx = f.read()
        assert idx[:9] == MAGIC, "not an MMIDIDX index"
        assert struct.unpack_from("<Q", idx, 9)[0] == 1, "only version 1"
        self.dtype = np.dtype(DTYPES[idx[17]]).newbyteorder("<")
        s, d = struct.unpack_from("<QQ", idx, 18)
        off = 34
        self.sequence_lengths = np.frombuffer(idx, "<i4", s, off).astype(np.int32)
        self.sequence_pointers = np.frombuffer(idx, "<i8", s, off + 4 * s).astype(np.int64)
        self.document_indices = np.frombuffer(idx, "<i8", d, off + 12 * s).astype(np.int64)
        self.tokens = np.fromfile(prefix + ".bin", dtype=self.dtype)

    def __getitem__(self, i):
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize
        return self.tokens[start:start + int(self.sequence_lengths[i])]


class Vocab:
    """What _BertWordPieceTokenizer exposes to the dataset, built the way it builds it.

    load_vocab reads with readline() in text mode (so \\r and \\r\\n end lines too), strips each
    line with str.strip() and stores vocab[token] = line number in an insertion-ordered dict; a
    repeated token keeps its first position and takes its last line number. inv_vocab is
    {id: token} in that order. add_token appends [BOS], [EOS], then <extra_id_i>, each only if
    missing, with id len(vocab) (which can collide with a file id when the file repeats tokens;
    inv_vocab then maps that id to the new token). The dataset draws random replacements from
    list(inv_vocab.keys()).
    """

    def __init__(self, path, extra_ids=0):
        vocab = {}
        index = 0
        with open(path, "r", encoding="utf-8") as reader:
            while True:
                token = reader.readline()
                if not token:
                    break
                vocab[token.strip()] = index
                index += 1
        inv_vocab = {v: k for k, v in vocab.items()}
        self.cls, self.sep = vocab["[CLS]"], vocab["[SEP]"]
        self.pad, self.mask = vocab["[PAD]"], vocab["[MASK]"]
        for token in ["[BOS]", "[EOS]"] + ["<extra_id_%d>" % i for i in range(extra_ids)]:
            if token not in vocab:
                inv_vocab[len(vocab)] = token
                vocab[token] = len(vocab)
        self.vocab, self.inv_vocab = vocab, inv_vocab
        self.token_lookup = list(inv_vocab.keys())

    def is_continuation(self, token_id):
        # An id missing from inv_vocab raises KeyError here, as it does in Megatron.
        return self.inv_vocab[token_id].startswith("##")


# ---- the sample index (helpers.cpp build_mapping) ---------------------------------------------

LONG_SENTENCE_LEN = 512
INT32_MAX = 2 ** 31 - 1


def _c_round_to_int32(x):
    """static_cast<int32_t>(round(x)): half away from zero; out of range gives INT32_MIN (x86)."""
    r = math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)
    return int(r) if -2 ** 31 <= r <= INT32_MAX else -2 ** 31


def build_mapping(docs, sizes, num_epochs, max_num_samples, max_seq_length, short_seq_prob,
                  seed, min_num_sent, shuffle=True):
    """Rows (first sentence, end sentence, target length) in global sentence indices.

    docs: the split's slice of document_indices (its documents' boundaries plus the end).
    Returns (array [n, 3] of uint32, or uint64 when there are more than 2^32 - 1 sentences,
    epochs actually walked). helpers.cpp makes two identical passes (count, then fill) from a
    freshly seeded generator; one pass gives the same rows.
    """
    docs = [int(d) for d in docs]
    sizes_list = sizes  # int32 array, indexed by global sentence
    ratio = _c_round_to_int32(1.0 / short_seq_prob) if short_seq_prob > 0 else 0
    ratio_u = ratio & U64  # the modulus is taken in unsigned long
    rng = MT19937(seed)

    def target_length():
        # No draw at all when short_seq_prob == 0.
        if ratio == 0:
            return max_seq_length
        r = rng()
        if r % ratio_u == 0:
            return 2 + r % ((max_seq_length - 1) & U64)
        return max_seq_length

    eligible = []
    for k in range(len(docs) - 1):
        first, last = docs[k], docs[k + 1]
        n = last - first
        long_sentence = n > 1 and bool(np.any(sizes_list[first:last] > LONG_SENTENCE_LEN))
        eligible.append(n >= min_num_sent and not long_sentence)

    rows = []
    epochs = 0
    for epoch in range(num_epochs):
        if len(rows) >= max_num_samples:
            break
        before = len(rows)
        for k in range(len(docs) - 1):
            if not eligible[k]:
                continue
            first, last = docs[k], docs[k + 1]
            prev_start = first
            remain = last - first
            seq_len = num_sent = 0
            target = target_length()
            for sent in range(first, last):
                seq_len += int(sizes_list[sent])
                num_sent += 1
                remain -= 1
                if (seq_len >= target and remain > 1 and num_sent >= min_num_sent) or remain == 0:
                    rows.append((prev_start, sent + 1, target))
                    prev_start = sent + 1
                    target = target_length()
                    seq_len = num_sent = 0
        epochs = epoch + 1
        if len(rows) == before:
            # No eligible document: every later epoch adds nothing and draws nothing either, so
            # this is already the final (empty) answer that helpers.cpp reaches after walking all
            # of its ~2^31 epochs.
            break

    dtype = np.uint64 if len(sizes) > U32 else np.uint32
    out = np.array(rows, dtype=np.int64).reshape(len(rows), 3).astype(dtype)
    if shuffle and len(out) > 1:
        # Fisher-Yates from the back: j = mt19937_64() % (i + 1).
        rng64 = MT19937_64(seed + 1)
        draws = rng64.block(len(out) - 1)
        for step, i in enumerate(range(len(out) - 1, 0, -1)):
            j = int(draws[step] % np.uint64(i + 1))
            if i != j:
                out[[i, j]] = out[[j, i]]
    return out, epochs


def sample_index_for(case, dataset):
    """MaskedWordPieceDataset._build_sample_index for BERT (max length seq - 3)."""
    begin, end = case["documents"]
    if end <= begin:
        # numpy.append(self.indices, self.indices[-1] + 1) fails on an empty split.
        raise IndexError("empty document range")
    docs = dataset.document_indices[begin:end + 1]
    if case.get("num_samples") is None:
        # Megatron passes None as max_num_samples here, which the uint64 parameter of the pybind11
        # binding refuses (TypeError); the oracle takes the documented intent: one epoch.
        num_epochs, max_num_samples = 1, U64
    else:
        num_epochs, max_num_samples = INT32_MAX - 1, int(case["num_samples"])
    min_sent = 2 if case["classification_head"] else 1
    index, epochs = build_mapping(docs, dataset.sequence_lengths, num_epochs, max_num_samples,
                                  case["sequence_length"] - 3,
                                  case["short_sequence_probability"], case["seed"], min_sent)
    return index, epochs, num_epochs, max_num_samples


# ---- masked LM predictions (MaskedWordPieceDataset._create_masked_lm_predictions) -------------


def get_token_mask(rs, vocab):
    """BERT's _get_token_mask: random() < 0.8 -> [MASK]; else random() >= 0.5 -> a random id
    drawn with randint(0, len(token_lookup)); else None (the token stays)."""
    if rs.random() < 0.8:
        return vocab.mask
    if rs.random() >= 0.5:
        return vocab.token_lookup[rs.randint(0, len(vocab.token_lookup))]
    return None


def create_masked_lm_predictions(token_ids, target_len, rs, vocab, cfg, global_rs):
    boundaries, candidates = [], []
    for i, tid in enumerate(token_ids):
        if tid == vocab.cls or tid == vocab.sep:
            boundaries.append(1)
        elif not vocab.is_continuation(tid):
            boundaries.append(1)
            candidates.append([i])
        else:
            boundaries.append(0)
            # A '##' piece joins the previous candidate, even one before a [SEP].
            if cfg["masking_do_full_word"] and len(candidates) > 0:
                candidates[-1].append(i)
            else:
                candidates.append([i])

    p_mask = cfg["masking_probability"]
    # Python round(): half to even on the exact double.
    n_maskings = min(p_mask * target_len, max(1, int(round(len(token_ids) * p_mask))))

    max_ngram = cfg["masking_max_ngram"]
    ngram_nvals = list(range(1, max_ngram + 1))
    nprobs = ngram_probabilities(max_ngram, cfg["masking_use_longer_ngrams"])

    # Every start gets max_ngram entries, the last ones cut short near the end of the list.
    candidate_ngrams = [[candidates[idx:idx + n] for n in ngram_nvals]
                        for idx in range(len(candidates))]
    rs.shuffle(candidate_ngrams)

    masked = list(token_ids)
    positions_and_labels, spans = [], []
    masked_indices = set()
    for c in range(len(candidate_ngrams)):
        n_ngrams = len(candidate_ngrams[c])
        if len(positions_and_labels) >= n_maskings:
            break
        if not candidate_ngrams[c]:
            continue
        if cfg["masking_use_geometric_distribution"]:
            n = min(int(rs.geometric(0.2)), max_ngram)
        else:
            head = nprobs[:n_ngrams]
            total = numpy_sum(head)
            n = int(_choice(rs, ngram_nvals[:n_ngrams], [q / total for q in head]))
        while True:
            ngram_indices = sum(candidate_ngrams[c][n - 1], [])
            n = n - 1
            if n_maskings >= len(positions_and_labels) + len(ngram_indices):
                skip = False
                break
            if n == 0:
                skip = True
                break
        if skip:
            continue
        if any(i in masked_indices for i in ngram_indices):
            continue
        for i in ngram_indices:
            masked_indices.add(i)
            m = get_token_mask(rs, vocab)
            masked[i] = token_ids[i] if m is None else m
            positions_and_labels.append((i, token_ids[i]))
        spans.append((ngram_indices, [token_ids[i] for i in ngram_indices]))
    assert len(positions_and_labels) <= n_maskings

    # Drawn whether or not permutation follows.
    rs.shuffle(candidate_ngrams)

    if cfg["masking_do_permutation"]:
        n_swappings = n_maskings
        permuted = set()
        for c in range(len(candidate_ngrams)):
            n_ngrams = len(candidate_ngrams[c])
            if len(permuted) >= n_swappings:
                break
            if not candidate_ngrams[c]:
                continue
            head = nprobs[:n_ngrams]
            total = numpy_sum(head)
            # Megatron draws this one from the process-global numpy.random, not the sample's
            # generator; the oracle stands in a generator seeded once per case.
            n = int(_choice(global_rs, ngram_nvals[:n_ngrams], [q / total for q in head]))
            while True:
                ngram_indices = sum(candidate_ngrams[c][n - 1], [])
                n = n - 1
                if n_swappings >= len(permuted) + len(ngram_indices):
                    skip = False
                    break
                if n == 0:
                    skip = True
                    break
            if skip:
                continue
            if any(i in masked_indices or i in permuted for i in ngram_indices):
                continue
            for i in ngram_indices:
                permuted.add(i)
        assert len(permuted) <= n_swappings
        permuted = sorted(permuted)
        permuted_copy = list(permuted)
        rs.shuffle(permuted_copy)
        masked_copy = list(masked)
        for i, j in zip(permuted, permuted_copy):
            masked[i] = masked_copy[j]
            positions_and_labels.append((i, masked_copy[i]))

    positions_and_labels.sort(key=lambda x: x[0])
    spans.sort(key=lambda x: x[0][0])
    return (masked, [p for p, _ in positions_and_labels], [l for _, l in positions_and_labels],
            boundaries, spans)


# ---- one sample (BERTMaskedWordPieceDataset.__getitem__) --------------------------------------


def bert_sample(idx, row, dataset, vocab, cfg, rs, global_rs):
    """One sample; rs is RandomState((seed + idx) % 2^32). Its draws, in order: [binary head:
    randint(1, n) when n >= 3 sentences, then random()], one random() per truncated token,
    shuffle(n-gram starts), per visited start one choice (or geometric) and per masked token
    random() [+ random() [+ randint]], shuffle(n-gram starts) again, [permutation: shuffle]."""
    beg, end, target = (int(v) for v in row)
    sample = [[int(t) for t in dataset[i]] for i in range(beg, end)]
    seq_length = cfg["sequence_length"]
    assert target <= seq_length

    pivot = len(sample)
    is_next_random = False
    if cfg["classification_head"]:
        assert len(sample) > 1, "the sample must contain at least two sentences"
        pivot = 1
        if len(sample) >= 3:
            pivot = int(rs.randint(1, len(sample)))
        is_next_random = rs.random() < 0.5
    split_a = [t for s in sample[:pivot] for t in s]
    split_b = [t for s in sample[pivot:] for t in s]
    if is_next_random:
        split_a, split_b = split_b, split_a

    truncated = False
    if len(split_a) + len(split_b) > target:
        while len(split_a) + len(split_b) > target:
            split = split_a if len(split_a) > len(split_b) else split_b
            if rs.random() < 0.5:
                del split[0]
            else:
                del split[-1]
        truncated = True

    tokens = [vocab.cls] + split_a + [vocab.sep]
    types = [0] * (len(split_a) + 2)
    if split_b:
        tokens += split_b + [vocab.sep]
        types += [1] * (len(split_b) + 1)

    tokens, positions, labels_at, _, _ = create_masked_lm_predictions(tokens, target, rs, vocab,
                                                                      cfg, global_rs)
    n_pad = seq_length - len(tokens)
    assert n_pad >= 0
    text = np.pad(np.array(tokens, dtype=np.int64), (0, n_pad), constant_values=vocab.pad)
    types = np.pad(np.array(types, dtype=np.int64), (0, n_pad), constant_values=vocab.pad)
    # The padding mask is padded with the pad id too, not with 0.
    padding_mask = np.pad(np.ones(len(tokens), dtype=np.int64), (0, n_pad),
                          constant_values=vocab.pad)
    labels = np.zeros(seq_length, dtype=np.int64) - 1
    labels[positions] = labels_at
    loss_mask = np.zeros(seq_length, dtype=np.int64)
    loss_mask[positions] = 1
    return {"text": text.tolist(), "types": types.tolist(), "labels": labels.tolist(),
            "is_random": int(is_next_random), "padding_mask": padding_mask.tolist(),
            "loss_mask": loss_mask.tolist(), "truncated": int(truncated)}


# ---- driver ----------------------------------------------------------------------------------


def run_case(case, restated=False):
    """The case's JSON facts. restated=True draws from LegacyRandomState instead of NumPy."""
    cfg = dict(case)
    cfg.setdefault("vocab_extra_ids", 0)
    dataset = IndexedDataset(case["prefix"])
    vocab = Vocab(case["vocab_file"], cfg["vocab_extra_ids"])
    try:
        index, epochs, num_epochs, max_num_samples = sample_index_for(cfg, dataset)
    except IndexError as err:
        return {"error": "IndexError: %s" % err}
    make = LegacyRandomState if restated else np.random.RandomState
    global_rs = make(cfg.get("global_numpy_seed", cfg["seed"]) % 2 ** 32)
    count = len(index)
    if cfg.get("max_samples_out") is not None:
        count = min(count, int(cfg["max_samples_out"]))
    samples = []
    for idx in range(count):
        rs = make((cfg["seed"] + idx) % 2 ** 32)
        if cfg.get("trace_rng"):
            rs = TracingRandomState(rs)
        s = bert_sample(idx, index[idx], dataset, vocab, cfg, rs, global_rs)
        if cfg.get("trace_rng"):
            s["rng_calls"] = rs.calls
        samples.append(s)
    return {
        "sample_index": index.astype(np.int64).tolist(),
        "sample_index_dtype": index.dtype.name,
        "samples": samples,
        "length": int(len(index)),
        "epochs_walked": epochs,
        "num_epochs": num_epochs,
        "max_num_samples": None if case.get("num_samples") is None else max_num_samples,
        "special_ids": {"cls": vocab.cls, "sep": vocab.sep, "pad": vocab.pad, "mask": vocab.mask},
        "token_lookup_size": len(vocab.token_lookup),
    }


def run_spec(spec, out):
    with open(spec) as f:
        cases = json.load(f)
    os.makedirs(out, exist_ok=True)
    for case in cases:
        with open(os.path.join(out, case["name"] + ".json"), "w") as f:
            json.dump(run_case(case), f)


# ---- self-test -------------------------------------------------------------------------------


def write_dataset(prefix, documents, dtype=np.uint16):
    """documents: lists of sentences (lists of ids) -> prefix.bin / prefix.idx (MMIDIDX v1)."""
    dtype = np.dtype(dtype)
    codes = {np.dtype(t).name: c for c, t in DTYPES.items()}
    lengths, doc_idx, chunks = [], [0], []
    for doc in documents:
        for sent in doc:
            chunks.append(np.asarray(sent, dtype=dtype).astype(dtype.newbyteorder("<")).tobytes())
            lengths.append(len(sent))
        doc_idx.append(len(lengths))
    with open(prefix + ".bin", "wb") as f:
        f.write(b"".join(chunks))
    lengths = np.asarray(lengths, dtype="<i4")
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize)
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", 1, codes[dtype.name], len(lengths), len(doc_idx)))
        f.write(lengths.tobytes() + pointers.tobytes() + np.asarray(doc_idx, "<i8").tobytes())


class _ScalarMT19937_64:
    """Element-by-element MT19937-64, only to cross-check the array twist."""

    def __init__(self, seed):
        self.mt = [seed & U64]
        for i in range(1, 312):
            self.mt.append((6364136223846793005 * (self.mt[-1] ^ (self.mt[-1] >> 62)) + i) & U64)
        self.i = 312

    def __call__(self):
        if self.i >= 312:
            mt = self.mt
            for k in range(312):
                x = (mt[k] & 0xFFFFFFFF80000000) | (mt[(k + 1) % 312] & 0x7FFFFFFF)
                mt[k] = mt[(k + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.i = 0
        x = self.mt[self.i]
        self.i += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000 & U64
        x ^= (x << 37) & 0xFFF7EEE000000000 & U64
        return x ^ (x >> 43)


def _check(cond, what):
    if not cond:
        raise AssertionError(what)


def self_test():
    # The generators, against the values [rand.predef] fixes and a scalar restatement.
    g = MT19937(5489)
    first = g()
    for _ in range(9998):
        g()
    _check(first == 3499211612 and g() == 4123659995, "std::mt19937 reference values")
    g64 = MT19937_64(5489)
    g64.block(9999)
    _check(g64() == 9981545732273789042, "std::mt19937_64 reference value")
    for seed in (1, 2, 1234, 2 ** 31 - 1, 2 ** 32 + 5):
        a, b = MT19937_64(seed), _ScalarMT19937_64(seed)
        _check(all(a() == b() for _ in range(700)), "mt19937_64 array twist, seed %d" % seed)
    # RandomState(int) seeds by init_genrand: its raw words are std::mt19937's.
    for seed in (0, 1, 5489, 123456789, U32):
        raw = np.random.RandomState(seed).randint(0, 2 ** 32, size=1500, dtype=np.uint32)
        g = MT19937(seed)
        _check(all(int(v) == g() for v in raw), "RandomState(%d) raw words" % seed)

    # The restated legacy calls, against NumPy's.
    for seed in range(60):
        a, b = np.random.RandomState(seed), LegacyRandomState(seed)
        for k in range(40):
            _check(float(a.random()) == b.random(), "random()")
            hi = [2, 3, 7, 30522, 2 ** 31, 1 + k][k % 6]
            _check(int(a.randint(0, hi)) == b.randint(0, hi), "randint(0, %d)" % hi)
            _check(int(a.randint(1, 2 + k % 5)) == b.randint(1, 2 + k % 5), "randint(1, n)")
            xa, xb = [[i] for i in range(k % 13)], [[i] for i in range(k % 13)]
            a.shuffle(xa)
            b.shuffle(xb)
            _check(xa == xb, "shuffle(list)")
            m = 1 + k % 12
            p = ngram_probabilities(m, k % 2 == 1)
            total = numpy_sum(p)
            p = [q / total for q in p]
            vals = list(range(1, m + 1))
            _check(int(a.choice(np.arange(1, m + 1), p=np.array(p))) == b.choice(vals, p),
                   "choice(p)")
            for q in (0.2, 0.5):
                _check(int(a.geometric(q)) == b.geometric(q), "geometric(%g)" % q)
    # The sums behind the n-gram probabilities, against ndarray.sum().
    rnd = np.random.RandomState(7)
    for n in list(range(1, 300)) + [1000, 4097]:
        arr = rnd.random_sample(n) * (10.0 ** rnd.randint(-5, 5, n))
        _check(float(arr.sum()) == numpy_sum(arr.tolist()), "pairwise sum, n=%d" % n)
    for m in range(1, 41):
        for longer in (False, True):
            ref = 1.0 / (np.arange(m, dtype=np.int64) + 1)
            ref = ref / ref.sum(keepdims=True)
            if longer:
                ref = ref[::-1]
            ref = ref / ref.sum(keepdims=True)
            ours = ngram_probabilities(m, longer)
            total = numpy_sum(ours)
            _check(ref.tolist() == [q / total for q in ours], "n-gram probabilities m=%d" % m)

    # build_mapping by hand: no short sequences, so no draws, before the shuffle.
    sizes = np.array([5, 5, 5, 5, 600, 3, 4, 2, 9, 9, 9], dtype=np.int32)
    docs = [0, 4, 6, 7, 8, 11]  # [0,4) 4 sents; [4,6) has a long one; [6,7); [7,8); [8,11)
    rows, _ = build_mapping(docs, sizes, 1, U64, 9, 0.0, 7, 2, shuffle=False)
    _check(rows.tolist() == [[0, 2, 9], [2, 4, 9], [8, 11, 9]], "hand mapping, min 2")
    rows, _ = build_mapping(docs, sizes, 1, U64, 9, 0.0, 7, 1, shuffle=False)
    _check(rows.tolist() == [[0, 2, 9], [2, 4, 9], [6, 7, 9], [7, 8, 9], [8, 9, 9], [9, 11, 9]],
           "hand mapping, min 1")
    # Whole epochs: 6 rows per epoch here, so 7 samples asked give 12, and 0 asked give none.
    rows, epochs = build_mapping(docs, sizes, INT32_MAX - 1, 7, 9, 0.0, 7, 1, shuffle=False)
    _check(len(rows) == 12 and epochs == 2, "epochs rounded up")
    rows, epochs = build_mapping(docs, sizes, INT32_MAX - 1, 0, 9, 0.0, 7, 1)
    _check(len(rows) == 0 and epochs == 0, "zero samples")
    # The shuffle is a permutation of the unshuffled rows, by mt19937_64(seed + 1).
    plain, _ = build_mapping(docs, sizes, INT32_MAX - 1, 40, 9, 0.3, 7, 1, shuffle=False)
    mixed, _ = build_mapping(docs, sizes, INT32_MAX - 1, 40, 9, 0.3, 7, 1)
    order = list(range(len(plain)))
    g64 = _ScalarMT19937_64(8)
    for i in range(len(order) - 1, 0, -1):
        j = g64() % (i + 1)
        order[i], order[j] = order[j], order[i]
    _check(mixed.tolist() == plain[order].tolist(), "shuffle by mt19937_64(seed + 1)")
    _check(set(int(t) for t in plain[:, 2]) != {9}, "short targets drawn")

    with tempfile.TemporaryDirectory() as tmp:
        _self_test_samples(tmp)
    print("bert_samples self-test: ok")
    return 0


def _self_test_samples(tmp):
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "big", "red", "un", "re"]
    pieces = ["##s", "##ed", "##ing", "##ly", "##er"]
    # [PAD] deliberately not at 0 (nor 1, the padding mask's "real token"), so that the pad value
    # shows everywhere Megatron pads with it.
    specials = ["[UNK]", "[CLS]", "[PAD]", "[SEP]", "[MASK]"]
    tokens = specials + words + pieces
    vocab_path = os.path.join(tmp, "vocab.txt")
    with open(vocab_path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    first_word, first_piece = len(specials), len(specials) + len(words)
    rnd = np.random.RandomState(3)

    def sentence(n):
        out = []
        while len(out) < n:
            out.append(int(rnd.randint(first_word, first_piece)))
            for _ in range(int(rnd.choice([0, 0, 1, 2]))):
                out.append(int(rnd.randint(first_piece, len(tokens))))
        return out[:n]

    documents = []
    for k in range(40):
        if k % 11 == 5:
            documents.append([])
        elif k % 13 == 7:
            documents.append([sentence(600)])  # one long sentence: allowed alone
        elif k % 17 == 3:
            documents.append([sentence(20), sentence(513), sentence(9)])  # skipped
        else:
            documents.append([sentence(int(rnd.randint(1, 30)))
                              for _ in range(int(rnd.randint(1, 7)))])
    prefix = os.path.join(tmp, "ds_text_sentence")
    write_dataset(prefix, documents)
    dataset = IndexedDataset(prefix)
    vocab = Vocab(vocab_path, 3)
    _check(vocab.token_lookup[-5:] == [len(tokens) + i for i in range(5)] and
           vocab.inv_vocab[len(tokens)] == "[BOS]", "[BOS] [EOS] <extra_id_i> appended")

    base = {"prefix": prefix, "vocab_file": vocab_path, "vocab_extra_ids": 3,
            "documents": [2, 38], "seed": 1234, "sequence_length": 64,
            "masking_probability": 0.15, "short_sequence_probability": 0.1,
            "masking_max_ngram": 3, "masking_do_full_word": True,
            "masking_do_permutation": False, "masking_use_longer_ngrams": False,
            "masking_use_geometric_distribution": False, "classification_head": True}
    variants = [
        dict(name="bert", num_samples=200),
        dict(name="no_head_one_epoch", num_samples=None, classification_head=False),
        dict(name="short", num_samples=50, sequence_length=16, short_sequence_probability=0.5),
        dict(name="geometric", num_samples=None, masking_max_ngram=10,
             masking_use_geometric_distribution=True, classification_head=False),
        dict(name="longer_no_full_word", num_samples=30, masking_use_longer_ngrams=True,
             masking_do_full_word=False, masking_max_ngram=9),
        dict(name="permutation", num_samples=30, masking_do_permutation=True,
             global_numpy_seed=99),
        dict(name="zero", num_samples=0),
    ]
    for v in variants:
        case = dict(base, **v)
        facts = run_case(case)
        _check(facts == run_case(case, restated=True), "%s: NumPy and restated draws" % v["name"])
        _check_case(case, facts, dataset, vocab)
        traced = run_case(dict(case, trace_rng=True, max_samples_out=3))
        _check([dict((k, x) for k, x in s.items() if k != "rng_calls") for s in traced["samples"]]
               == facts["samples"][:3], "%s: tracing changes nothing" % v["name"])
    # The --spec interface end to end.
    spec = os.path.join(tmp, "spec.json")
    with open(spec, "w") as f:
        json.dump([dict(base, name="cli", num_samples=10, max_samples_out=4)], f)
    run_spec(spec, os.path.join(tmp, "out"))
    with open(os.path.join(tmp, "out", "cli.json")) as f:
        cli = json.load(f)
    _check(len(cli["samples"]) == 4 and cli["length"] >= 10, "--spec output")


def _check_case(case, facts, dataset, vocab):
    name, seq = case["name"], case["sequence_length"]
    begin, end = case["documents"]
    docs = dataset.document_indices
    first_sent, end_sent = int(docs[begin]), int(docs[end])
    index = np.array(facts["sample_index"], dtype=np.int64).reshape(-1, 3)
    if case["num_samples"] == 0:
        _check(facts["length"] == 0, name + ": zero samples")
        return
    # Rows stay inside one document of the split, in global sentence numbers.
    doc_of = np.searchsorted(docs, np.arange(len(dataset.sequence_lengths)), side="right") - 1
    min_sent = 2 if case["classification_head"] else 1
    for a, b, t in index.tolist():
        _check(first_sent <= a < b <= end_sent and doc_of[a] == doc_of[b - 1],
               name + ": row inside one document")
        _check(b - a >= min_sent and 2 <= t <= seq - 3, name + ": row shape")
    # The rows of one epoch tile the eligible documents exactly.
    eligible = sum(int(docs[d + 1] - docs[d]) for d in range(begin, end)
                   if docs[d + 1] - docs[d] >= min_sent and
                   (docs[d + 1] - docs[d] == 1 or
                    not np.any(dataset.sequence_lengths[docs[d]:docs[d + 1]] > 512)))
    covered = int(np.sum(index[:, 1] - index[:, 0]))
    _check(covered == eligible * facts["epochs_walked"], name + ": epochs tile the documents")
    if case["num_samples"] is not None:
        _check(facts["length"] >= case["num_samples"], name + ": at least num_samples")
    else:
        _check(facts["epochs_walked"] == 1, name + ": one epoch")

    masked_total = replaced = kept = 0
    any_masked = False
    for idx, s in enumerate(facts["samples"]):
        text = s["text"]
        length = sum(1 for x in s["padding_mask"][:seq] if x == 1)
        _check(s["padding_mask"][:length] == [1] * length and
               s["padding_mask"][length:] == [vocab.pad] * (seq - length), name + ": padding")
        _check(text[length:] == [vocab.pad] * (seq - length) and
               s["types"][length:] == [vocab.pad] * (seq - length), name + ": pad values")
        target = int(index[idx][2])
        _check(length <= target + 3 and len(text) == seq, name + ": length")
        _check(text[0] == vocab.cls and text[length - 1] == vocab.sep, name + ": [CLS] ... [SEP]")
        seps = [i for i in range(length) if text[i] == vocab.sep and s["labels"][i] == -1]
        types = s["types"][:length]
        if case["classification_head"]:
            _check(len(seps) == 2, name + ": two [SEP] with the binary head")
            _check(types == [0] * (seps[0] + 1) + [1] * (length - seps[0] - 1), name + ": types")
        else:
            _check(len(seps) == 1 and types == [0] * length and s["is_random"] == 0,
                   name + ": one segment")
        _check(s["loss_mask"] == [int(x != -1) for x in s["labels"]], name + ": loss mask")
        n_masked = sum(s["loss_mask"])
        p = case["masking_probability"]
        budget = min(p * target, max(1, int(round(length * p))))
        if not case["masking_do_permutation"]:
            _check(n_masked <= budget, name + ": masked count within budget")
        # Unmasked tokens come from the sample's sentences; labels hold the originals.
        a, b = int(index[idx][0]), int(index[idx][1])
        pool = set(int(t) for i in range(a, b) for t in dataset[i])
        original = [s["labels"][i] if s["labels"][i] != -1 else text[i] for i in range(length)]
        body = [t for i, t in enumerate(original) if i != 0 and i not in seps]
        _check(all(t in pool for t in body), name + ": tokens from the sample")
        any_masked = any_masked or n_masked > 0
        if not s["truncated"] and not s["is_random"]:
            want = [int(t) for i in range(a, b) for t in dataset[i]]
            _check([t for i, t in enumerate(original) if i != 0 and i not in seps] == want,
                   name + ": untruncated sample keeps its sentences in order")
        for i in range(length):
            if s["labels"][i] != -1 and not case["masking_do_permutation"]:
                masked_total += 1
                if text[i] == vocab.mask:
                    pass
                elif text[i] == s["labels"][i]:
                    kept += 1
                else:
                    replaced += 1
            if (s["labels"][i] != -1 and case["masking_do_full_word"] and
                    not case["masking_do_permutation"] and vocab.is_continuation(original[i])):
                j = i - 1 if original[i - 1] != vocab.sep else i - 2
                if j > 0 and original[j] not in (vocab.cls, vocab.sep):
                    _check(s["labels"][j] != -1, name + ": whole words masked")
    _check(any_masked or not facts["samples"], name + ": something masked")
    if masked_total >= 400:
        _check(0.7 < 1 - (replaced + kept) / masked_total < 0.9 and
               0.03 < kept / masked_total < 0.2, name + ": 80/10/10 proportions")


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
