#!/usr/bin/env python3
"""Oracle for --sft: Megatron's SFTTokenizer.tokenize_conversation and SFTDataset.__getitem__,
restated in Python over a tokenizer simple enough to restate too.

It writes into --out:
- tokenizer.json: a byte-level BPE whose one merge ("~~") never applies here (every byte its own
  token, id = the byte's value), with the nemotron-h-aligned prompt format's special tokens added
  (<SPECIAL_10>, <SPECIAL_11>, the pad <SPECIAL_233>) and the EOS </s>; encoding a text is then
  "split out the added tokens, every other byte one id", which this script does by hand;
- conversations.jsonl: conversations exercising the template (system, multi-turn, white space
  Python's str.strip() removes, non-ASCII text, truncation, padding) and three that
  tokenize_conversation refuses (an empty assistant turn, an assistant turn after a system
  turn, an unknown role);
- expected.json: for each conversation, {"tokens": [...], "labels": [...]} of the sample
  (the model's input tokens[:-1] and the targets[1:], -100 kept) at --seq-length, or
  {"error": "..."} for the refused ones.

Usage: sft_oracle.py --out DIR --seq-length S
"""

import argparse
import json
import os

IGNORE_INDEX = -100
SPECIAL = ["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_233>", "</s>"]


def bytes_to_unicode():
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_CHAR = bytes_to_unicode()
BYTE_ID = {b: i for i, b in enumerate(sorted(BYTE_CHAR))}  # id = the byte's value
SPECIAL_ID = {t: 256 + i for i, t in enumerate(SPECIAL)}


def tokenizer_json():
    vocab = {BYTE_CHAR[b]: BYTE_ID[b] for b in BYTE_CHAR}
    # One merge, of a pair the conversations never hold ("~~"), so that every text here still
    # encodes byte by byte (the C++ tokenizer refuses a BPE without merges as a broken file).
    vocab["~~"] = 256 + len(SPECIAL)
    added = [{"id": SPECIAL_ID[t], "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for t in SPECIAL]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": False},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                        "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": ["~ ~"]}}


def encode(text):
    """The added tokens split out (leftmost, longest first), every other byte its id."""
    ids, i = [], 0
    while i < len(text):
        hit = next((t for t in sorted(SPECIAL, key=len, reverse=True) if text.startswith(t, i)),
                   None)
        if hit:
            ids.append(SPECIAL_ID[hit])
            i += len(hit)
            continue
        j = i
        while j < len(text) and not any(text.startswith(t, j) for t in SPECIAL):
            j += 1
        ids.extend(BYTE_ID[b] for b in text[i:j].encode("utf-8"))
        i = j
    return ids


def render(conversation):
    """The nemotron-h-aligned chat template."""
    out = ""
    for m in conversation:
        if m["role"] == "system":
            out += "<SPECIAL_10>System\n" + m["content"].strip() + "\n"
        elif m["role"] == "user":
            out += "<SPECIAL_11>User\n" + m["content"].strip() + "\n" + "<SPECIAL_11>Assistant\n"
        elif m["role"] == "assistant":
            out += m["content"].strip() + "\n"
    return out


def tokenize_conversation(conversation):
    tokens = encode(render(conversation))
    target = list(tokens)
    idx = 0
    for turn_idx, turn in enumerate(conversation):
        role = turn["role"].lower()
        if role == "assistant" and len(turn["content"]) == 0:
            raise ValueError("empty assistant turn")
        if role == "assistant" and conversation[turn_idx - 1]["role"].lower() != "user":
            raise ValueError("assistant turn does not follow a user turn")
        if role not in ("system", "user", "assistant"):
            raise ValueError("unknown role")
        turn_tokens = encode(render([turn]))
        assert tokens[idx:idx + len(turn_tokens)] == turn_tokens
        if role in ("system", "user"):
            target[idx:idx + len(turn_tokens)] = [IGNORE_INDEX] * len(turn_tokens)
        idx += len(turn_tokens)
    assert idx == len(tokens)
    return tokens, target


def sample(conversation, seq_length):
    tokens, target = tokenize_conversation(conversation)
    tokens, target = tokens[:seq_length - 1], target[:seq_length - 1]
    eod, pad = SPECIAL_ID["</s>"], SPECIAL_ID["<SPECIAL_233>"]
    filler = [pad] * (seq_length - len(tokens))
    tokens = tokens + [eod] + filler
    target = target + [eod] + filler
    return {"tokens": tokens[:-1], "labels": target[1:]}


def conversations():
    sys_msg = {"role": "system", "content": "  You count.\t"}
    out = []
    for start in range(12):
        out.append([sys_msg,
                    {"role": "user", "content": f"count from {start}"},
                    {"role": "assistant", "content": " ".join(str(start + k) for k in range(6))},
                    {"role": "user", "content": "more\u00a0"},
                    {"role": "assistant", "content": "\u3000" + str(start + 6) + " caf\u00e9\n"}])
    out.append([{"role": "user", "content": "no system turn, a long answer"},
                {"role": "assistant", "content": "x" * 200}])
    out.append([{"role": "user", "content": "empty"}, {"role": "assistant", "content": ""}])
    out.append([sys_msg, {"role": "assistant", "content": "no question"}])
    out.append([{"role": "user", "content": "hi"}, {"role": "tool", "content": "?"}])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq-length", type=int, required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "</s>"}, f)
    expected = []
    with open(os.path.join(a.out, "conversations.jsonl"), "w", encoding="utf-8") as f:
        for c in conversations():
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
            try:
                expected.append(sample(c, a.seq_length))
            except ValueError as e:
                expected.append({"error": str(e)})
    with open(os.path.join(a.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
