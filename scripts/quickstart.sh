#!/usr/bin/env bash
# The main job: installs dependencies, builds, fetches and preprocesses the Brown corpus (GPT-2
# BPE), and trains a small GPT (4 layers, hidden 256, GPT-2 vocabulary) on it for 200 iterations
# with a 90/5/5 train/validation/test split, printing Megatron's log lines and the validation
# loss and perplexity every 50 iterations. It runs as a 2-process MPI job, tensor and sequence
# parallel (each rank holds half of every layer and of the vocabulary, one thread each); the loss
# curve is the single-process one. At the end it prints the unigram entropy of the training
# tokens: the validation loss ends well below it. Then it loads the checkpoint the run saved into
# one process (the checkpoint reshards on load) and generates a few lines from it: prompts from
# the corpus's own register, sampled with the KV cache (top-k 40, temperature 0.8, a fixed seed,
# so the text is the same every run on the same machine), printing each prompt and its
# continuation as one quoted line (`megatron generate` itself prints JSON lines with the tokens
# and log-probabilities too). 5 to 8 minutes on 2 cores.
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
  --tensorboard-dir runs/quickstart --save runs/quickstart/checkpoints \
  "$@"
/usr/bin/python3 tools/unigram_entropy.py data/brown_text_document --fraction 0.9
build/megatron generate --load runs/quickstart/checkpoints \
  --tokenizer-type GPT2BPETokenizer \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt \
  --prompts "The jury said" "In the morning, she" "The new government will" \
  --num-tokens-to-generate 40 --top_k 40 --temperature 0.8 --seed 1234 \
  --num-threads 2 |
  /usr/bin/python3 -c 'import json, sys
for line in sys.stdin:
    print("generated:", json.dumps(json.loads(line)["text"]))'
