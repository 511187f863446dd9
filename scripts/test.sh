#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds, and runs every CTest test (unit, oracle,
# end-to-end). Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "${JOBS:-2}" --timeout 900
