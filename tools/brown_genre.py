#!/usr/bin/env python3
"""Splits the Brown corpus into a BERT pretraining corpus and a genre classification task.

What it is: the Brown corpus's 500 documents (data/brown.jsonl, one per corpus file; the file
name's second letter is the genre, 15 genres a..r) are divided by document: in each genre, every
third document (in file-name order, from the first) is held out for the classification task and
the rest are the pretraining corpus. Held-out documents alternate between the task's training and
validation sets (by document, so no document's paragraphs are on both sides). Each paragraph of
at least MIN_WORDS words is one example: text_a = the paragraph, label = its document's genre.

Writes OUT/pretrain.jsonl ({"text", "id"} per document, for `megatron preprocess
--split-sentences`), OUT/train.tsv and OUT/valid.tsv (header text_a, label), and prints the counts
and the majority-class share of the validation set.

Usage: brown_genre.py data/brown.jsonl OUT_DIR
"""
import collections
import json
import os
import sys

MIN_WORDS = 10  # shorter paragraphs (headlines, dialogue lines) say little about the genre


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    docs = [json.loads(line) for line in open(src, encoding="utf-8")]
    by_genre = collections.defaultdict(list)
    for d in sorted(docs, key=lambda d: d["id"]):
        by_genre[d["id"][1]].append(d)
    pretrain, task = [], {"train": [], "valid": []}
    for genre, group in sorted(by_genre.items()):
        held = 0
        for i, d in enumerate(group):
            if i % 3 != 0:
                pretrain.append(d)
                continue
            side = "train" if held % 2 == 0 else "valid"
            held += 1
            for p in d["text"].split("\n\n"):
                p = " ".join(p.split())
                if len(p.split()) >= MIN_WORDS:
                    task[side].append((p, genre))
    with open(os.path.join(out, "pretrain.jsonl"), "w", encoding="utf-8") as f:
        for d in pretrain:
            f.write(json.dumps({"text": d["text"], "id": d["id"]}) + "\n")
    for side, rows in task.items():
        with open(os.path.join(out, f"{side}.tsv"), "w", encoding="utf-8") as f:
            f.write("text_a\tlabel\n")
            for text, genre in rows:
                f.write(f"{text.replace(chr(9), ' ')}\t{genre}\n")
    counts = collections.Counter(g for _, g in task["valid"])
    genre, n = counts.most_common(1)[0]
    print(f"pretraining documents: {len(pretrain)}; paragraphs: train {len(task['train'])}, "
          f"valid {len(task['valid'])}; validation majority class '{genre}': "
          f"{n / len(task['valid']):.4f}")


if __name__ == "__main__":
    main()
