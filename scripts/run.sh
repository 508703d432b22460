#!/usr/bin/env bash
# The main job: install, build, and run `moekit run` on the default model shape.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --target moekit_cli
./build/moekit run "$@"
