#!/usr/bin/env bash
# The Brown genre task (docs/BERT.md): pretrain a small BERT on two thirds of the Brown corpus,
# finetune it to tell the genre (15 classes) of paragraphs from the held-out documents, and
# compare with the same classifier trained from random weights and with the majority class.
# Needs build/megatron (scripts/build.sh) and the data (scripts/fetch_data.sh). About 40 minutes
# on 2 cores. Usage: scripts/brown_genre.sh [OUT_DIR] (default runs/brown_genre).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/brown_genre}
M=build/megatron
mkdir -p "$OUT"
bash scripts/fetch_data.sh >/dev/null
/usr/bin/python3 tools/brown_genre.py data/brown.jsonl "$OUT" | tee "$OUT/split.txt"
TOK=(--tokenizer-type BertWordPieceLowerCase --vocab-file data/bert-vocab.txt)
"$M" preprocess --input "$OUT/pretrain.jsonl" --output-prefix "$OUT/pretrain" "${TOK[@]}" \
  --split-sentences --workers 2 >"$OUT/preprocess.log" 2>&1
MODEL=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128
       --max-position-embeddings 128 "${TOK[@]}")
# Masked LM + sentence order over ~8 passes of the 0.9 M-token corpus, bf16 GEMM inputs.
"$M" pretrain_bert "${MODEL[@]}" --micro-batch-size 16 --global-batch-size 32 --bf16 \
  --lr 1e-3 --min-lr 1e-5 --lr-decay-style cosine --lr-warmup-iters 100 --weight-decay 0.01 \
  --clip-grad 1.0 --train-iters 1800 --log-interval 50 --eval-interval 600 --eval-iters 5 \
  --data-path "$OUT/pretrain_text_sentence" --split 98,2,0 \
  --data-cache-path "$OUT/cache" --save "$OUT/pretrained" --save-interval 1800 \
  >"$OUT/pretrain.log" 2>&1
FT=(--task classification --train-data "$OUT/train.tsv" --valid-data "$OUT/valid.tsv"
    --epochs 4 --micro-batch-size 16 --global-batch-size 32 --lr 5e-4 --lr-warmup-iters 30
    --lr-decay-style linear --weight-decay 0.01 --clip-grad 1.0 --log-interval 20)
"$M" finetune "${MODEL[@]}" "${FT[@]}" --pretrained-checkpoint "$OUT/pretrained" \
  >"$OUT/finetune_pretrained.log" 2>&1
"$M" finetune "${MODEL[@]}" "${FT[@]}" >"$OUT/finetune_scratch.log" 2>&1
echo "pretraining (first and last iteration lines):"
grep -E 'iteration +(50|1800)/' "$OUT/pretrain.log" | grep -oE '(lm|sop) loss: [0-9.E+-]+' | paste - -
for run in pretrained scratch; do
  acc=$(grep 'on validation set' "$OUT/finetune_$run.log" | grep -oE 'accuracy value: [0-9.E+-]+')
  echo "finetuned from $run weights: validation $acc"
done
grep -o "majority class.*" "$OUT/split.txt"
