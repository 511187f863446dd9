#!/usr/bin/env bash
# The main job: installs dependencies, builds, fetches and preprocesses the Brown corpus (GPT-2
# BPE), and trains a small GPT (4 layers, hidden 256, GPT-2 vocabulary) on it for 200 iterations
# with a 90/5/5 train/validation/test split, printing Megatron's log lines and the validation
# loss and perplexity every 50 iterations. It runs as a 2-process MPI job, tensor and sequence
# parallel (each rank holds half of every layer and of the vocabulary, one thread each); the loss
# curve is the single-process one. At the end it prints the unigram entropy of the training
# tokens: the validation loss ends well below it. 5 to 8 minutes on 2 cores.
# Extra arguments are passed to `megatron train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/fetch_data.sh
# Root may launch MPI jobs here (containers and CI run as root); more ranks than cores is allowed.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpiexec -n 2 --oversubscribe build/megatron train \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --data-path data/brown_text_document --split 90,5,5 --data-cache-path data/cache \
  --tokenizer-type GPT2BPETokenizer \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt \
  --num-layers 4 --hidden-size 256 --num-attention-heads 4 \
  --seq-length 128 --max-position-embeddings 128 \
  --micro-batch-size 8 --global-batch-size 16 \
  --train-iters 200 --log-interval 10 --eval-interval 50 --eval-iters 4 \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 20 \
  --weight-decay 0.1 --clip-grad 1.0 --hidden-dropout 0.1 --attention-dropout 0.1 \
  --tensorboard-dir runs/quickstart \
  "$@"
/usr/bin/python3 tools/unigram_entropy.py data/brown_text_document --fraction 0.9
