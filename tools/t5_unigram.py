#!/usr/bin/env python3
"""The unigram baseline of T5's span-corruption targets: the cross entropy (nats per target token)
of the best model that ignores every input, i.e. the entropy of the target tokens' frequencies
(span tokens, their sentinels and the closing [EOS], where loss_mask is 1) over the first
samples of a T5 training set. A T5 whose lm loss is well below it uses its inputs.

The samples come from tests/data/t5_samples.py, the NumPy restatement of Megatron's
T5MaskedWordPieceDataset that the C++ dataset is tested against, with the same settings as
`megatron pretrain_t5` (seed, lengths, --mask-prob 0.15, --short-seq-prob 0.1, the split).
The entropy is measured on the samples it is estimated from, so it is a slightly optimistic
baseline.

Usage: t5_unigram.py PREFIX VOCAB EXTRA_IDS ENC_LEN DEC_LEN SPLIT TRAIN_SAMPLES [SAMPLES] [SEED]
  PREFIX   the `_text_sentence` dataset;  SPLIT  --split as given (e.g. "98,2,0")
  TRAIN_SAMPLES  the run's training samples (train iterations x global batch): the sample index
  SAMPLES  how many of them to count (default 4000);  SEED  --seed (default 1234)
"""
import collections
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data"))
import t5_samples  # noqa: E402


def split_documents(split, n):
    # Megatron's get_split_indices: normalised weights, cumulative rounded bounds.
    w = [float(x) for x in split.replace("/", ",").split(",")]
    w = [x / sum(w) for x in w] + [0.0] * (3 - len(w))
    bounds = [0]
    for x in w[:3]:
        bounds.append(bounds[-1] + int(round(x * float(n))))
    diff = bounds[-1] - n
    bounds = [bounds[0]] + [b - diff for b in bounds[1:]]
    return bounds[0], bounds[1]


def main():
    if len(sys.argv) < 8:
        sys.exit(__doc__)
    prefix, vocab_file, extra, enc, dec, split, train = sys.argv[1:8]
    count = int(sys.argv[8]) if len(sys.argv) > 8 else 4000
    seed = int(sys.argv[9]) if len(sys.argv) > 9 else 1234
    dataset = t5_samples.IndexedDataset(prefix)
    begin, end = split_documents(split, len(dataset.document_indices) - 1)
    case = {"name": "baseline", "prefix": prefix, "vocab_file": vocab_file,
            "vocab_extra_ids": int(extra), "documents": [begin, end],
            "num_samples": int(train), "index_split": "train", "split": split, "tokenizer": None,
            "seed": seed, "sequence_length": int(enc), "sequence_length_decoder": int(dec),
            "masking_probability": 0.15, "short_sequence_probability": 0.1,
            "masking_max_ngram": 10, "masking_do_full_word": True,
            "masking_use_longer_ngrams": False, "masking_use_geometric_distribution": True,
            "max_samples_out": count}
    vocab = t5_samples.Vocab(vocab_file, int(extra))
    index = t5_samples.sample_index_for(case, dataset)
    samples = [t5_samples.t5_sample(i, index[i], dataset, vocab, case)
               for i in range(min(count, len(index)))]
    counts = collections.Counter()
    for s in samples:
        if "error" in s:
            continue
        counts.update(t for t, m in zip(s["labels"], s["loss_mask"]) if m)
    total = sum(counts.values())
    entropy = -sum(c / total * math.log(c / total) for c in counts.values())
    print(f"unigram baseline of the targets: {entropy:.4f} nats/token over {total} target tokens "
          f"({len(counts)} distinct) of {len(samples)} samples")


if __name__ == "__main__":
    main()
