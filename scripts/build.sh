#!/usr/bin/env bash
# Configures and builds moekit into build/ (CUDA path when nvcc is found; MOEKIT_CUDA=OFF to skip).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA="${MOEKIT_CUDA:-AUTO}" >/dev/null
cmake --build build -j"$(nproc)" "$@"
