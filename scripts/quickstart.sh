#!/usr/bin/env bash
# The main job: installs dependencies, builds, and trains a small GPT (4 layers, hidden 256) on
# mock data for 200 iterations, printing Megatron's log lines; the loss falls from ~8.3 (ln of the
# vocabulary) to well under 1. Extra arguments are passed to `megatron train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/megatron train \
  --mock-data --vocab-size 4096 \
  --num-layers 4 --hidden-size 256 --num-attention-heads 4 \
  --seq-length 128 --max-position-embeddings 128 \
  --micro-batch-size 8 --global-batch-size 16 \
  --train-iters 200 --log-interval 10 \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 20 \
  --weight-decay 0.1 --clip-grad 1.0 \
  --tensorboard-dir runs/quickstart \
  "$@"
