#!/usr/bin/env python3
"""Independent oracle for fill-in-the-middle samples (Megatron core 0.19's GPTFIMDataset).

Restates, from megatron/training/datasets/fim_dataset.py, what the dataset does to the ids of one
sample once its tokens are read: the cut at the FIM EOD token, the optional second cut at the
split token, the draws of numpy.random.RandomState (NumPy's own: binomial(1, rate),
randint(low=0, high=len(text) + 1, size=2), binomial(1, spm_rate)), the decoding without
special tokens, the character boundaries (Python string indices), the re-encoding of prefix,
middle and suffix, the PSM/SPM layouts and the final cut or padding. Each sample draws from
RandomState(seed) with the seed the C++ test gives (our per-sample seeding; Megatron's one stream
per dataset object is not reproducible across data-loader workers).

The tokenizer is a byte-level BPE tokenizer.json (no regex pre-tokenizer, so a text is one
word) restated here from the file: added tokens split out of the text (longest first at each
position), GPT-2's byte-to-unicode map, merges applied lowest rank first, the post-processor's
single template around the ids; decoding maps the byte characters back and decodes UTF-8 with
replacement characters. It shares no code with the C++ side.

Usage: fim_oracle.py --write-tokenizer tokenizer.json
  writes the test tokenizer: the 256 byte characters (id = byte), a few merges, the FIM tokens
  (<fim_prefix> <fim_middle> <fim_suffix> <fim_pad> <|endoftext|>), <file_sep> and the template's
  <s> as special added tokens, <keep> as a non-special one, <s> before every text.
       fim_oracle.py --spec cases.json --out results.json
  cases.json: {"tokenizer": PATH, "cases": [{"name", "sample": [ids], "seed", "rate",
               "spm_rate", "fragment_rate" (or null), "no_prefix" (or null), "tokens":
               {"prefix", "middle", "suffix", "pad", "eod", "split" (or null)}}]}
  results.json: {name: [ids]}
"""

import argparse
import json

import numpy as np

from sft_oracle import bytes_to_unicode  # GPT-2's byte -> character table


SPECIAL = ["<s>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<|endoftext|>",
           "<file_sep>"]
MERGES = ["\u0120 t", "h e", "\u0120t he", "i n", "e r", "\u0120 a", "o n", "d e", "\u0120 f",
          "r e"]


def tokenizer_json():
    byte_char = bytes_to_unicode()
    vocab = {byte_char[b]: b for b in range(256)}
    for m in MERGES:
        vocab[m.replace(" ", "")] = len(vocab)
    added = [{"id": len(vocab) + i, "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": t != "<keep>"}
             for i, t in enumerate(SPECIAL + ["<keep>"])]
    bos = added[0]["id"]
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [bos], "tokens": ["<s>"]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                      "merges": MERGES}}


