#!/usr/bin/env bash
# Installs, builds and runs the whole test suite. GPU tests (label gpu) skip with a reason when no
# GPU is present; `scripts/test.sh -L gpu` runs only those (on an H200).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
# Spinning OpenMP workers oversubscribe the cores when ctest runs tests in parallel.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
