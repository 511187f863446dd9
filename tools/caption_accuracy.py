#!/usr/bin/env python3
"""Caption accuracy on `megatron scenes` data: how many of a model's generated captions name the
scene's true size, colour, shape and place, against the manifest's true captions.

Reads the manifest (scenes.jsonl: {"id", "image", "text"}) and `megatron generate`'s JSON lines
(one per scene, in the manifest's order; "text" is the prompt and the generation). A caption's
attributes are the words of the scene vocabulary it contains (the first of each kind, the place
as "top left" ... "center"); a missing attribute counts as wrong. Prints one JSON object: the
number of scenes, the accuracy of each attribute, and the exact accuracy (all four right).

What it is not: a language metric (BLEU, CIDEr); the scenes' captions have one right answer.

Usage: caption_accuracy.py MANIFEST GENERATIONS [--chance]
  --chance also prints the accuracy of always answering the most frequent value of each
  attribute in the manifest (what a model that cannot see the image approaches at best).
"""
import argparse
import collections
import json
import re

KINDS = {
    "size": ["small", "large"],
    "colour": ["red", "green", "blue", "yellow"],
    "shape": ["circle", "square", "triangle"],
    "place": ["top left", "top right", "bottom left", "bottom right", "center"],
}


def attributes(text):
    words = " ".join(re.findall(r"[a-z]+", text.lower()))
    out = {}
    for kind, values in KINDS.items():
        found = [(words.find(v), v) for v in values if re.search(r"\b" + v + r"\b", words)]
        out[kind] = min(found)[1] if found else None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest")
    ap.add_argument("generations")
    ap.add_argument("--chance", action="store_true")
    args = ap.parse_args()
    with open(args.manifest) as f:
        truth = [attributes(json.loads(line)["text"]) for line in f if line.strip()]
    with open(args.generations) as f:
        got = [attributes(json.loads(line)["text"]) for line in f if line.strip()]
    if len(got) != len(truth):
        raise SystemExit(f"{len(got)} generations for {len(truth)} scenes")
    right = {k: sum(g[k] == t[k] for g, t in zip(got, truth)) for k in KINDS}
    exact = sum(all(g[k] == t[k] for k in KINDS) for g, t in zip(got, truth))
    n = len(truth)
    out = {"scenes": n, "exact": exact / n, **{k: right[k] / n for k in KINDS}}
    if args.chance:
        common = {k: collections.Counter(t[k] for t in truth).most_common(1)[0][0] for k in KINDS}
        out["chance"] = {
            "exact": sum(all(t[k] == common[k] for k in KINDS) for t in truth) / n,
            **{k: sum(t[k] == common[k] for t in truth) / n for k in KINDS}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