class ByteLevelBpe:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            root = json.load(f)
        model = root["model"]
        self.vocab = model["vocab"]
        self.inv = {i: t for t, i in self.vocab.items()}
        merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        self.ranks = {tuple(m): r for r, m in enumerate(merges)}
        self.added = {t["content"]: t["id"] for t in root["added_tokens"]}
        self.added_inv = {t["id"]: t["content"] for t in root["added_tokens"]}
        self.special = {t["id"] for t in root["added_tokens"] if t.get("special")}
        self.byte_char = bytes_to_unicode()
        self.char_byte = {c: b for b, c in self.byte_char.items()}
        template = root["post_processor"]["single"]
        self.before = [self.added[item["SpecialToken"]["id"]] for item in
                       template[:[i for i, it in enumerate(template) if "Sequence" in it][0]]]

    def bpe(self, word):
        symbols = list(word)
        while len(symbols) > 1:
            pairs = [(self.ranks.get((a, b), None), i)
                     for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
            ranked = [p for p in pairs if p[0] is not None]
            if not ranked:
                break
            best = min(ranked)[0]
            merged, i = [], 0
            while i < len(symbols):
                if (i + 1 < len(symbols) and
                        self.ranks.get((symbols[i], symbols[i + 1])) == best):
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return [self.vocab[s] for s in symbols]

    def encode(self, text):
        """tokenizer(text).input_ids: the template's ids, then the text's."""
        ids, i, plain = list(self.before), 0, ""
        by_length = sorted(self.added, key=len, reverse=True)
        while i < len(text):
            hit = next((t for t in by_length if text.startswith(t, i)), None)
            if hit is None:
                plain += text[i]
                i += 1
                continue
            if plain:
                ids += self.bpe("".join(self.byte_char[b] for b in plain.encode("utf-8")))
                plain = ""
            ids.append(self.added[hit])
            i += len(hit)
        if plain:
            ids += self.bpe("".join(self.byte_char[b] for b in plain.encode("utf-8")))
        return ids

    def decode_without_special(self, ids):
        """ids_to_text(ids, remove_special_tokens=True)."""
        out = b""
        for i in ids:
            i = int(i)
            if i in self.special:
                continue
            if i in self.added_inv:
                out += self.added_inv[i].encode("utf-8")
            else:
                out += bytes(self.char_byte[c] for c in self.inv[i])
        return out.decode("utf-8", errors="replace")


class Fim:
    """GPTFIMDataset's methods, over one sample and one RandomState."""

    def __init__(self, case, tokenizer):
        self.tok = tokenizer
        self.np_rng = np.random.RandomState(seed=case["seed"])
        self.fim_rate = case["rate"]
        self.fim_spm_rate = case["spm_rate"]
        self.fragment_fim_rate = case["fragment_rate"]
        self.no_fim_prefix = case["no_prefix"]
        t = case["tokens"]
        self.fim_split_sample = t["split"]
        self.prefix_tok_id, self.middle_tok_id = t["prefix"], t["middle"]
        self.suffix_tok_id, self.pad_tok_id, self.eod_tok_id = t["suffix"], t["pad"], t["eod"]

    def sample(self, sample):
        sample = np.array(sample, dtype=np.int64)
        sample_len = sample.shape[0]
        segment_breaks = np.argwhere(sample == self.eod_tok_id)
        if segment_breaks.shape != (0, 1):
            curr_start_position = 0
            new_samples = []
            for loc in np.nditer(segment_breaks):
                if loc - curr_start_position > 0:
                    permuted = self.split_and_permute(sample[curr_start_position:loc])
                    new_samples += [permuted, [self.eod_tok_id]]
                curr_start_position = loc + 1
            new_samples.append(self.split_and_permute(sample[curr_start_position:]))
            sample = np.concatenate(new_samples)
        else:
            sample = self.split_and_permute(sample)
        diff = sample.shape[0] - sample_len
        if diff > 0:
            sample = sample[:sample_len]
        elif diff < 0:
            sample = np.concatenate([sample, np.full((-1 * diff), self.pad_tok_id)])
        assert sample.shape[0] == sample_len
        return [int(v) for v in sample]

    def split_and_permute(self, sequence):
        if self.fim_split_sample is None:
            return self.permute(sequence, self.fim_rate)
        fragment_breaks = np.argwhere(sequence == self.fim_split_sample)
        if fragment_breaks.shape == (0, 1):
            return self.permute(sequence, self.fim_rate)
        if not self.np_rng.binomial(1, self.fim_rate):
            return sequence
        curr_start_position = 0
        new_samples = []
        for loc in np.nditer(fragment_breaks):
            if loc - curr_start_position > 0:
                permuted = self.permute(sequence[curr_start_position:loc], self.fragment_fim_rate)
                new_samples += [permuted, [self.fim_split_sample]]
            curr_start_position = loc + 1
        new_samples.append(self.permute(sequence[curr_start_position:], self.fragment_fim_rate))
        return np.concatenate(new_samples)

    def permute(self, sample, fim_rate):
        if not self.np_rng.binomial(1, fim_rate):
            return sample
        contents = self.tok.decode_without_special(sample)
        if self.no_fim_prefix is not None and contents.startswith(self.no_fim_prefix):
            return sample
        boundaries = list(self.np_rng.randint(low=0, high=len(contents) + 1, size=2))
        boundaries.sort()
        prefix = np.array(self.tok.encode(contents[:boundaries[0]]), dtype=np.int64)
        middle = np.array(self.tok.encode(contents[boundaries[0]:boundaries[1]]), dtype=np.int64)
        suffix = np.array(self.tok.encode(contents[boundaries[1]:]), dtype=np.int64)
        if self.np_rng.binomial(1, self.fim_spm_rate):
            return np.concatenate([[self.prefix_tok_id, self.suffix_tok_id], suffix,
                                   [self.middle_tok_id], prefix, middle])
        return np.concatenate([[self.prefix_tok_id], prefix, [self.suffix_tok_id], suffix,
                               [self.middle_tok_id], middle])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--write-tokenizer")
    parser.add_argument("--spec")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.write_tokenizer:
        with open(args.write_tokenizer, "w", encoding="utf-8") as f:
            json.dump(tokenizer_json(), f)
        return
    with open(args.spec, encoding="utf-8") as f:
        spec = json.load(f)
    tokenizer = ByteLevelBpe(spec["tokenizer"])
    results = {}
    for case in spec["cases"]:
        results[case["name"]] = Fim(case, tokenizer).sample(case["sample"])
    # The tokenizer restated, checked by the C++ side on whole texts.
    results["__encode__"] = [tokenizer.encode(t) for t in spec.get("texts", [])]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
