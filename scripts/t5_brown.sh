#!/usr/bin/env bash
# T5 span-corruption pretraining on the Brown corpus (docs/T5.md): a small T5 (Megatron's default
# form) trained with `megatron pretrain_t5`, its validation lm loss against the unigram baseline
# of the targets (tools/t5_unigram.py). Needs build/megatron (scripts/build.sh); fetches the data.
# About 12 minutes on 2 cores. Usage: scripts/t5_brown.sh [OUT_DIR] (default runs/t5_brown).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/t5_brown}
M=build/megatron
ITERS=${ITERS:-1000}
mkdir -p "$OUT"
bash scripts/fetch_data.sh >/dev/null
TOK=(--tokenizer-type BertWordPieceLowerCase --vocab-file data/bert-vocab.txt
     --vocab-extra-ids 100)
"$M" preprocess --input data/brown.jsonl --output-prefix "$OUT/brown" "${TOK[@]:0:4}" \
  --split-sentences --workers 2 >"$OUT/preprocess.log" 2>&1
# At most round(0.15 x 126) = 19 masked tokens, each span with its sentinel, after [BOS]: a
# decoder of 48 positions always holds the targets.
"$M" pretrain_t5 "${TOK[@]}" --encoder-num-layers 2 --decoder-num-layers 2 --hidden-size 256 \
  --num-attention-heads 4 --kv-channels 64 --ffn-hidden-size 1024 \
  --encoder-seq-length 128 --decoder-seq-length 48 --max-position-embeddings 128 \
  --micro-batch-size 16 --global-batch-size 32 --bf16 \
  --lr 1e-3 --min-lr 1e-5 --lr-decay-style cosine --lr-warmup-iters 50 --weight-decay 0.01 \
  --clip-grad 1.0 --train-iters "$ITERS" --log-interval 50 --eval-interval 500 --eval-iters 10 \
  --data-path "$OUT/brown_text_sentence" --split 98,2,0 --data-cache-path "$OUT/cache" \
  >"$OUT/pretrain.log" 2>&1
echo "training lm loss (first and last logged iterations):"
grep -E "iteration +(50|$ITERS)/" "$OUT/pretrain.log" | grep -oE 'lm loss: [0-9.E+-]+'
echo "validation:"
grep -oE 'validation loss at iteration [0-9]+ \| lm loss value: [0-9.E+-]+' "$OUT/pretrain.log"
/usr/bin/python3 tools/t5_unigram.py "$OUT/brown_text_sentence" data/bert-vocab.txt 100 128 48 \
  98,2,0 $((ITERS * 32)) 4000
