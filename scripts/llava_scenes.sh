#!/usr/bin/env bash
# A vision-language model that must see the image: `megatron scenes` renders 4000 training and
# 200 held-out 32x32 scenes (one shape of a colour and size at a place) with true captions, and
# a WordPiece vocabulary of their words. Then, in Megatron's LLaVA recipe:
#   0. a text-only baseline: a Llama-style GPT (2 layers, hidden 64) trained on the captions
#      alone (`megatron pretrain_gpt`); it cannot see the image;
#   1. `megatron pretrain_vlm` with that GPT as the language model (--pretrained-checkpoint: a GPT
#      checkpoint is a LLaVA language model, Megatron's combine step), a CLIP ViT (2 layers, 8x8
#      patches), the projector trained alone (--freeze-LM --freeze-ViT);
#   2. everything trained from stage 1's weights.
# After each, `megatron generate --model llava` captions the held-out scenes greedily from their
# images ("a" as the prompt; the text-only model gets the same prompt) and
# tools/caption_accuracy.py prints how many captions name the true size, colour, shape and place.
# One process, 2 threads; about a minute on 2 cores. Output in runs/llava_scenes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
M=build/megatron
OUT=runs/llava_scenes
rm -rf "$OUT" && mkdir -p "$OUT"
$M scenes --output-dir "$OUT/train" --num-samples 4000 --img-size 32
$M scenes --output-dir "$OUT/test" --num-samples 200 --first-index 1000000 --img-size 32
VOCAB=(--tokenizer-type BertWordPieceLowerCase --vocab-file "$OUT/train/vocab.txt")
LM=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --position-embedding-type rope
    --normalization RMSNorm --swiglu --disable-bias-linear --untie-embeddings-and-output-weights)
TRAIN=(--micro-batch-size 16 --global-batch-size 16 --lr 2e-3 --min-lr 1e-4
       --lr-decay-style cosine --lr-warmup-iters 50 --hidden-dropout 0 --attention-dropout 0
       --log-interval 500 --num-threads 2)
VLM=(--img-h 32 --img-w 32 --patch-dim 8 --seq-length 12
     --train-data-path "$OUT/train/scenes.jsonl" --valid-data-path "$OUT/test/scenes.jsonl"
     --eval-interval 1000 --eval-iters 4)
/usr/bin/python3 - "$OUT/test" <<'PY'
import json, os, sys
d = sys.argv[1]
with open(os.path.join(d, "scenes.jsonl")) as f, open(os.path.join(d, "prompts.jsonl"), "w") as g, \
        open(os.path.join(d, "text_prompts.txt"), "w") as t:
    for line in f:
        g.write(json.dumps({"prompt": "a", "image": json.loads(line)["image"]}) + "\n")
        t.write("a\n")
PY
caption() {  # caption CHECKPOINT NAME text|llava: the accuracy of its held-out captions
  local model=() prompts="$OUT/test/text_prompts.txt" chance=--chance
  if [ "$3" = llava ]; then model=(--model llava); prompts="$OUT/test/prompts.jsonl"; chance=; fi
  $M generate "${model[@]}" --load "$1" "${VOCAB[@]}" --prompt-file "$prompts" \
    --num-tokens-to-generate 12 --num-threads 2 > "$OUT/$2.jsonl" 2> "$OUT/$2.log"
  echo "$2: $(/usr/bin/python3 tools/caption_accuracy.py "$OUT/test/scenes.jsonl" \
    "$OUT/$2.jsonl" $chance)"
}

$M preprocess --input "$OUT/train/scenes.jsonl" --output-prefix "$OUT/captions" "${VOCAB[@]}" \
  --append-eod --workers 1
$M pretrain_gpt "${LM[@]}" "${VOCAB[@]}" "${TRAIN[@]}" --seq-length 32 \
  --max-position-embeddings 64 --data-path "$OUT/captions_text_document" --split 100,0,0 \
  --eval-iters 0 --train-iters 600 --save "$OUT/text_only" --save-interval 600
$M pretrain_vlm "${VOCAB[@]}" "${TRAIN[@]}" "${VLM[@]}" --pretrained-checkpoint "$OUT/text_only" \
  --freeze-LM --freeze-ViT --train-iters 1000 --save "$OUT/stage1" --save-interval 1000
$M pretrain_vlm "${VOCAB[@]}" "${TRAIN[@]}" "${VLM[@]}" --pretrained-checkpoint "$OUT/stage1" \
  --train-iters 2000 --save "$OUT/stage2" --save-interval 2000
echo "held-out caption accuracy (200 scenes; exact = all four attributes right):"
caption "$OUT/text_only" text_only text
caption "$OUT/stage1" stage1_projector llava
caption "$OUT/stage2" stage2_all llava
