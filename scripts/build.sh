#!/usr/bin/env bash
# Configures and builds megatron-cpp (Release, warnings as errors) into build/.
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-2}"
GENERATOR=()
if command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
else
  cmake -S . -B build "$@" >/dev/null
fi
cmake --build build -j "$JOBS"
